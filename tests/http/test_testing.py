"""http/testing.py: a run over a scripted transport, as a unit on trio's MockClock.

The engine, its retries and its backpressure are driven here without a socket or a real second:
the agent is a function, its episodes take virtual time, and what the run did is read off the
requests the transport kept and the outcomes the sink got.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import trio
import trio.testing

from rollfilter.config import Config, Retries
from rollfilter.engine.plan import Job
from rollfilter.formats.source import InputLine
from rollfilter.formats.writers import Release
from rollfilter.http.framing import Reply
from rollfilter.http.testing import ScriptedRequest, ScriptedTransport, scripted_reply
from rollfilter.outcomes import AttemptFailure
from rollfilter.run.run import Run

URL = "http://127.0.0.1:9/run"  # never dialled: the transport is scripted


class Rows:
    """A LineSource over a list of rows."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._lines = [InputLine("<rows>", n, json.dumps(row).encode()) for n, row in enumerate(rows, 1)]

    def next_line_nowait(self) -> InputLine | None:
        return self._lines.pop(0) if self._lines else None

    async def fill(self) -> None:
        pass


class Outcomes:
    """A RowSink that keeps what it is handed and gives each row's slot back at once."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []
        self.failures: list[AttemptFailure] = []

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None:
        self.results.append(result)
        release()

    def failure(self, job: Job, failure: AttemptFailure, release: Release) -> None:
        self.failures.append(failure)
        release()

    def not_persisted(self, job: Job, attempts: int, release: Release) -> None:
        release()


async def run_over(transport: ScriptedTransport, config: Config, rows: list[dict[str, Any]]) -> Outcomes:
    outcomes = Outcomes()
    run = Run(config, source=Rows(rows), sink=outcomes, transport=transport)
    try:
        await run.connect()
        await run.send()
    finally:
        await run.aclose()
    return outcomes


def rows(n: int) -> list[dict[str, Any]]:
    return [{"responses_create_params": {"input": f"q{i}"}} for i in range(n)]


async def test_concurrency_bounds_the_episodes_in_flight(autojump_clock: trio.testing.MockClock):
    in_flight = peak = 0

    async def agent(request: ScriptedRequest) -> Reply:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await trio.sleep(10.0)
        in_flight -= 1
        return scripted_reply(200, {"reward": 1.0, "echo": request.json()["responses_create_params"]["input"]})

    start = trio.current_time()
    transport = ScriptedTransport(agent)
    outcomes = await run_over(transport, Config(url=URL, concurrency=8), rows(40))
    assert peak == 8
    assert sorted(r["echo"] for r in outcomes.results) == sorted(f"q{i}" for i in range(40))
    assert trio.current_time() - start == 50.0  # five waves of eight ten-second episodes, in virtual time
    assert transport.closed  # the run owns its transport


async def test_a_retry_after_is_waited_in_virtual_time(autojump_clock: trio.testing.MockClock):
    answered: dict[str, int] = {}

    def agent(request: ScriptedRequest) -> Reply:
        key = request.json()["responses_create_params"]["input"]
        answered[key] = answered.get(key, 0) + 1
        if answered[key] == 1:
            return scripted_reply(503, {"error": "busy"}, headers=[("Retry-After", "30")])
        return scripted_reply(200, {"reward": 0.5})

    start = trio.current_time()
    outcomes = await run_over(ScriptedTransport(agent), Config(url=URL, retries=Retries(count=2)), rows(3))
    assert [r["reward"] for r in outcomes.results] == [0.5, 0.5, 0.5]
    assert answered == {"q0": 2, "q1": 2, "q2": 2}
    assert trio.current_time() - start >= 30.0  # the agent's Retry-After was honoured


async def test_a_connection_refused_by_the_script_fails_the_row_as_the_wire_would(
    autojump_clock: trio.testing.MockClock,
):
    def agent(request: ScriptedRequest) -> Reply:
        raise httpx.ConnectError("Connection refused")

    transport = ScriptedTransport(agent)
    outcomes = await run_over(transport, Config(url=URL, retries=Retries(count=1)), rows(2))
    assert outcomes.results == []
    assert [failure.kind.value for failure in outcomes.failures] == ["connect", "connect"]
    assert len(transport.requests) == 4  # each row tried, then retried once
    assert all(request.method == b"POST" and request.url.path == "/run" for request in transport.requests)
