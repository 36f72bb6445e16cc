"""The ROLLFILTER_* variables: each sets what its option sets."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from tests.conftest import (
    DemoServer,
    HeadServer,
    QuietHandler,
    ThreadedHTTPServer,
    clean_env,
    documented_shard,
    read_jsonl,
    rows_jsonl,
    run,
    serving,
    simple_rows,
)


class CountingAgent(ThreadedHTTPServer):
    """An agent that answers each /run after `delay` seconds and counts the most it had in flight at once."""

    def __init__(self, delay: float) -> None:
        self.in_flight = self.most_in_flight = 0
        lock = threading.Lock()
        agent = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    agent.in_flight += 1
                    agent.most_in_flight = max(agent.most_in_flight, agent.in_flight)
                time.sleep(delay)
                with lock:
                    agent.in_flight -= 1
                self.send_json(200, b'{"reward": 1.0}')

        super().__init__(Handler)


@contextlib.contextmanager
def unanswered_connects() -> Iterator[str]:
    """A loopback port where connecting hangs: its one-place accept queue is already full,
    so the kernel drops further SYNs until the client gives up."""
    with socket.socket() as listener, socket.socket() as filler:
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        filler.connect(listener.getsockname())
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/run"


def test_the_shard_rule_is_pinned():
    # Shards run on different machines and rollfilter versions; the assignment must never drift.
    assert [documented_shard(f"task-{i}", 3) for i in range(10)] == [0, 2, 2, 2, 2, 0, 1, 0, 1, 2]


def test_rollfilter_url_sets_the_agent(demo_server: DemoServer):
    proc = run([], input=rows_jsonl(simple_rows(3)), env=clean_env(ROLLFILTER_URL=demo_server.url))
    assert proc.returncode == 0, proc.stderr
    assert demo_server.stats()["requests"] == 3


def test_rollfilter_head_server_resolves_agent_names(demo_server: DemoServer):
    rows = [{**row, "agent_ref": {"name": "simple_agent"}} for row in simple_rows(3)]
    with serving(HeadServer(port=demo_server.port)) as head:
        proc = run([], input=rows_jsonl(rows), env=clean_env(ROLLFILTER_HEAD_SERVER=head.url))
    assert proc.returncode == 0, proc.stderr
    assert demo_server.stats()["requests"] == 3


def test_rollfilter_concurrency_bounds_the_rows_in_flight():
    with serving(CountingAgent(delay=0.1)) as agent:
        proc = run(["-u", agent.url], input=rows_jsonl(simple_rows(6)), env=clean_env(ROLLFILTER_CONCURRENCY="3"))
    assert proc.returncode == 0, proc.stderr
    assert agent.most_in_flight == 3


@pytest.mark.usefixtures("quick_backoff")
def test_rollfilter_retries_sets_the_retries(demo_server: DemoServer):
    rows = [{**row, "demo": {"fault": "500"}} for row in simple_rows(2)]
    proc = run(["-u", demo_server.url], input=rows_jsonl(rows), env=clean_env(ROLLFILTER_RETRIES="1"))
    assert proc.returncode == 1
    assert demo_server.stats()["by_id"] == {"0": 2, "1": 2}


def test_rollfilter_timeout_bounds_an_attempt(tmp_path, demo_server: DemoServer):
    errors = tmp_path / "errors.jsonl"
    rows = [{**row, "demo": {"latency": 600}} for row in simple_rows(2)]
    env = clean_env(ROLLFILTER_TIMEOUT="0.1", ROLLFILTER_RETRIES="0")
    proc = run(["-u", demo_server.url, "--errors", str(errors)], input=rows_jsonl(rows), env=env)
    assert proc.returncode == 1
    records = read_jsonl(errors)
    assert [record["error"]["kind"] for record in records] == ["timeout", "timeout"]  # the file was written
    assert {record["error"]["message"] for record in records} == {"no answer within 0.1 s"}


@pytest.mark.usefixtures("quick_backoff")
def test_rollfilter_connect_timeout_bounds_connecting(tmp_path):
    errors = tmp_path / "errors.jsonl"
    env = clean_env(ROLLFILTER_CONNECT_TIMEOUT="0.1", ROLLFILTER_RETRIES="0")
    with unanswered_connects() as url:
        proc = run(["-u", url, "--errors", str(errors)], input=rows_jsonl(simple_rows(1)), env=env)
    assert proc.returncode == 3  # no connection to it ever worked: the run stops as a service failure
    [record] = read_jsonl(errors)
    assert record["error"]["kind"] == "connect"
    assert "connecting took over 0.1 s" in record["error"]["message"]
