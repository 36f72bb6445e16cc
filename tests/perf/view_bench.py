"""The viewer at scale, beside --summarize over the same file: the seconds until --view's first page
answers, and its peak memory (VmHWM), against --summarize's seconds and peak memory.

    python tests/perf/view_bench.py --rollouts 300000 [--rollfilter PATH]

It writes the file (demo-sized result lines, 4 rollouts a task) in a temporary folder first."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

LINE = re.compile(rb"at (http://127\.0\.0\.1:\d+/) ")


def write_results(path: Path, rollouts: int) -> None:
    with path.open("w") as file:
        for number in range(rollouts):
            task, rollout = divmod(number, 4)
            record = {
                "responses_create_params": {"input": [{"role": "user", "content": f"what is it like in city {task}?"}]},
                "response": {
                    "output": [
                        {"type": "function_call", "name": "get_weather", "arguments": '{"city": "x"}', "call_id": "c"},
                        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                    ],
                    "usage": {"input_tokens": 30, "output_tokens": 5 + number % 50, "total_tokens": 40},
                },
                "reward": float((task + rollout) % 3 == 0),
                "_ng_task_index": task,
                "_ng_rollout_index": rollout,
            }
            file.write(json.dumps(record) + "\n")


def peak_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmHWM:\s+(\d+)", status).group(1))  # type: ignore[union-attr]


def cpu_seconds(pid: int) -> float:
    """The user and system time of process `pid` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summarize(command: str, path: Path) -> tuple[float, float, float]:
    started = time.perf_counter()
    process = subprocess.Popen(
        ["/usr/bin/time", "-f", "%U %S %M", command, "--summarize", "-r", "4", str(path)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    _, stderr = process.communicate()
    user, system, peak = stderr.split()[-3:]
    return time.perf_counter() - started, float(user) + float(system), int(peak) / 1024


def view(command: str, path: Path) -> tuple[float, float, float]:
    started = time.perf_counter()
    process = subprocess.Popen([command, "--view", "-r", "4", str(path)], stderr=subprocess.PIPE)
    try:
        assert process.stderr is not None
        found = LINE.search(process.stderr.readline())
        assert found is not None
        urllib.request.urlopen(found.group(1).decode(), timeout=600).read()
        elapsed, cpu = time.perf_counter() - started, cpu_seconds(process.pid)
        urllib.request.urlopen(found.group(1).decode() + "?sort=-reward&page=3", timeout=600).read()
        urllib.request.urlopen(found.group(1).decode() + "?q=city%20123", timeout=600).read()
        return elapsed, cpu, peak_kib(process.pid) / 1024
    finally:
        process.terminate()
        process.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rollouts", type=int, default=300_000)
    parser.add_argument("--rollfilter", default="rollfilter")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "results.jsonl"
        write_results(path, options.rollouts)
        size = path.stat().st_size / 1e6
        summarized, summarize_cpu, summarize_mib = summarize(options.rollfilter, path)
        viewed, view_cpu, view_mib = view(options.rollfilter, path)
    print(f"{options.rollouts} rollouts, {size:.0f} MB")
    print(f"--summarize: {summarized:.2f} s, {summarize_cpu:.2f} s of CPU, peak {summarize_mib:.0f} MiB")
    ratio, cpu_ratio = viewed / summarized, view_cpu / summarize_cpu
    print(
        f"--view, first page: {viewed:.2f} s ({ratio:.2f}x), {view_cpu:.2f} s of CPU ({cpu_ratio:.2f}x),"
        f" peak {view_mib:.0f} MiB (after a sort and a search)"
    )


if __name__ == "__main__":
    main()
