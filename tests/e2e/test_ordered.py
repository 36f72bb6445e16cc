"""--ordered: results in input order whatever order they finish in."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable
from typing import IO, Any

from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    read_jsonl,
    result_lines,
    rows_jsonl,
    run,
    simple_rows,
    start,
    summary_of,
    task_indices,
)


def later_rows_first(n: int, step: float = 0.0125) -> list[dict[str, Any]]:
    """Rows whose answers come in reverse: row i takes (n - i) * step seconds."""
    return [{**row, "demo": {"latency": round((n - i) * step, 3)}} for i, row in enumerate(simple_rows(n))]


def read_until(stream: IO[bytes], done: Callable[[bytes], bool], timeout: float = SUBPROCESS_TIMEOUT) -> bytes:
    """Read from a pipe until `done(everything read)`; fails after `timeout` seconds."""
    data = b""
    deadline = time.monotonic() + timeout
    while not done(data):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"not seen in time; read so far: {data[-2000:]!r}"
        ready, _, _ = select.select([stream], [], [], remaining)
        if ready:
            chunk = os.read(stream.fileno(), 65536)
            assert chunk, f"the stream ended; read so far: {data[-2000:]!r}"
            data += chunk
    return data


def test_ordered_writes_in_input_order_when_later_rows_finish_first(demo_server: DemoServer):
    rows = rows_jsonl(later_rows_first(12))
    proc = run(["-u", demo_server.url, "-k", "-j", "12"], input=rows)
    assert proc.returncode == 0, proc.stderr
    assert task_indices(proc.stdout) == list(range(12))
    unordered = run(["-u", demo_server.url, "-j", "12"], input=rows)  # the same rows finish out of order
    assert task_indices(unordered.stdout) != list(range(12))


def test_ordered_with_failures_keeps_input_order_and_reports_each_failure(tmp_path, demo_server: DemoServer):
    rows = later_rows_first(12)
    for failing in (3, 7):
        rows[failing]["demo"]["fault"] = "422"
    errors = tmp_path / "errors.jsonl"
    proc = run(["-u", demo_server.url, "-k", "-j", "12", "--errors", str(errors)], input=rows_jsonl(rows))
    assert proc.returncode == 1
    assert task_indices(proc.stdout) == [i for i in range(12) if i not in (3, 7)]
    assert sorted(r["_ng_task_index"] for r in read_jsonl(errors)) == [3, 7]


def test_ordered_with_repeats_writes_task_then_rollout(demo_server: DemoServer):
    proc = run(["-u", demo_server.url, "-k", "-j", "18", "-r", "3"], input=rows_jsonl(later_rows_first(6)))
    assert proc.returncode == 0, proc.stderr
    pairs = [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in result_lines(proc.stdout)]
    assert pairs == [(t, k) for t in range(6) for k in range(3)]


def test_ordered_interrupt_writes_what_finished_in_input_order(demo_server: DemoServer):
    # Rows 0-2 are written at once; row 3 is never answered, so rows 4-12 are held behind
    # it, and they finish in reverse. On Ctrl-C, what was held is written in input order.
    rows = simple_rows(13)
    rows[3]["demo"] = {"latency": 600}
    for i in range(4, 13):
        rows[i]["demo"] = {"latency": round((13 - i) * 0.025, 3)}
    proc = start(["-u", demo_server.url, "-k", "-j", "13", "-v"], stdin=subprocess.PIPE)
    assert proc.stdin
    assert proc.stdout
    assert proc.stderr
    try:
        proc.stdin.write(rows_jsonl(rows).encode())
        proc.stdin.close()
        events = read_until(proc.stderr, lambda seen: seen.count(b": finished in ") == 12)
        proc.send_signal(signal.SIGINT)
        stdout = proc.stdout.read()
        stderr = proc.stderr.read()
        status = proc.wait(timeout=SUBPROCESS_TIMEOUT)
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
        proc.stdout.close()
        proc.stderr.close()
    assert status == 130
    assert task_indices(stdout) == [0, 1, 2, *range(4, 13)]
    finished = [int(line.split(b" task ")[1].split()[0]) for line in events.splitlines() if b": finished in " in line]
    assert finished[3:] != sorted(finished[3:])  # they did finish out of order
    figures = summary_of(stderr)["rollfilter"]
    assert (figures["succeeded"], figures["cancelled"]) == (12, 1)
