"""The engine's loop, over a real agent or none."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollfilter import Failure, rollouts
from rollfilter.config import Config
from rollfilter.connect import transport_for
from rollfilter.engine import RunControl, connect_engine
from rollfilter.metrics import Metrics
from rollfilter.outcomes import AttemptFailure
from rollfilter.plan import Job
from rollfilter.routing import Agent
from rollfilter.source import LineReader
from rollfilter.writers import Release
from tests.conftest import DemoServer, QuietHandler, ThreadedHTTPServer, rows_jsonl, simple_rows


class _Shown:
    """What a dry run shows, in the order shown: each job's route, then its body."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def route(self, job: Job, agent: Agent) -> None:
        self.events.append(("route", job.seq))

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None:
        self.events.append(("body", job.seq))
        release()

    def failure(self, job: Job, failure: AttemptFailure, release: Release) -> None:
        self.events.append(("failure", job.seq))
        release()

    def not_persisted(self, job: Job, attempts: int, release: Release) -> None:
        raise AssertionError("a dry run has no answers")


async def test_a_dry_run_takes_one_row_at_a_time_whatever_the_concurrency(tmp_path: Path, demo_server: DemoServer):
    """Each row's route is shown and the client yields to the scheduler before its body comes
    back: with more than one worker, the next row's route would come in between, and bodies
    would come back in the scheduler's order rather than the input's."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(rows_jsonl(simple_rows(20)))
    config = Config(url=demo_server.url, concurrency=16)
    shown = _Shown()
    reader = LineReader([str(rows)], max_line_bytes=1 << 20)
    transport = transport_for(config)
    try:
        engine = await connect_engine(
            config,
            source=reader,
            sink=shown,
            transport=transport,
            control=RunControl(),
            metrics=Metrics(),
            dry_run=shown.route,
        )
        await engine.run()
    finally:
        reader.close()
        await transport.aclose()
    assert shown.events == [(event, seq) for seq in range(20) for event in ("route", "body")]
    assert demo_server.stats()["requests"] == 0


class _BusyOnce(QuietHandler):
    """Refuses each row's first request (503), then gives the answer the row carries."""

    seen: dict[str, int]
    lock = threading.Lock()

    def do_POST(self) -> None:
        row = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with self.lock:
            count = self.seen[row["id"]] = self.seen.get(row["id"], 0) + 1
        if count == 1:
            self.send_response(503)
            self.send_header("Retry-After", "0")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_json(200, json.dumps(row["answer"]).encode())


@pytest.fixture
def busy_once() -> Iterator[tuple[str, dict[str, int]]]:
    _BusyOnce.seen = {}
    server = ThreadedHTTPServer(_BusyOnce)
    yield f"{server.url}/run", _BusyOnce.seen
    server.close()


def test_an_answer_after_a_retry_counts_both_attempts(busy_once: tuple[str, dict[str, int]]):
    """The client counts a job's attempts; what the engine makes of the answer that came on the
    second (an agent's own failure, a rollout not to be kept) says two."""
    url, seen = busy_once
    rows = [
        {"id": "a", "responses_create_params": {"input": "a"}, "answer": {"_ng_failure_class": "x", "reward": 0.0}},
        {"id": "b", "responses_create_params": {"input": "b"}, "answer": {"_ng_no_persist": True, "reward": 1.0}},
    ]
    outcomes = list(rollouts(rows, Config(url=url, retries=2)))
    assert all(isinstance(outcome, Failure) for outcome in outcomes)
    attempts = {
        outcome.row["id"]: outcome.attempts for outcome in outcomes if isinstance(outcome, Failure) and outcome.row
    }
    assert attempts == {"a": 2, "b": 2}
    assert seen == {"a": 2, "b": 2}
