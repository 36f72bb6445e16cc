"""Behaviours a subtle break could change without failing a plainer test: how tasks are
assigned to shards, the order --ordered writes in (also when stopped), the exact
--max-failures count, each ROLLFILTER_* variable, and proxy variables left unread."""

from __future__ import annotations

import contextlib
import json
import os
import random
import select
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    QuietHandler,
    ThreadedHTTPServer,
    clean_env,
    result_lines,
    rows_jsonl,
    run,
    simple_rows,
    start,
    summary_of,
)

PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def task_indices(stdout: bytes) -> list[Any]:
    return [r["_ng_task_index"] for r in result_lines(stdout)]


# -- shards ---------------------------------------------------------------------------------------


def documented_shard(task_index: Any, shards: int) -> int:
    """The man page's rule, restated: an integer index mod N; any other index by the CRC-32
    of its compact JSON, which is the same in every process and on every machine."""
    if isinstance(task_index, int):
        return task_index % shards
    return zlib.crc32(json.dumps(task_index, separators=(",", ":")).encode()) % shards


def test_the_shard_rule_is_pinned():
    # Shards run on different machines and rollfilter versions; the assignment must never drift.
    assert [documented_shard(f"task-{i}", 3) for i in range(10)] == [0, 2, 2, 2, 2, 0, 1, 0, 1, 2]


def test_string_task_indices_split_across_processes_cover_every_task_once(tmp_path, demo_server: DemoServer):
    rows = [{**row, "_ng_task_index": f"task-{row['id']}"} for row in simple_rows(40)]
    assert any(documented_shard(row["_ng_task_index"], 3) != line % 3 for line, row in enumerate(rows))
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(rows))
    pairs: Counter[tuple[str, int]] = Counter()
    for shard in range(3):
        # Each process hashes strings with its own seed: a shard chosen by hash() would differ.
        env = clean_env(PYTHONHASHSEED=str(shard + 1))
        proc = run(["-u", demo_server.url, "-r", "2", "--shard", f"{shard}/3", str(data)], env=env)
        assert proc.returncode == 0, proc.stderr
        results = result_lines(proc.stdout)
        expected = {row["_ng_task_index"] for row in rows if documented_shard(row["_ng_task_index"], 3) == shard}
        assert {r["_ng_task_index"] for r in results} == expected
        pairs.update((r["_ng_task_index"], r["_ng_rollout_index"]) for r in results)
    assert sorted(pairs) == sorted((row["_ng_task_index"], k) for row in rows for k in range(2))
    assert set(pairs.values()) == {1}


def test_shards_follow_the_rows_own_task_index_not_the_line(tmp_path, demo_server: DemoServer):
    indices = [100 + 7 * i for i in range(30)]
    random.Random(3).shuffle(indices)
    rows = [{**row, "_ng_task_index": index} for row, index in zip(simple_rows(30), indices, strict=True)]
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(rows))
    seen: list[int] = []
    for shard in range(3):
        proc = run(["-u", demo_server.url, "--shard", f"{shard}/3", str(data)])
        assert proc.returncode == 0, proc.stderr
        assert sorted(task_indices(proc.stdout)) == sorted(i for i in indices if i % 3 == shard)
        seen += task_indices(proc.stdout)
    assert sorted(seen) == sorted(indices)


# -- --ordered ------------------------------------------------------------------------------------


def later_rows_first(n: int, step: float = 0.1) -> list[dict[str, Any]]:
    """Rows whose answers come in reverse: row i takes (n - i) * step seconds."""
    return [{**row, "demo": {"latency": round((n - i) * step, 3)}} for i, row in enumerate(simple_rows(n))]


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


def test_ordered_interrupt_writes_what_finished_in_input_order(demo_server: DemoServer):
    # Rows 0-2 are written at once; row 3 is never answered, so rows 4-12 are held behind
    # it, and they finish in reverse. On Ctrl-C, what was held is written in input order.
    rows = simple_rows(13)
    rows[3]["demo"] = {"latency": 600}
    for i in range(4, 13):
        rows[i]["demo"] = {"latency": round((13 - i) * 0.1, 3)}
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


# -- --max-failures -------------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 4])
def test_max_failures_stops_after_exactly_n_failures(tmp_path, demo_server: DemoServer, limit: int):
    rows = simple_rows(30)
    for row in rows[1::2]:  # every odd row fails, and 422 is not retried
        row["demo"] = {"fault": "422"}
    errors = tmp_path / "errors.jsonl"
    args = ["-u", demo_server.url, "-j", "1", "--max-failures", str(limit), "--errors", str(errors)]
    proc = run(args, input=rows_jsonl(rows))
    assert proc.returncode == 1
    assert [r["_ng_task_index"] for r in read_jsonl(errors)] == [2 * k + 1 for k in range(limit)]
    assert task_indices(proc.stdout) == [2 * k for k in range(limit)]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["failed"], figures["succeeded"]) == (limit, limit)
    assert demo_server.stats()["requests"] == 2 * limit


# -- ROLLFILTER_* variables -----------------------------------------------------------------------


class HeadServer(ThreadedHTTPServer):
    """A NeMo Gym head server stand-in that names one agent, `simple_agent`, at `port`."""

    def __init__(self, port: int) -> None:
        config = {"simple_agent": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": port}}}}
        body = json.dumps(yaml.safe_dump(config)).encode()

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                self.send_json(200, body)

        super().__init__(Handler)


class CountingAgent(ThreadedHTTPServer):
    """An agent that answers each /run after `delay` seconds and counts the most it held at once."""

    def __init__(self, delay: float) -> None:
        self.held = self.most_held = 0
        lock = threading.Lock()
        agent = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    agent.held += 1
                    agent.most_held = max(agent.most_held, agent.held)
                time.sleep(delay)
                with lock:
                    agent.held -= 1
                self.send_json(200, b'{"reward": 1.0}')

        super().__init__(Handler)


class RecordingProxy(ThreadedHTTPServer):
    """A plain-HTTP forward proxy on 127.0.0.1 that records every request it is asked to carry."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        proxy = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def forward(self) -> None:
                proxy.requests.append(f"{self.command} {self.path}")
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                request = urllib.request.Request(self.path, data=body, method=self.command)
                request.add_header("Content-Type", "application/json")
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                with opener.open(request, timeout=30) as response:
                    self.send_json(response.status, response.read())

            do_GET = do_POST = forward

            def do_CONNECT(self) -> None:
                proxy.requests.append(f"CONNECT {self.path}")
                self.send_json(405, b"{}")

        super().__init__(Handler)


@contextlib.contextmanager
def serving(server: ThreadedHTTPServer) -> Iterator[Any]:
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def unanswered_connects() -> Iterator[str]:
    """A loopback port where connecting hangs: its one-place accept queue is already full,
    so the kernel drops further SYNs until the client gives up."""
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        filler.connect(listener.getsockname())
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/run"


def test_rollfilter_url_sets_the_agent(demo_server: DemoServer):
    proc = run([], input=rows_jsonl(simple_rows(3)), env=clean_env(ROLLFILTER_URL=demo_server.url))
    assert proc.returncode == 0, proc.stderr
    assert demo_server.stats()["requests"] == 3


def test_rollfilter_head_server_resolves_agent_names(demo_server: DemoServer):
    rows = [{**row, "agent_ref": {"name": "simple_agent"}} for row in simple_rows(3)]
    with serving(HeadServer(demo_server.port)) as head:
        proc = run([], input=rows_jsonl(rows), env=clean_env(ROLLFILTER_HEAD_SERVER=head.url))
    assert proc.returncode == 0, proc.stderr
    assert demo_server.stats()["requests"] == 3


def test_rollfilter_concurrency_bounds_the_rows_in_flight():
    with serving(CountingAgent(delay=0.2)) as agent:
        proc = run(["-u", agent.url], input=rows_jsonl(simple_rows(12)), env=clean_env(ROLLFILTER_CONCURRENCY="3"))
    assert proc.returncode == 0, proc.stderr
    assert agent.most_held == 3


def test_rollfilter_retries_sets_the_retries(demo_server: DemoServer):
    rows = [{**row, "demo": {"fault": "500"}} for row in simple_rows(2)]
    proc = run(["-u", demo_server.url], input=rows_jsonl(rows), env=clean_env(ROLLFILTER_RETRIES="1"))
    assert proc.returncode == 1
    assert demo_server.stats()["by_id"] == {"0": 2, "1": 2}


def test_rollfilter_timeout_bounds_an_attempt(tmp_path, demo_server: DemoServer):
    errors = tmp_path / "errors.jsonl"
    rows = [{**row, "demo": {"latency": 600}} for row in simple_rows(2)]
    env = clean_env(ROLLFILTER_TIMEOUT="0.3", ROLLFILTER_RETRIES="0")
    proc = run(["-u", demo_server.url, "--errors", str(errors)], input=rows_jsonl(rows), env=env)
    assert proc.returncode == 1
    for record in read_jsonl(errors):
        assert record["error"]["kind"] == "timeout"
        assert "--timeout 0.3 s" in record["error"]["message"]


def test_rollfilter_connect_timeout_bounds_connecting(tmp_path):
    errors = tmp_path / "errors.jsonl"
    env = clean_env(ROLLFILTER_CONNECT_TIMEOUT="0.3", ROLLFILTER_RETRIES="0")
    with unanswered_connects() as url:
        proc = run(["-u", url, "--errors", str(errors)], input=rows_jsonl(simple_rows(1)), env=env)
    assert proc.returncode == 1
    [record] = read_jsonl(errors)
    assert record["error"]["kind"] == "connect"
    assert "connecting took over 0.3 s" in record["error"]["message"]


def test_rollfilter_proxy_sends_through_the_proxy(demo_server: DemoServer):
    with serving(RecordingProxy()) as proxy:
        proc = run(["-u", demo_server.url], input=rows_jsonl(simple_rows(3)), env=clean_env(ROLLFILTER_PROXY=proxy.url))
    assert proc.returncode == 0, proc.stderr
    assert len(proxy.requests) == 3
    assert demo_server.stats()["requests"] == 3


def test_proxy_environment_variables_are_not_read(demo_server: DemoServer):
    rows = rows_jsonl([{**row, "agent_ref": {"name": "simple_agent"}} for row in simple_rows(3)])
    with serving(RecordingProxy()) as proxy, serving(HeadServer(demo_server.port)) as head:
        env = clean_env(**dict.fromkeys(PROXY_VARIABLES, proxy.url))
        by_url = run(["-u", demo_server.url], input=rows, env=env)
        by_name = run(["--head-server", head.url], input=rows, env=env)
    assert (by_url.returncode, by_name.returncode) == (0, 0), (by_url.stderr, by_name.stderr)
    assert proxy.requests == []
    assert demo_server.stats()["requests"] == 6


def test_every_call_of_a_run_goes_through_the_proxy(demo_server: DemoServer, tmp_path):
    """The head server, /run and /aggregate_metrics share one HTTP path, --proxy included."""
    rows = [{**row, "agent_ref": {"name": "simple_agent"}} for row in simple_rows(3)]
    with serving(RecordingProxy()) as proxy, serving(HeadServer(demo_server.port)) as head:
        args = ["--head-server", head.url, "--proxy", proxy.url, "--aggregate", str(tmp_path / "agg.json")]
        proc = run(args, input=rows_jsonl(rows))
    assert proc.returncode == 0, proc.stderr
    carried = sorted(f"{method} {urllib.parse.urlsplit(url).path}" for method, url in map(str.split, proxy.requests))
    assert carried == ["GET /global_config_dict_yaml", "POST /aggregate_metrics", *["POST /run"] * 3]
