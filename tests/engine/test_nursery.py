"""The engine's loop, over a real agent or none."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from rollfilter import Failure, rollouts
from rollfilter.api.in_trio import _RowFeed
from rollfilter.config import Config, Timeouts
from rollfilter.engine.nursery import START_BATCH
from rollfilter.engine.routing import UNREACHABLE_AFTER_FAILURES
from rollfilter.errors import ErrorKind
from rollfilter.formats.writers import Release
from rollfilter.http import Reply
from rollfilter.http.testing import Handler, ScriptedRequest, ScriptedTransport, scripted_reply
from rollfilter.outcomes import Outcome
from rollfilter.run.outputs import ChannelSink
from rollfilter.run.run import Run
from rollfilter.stops import StopCause
from tests.conftest import URL, QuietHandler, ThreadedHTTPServer


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


@pytest.mark.usefixtures("quick_backoff")
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
    from rollfilter.stops import StopCause, StopControl

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


# The stop for an agent that never answered, on trio's MockClock: a Run over ScriptedTransport,
# whose agent is down, or up after a while, in seconds of the mock clock.

CONNECT_TIMEOUT = 10.0  # seconds: how long an agent that never answered is given (Config.timeout.connect)


async def run_rows(
    handler: Handler, count: int, concurrency: int = 200, **options: Any
) -> tuple[Run, list[Outcome], ScriptedTransport]:
    """`count` rows sent through `handler` by a run that stops for an agent that never answered."""
    config = Config(url=URL, concurrency=concurrency, timeout=Timeouts(connect=CONNECT_TIMEOUT), **options)
    send, receive = trio.open_memory_channel[tuple[Outcome, Release]](math.inf)
    rows = [{"id": number, "responses_create_params": {"input": "x"}} for number in range(count)]
    transport = ScriptedTransport(handler)
    run = Run(config, source=_RowFeed(rows), sink=ChannelSink(send), transport=transport, stop_when_unreachable=True)
    outcomes: list[Outcome] = []
    await run.connect()
    async with trio.open_nursery() as nursery:

        async def take() -> None:
            async for outcome, release in receive:
                release()
                outcomes.append(outcome)

        nursery.start_soon(take)
        async with send:
            await run.send()
    await run.aclose()
    return run, outcomes, transport


def refusing_until(up_at: float) -> Handler:
    """An agent whose listen backlog overflows until `up_at` (every connection refused), then
    answers each row in 0.2 s."""

    async def agent(request: ScriptedRequest) -> Reply:
        if trio.current_time() < up_at:
            raise httpx.ConnectError("Connection refused")
        await trio.sleep(0.2)
        return scripted_reply(200, {"reward": 1.0})

    return agent


@pytest.mark.parametrize("retries", [0, 3])
async def test_a_live_agent_that_refuses_a_burst_at_the_start_is_not_judged_down(
    retries: int, autojump_clock: trio.testing.MockClock
):
    """Refused for most of the connect timeout at the start of a run at -j 200: no row fails, and
    the run is not stopped, whatever the retries and the budget allow."""
    run, outcomes, transport = await run_rows(refusing_until(CONNECT_TIMEOUT * 0.9), 600, retries=retries)
    assert run.control.cause is None
    assert len(outcomes) == 600
    assert all(outcome.ok for outcome in outcomes)
    assert len(transport.requests) > 600  # the burst was refused, and sent again


async def test_an_agent_down_from_the_start_stops_the_run_once_refused_for_the_connect_timeout(
    autojump_clock: trio.testing.MockClock,
):
    refused_at: list[float] = []

    def down(request: ScriptedRequest) -> Reply:
        refused_at.append(trio.current_time())
        raise httpx.ConnectError("Connection refused")

    run, outcomes, _ = await run_rows(down, 3000, retries=0)
    assert run.control.cause is StopCause.AGENT_UNREACHABLE
    assert refused_at[-1] - refused_at[0] == pytest.approx(CONNECT_TIMEOUT)  # not before, and not a pause after
    assert len(refused_at) >= UNREACHABLE_AFTER_FAILURES
    failed = [outcome for outcome in outcomes if not outcome.ok]
    assert 1 <= len(failed) == len(outcomes) < 200  # of the rows in flight, not the whole input
    assert run.statistics().rows_read == 200


@pytest.mark.parametrize("status", [503, 500, 404])
async def test_an_agent_that_answers_a_status_is_answering_and_never_stops_the_run(
    status: int, autojump_clock: trio.testing.MockClock
):
    run, outcomes, _ = await run_rows(lambda request: scripted_reply(status, {"error": "busy"}), 50, retries=0)
    assert run.control.cause is None
    assert len(outcomes) == 50
    assert {outcome.kind for outcome in outcomes if isinstance(outcome, Failure)} == {ErrorKind.HTTP_STATUS}


class SpawnCounter(trio.abc.Instrument):
    def __init__(self) -> None:
        self.spawned = 0

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1


async def test_a_run_costs_what_it_uses_of_its_concurrency_not_the_bound():
    """5 rows at a concurrency of a million (fitted to the open-file limit, still thousands):
    the run starts a batch of workers, not one a slot; raising the bound mid-run neither."""
    spawned = SpawnCounter()
    trio.lowlevel.add_instrument(spawned)
    try:
        run, outcomes, _ = await run_rows(lambda request: scripted_reply(200, {"reward": 1.0}), 5, concurrency=10**6)
    finally:
        trio.lowlevel.remove_instrument(spawned)
    assert len(outcomes) == 5
    assert run.concurrency > 4 * START_BATCH  # the open-file limit leaves room for many
    assert spawned.spawned < 2 * START_BATCH
