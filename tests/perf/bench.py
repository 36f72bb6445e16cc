"""rollfilter against a NeMo Gym-style reference collector, side by side, in one run.

    pip install -e '.[test,bench]' && python tests/perf/bench.py [--quick] [--json FILE] [--baseline COMMAND]

Each client runs pinned to core 0 and the demo agent, in its own process, to core 1
(on a machine with one core both share it). The runs of rollfilter and of the reference
alternate. Each scenario's medians go into a table with their ratios and targets, and the
whole run is written as JSON (default tests/perf/results.json). Only loopback addresses
are used, and every wait is bounded.

--baseline COMMAND (another build's `rollfilter` script) runs that build too, as the client
"rollfilter (baseline)", in the same alternation in overhead, scale and memory (its
1,000,000-row plain run); the table gets a column for it and the ratio of this build to it.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import importlib.util
import json
import math
import os
import platform
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCE = HERE / "reference_collector.py"
RUN_TIMEOUT = 1800  # seconds: no single client run may take longer
BASELINE = "rollfilter (baseline)"  # the client --baseline runs
VARIANTS = (("rollfilter", ()), ("rollfilter --ordered", ("--ordered",)))  # the targets hold for both
QUEUEING = ["--slots", "40", "--thrash", "0.2"]  # the demo agent as a model server: a queue, thrashing past 80
SCENARIOS = (
    "overhead",
    "scale",
    "healthy",
    "adaptive",
    "queueing",
    "moving",
    "retry_budget",
    "memory",
    "first_result",
    "early_exit",
    "groups",
    "stragglers",
    "fleet",
    "rate_limits",
    "startup",
    "prometheus",
    "reverify",
    "trackers",
)


def pinned(core: int) -> list[str]:
    if shutil.which("taskset") and (os.cpu_count() or 1) > core:
        return ["taskset", "-c", str(core)]
    return []


EXAMPLE_ROWS = HERE.parent.parent / "rollfilter" / "examples" / "weather.jsonl"  # NeMo Gym's five rows


def process_cpu_ms(argv: Sequence[str]) -> float:
    """The CPU (user and system) of one run of `argv` to its end, its output discarded."""
    with open(os.devnull, "r+b") as devnull:
        proc = subprocess.Popen(argv, stdin=devnull, stdout=devnull, stderr=devnull)
        _, _, usage = os.wait4(proc.pid, 0)
        proc.returncode = 0  # reaped here: Popen must not wait for it again
    return (usage.ru_utime + usage.ru_stime) * 1000


def process_wall_s(argv: Sequence[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    return time.perf_counter() - start


def signalled_at(argv: Sequence[str], name: str, delay_s: float) -> tuple[int, bytes]:
    """`argv` sent signal `name` `delay_s` after it was started: its exit status and its stderr."""
    import signal

    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(delay_s)
    if proc.poll() is None:
        proc.send_signal(getattr(signal, name))
    _, stderr = proc.communicate(timeout=60)
    return (proc.returncode if proc.returncode >= 0 else 128 - proc.returncode), stderr


def rollfilter_cmd() -> list[str]:
    script = Path(sys.executable).parent / "rollfilter"
    return [str(script)] if script.exists() else [sys.executable, "-m", "rollfilter"]


class Agent:
    """The demo agent in its own process on 127.0.0.1."""

    def __init__(self, latency: float, extra: Sequence[str] = ()) -> None:
        self.process = subprocess.Popen(
            [*pinned(1), sys.executable, "-m", "rollfilter.demo", "--port", "0", "--latency", str(latency), *extra],
            stderr=subprocess.PIPE,
        )
        assert self.process.stderr is not None
        line = self.process.stderr.readline().decode()
        if "listening on" not in line:
            raise SystemExit(f"the demo agent did not start: {line!r}")
        self.base = line.rsplit(" ", 1)[1].strip()
        self.url = self.base + "/run"

    def stats(self) -> dict[str, int]:
        with urllib.request.urlopen(self.base + "/stats", timeout=30) as response:
            stats = json.load(response)
        return {"requests": int(stats["requests"]), "throttled": int(stats.get("throttled", 0))}

    def busy_s(self) -> float:
        """Seconds from its first /run to its last answer (the client's start-up left out)."""
        with urllib.request.urlopen(self.base + "/stats", timeout=30) as response:
            return float(json.load(response)["busy_s"])

    def requests(self) -> int:
        return self.stats()["requests"]

    def arrivals(self) -> list[float]:
        """When each /run arrived, in seconds after the first (an agent started with --record-arrivals)."""
        with urllib.request.urlopen(self.base + "/stats", timeout=30) as response:
            return [float(at) for at in json.load(response)["arrivals"]]

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)


@dataclass
class FleetProcess:
    """tests/servers/fleet.py in its own process: an agent's replicas with prefix caches."""

    def __init__(self, extra: Sequence[str] = ()) -> None:
        command = [*pinned(1), sys.executable, "-m", "tests.servers.fleet", *extra]
        self.process = subprocess.Popen(command, stderr=subprocess.PIPE, cwd=HERE.parent.parent)
        assert self.process.stderr is not None
        line = self.process.stderr.readline().decode()
        if "listening on" not in line:
            raise SystemExit(f"the fleet did not start: {line!r}")
        self.urls = line.rsplit(" ", 1)[1].strip().split(",")

    def stats(self) -> list[dict[str, object]]:
        found = []
        for url in self.urls:
            try:
                with urllib.request.urlopen(url.removesuffix("/run") + "/stats", timeout=30) as response:
                    found.append(json.load(response))
            except OSError:
                found.append({"requests": 0, "hits": 0, "down": True})
        return found

    def stop(self) -> None:
        self.process.kill()
        self.process.wait(timeout=30)


SCRAPE_SECONDS = 0.5  # how often the prometheus scenario's scraper asks, as a busy Prometheus might


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Scraper:
    """GET /metrics on 127.0.0.1:`port` every SCRAPE_SECONDS, in a thread, while the block runs;
    `scrapes` counts the answers (none come before the run has bound the port, or after it ends)."""

    def __init__(self, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}/metrics"
        self.scrapes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(SCRAPE_SECONDS):
            try:
                with urllib.request.urlopen(self.url, timeout=5) as response:
                    response.read()
                self.scrapes += 1
            except OSError:
                continue

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


@dataclass
class Measure:
    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    rows: int


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def high_water_rss_kb(pid: int) -> int:
    """The process's own peak RSS (VmHWM), 0 when /proc cannot tell."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def count_lines(path: Path) -> int:
    lines = 0
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            lines += chunk.count(b"\n")
    return lines


def run_client(
    argv: Sequence[str], *, stdin_path: Path | None = None, output: Path | None = None, may_fail_rows: bool = False
) -> Measure:
    """Run one client to its end: wall time, its CPU from wait4(), and its peak RSS.

    Peak RSS is the child's VmHWM, sampled until it exits. wait4()'s ru_maxrss is not used:
    Linux counts in it the parent's memory at fork time, so after this script had read a
    large output file every later client seemed to peak at 400 MB.
    """
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        start = time.monotonic()
        process = subprocess.Popen([*pinned(0), *argv], stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert process.stderr is not None
        stderr_chunks: list[bytes] = []
        reader = threading.Thread(target=lambda: stderr_chunks.append(process.stderr.read()))  # type: ignore[union-attr]
        reader.start()
        deadline = time.monotonic() + RUN_TIMEOUT
        peak_kb = 0
        while True:
            peak_kb = max(peak_kb, high_water_rss_kb(process.pid))
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                process.kill()
                raise SystemExit(f"{argv[0]} ran over {RUN_TIMEOUT} s")
            time.sleep(0.01)
        wall = time.monotonic() - start
        process.returncode = os.waitstatus_to_exitcode(status)
        reader.join()
        process.stderr.close()
    finally:
        if stdin_path:
            stdin.close()  # type: ignore[union-attr]
    stderr = b"".join(stderr_chunks)
    if process.returncode != 0 and not (may_fail_rows and process.returncode == 1):
        raise SystemExit(f"{' '.join(argv)} failed ({process.returncode}): {stderr.decode()[-500:]}")
    rows = count_lines(output) if output else 0
    return Measure(wall, usage.ru_utime + usage.ru_stime, (peak_kb or usage.ru_maxrss) / 1024, rows)


def make_group_rows(path: Path, n: int, repeats: int, *, tail: float = 0.0, seed: int = 7) -> list[bool]:
    """n rows whose `repeats` rollouts the demo agent answers with a reward of 0 or 1 drawn here,
    and, with `tail`, that share of rollouts 25 times slower than the rest (0.2 s); returns, by
    task, whether its group is kept by --drop-uniform (its rewards differ)."""
    import random

    rng = random.Random(seed)
    kept = []
    with open(path, "w") as file:
        for i in range(n):
            rewards = [rng.randrange(2) for _ in range(repeats)]
            demo: dict[str, object] = {"rewards": rewards}
            if tail:
                demo["latencies"] = [5.0 if rng.random() < tail else 0.2 for _ in range(repeats)]
            row = {"responses_create_params": {"input": f"task {i:08d}"}, "id": i, "demo": demo}
            file.write(json.dumps(row) + "\n")
            kept.append(len(set(rewards)) > 1)
    return kept


def make_rescoring_files(workdir: Path, n: int) -> tuple[Path, Path]:
    """NeMo Gym's materialized inputs for n rollouts (4 a task, of agent `bench`), and their rollouts
    in another order (a stride through them), as --reverify reads them: ~140 and ~280 bytes a line."""
    materialized, rollouts = workdir / f"materialized-{n}.jsonl", workdir / f"rollouts-{n}.jsonl"
    if materialized.exists():
        return materialized, rollouts
    stride = next(step for step in range(7919, n + 7919) if math.gcd(step, n) == 1)
    with open(materialized, "w") as inputs, open(rollouts, "w") as results:
        for i in range(n):
            task, rollout = divmod(i, 4)
            row = {"responses_create_params": {"input": f"task {task:08d}"}, "agent_ref": {"name": "bench"}}
            inputs.write(json.dumps({**row, "_ng_task_index": task, "_ng_rollout_index": rollout}) + "\n")
        for i in range(n):
            task, rollout = divmod(i * stride % n, 4)
            content = [{"type": "output_text", "text": f"answer {task}"}]
            response = {"output": [{"type": "message", "content": content}], "usage": {"total_tokens": 5}}
            line = {"response": response, "reward": 0.0, "_ng_task_index": task, "_ng_rollout_index": rollout}
            results.write(json.dumps({**line, "agent_ref": {"name": "bench"}}) + "\n")
    return materialized, rollouts


def make_rows(path: Path, n: int) -> Path:
    if not path.exists():
        with open(path, "w") as file:
            for i in range(n):
                # ~100 bytes a row
                file.write(f'{{"responses_create_params": {{"input": "task {i:08d} {"x" * (i % 7)}"}}, "id": {i}}}\n')
    return path


@dataclass
class Row:
    scenario: str
    metric: str
    rollfilter: float | None
    reference: float | None
    target: str
    passed: bool | None
    runs: dict[str, list[float]] = field(default_factory=dict)
    baseline: float | None = None  # the --baseline build's figure, beside this build's

    def record(self) -> dict[str, object]:
        """The row as JSON, without `baseline` when there is none."""
        return {key: value for key, value in self.__dict__.items() if key != "baseline" or value is not None}


def labelled(scenario: str, variant: str) -> str:
    """A scenario's row name: the plain run keeps the bare name, other variants are named."""
    return scenario if variant == "rollfilter" else f"{scenario} ({variant})"


def median(values: list[float]) -> float:
    return statistics.median(values)


class Bench:
    def __init__(self, workdir: Path, runs: int, quick: bool, baseline: Sequence[str] | None = None) -> None:
        self.workdir = workdir
        self.runs = runs
        self.quick = quick
        self.baseline = list(baseline) if baseline else None  # another build's command, or None
        self.rows: list[Row] = []

    def out(self, name: str) -> Path:
        path = self.workdir / name
        path.unlink(missing_ok=True)
        return path

    def rf(
        self,
        agent: Agent,
        concurrency: int,
        data: Path | None,
        extra: Sequence[str] = (),
        stdin: Path | None = None,
        may_fail_rows: bool = False,
        command: Sequence[str] | None = None,
    ) -> Measure:
        """Run rollfilter (this build, or `command`) to its end against `agent`."""
        output = self.out("rf.jsonl")
        argv = [*(command or rollfilter_cmd()), "-q", "-u", agent.url, "-j", str(concurrency), "-o", str(output)]
        argv.extend(extra)
        if data:
            argv.append(str(data))
        return run_client(argv, stdin_path=stdin, output=output, may_fail_rows=may_fail_rows)

    def ref(self, agent: Agent, concurrency: int, data: Path | None, stdin: Path | None = None) -> Measure:
        output = self.out("ref.jsonl")
        argv = [sys.executable, str(REFERENCE), agent.url, str(data) if data else "-", str(output), str(concurrency)]
        return run_client(argv, stdin_path=stdin, output=output)

    def alternate(self, clients: dict[str, Callable[[], Measure]], runs: int) -> dict[str, list[Measure]]:
        results: dict[str, list[Measure]] = {name: [] for name in clients}
        for _ in range(runs):
            for name, client in clients.items():
                measure = client()
                results[name].append(measure)
                print(
                    f"    {name}: {measure.rows} rows, {measure.wall_s:.2f} s, cpu {measure.cpu_s:.2f} s, "
                    f"rss {measure.peak_rss_mb:.0f} MB",
                    file=sys.stderr,
                )
        return results

    def _with_baseline(
        self, clients: dict[str, Callable[[], Measure]], baseline: Callable[[Sequence[str]], Measure]
    ) -> dict[str, Callable[[], Measure]]:
        """`clients`, and the --baseline build run by `baseline` after the plain rollfilter when it is given."""
        if not self.baseline:
            return clients
        command = self.baseline
        named = list(clients.items())
        named.insert(list(clients).index("rollfilter") + 1, (BASELINE, lambda: baseline(command)))
        return dict(named)

    @staticmethod
    def _beside(row: Row, runs: list[float]) -> Row:
        """`row` with the --baseline build's runs and their median beside this build's."""
        row.runs[BASELINE] = runs
        row.baseline = median(runs)
        return row

    def overhead(self) -> None:
        n = 5_000 if self.quick else 20_000
        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)
        agent = Agent(latency=0.0)
        try:
            print(f"overhead: instant agent, {n} rows, -j 64", file=sys.stderr)
            clients: dict[str, Callable[[], Measure]] = {
                "rollfilter": lambda: self.rf(agent, 64, data),
                "rollfilter --ordered": lambda: self.rf(agent, 64, data, ["--ordered"]),
                "reference": lambda: self.ref(agent, 64, data),
            }
            clients = self._with_baseline(clients, lambda command: self.rf(agent, 64, data, command=command))
            results = self.alternate(clients, self.runs)
        finally:
            agent.stop()
        ref_rate = median([n / m.wall_s for m in results["reference"]])
        ref_cpu = median([m.cpu_s for m in results["reference"]])
        for name in ("rollfilter", "rollfilter --ordered"):
            rates = {label: [n / m.wall_s for m in results[label]] for label in (name, "reference")}
            cpus = {label: [m.cpu_s for m in results[label]] for label in (name, "reference")}
            rate, cpu = median(rates[name]), median(cpus[name])
            scenario = f"overhead ({name})"
            rate_row = Row(scenario, "rows/s", rate, ref_rate, ">= 1.0x reference", rate >= ref_rate, rates)
            cpu_row = Row(scenario, "CPU s (user+sys)", cpu, ref_cpu, "<= 1.0x reference", cpu <= ref_cpu, cpus)
            if not (self.baseline and name == "rollfilter"):
                self.rows.extend((rate_row, cpu_row))
                continue
            per_row = {label: [m.cpu_s * 1e6 / n for m in results[label]] for label in (name, "reference")}
            us, ref_us = median(per_row[name]), median(per_row["reference"])
            us_row = Row(scenario, "CPU us a row", us, ref_us, "<= 1.0x reference", us <= ref_us, per_row)
            baseline = results[BASELINE]
            self.rows.append(self._beside(rate_row, [n / m.wall_s for m in baseline]))
            self.rows.append(self._beside(cpu_row, [m.cpu_s for m in baseline]))
            self.rows.append(self._beside(us_row, [m.cpu_s * 1e6 / n for m in baseline]))

    def prometheus(self) -> None:
        """CPU a row with and without --prometheus, scraped every SCRAPE_SECONDS meanwhile (rows
        enough for a run of seconds: importing prometheus_client is a start-up cost, not a row's)."""
        n = 20_000 if self.quick else 100_000
        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)
        agent = Agent(latency=0.0)
        scrapes: list[int] = []

        def exported() -> Measure:
            port = free_port()
            with Scraper(port) as scraper:
                measure = self.rf(agent, 64, data, ["--prometheus", f"127.0.0.1:{port}"])
            scrapes.append(scraper.scrapes)
            return measure

        try:
            print(f"prometheus: instant agent, {n} rows, -j 64, scraped every {SCRAPE_SECONDS} s", file=sys.stderr)
            clients = {"rollfilter": lambda: self.rf(agent, 64, data), "rollfilter --prometheus": exported}
            results = self.alternate(clients, self.runs)
        finally:
            agent.stop()
        per_row = {label: [m.cpu_s * 1e6 / n for m in runs] for label, runs in results.items()}
        rates = {label: [n / m.wall_s for m in runs] for label, runs in results.items()}
        off, on = median(per_row["rollfilter"]), median(per_row["rollfilter --prometheus"])
        scenario = f"prometheus (scraped {median([float(s) for s in scrapes]):.0f} times a run)"
        self.rows.append(Row(scenario, "CPU us a row", on, off, "<= 1.05x without", on <= off * 1.05, per_row))
        rate_on, rate_off = median(rates["rollfilter --prometheus"]), median(rates["rollfilter"])
        self.rows.append(
            Row(scenario, "rows/s", rate_on, rate_off, ">= 0.95x without", rate_on >= rate_off * 0.95, rates)
        )

    def trackers(self) -> None:
        """CPU a row with and without --mlflow, logging to an `mlflow server` started here (the
        `test-trackers` extra): the CPU of a long run less that of a short one, over the rows
        between, so that what a run costs once (the client's import, the tracker run's start and
        end) is no row's."""
        mlflow = shutil.which("mlflow", path=os.path.dirname(sys.executable))
        if mlflow is None:
            print("trackers: no mlflow server here (pip install -e '.[test-trackers]'): left out", file=sys.stderr)
            return
        n, short = (20_000 if self.quick else 100_000), 1_000
        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)
        few = make_rows(self.workdir / f"rows-{short}.jsonl", short)
        store, port = self.workdir / "mlflow", free_port()
        server = subprocess.Popen(
            [
                *(mlflow, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
                *("--backend-store-uri", f"sqlite:///{store}.db", "--artifacts-destination", str(store)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        agent = Agent(latency=0.0)
        tracked = ["--mlflow", f"http://127.0.0.1:{port}", "--experiment", "bench"]
        try:
            deadline = time.monotonic() + 300
            while not _answers(f"http://127.0.0.1:{port}/health"):
                assert server.poll() is None, "mlflow server ended"
                if time.monotonic() > deadline:  # a bound on the wait
                    raise RuntimeError("mlflow server did not start")
                time.sleep(0.5)
            print(f"trackers: instant agent, {n} rows less {short}, -j 64", file=sys.stderr)
            clients = {
                "rollfilter": lambda: self.rf(agent, 64, data),
                "rollfilter (short)": lambda: self.rf(agent, 64, few),
                "rollfilter --mlflow": lambda: self.rf(agent, 64, data, tracked),
                "rollfilter --mlflow (short)": lambda: self.rf(agent, 64, few, tracked),
            }
            results = self.alternate(clients, self.runs)
        finally:
            agent.stop()
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(timeout=60)
            with contextlib.suppress(ProcessLookupError):  # its job runner's consumers outlive a SIGTERM
                os.killpg(server.pid, signal.SIGKILL)
        per_row = {
            label: [
                (whole.cpu_s - part.cpu_s) * 1e6 / (n - short)
                for whole, part in zip(runs, results[f"{label} (short)"], strict=True)
            ]
            for label, runs in results.items()
            if not label.endswith("(short)")
        }
        off, on = median(per_row["rollfilter"]), median(per_row["rollfilter --mlflow"])
        scenario = "trackers (--mlflow, a long run less a short one)"
        self.rows.append(Row(scenario, "CPU us a row", on, off, "<= 1.05x without", on <= off * 1.05, per_row))

    def scale(self) -> None:
        latency, concurrency = 2.0, 2000
        n = 6_000 if self.quick else 20_000
        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)
        ideal = concurrency / latency
        agent = Agent(latency=latency)
        try:
            print(f"scale: {latency:g} s agent, {n} rows, -j {concurrency} (ideal {ideal:.0f} rows/s)", file=sys.stderr)
            clients: dict[str, Callable[[], Measure]] = {
                "rollfilter": lambda: self.rf(agent, concurrency, data),
                "rollfilter --ordered": lambda: self.rf(agent, concurrency, data, ["--ordered"]),
                "reference": lambda: self.ref(agent, concurrency, data),
            }
            clients = self._with_baseline(clients, lambda command: self.rf(agent, concurrency, data, command=command))
            results = self.alternate(clients, self.runs)
        finally:
            agent.stop()
        fractions = {name: [n / m.wall_s / ideal for m in runs] for name, runs in results.items()}
        ref = median(fractions["reference"])
        for name in ("rollfilter", "rollfilter --ordered"):
            rf = median(fractions[name])
            runs = {label: fractions[label] for label in (name, "reference")}
            scenario = labelled("scale", name)
            target = ">= 0.95 and >= reference"
            row = Row(scenario, "fraction of ideal rows/s", rf, ref, target, rf >= 0.95 and rf >= ref, runs)
            self.rows.append(
                self._beside(row, fractions[BASELINE]) if BASELINE in fractions and name == "rollfilter" else row
            )

    def adaptive(self) -> None:
        """A refusing agent: 429 with Retry-After 1 above 40 episodes at once, 0.2 s each: ideal 200 rows/s."""
        capacity, latency = 40, 0.2
        n = 1_000 if self.quick else 4_000
        ideal = capacity / latency
        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)
        agent = Agent(latency=latency, extra=["--capacity", str(capacity), "--retry-after", "1"])
        clients = {
            "rollfilter -j 40": ("40", ()),
            "rollfilter -j 400": ("400", ()),
            "rollfilter -j 400 --adaptive": ("400", ("--adaptive",)),
            # A rate limit over the agent's capacity (200 rows/s): the window still finds the capacity.
            "rollfilter -j 400 --adaptive --rpm 18000": ("400", ("--adaptive", "--rpm", "18000")),
        }
        figures: dict[str, list[tuple[float, float, int]]] = {name: [] for name in clients}
        try:
            print(
                f"adaptive: refusing above {capacity}, {latency:g} s agent, {n} rows (ideal {ideal:.0f} rows/s)",
                file=sys.stderr,
            )
            for _ in range(self.runs):
                for name, (concurrency, extra) in clients.items():
                    before = agent.stats()
                    measure = self.rf(agent, int(concurrency), data, extra, may_fail_rows=True)
                    after = agent.stats()
                    requests = after["requests"] - before["requests"]
                    throttled = (after["throttled"] - before["throttled"]) / max(requests, 1)
                    figures[name].append((measure.rows / measure.wall_s / ideal, throttled, n - measure.rows))
                    print(
                        f"    {name}: {measure.wall_s:.1f} s, {measure.rows} rows, {requests} requests,"
                        f" {throttled:.1%} throttled",
                        file=sys.stderr,
                    )
        finally:
            agent.stop()
        for name, values in figures.items():
            fraction = median([v[0] for v in values])
            throttled = median([v[1] for v in values])
            failed = median([float(v[2]) for v in values])
            passed = fraction >= 0.9 and throttled <= 0.02 and failed == 0 if "adaptive" in name else None
            scenario = f"refusing agent ({name})"
            target = ">= 0.9, <= 2% throttled, none failed" if "adaptive" in name else "-"
            runs = {"fraction": [v[0] for v in values], "throttled": [v[1] for v in values]}
            self.rows.append(Row(scenario, "fraction of ideal rows/s", fraction, None, target, passed, runs))
            self.rows.append(Row(scenario, "share of requests throttled", throttled, None, target, passed))
            self.rows.append(Row(scenario, "rows failed", failed, None, target, passed))

    def retry_budget(self) -> None:
        """Requests an agent receives a row, --retries 3: under a total outage, and under 5% failures."""
        n = 500 if self.quick else 2_000
        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)

        def outage_target(per_row: float, failed: float) -> bool:
            return per_row <= 1.2

        def rare_target(per_row: float, failed: float) -> bool:
            return failed == 0

        cases: tuple[tuple[str, float, str, tuple[str, ...], Callable[[float, float], bool] | None], ...] = (
            ("outage", 1.0, "--retry-budget 0.1 (default)", (), outage_target),
            ("outage", 1.0, "--retry-budget off", ("--retry-budget", "off"), None),
            ("5% failures", 0.05, "--retry-budget 0.1 (default)", (), rare_target),
        )
        for name, rate, label, extra, check in cases:
            agent = Agent(latency=0.0, extra=["--fail-rate", str(rate)])
            try:
                measures = []
                for _ in range(self.runs):
                    before = agent.requests()
                    measure = self.rf(agent, 64, data, ["--retries", "3", *extra], may_fail_rows=True)
                    measures.append(((agent.requests() - before) / n, float(n - measure.rows)))
            finally:
                agent.stop()
            per_row = median([m[0] for m in measures])
            failed = median([m[1] for m in measures])
            print(f"    {name}, {label}: {per_row:.3f} requests a row, {failed:.0f} rows failed", file=sys.stderr)
            passed = check(per_row, failed) if check is not None else None
            target = "<= 1.2" if name == "outage" and check else "no row failed" if check else "-"
            scenario = f"retry budget: {name}, {label}"
            self.rows.append(Row(scenario, "requests a row", per_row, None, target, passed))
            self.rows.append(Row(scenario, "rows failed", failed, None, target, passed))

    def queueing(self) -> None:
        """A model server as they are: 40 slots of 0.2 s episodes, a queue beyond them, every episode
        slower past 80 in the system. -j 320 --adaptive against a sweep of fixed -j."""
        n = 1_000 if self.quick else 3_000
        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)
        agent = Agent(latency=0.2, extra=QUEUEING)
        try:
            print(f"queueing: 40 slots, 0.2 s episodes, thrashing past 80, {n} rows", file=sys.stderr)
            rates = self._sweep(lambda: agent, n, data, (20, 40, 80, 160, 320), lambda m: n / m.wall_s)
        finally:
            agent.stop()
        self._sweep_rows("queueing server", "rows/s", rates, ">= 0.9 of the best fixed -j, none failed", 0.9)

    def moving(self) -> None:
        """The same server, its slots 40, then 20 from 6 s after the first request, then 40 from 12 s:
        each run's rows against the ideal: the slots over 0.2 s, integrated from the agent's first
        request to its last answer (a fresh agent each run, so that the schedule starts with it)."""
        n = 1_500 if self.quick else 3_000

        def ideal_rows(seconds: float) -> float:
            return 200 * min(seconds, 6) + 100 * max(0, min(seconds, 12) - 6) + 200 * max(0, seconds - 12)

        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)
        agents: list[Agent] = []

        def fresh_agent() -> Agent:  # the schedule starts at each agent's first request
            while agents:
                agents.pop().stop()
            agents.append(Agent(latency=0.2, extra=[*QUEUEING, "--schedule", "6=20,12=40"]))
            return agents[-1]

        try:
            print(f"moving: 40 -> 20 (at 6 s) -> 40 (at 12 s) slots, 0.2 s episodes, {n} rows", file=sys.stderr)
            fractions = self._sweep(
                fresh_agent, n, data, (20, 40, 80), lambda m: m.rows / ideal_rows(agents[0].busy_s())
            )
        finally:
            while agents:
                agents.pop().stop()
        self._sweep_rows("moving capacity", "fraction of ideal", fractions, ">= 0.85 of ideal, none failed", 0.85)

    def _sweep(
        self,
        agent_for_run: Callable[[], Agent],
        n: int,
        data: Path,
        sweep: Sequence[int],
        figure: Callable[[Measure], float],
    ) -> dict[str, list[tuple[float, int]]]:
        """Each fixed -j of `sweep` and -j 320 --adaptive, alternating: `figure` and rows failed."""
        clients = {f"rollfilter -j {j}": (j, ()) for j in sweep}
        clients["rollfilter -j 320 --adaptive"] = (320, ("--adaptive",))
        results: dict[str, list[tuple[float, int]]] = {name: [] for name in clients}
        for _ in range(self.runs):
            for name, (concurrency, extra) in clients.items():
                measure = self.rf(agent_for_run(), concurrency, data, extra, may_fail_rows=True)
                results[name].append((figure(measure), n - measure.rows))
                shown = f"{measure.wall_s:.1f} s, {measure.rows} rows, {figure(measure):.3f}"
                print(f"    {name}: {shown}", file=sys.stderr)
        return results

    def _sweep_rows(
        self, scenario: str, metric: str, results: dict[str, list[tuple[float, int]]], target: str, share: float
    ) -> None:
        """A row for each fixed -j, then the adaptive run's share of the best of them (or of the ideal)."""
        medians = {name: median([figure for figure, _ in runs]) for name, runs in results.items()}
        adaptive_name = next(name for name in results if "adaptive" in name)
        best = max(value for name, value in medians.items() if name != adaptive_name)
        for name, value in medians.items():
            if name != adaptive_name:
                runs = {name: [figure for figure, _ in results[name]]}
                self.rows.append(Row(f"{scenario} ({name})", metric, value, None, "-", None, runs))
        adaptive = medians[adaptive_name]
        failed = max(failed for _, failed in results[adaptive_name])
        ratio = adaptive / best if metric == "rows/s" else adaptive
        what = "share of the best fixed -j" if metric == "rows/s" else "fraction of ideal"
        passed = ratio >= share and failed == 0
        runs = {adaptive_name: [figure for figure, _ in results[adaptive_name]]}
        self.rows.append(Row(f"{scenario} ({adaptive_name})", metric, adaptive, None, target, passed, runs))
        if what != metric:
            self.rows.append(Row(f"{scenario} ({adaptive_name})", what, ratio, None, target, passed))
        self.rows.append(Row(f"{scenario} ({adaptive_name})", "rows failed", float(failed), None, target, passed))

    def healthy(self) -> None:
        """An agent with ample capacity (scale's: 2 s episodes, -j 2000): --adaptive against a fixed -j."""
        latency, concurrency = 2.0, 2000
        n = 6_000 if self.quick else 20_000
        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)
        agent = Agent(latency=latency)
        try:
            print(f"healthy: {latency:g} s agent, {n} rows, -j {concurrency}", file=sys.stderr)
            results = self.alternate(
                {
                    "rollfilter": lambda: self.rf(agent, concurrency, data),
                    "rollfilter --adaptive": lambda: self.rf(agent, concurrency, data, ["--adaptive"]),
                },
                self.runs,
            )
        finally:
            agent.stop()
        rates = {name: [n / m.wall_s for m in runs] for name, runs in results.items()}
        fixed, adaptive = median(rates["rollfilter"]), median(rates["rollfilter --adaptive"])
        ratio = adaptive / fixed
        metric = "--adaptive rows/s vs fixed -j"
        self.rows.append(Row("healthy agent", metric, ratio, None, ">= 0.97", ratio >= 0.97, rates))

    def reverify(self) -> None:
        """--reverify: peak RSS and rate re-scoring n rollouts at the demo agent's /verify, the
        materialized file indexed (its memory grows by the pair, not by the line's size)."""
        sizes = (20_000, 200_000) if self.quick else (100_000, 1_000_000)
        agent = Agent(latency=0.0, extra=["--no-aggregate-groups"])
        measures = []
        try:
            for n in sizes:
                materialized, rollouts = make_rescoring_files(self.workdir, n)
                print(f"reverify: {n} rollouts, -j 256", file=sys.stderr)
                measures.append(self.rf(agent, 256, rollouts, ["--reverify", str(materialized)]))
        finally:
            agent.stop()
        for n, m in zip(sizes, measures, strict=True):
            print(
                f"    {n} rollouts: peak RSS {m.peak_rss_mb:.1f} MB, {m.wall_s:.1f} s, cpu {m.cpu_s:.1f} s",
                file=sys.stderr,
            )
        large = measures[-1]
        self.rows.append(
            Row(f"reverify {sizes[1]:,} rollouts", "peak RSS MB", large.peak_rss_mb, None, "<= 100 MB",
                large.peak_rss_mb <= 100)
        )  # fmt: skip
        self.rows.append(Row(f"reverify {sizes[1]:,} rollouts", "rows/s", large.rows / large.wall_s, None, "-", None))

    def memory(self) -> None:
        sizes = (20_000, 200_000) if self.quick else (100_000, 1_000_000)
        # Its /aggregate_metrics only counts what it reads: the figure is rollfilter's spooling and streaming.
        agent = Agent(latency=0.0, extra=["--no-aggregate-groups"])
        try:
            small = make_rows(self.workdir / f"rows-{sizes[0]}.jsonl", sizes[0])
            large = make_rows(self.workdir / f"rows-{sizes[1]}.jsonl", sizes[1])
            print(f"memory: {sizes[0]} and {sizes[1]} rows from stdin, -j 256", file=sys.stderr)
            rf_small = self.rf(agent, 256, None, stdin=small)
            rf_large = self.rf(agent, 256, None, stdin=large)
            baseline_large = self.rf(agent, 256, None, stdin=large, command=self.baseline) if self.baseline else None
            rf_ordered = self.rf(agent, 256, None, ["--ordered"], stdin=large)
            aggregate = ["-a", "bench", "--aggregate", str(self.out("aggregate.json"))]
            rf_aggregate = self.rf(agent, 256, None, aggregate, stdin=large)
            # NeMo Gym's four files: the materialized file is written by a first planning pass over
            # the whole input (read to its end first, from stdin), before anything is sent.
            rf_gym = self.rf(agent, 256, None, ["-a", "bench", "--gym-layout"], stdin=large)
            ref_small = self.ref(agent, 256, None, stdin=small)
        finally:
            agent.stop()
        for label, m in (
            ("rollfilter", rf_small),
            ("rollfilter", rf_large),
            *([(BASELINE, baseline_large)] if baseline_large else []),
            ("rollfilter --ordered", rf_ordered),
            ("rollfilter --aggregate", rf_aggregate),
            ("rollfilter --gym-layout", rf_gym),
            ("reference", ref_small),
        ):
            print(f"    {label}: {m.rows} rows, peak RSS {m.peak_rss_mb:.1f} MB, {m.wall_s:.1f} s", file=sys.stderr)
        large_row = Row(
            f"memory {sizes[1]:,} rows",
            "peak RSS MB",
            rf_large.peak_rss_mb,
            None,
            "<= 100 MB",
            rf_large.peak_rss_mb <= 100,
        )
        if baseline_large:
            large_row.runs["rollfilter"] = [rf_large.peak_rss_mb]
            self._beside(large_row, [baseline_large.peak_rss_mb])
        self.rows.append(large_row)
        self.rows.append(
            Row(
                f"memory {sizes[1]:,} rows --ordered",
                "peak RSS MB",
                rf_ordered.peak_rss_mb,
                None,
                "<= 100 MB",
                rf_ordered.peak_rss_mb <= 100,
            )
        )
        self.rows.append(
            Row(
                f"memory {sizes[1]:,} rows --aggregate",
                "peak RSS MB",
                rf_aggregate.peak_rss_mb,
                None,
                "<= 100 MB",
                rf_aggregate.peak_rss_mb <= 100,
            )
        )
        self.rows.append(
            Row(
                f"memory {sizes[1]:,} rows --gym-layout",
                "peak RSS MB",
                rf_gym.peak_rss_mb,
                None,
                "<= 100 MB",
                rf_gym.peak_rss_mb <= 100,
            )
        )
        # What the first planning pass costs: --gym-layout against --aggregate, which differ by it
        # (and by writing the materialized and progress files).
        first_pass = (rf_gym.cpu_s - rf_aggregate.cpu_s) * 1e6 / sizes[1]
        self.rows.append(
            Row("first planning pass (--gym-layout)", "CPU us a row", first_pass, None, "(reported)", None)
        )
        # NeMo Gym's numbering (identical lines share a task index) remembers each distinct line:
        # memory grows by a few bytes a row, by design; this row says how many.
        per_row = (rf_large.peak_rss_mb - rf_small.peak_rss_mb) * 2**20 / (sizes[1] - sizes[0])
        self.rows.append(
            Row(f"memory {sizes[0]:,} -> {sizes[1]:,} rows", "bytes a row", per_row, None, "<= 40", per_row <= 40)
        )
        self.rows.append(
            Row(
                f"memory {sizes[0]:,} rows",
                "peak RSS MB",
                rf_small.peak_rss_mb,
                ref_small.peak_rss_mb,
                "(reference holds all rows)",
                None,
            )
        )

    def first_result(self) -> None:
        agent = Agent(latency=0.0)
        try:
            delays = {
                name: [self._first_result_delay(agent, extra) for _ in range(self.runs)] for name, extra in VARIANTS
            }
        finally:
            agent.stop()
        for name, _ in VARIANTS:
            value = median(delays[name])
            scenario = labelled("first result", name)
            target = "<= agent latency (0) + 0.2 s"
            self.rows.append(
                Row(scenario, "s after first row written", value, None, target, value <= 0.2, {name: delays[name]})
            )

    def _first_result_delay(self, agent: Agent, extra: Sequence[str]) -> float:
        process = subprocess.Popen(
            [*pinned(0), *rollfilter_cmd(), "-q", "-u", agent.url, *extra],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert process.stdin is not None
        assert process.stdout is not None
        time.sleep(1.0)  # let it start: start-up is not what this measures
        start = time.monotonic()
        process.stdin.write(b'{"responses_create_params": {"input": "first"}}\n')
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], 3.0)
        delay = time.monotonic() - start if ready else float("inf")
        if ready:
            process.stdout.readline()
        time.sleep(max(0.0, 3.0 - (time.monotonic() - start)))
        process.stdin.write(b'{"responses_create_params": {"input": "rest"}}\n' * 100)
        process.stdin.close()
        process.stdout.read()
        process.stdout.close()
        process.wait(timeout=60)
        print(f"    {' '.join(['rollfilter', *extra])}: first result after {delay:.3f} s", file=sys.stderr)
        return delay

    def early_exit(self) -> None:
        n = 200_000 if self.quick else 1_000_000
        concurrency = 64
        data = make_rows(self.workdir / f"rows-{n}.jsonl", n)
        agent = Agent(latency=0.0)
        try:
            measured = {
                name: [self._early_exit(agent, concurrency, data, extra) for _ in range(self.runs)]
                for name, extra in VARIANTS
            }
        finally:
            agent.stop()
        bound = 10 + 2 * concurrency
        for name, _ in VARIANTS:
            exits = [exit_s for exit_s, _ in measured[name]]
            extra = [requests for _, requests in measured[name]]
            scenario = labelled("early exit (head -n 10)", name)
            self.rows.append(
                Row(
                    scenario,
                    "s from 10th result to exit",
                    median(exits),
                    None,
                    "<= 2 s",
                    median(exits) <= 2,
                    {name: exits},
                )
            )
            self.rows.append(
                Row(
                    scenario,
                    "requests the agent received",
                    max(extra),
                    None,
                    f"<= 10 + 2 x {concurrency}",
                    max(extra) <= bound,
                    {name: [float(requests) for requests in extra]},
                )
            )

    def _early_exit(self, agent: Agent, concurrency: int, data: Path, extra: Sequence[str]) -> tuple[float, int]:
        """Read 10 results and close the pipe, as `head -n 10` does: seconds to exit, requests sent."""
        before = agent.requests()
        argv = [*pinned(0), *rollfilter_cmd(), "-q", "-u", agent.url, "-j", str(concurrency), *extra, str(data)]
        process = subprocess.Popen(argv, stdout=subprocess.PIPE)
        assert process.stdout is not None
        for _ in range(10):
            process.stdout.readline()
        tenth = time.monotonic()
        process.stdout.close()
        process.wait(timeout=60)
        exit_s = time.monotonic() - tenth
        time.sleep(0.2)
        requests = agent.requests() - before
        print(
            f"    {' '.join(['rollfilter', *extra])}: exit {exit_s:.3f} s after the 10th result, {requests} requests,"
            f" status {process.returncode}",
            file=sys.stderr,
        )
        return exit_s, requests

    def groups(self) -> None:
        """The memory --groups costs: a task's rollouts held until the group ends."""
        tasks, repeats, concurrency = (1_000 if self.quick else 5_000), 8, 256
        data = self.workdir / f"group-rows-{tasks}.jsonl"
        make_group_rows(data, tasks, repeats)
        # Episodes of 0 to 0.2 s at random: a task's rollouts end out of order, its group open meanwhile.
        agent = Agent(latency=0.0, extra=["--jitter", "0.2", "--no-aggregate-groups"])
        plain = ["-r", str(repeats)]
        try:
            print(f"groups: {tasks} tasks x {repeats}, -j {concurrency}, episodes of 0-0.2 s", file=sys.stderr)
            results = self.alternate(
                {
                    "rollfilter -r 8": lambda: self.rf(agent, concurrency, data, plain),
                    "rollfilter -r 8 --groups": lambda: self.rf(agent, concurrency, data, [*plain, "--groups"]),
                    "rollfilter -r 8 --drop-uniform": lambda: self.rf(
                        agent, concurrency, data, [*plain, "--drop-uniform"]
                    ),
                },
                self.runs,
            )
        finally:
            agent.stop()
        rss = {name: [m.peak_rss_mb for m in runs] for name, runs in results.items()}
        cpu = {name: [m.cpu_s for m in runs] for name, runs in results.items()}
        base = median(rss["rollfilter -r 8"])
        for name in ("rollfilter -r 8 --groups", "rollfilter -r 8 --drop-uniform"):
            peak = median(rss[name])
            runs = {label: rss[label] for label in ("rollfilter -r 8", name)}
            self.rows.append(
                Row(f"groups ({name})", "peak RSS MB", peak, base, "<= 1.3x -r 8", peak <= 1.3 * base, runs)
            )
            cpus = {label: cpu[label] for label in ("rollfilter -r 8", name)}
            self.rows.append(
                Row(
                    f"groups ({name})",
                    "CPU s (user+sys)",
                    median(cpu[name]),
                    median(cpu["rollfilter -r 8"]),
                    "-",
                    None,
                    cpus,
                )
            )

    def stragglers(self) -> None:
        """--target-groups against a heavy tail: 3% of episodes take 5 s, the rest 0.2 s. The target of
        N groups over-provisioned (-j 1024 > N x K) against a plain run of the first tasks that hold N
        kept groups: the time to N kept groups."""
        tasks, repeats, target = 2_000, 8, 64
        data = self.workdir / "straggler-rows.jsonl"
        kept = make_group_rows(data, tasks, repeats, tail=0.03)
        first = next(i + 1 for i in range(tasks) if sum(kept[: i + 1]) == target)
        head = self.workdir / "straggler-rows-head.jsonl"
        with open(data) as source, open(head, "w") as out:
            for _ in range(first):
                out.write(source.readline())
        agent = Agent(latency=0.0, extra=["--no-aggregate-groups"])
        options = ["-r", str(repeats), "--drop-uniform"]
        try:
            print(f"stragglers: {target} kept groups of {repeats}, 3% of episodes 25x longer", file=sys.stderr)
            results = self.alternate(
                {
                    f"--target-groups {target} -j 1024": lambda: self.rf(
                        agent, 1024, data, [*options, "--target-groups", str(target)]
                    ),
                    f"the first {first} tasks -j 1024": lambda: self.rf(agent, 1024, head, options),
                },
                self.runs,
            )
        finally:
            agent.stop()
        walls = {name: [m.wall_s for m in runs] for name, runs in results.items()}
        cut, plain = (median(walls[name]) for name in walls)
        names = list(walls)
        metric = f"s to {target} kept groups"
        self.rows.append(Row(f"stragglers ({names[0]})", metric, cut, plain, "< 1.0x plain", cut < plain, walls))

    def fleet(self) -> None:
        """--route task against least-outstanding on a stand-in fleet: 4 replicas of 8 slots, an LRU
        prefix cache, 0.05 s a hit and 0.2 s a miss; 200 tasks x -r 8, -j 64. Then one replica at 0.4
        of the speed, and one that dies 1 s in."""
        tasks, repeats, concurrency = 200, 8, 64
        data = self.workdir / "fleet-rows.jsonl"
        with open(data, "w") as file:
            for task in range(tasks):
                file.write(json.dumps({"responses_create_params": {"input": f"the prompt of task {task:05d}"}}) + "\n")
        found: dict[str, list[tuple[Measure, list[dict[str, object]], int]]] = {}

        def one(route: str, fleet_options: Sequence[str]) -> Measure:
            fleet = FleetProcess(fleet_options)
            try:
                output = self.out("rf.jsonl")
                argv = [*rollfilter_cmd(), "-q", "-e", f"a={','.join(fleet.urls)}", "-a", "a", "-r", str(repeats)]
                argv += ["-j", str(concurrency), "--route", route, "-o", str(output), str(data)]
                measure = run_client(argv, output=output)
                pairs = {(r["_ng_task_index"], r["_ng_rollout_index"]) for r in map(json.loads, output.open())}
                found.setdefault(f"{route} {' '.join(fleet_options)}".strip(), []).append(
                    (measure, fleet.stats(), len(pairs))
                )
                return measure
            finally:
                fleet.stop()

        setups = {
            "even": (),
            "one replica at 0.4": ("--speed", "0=0.4"),
            "one replica dies 1 s in": ("--death", "3=1.0"),
        }
        print(f"fleet: {tasks} tasks x {repeats}, -j {concurrency}, 4 replicas", file=sys.stderr)
        clients = {
            f"{route} ({setup})": (lambda route=route, options=options: one(route, options))
            for setup, options in setups.items()
            for route in ("task", "least-outstanding")
            if setup == "even" or route == "task"
        }
        self.alternate(clients, self.runs)
        rollouts = tasks * repeats

        def figures(name: str) -> tuple[float, float, float, list[float]]:
            route, setup = name.split(" (", 1)
            key = f"{route} {' '.join(setups[setup.rstrip(')')])}".strip()
            runs = found[key]
            hits = [sum(int(s.get("hits", 0)) for s in stats) / rollouts for _, stats, _ in runs]
            skew = [
                max(int(s["requests"]) for s in st) / (sum(int(s["requests"]) for s in st) / 4) for _, st, _ in runs
            ]
            walls = [m.wall_s for m, _, _ in runs]
            return median(hits), median(walls), median(skew), walls

        even_hits, even_wall, even_skew, even_walls = figures("task (even)")
        least_hits, least_wall, _, least_walls = figures("least-outstanding (even)")
        name = "fleet, even (--route task)"
        self.rows.append(Row(name, "prefix-cache hit rate", even_hits, least_hits, ">= 0.85", even_hits >= 0.85))
        speedup = least_wall / even_wall
        walls = {"task": even_walls, "least-outstanding": least_walls}
        self.rows.append(Row(name, "rows/s vs least-outstanding", speedup, None, ">= 1.5x", speedup >= 1.5, walls))
        self.rows.append(Row(name, "busiest replica / mean requests", even_skew, None, "<= 1.25", even_skew <= 1.25))
        slow_hits, slow_wall, _, _ = figures("task (one replica at 0.4)")
        ratio = slow_wall / even_wall
        name = "fleet, one replica at 0.4 (--route task)"
        self.rows.append(Row(name, "wall vs even fleet", ratio, None, "<= 1.35x", ratio <= 1.35))
        self.rows.append(Row(name, "prefix-cache hit rate", slow_hits, None, ">= 0.7", slow_hits >= 0.7))
        died = found["task --death 3=1.0"]
        complete = all(pairs == rollouts for _, _, pairs in died)
        name = "fleet, one replica dies 1 s in (--route task)"
        self.rows.append(Row(name, "runs with every pair once, exit 0", float(complete), None, "1", complete))

    def startup(self) -> None:
        """The CPU of a process per shard: --version, --help and a 5-row --demo run, each beside
        `python -c pass` (the same venv) and the --baseline build, alternating; then signals sent
        across the start-up window (SIGINT: exit 130 and no traceback naming rollfilter; SIGUSR1:
        never fatal)."""
        runs = 5 if self.quick else 15
        python = [sys.executable]
        builds = {"rollfilter": rollfilter_cmd(), **({BASELINE: self.baseline} if self.baseline else {})}
        cases = {
            "--version": ["--version"],
            "--help": ["--help"],
            "--demo, 5 rows": ["--demo", "-q", str(EXAMPLE_ROWS)],
        }
        bare: list[float] = []
        cpu: dict[tuple[str, str], list[float]] = {(case, name): [] for case in cases for name in builds}
        for _ in range(runs):
            bare.append(process_cpu_ms([*python, "-c", "pass"]))
            for case, args in cases.items():
                for name, command in builds.items():
                    cpu[case, name].append(process_cpu_ms([*command, *args]))
        bare_ms = median(bare)
        print(f"startup: python -c pass {bare_ms:.1f} ms CPU", file=sys.stderr)
        bound = {"--version": ("<= 4x python -c pass", None), "--help": ("<= 0.5x baseline", 0.5)}
        bound["--demo, 5 rows"] = ("<= 0.7x baseline", 0.7)
        for case in cases:
            mine = median(cpu[case, "rollfilter"])
            before = median(cpu[case, BASELINE]) if self.baseline else None
            target, ratio = bound[case]
            if ratio is None:
                passed: bool | None = mine <= 4 * bare_ms
            else:
                passed = mine <= ratio * before if before is not None else None
            row = Row(
                f"startup {case}",
                "CPU ms, median",
                mine,
                bare_ms,
                target,
                passed,
                {"rollfilter": cpu[case, "rollfilter"]},
            )
            self.rows.append(self._beside(row, cpu[case, BASELINE]) if self.baseline else row)
        self._signal_window(statistics.median(process_wall_s([*python, "-c", "pass"]) for _ in range(5)))

    def _signal_window(self, bare_s: float) -> None:
        """SIGINT and SIGUSR1 at evenly spread moments from bare Python's start-up (`bare_s`, wall)
        to the end of a 5-row demo run's start-up: from twice `bare_s` on, SIGINT must exit 130 with
        no traceback naming rollfilter, and SIGUSR1 must never be fatal; before that, what Python
        does before any of rollfilter runs is counted apart."""
        samples = 30 if self.quick else 90
        command = [*rollfilter_cmd(), "--demo", "-q", str(EXAMPLE_ROWS)]
        span_s = 0.4
        counts = {(early, what): 0 for early in (True, False) for what in ("traceback", "not 130", "USR1 fatal")}
        for i in range(samples):
            delay = bare_s + span_s * i / samples
            early = delay < 2 * bare_s
            code, stderr = signalled_at(command, "SIGINT", delay)
            counts[early, "traceback"] += b"Traceback" in stderr and b"/rollfilter/" in stderr  # a frame of the package
            counts[early, "not 130"] += code not in (130, 0)  # 0: the run was over before the signal came
            code, _ = signalled_at(command, "SIGUSR1", delay)
            counts[early, "USR1 fatal"] += code != 0
        late = f"{2 * bare_s * 1000:.0f}-{(bare_s + span_s) * 1000:.0f} ms after start"
        early = f"{bare_s * 1000:.0f}-{2 * bare_s * 1000:.0f} ms (before twice bare Python's start-up)"
        for window, is_early in ((late, False), (early, True)):
            for what, metric in (
                ("traceback", "SIGINT: tracebacks naming rollfilter"),
                ("not 130", "SIGINT: exits other than 130"),
                ("USR1 fatal", "SIGUSR1: runs not exiting 0"),
            ):
                found = counts[is_early, what]
                target, passed = ("-", None) if is_early else ("0", found == 0)
                self.rows.append(Row(f"startup signals, {window}", metric, float(found), None, target, passed))

    def rate_limits(self) -> None:
        """--rpm and --tpm against an instant agent that logs arrivals; per agent, one limited beside one not."""

        def most_in(times: list[float], seconds: float) -> int:
            most, end = 0, 0
            for start, at in enumerate(times):
                while end < len(times) and times[end] < at + seconds:
                    end += 1
                most = max(most, end - start)
            return most

        rows = self.workdir / "limit-rows.jsonl"
        with open(rows, "w") as file:
            for i in range(500):
                file.write(json.dumps({"responses_create_params": {"input": f"row {i}"}}) + "\n")
        # The demo agent reports len(input) // 4 + 5 tokens: 3,980 characters make 1,000.
        thousand = self.workdir / "limit-rows-1000-tokens.jsonl"
        with open(thousand, "w") as file:
            for i in range(300):
                file.write(json.dumps({"responses_create_params": {"input": f"{i:06d}" + "x" * 3974}}) + "\n")
        print("rate limits: --rpm 3000 over 500 rows, --tpm 600000 over 300 rows of 1,000 tokens", file=sys.stderr)

        def arrivals(data: Path, limit: list[str]) -> list[float]:
            """When each /run of a run of `data` under `limit` arrived at an instant agent."""
            agent = Agent(latency=0.0, extra=["--record-arrivals", "--no-aggregate-groups"])
            try:
                self.rf(agent, 64, data, limit)
                return agent.arrivals()
            finally:
                agent.stop()

        times = arrivals(rows, ["--rpm", "3000"])
        rate = (len(times) - 1) / (times[-1] - times[0])
        one, five = most_in(times, 1.0), most_in(times, 5.0)
        name = "rate limits (--rpm 3000, 500 rows)"
        self.rows.append(Row(name, "rows/s, first to last arrival", rate, 50.0, "50 within 5%", abs(rate - 50) <= 2.5))
        self.rows.append(Row(name, "most arrivals in 1 s", float(one), None, "<= 60", one <= 60))
        self.rows.append(Row(name, "most arrivals in 5 s", float(five), None, "<= 262", five <= 262))
        times = arrivals(thousand, ["--tpm", "600000"])
        rate = (len(times) - 1) / (times[-1] - times[0])
        five = most_in(times, 5.0)
        name = "rate limits (--tpm 600000, 1,000 tokens a row)"
        self.rows.append(Row(name, "rows/s, first to last arrival", rate, None, ">= 9", rate >= 9))
        self.rows.append(Row(name, "most arrivals in 5 s", float(five), None, "<= 60", five <= 60))
        limited = Agent(latency=0.0, extra=["--record-arrivals", "--no-aggregate-groups"])
        free = Agent(latency=0.05, extra=["--record-arrivals", "--no-aggregate-groups"])
        try:
            mixed = self.workdir / "limit-rows-two-agents.jsonl"
            with open(mixed, "w") as file:
                for i in range(300):
                    name = "a" if i % 3 == 0 else "b"  # 100 rows of a (10 s at 10/s), 200 of b
                    file.write(json.dumps({"responses_create_params": {"input": f"{i}"}, "agent_ref": {"name": name}}))
                    file.write("\n")
            output = self.out("rf.jsonl")
            argv = [*rollfilter_cmd(), "-q", "-e", f"a={limited.url}", "-e", f"b={free.url}", "-j", "64"]
            run_client([*argv, "--rpm", "a=600", "-o", str(output), str(mixed)], output=output)
            a_times, b_times = limited.arrivals(), free.arrivals()
        finally:
            limited.stop()
            free.stop()
        a_rate = (len(a_times) - 1) / (a_times[-1] - a_times[0])
        b_span = b_times[-1] - b_times[0]
        name = "rate limits (--rpm a=600 beside an unlimited b)"
        self.rows.append(Row(name, "a's rows/s", a_rate, 10.0, "10 within 5%", abs(a_rate - 10) <= 0.5))
        # b's 200 rows, 0.05 s each, at most 64 at once, take about 0.16 s when nothing holds them back.
        self.rows.append(Row(name, "s b's rows took", b_span, None, "< 1 (not slowed)", b_span < 1.0))


def _cell(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3f}" if value < 10 else f"{value:,.0f}"


def _ratio(value: float | None, against: float | None) -> str:
    return f"{value / against:.2f}" if value is not None and against else "-"


def table(rows: list[Row]) -> str:
    """The rows as markdown; with --baseline's figures, two more columns: the baseline and the ratio to it."""
    baseline = any(row.baseline is not None for row in rows)
    header = ["scenario", "metric", "rollfilter", "reference", "ratio", "target", "met"]
    if baseline:
        header += [BASELINE, "ratio to baseline"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        met = {True: "yes", False: "NO", None: "-"}[row.passed]
        ratio = _ratio(row.rollfilter, row.reference)
        cells = [row.scenario, row.metric, _cell(row.rollfilter), _cell(row.reference), ratio, row.target, met]
        if baseline:
            cells += [_cell(row.baseline), _ratio(row.rollfilter, row.baseline)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def compile_this_build() -> None:
    """Write this build's bytecode before anything is measured. An editable install run with
    PYTHONDONTWRITEBYTECODE set compiles every module of its own at every start, which a build
    installed by pip (compiled when installed) does not: their CPU a row would not compare."""
    spec = importlib.util.find_spec("rollfilter")
    if spec is None or not spec.submodule_search_locations:
        return
    for location in spec.submodule_search_locations:
        compileall.compile_dir(location, quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick", action="store_true", help="smaller inputs, for a try-out (not the figures of record)"
    )
    parser.add_argument("--runs", type=int, default=3, help="alternating runs per client in each scenario")
    parser.add_argument("--json", type=Path, default=HERE / "results.json", help="where to write the results")
    parser.add_argument(
        "--baseline",
        metavar="COMMAND",
        default=None,
        help=f"another build's rollfilter script: overhead, scale and memory run it too, as {BASELINE!r}",
    )
    parser.add_argument(
        "--only",
        nargs="*",
        choices=SCENARIOS,
        default=None,
        help="scenarios (default all): " + " ".join(SCENARIOS) + "; --adaptive's are healthy adaptive queueing moving",
    )
    args = parser.parse_args()
    if args.baseline and not shutil.which(args.baseline):
        parser.error(f"--baseline {args.baseline}: not an executable command")
    compile_this_build()
    with tempfile.TemporaryDirectory(prefix="rollfilter-bench-") as tmp:
        bench = Bench(Path(tmp), args.runs, args.quick, [args.baseline] if args.baseline else None)
        for name in args.only or SCENARIOS:
            getattr(bench, name)()
    text = table(bench.rows)
    print(text)
    args.json.write_text(
        json.dumps(
            {
                "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "quick": args.quick,
                "runs": args.runs,
                **({"baseline": args.baseline} if args.baseline else {}),
                "rows": [row.record() for row in bench.rows],
                "table": text,
            },
            indent=2,
        )
        + "\n"
    )


if __name__ == "__main__":
    main()
