"""The engine's loop, over a real agent or none."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import pytest

from rollfilter import Failure, rollouts
from rollfilter.config import Config
from tests.conftest import QuietHandler, ThreadedHTTPServer


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


async def test_why_a_run_stopped_is_its_reason_else_its_cause_else_the_callers_leaving():
    """One wording for the command and the API: the stop's reason, the cause's words without one,
    the caller's leaving for a run cancelled with no cause, and None for a run not stopped."""
    from rollfilter.engine.nursery import StopCause, StopControl

    assert StopControl().why_stopped is None
    interrupted = StopControl()
    interrupted.stop(StopCause.INTERRUPTED)
    assert interrupted.why_stopped == "interrupted"
    limited = StopControl()
    limited.stop(StopCause.LIMIT_REACHED, lambda: "stopped after 2 failed rows (the limit: 2)")
    assert limited.why_stopped == "stopped after 2 failed rows (the limit: 2)"
    left = StopControl()
    left.cancel()
    assert left.why_stopped == "stopped early by the caller"
