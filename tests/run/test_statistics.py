"""statistics.py: a run's snapshot, taken mid-run on trio's MockClock, and the summary made from it.

The run here is a `Run` over `ScriptedTransport`: its agent answers in seconds of the mock clock,
so what is in flight when the snapshot is taken is decided by the clock, not the machine's speed.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import trio
import trio.testing

from rollfilter import Config
from rollfilter.api.in_trio import _RowFeed, open_rollouts_in_trio
from rollfilter.config import Groups, Rates, Retries
from rollfilter.engine.metrics import Metrics
from rollfilter.figures.compare import RunComparison
from rollfilter.formats.writers import Release
from rollfilter.http import Reply
from rollfilter.http.testing import ScriptedRequest, ScriptedTransport, scripted_reply
from rollfilter.outcomes import Outcome
from rollfilter.run.outputs import ChannelSink
from rollfilter.run.run import Run
from rollfilter.run.statistics import RunStatistics, statistics_of
from rollfilter.run.summary import summary_of
from tests.conftest import URL
from tests.engine.test_steering import StandIn, collect

SLOW = 100.0  # an odd row's episode, in seconds of the mock clock; an even row's takes 1


async def episode(request: ScriptedRequest) -> Reply:
    """An even row answers in a second, an odd one in SLOW seconds; row 4 fails (500)."""
    number = request.json()["id"]
    await trio.sleep(1.0 if number % 2 == 0 else SLOW)
    if number == 4:
        return scripted_reply(500, {"error": "no"})
    usage = {"input_tokens": 10, "output_tokens": 5 + number}
    return scripted_reply(200, {"reward": number / 10, "id": number, "response": {"usage": usage}})


def rows(count: int, agent: str | None = None) -> list[dict[str, Any]]:
    named = {"agent_ref": {"name": agent}} if agent is not None else {}
    return [{"id": number, "responses_create_params": {"input": f"row {number}"}, **named} for number in range(count)]


async def take_outcomes(receive: trio.MemoryReceiveChannel[tuple[Outcome, Release]], into: list[Outcome]) -> None:
    async for outcome, release in receive:
        release()
        into.append(outcome)


async def test_a_snapshot_taken_mid_run_is_consistent_and_stays_as_it_was_taken(
    autojump_clock: trio.testing.MockClock,
):
    config = Config(url=URL, concurrency=8, retries=Retries(count=0))
    send, receive = trio.open_memory_channel[tuple[Outcome, Release]](math.inf)
    run = Run(config, source=_RowFeed(rows(8)), sink=ChannelSink(send), transport=ScriptedTransport(episode))
    outcomes: list[Outcome] = []
    await run.connect()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_outcomes, receive, outcomes)

        async def send_all() -> None:
            async with send:
                await run.send()

        nursery.start_soon(send_all)
        await trio.sleep(SLOW / 2)  # the even rows have ended (row 4 failed), the odd ones are out
        mid_run = run.statistics()
        assert (mid_run.started, mid_run.succeeded, mid_run.failed, mid_run.in_flight) == (8, 3, 1, 4)
        assert mid_run.ended + mid_run.in_flight == mid_run.started
        assert mid_run.rows_read == mid_run.started + mid_run.skipped + mid_run.not_retried == 8
        assert mid_run.not_started is None  # nothing says yet how many rows the input holds
        assert mid_run.finished == mid_run.ended == 4
        (agent,) = mid_run.agents.values()
        assert (agent.succeeded, agent.failed_by_kind, agent.in_flight) == (3, {"http_status": 1}, 4)
        assert agent.tokens == 3 * 10 + (5 + 0) + (5 + 2) + (5 + 6)
        assert mid_run.reward_mean == agent.reward_mean == pytest.approx((0.0 + 0.2 + 0.6) / 3)
        assert mid_run.steering.requests_out == 4
        assert [rollout.task_index for rollout in mid_run.oldest] == [1, 3, 5, 7]
        assert mid_run.latency.count == mid_run.output_tokens().count == 3
        run.expected = 10  # once known (a materialized file): the rows never read are derived from it
        assert run.statistics().not_started == 10 - 8
    at_the_end = run.statistics()
    assert (at_the_end.succeeded, at_the_end.in_flight, at_the_end.latency.count) == (7, 0, 7)
    assert len(outcomes) == 8
    # The snapshot taken mid-run is as it was: no figure moved with the run, the copies neither.
    assert (mid_run.succeeded, mid_run.in_flight, mid_run.expected, mid_run.not_started) == (3, 4, None, None)
    assert mid_run.latency.count == mid_run.output_tokens().count == 3
    assert sum(means.succeeded for means in mid_run.results_by_agent.values()) == 3
    assert summary_of(mid_run)["reward"] == pytest.approx((0.0 + 0.2 + 0.6) / 3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mid_run.succeeded = 0  # type: ignore[misc]
    await run.aclose()


async def test_the_agents_figures_add_up_to_the_runs_and_are_keyed_by_label(autojump_clock: trio.testing.MockClock):
    config = Config(endpoints={"a": (URL,)}, url=URL, concurrency=8, retries=Retries(count=0))
    send, receive = trio.open_memory_channel[tuple[Outcome, Release]](math.inf)
    mixed = rows(5, "a") + [{"id": 10 + number, "responses_create_params": {"input": "x"}} for number in range(3)]
    run = Run(config, source=_RowFeed(mixed), sink=ChannelSink(send), transport=ScriptedTransport(episode))
    await run.connect()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(take_outcomes, receive, [])
        async with send:
            await run.send()
    statistics = run.statistics()
    assert set(statistics.agents) == {"a", "(no name)"}
    assert sum(agent.succeeded for agent in statistics.agents.values()) == statistics.succeeded == 7
    failed = sum(sum(agent.failed_by_kind.values()) for agent in statistics.agents.values())
    assert failed == statistics.failed == 1
    assert all(agent.concurrency_limit == 8 for agent in statistics.agents.values())
    await run.aclose()


def test_rows_read_and_not_started_are_derived_once_from_the_counts():
    metrics = Metrics()
    metrics.taken = 5
    statistics = statistics_of(metrics, expected=12, skipped_unread=3, finished_earlier=2)
    assert (statistics.rows_read, statistics.not_started, statistics.finished) == (8, 4, 2)
    summary = summary_of(dataclasses.replace(statistics, stopped="interrupted"))["rollfilter"]
    assert (summary["rows_read"], summary["not_started"]) == (8, 4)
    assert statistics.cancelled == summary["cancelled"] == 5  # taken and not ended: never started is apart
    assert statistics_of(metrics, expected=6, skipped_unread=3).not_started == 0  # never below none


async def test_the_summary_renders_the_runs_snapshot():  # a run is summed up in trio
    run = Run(Config(url=URL, groups=True, repeats=2))
    taken = run.statistics()
    shown = dataclasses.replace(taken, succeeded=1234, skipped=7, rows_read=1241, expected=1300, not_started=59)
    run.statistics = lambda: shown  # type: ignore[method-assign]
    figures = run.summary()["rollfilter"]
    assert (figures["succeeded"], figures["skipped"], figures["rows_read"]) == (1234, 7, 1241)
    assert figures["expected"] == 1300
    assert isinstance(taken, RunStatistics)


def test_the_summary_keeps_its_keys_and_their_order():
    metrics = Metrics()
    metrics.add_result({"reward": 1.0, "response": {"usage": {"total_tokens": 3}}}, 0.5, "a")
    metrics.add_result({"reward": 0.0}, 0.5, "b")
    metrics.taken = 3
    summary = summary_of(statistics_of(metrics, expected=3, stopped="interrupted"))
    assert list(summary) == [
        *("reward", "stderr", "ci95", "sample_size", "usage", "per_rollout", "agents", "rollfilter")
    ]
    assert list(summary["rollfilter"]) == [
        *("expected", "rows_read", "succeeded", "failed", "masked", "means_cover", "not_persisted", "skipped"),
        *("not_retried", "cancelled", "not_started", "failed_by_kind", "retries", "retries_withheld", "health"),
        *("elapsed_s", "rows_per_s", "tokens_per_s", "latency_s", "stopped"),
    ]


def test_the_summary_shows_what_the_snapshot_says_of_the_run_and_nothing_else():
    """Everything the summary shows beside the counts is in the snapshot: rendered in its place,
    with no code editing the summary afterwards."""
    metrics = Metrics()
    metrics.add_result({"reward": 1.0}, 0.5, None)
    metrics.taken = 1
    comparison = RunComparison()
    comparison.add_baseline({"_ng_task_index": 0, "reward": 0.0})
    comparison.add({"_ng_task_index": 0, "reward": 1.0})
    said = statistics_of(
        metrics,
        stopped="interrupted",
        unsafe=True,
        would_send=1,
        key_metrics={"a": {"accuracy": 1}},
        shards={"of": 2, "read": [0, 1]},
        comparison=comparison.comparison(),
        timed=False,
    )
    said = dataclasses.replace(said, not_judge_failed=2)  # as re-scoring's planner counts them
    summary = summary_of(said)
    assert list(summary)[-3:] == ["key_metrics", "compare", "rollfilter"]
    figures = summary["rollfilter"]
    assert (figures["succeeded"], figures["would_send"]) == (0, 1)  # nothing sent, nothing succeeded
    assert list(figures)[-5:] == ["stopped", "unsafe", "not_judge_failed", "shards", "compared_tasks"]
    assert figures["compared_tasks"]["paired"] == 1
    assert "elapsed_s" not in figures  # counted from files: no timings
    assert summary_of(said) == summary  # a rendering: the same snapshot, the same summary


async def snapshot_at(config: Config, count: int, moment: float, steer: Any = None) -> tuple[RunStatistics, int]:
    """The snapshot of a run of `count` rows whose agent answers in SLOW seconds, taken `moment`
    seconds in (after `steer(run)`, if given), and how many requests were at the agent then."""
    agent = StandIn(lambda row: SLOW)
    async with open_rollouts_in_trio(rows(count), config, transport=agent) as run, trio.open_nursery() as nursery:
        nursery.start_soon(collect, run, [])
        if steer is not None:
            steer(run)
        await trio.sleep(moment)
        await trio.testing.wait_all_tasks_blocked()
        assert run._run is not None
        statistics, out = run._run.statistics(), agent.out
        run.resume()
        run.set_rate(rpm=None)
        if run._run.staleness is not None:
            run.set_policy_version(10**6)
    return statistics, out


def held(statistics: RunStatistics) -> tuple[int, int, int, int]:
    status = statistics.status()
    return (
        status.waiting_on_pause,
        status.waiting_on_rate_limits,
        status.waiting_on_window,
        status.waiting_on_policy_version,
    )


async def test_rows_taken_and_not_sent_are_counted_by_what_they_wait_on_never_in_flight(autojump_clock):
    # Paused before anything is sent: the four rows taken wait, waiting on the pause.
    paused, out = await snapshot_at(Config(url=URL, concurrency=4), 12, 1, lambda run: run.pause())
    assert (paused.ended, paused.in_flight, out, held(paused)) == (0, 0, 0, (4, 0, 0, 0))
    assert paused.waiting == 4
    assert paused.status().in_flight == 0
    assert [rollout.waiting for rollout in paused.oldest] == ["pause"] * 4
    # A minute a request: one sent, the other five wait on the limit.
    limited, out = await snapshot_at(Config(url=URL, concurrency=8, rates=Rates(rpm=1)), 6, 1)
    assert (limited.in_flight, out, held(limited), limited.waiting) == (1, 1, (0, 5, 0, 0), 5)
    # An adaptive window starts at eight: the other twelve rows taken wait for room in it.
    windowed, out = await snapshot_at(Config(url=URL, concurrency=20, adaptive=True), 20, 0.01)
    assert (windowed.in_flight, out, held(windowed), windowed.waiting) == (8, 8, (0, 0, 12, 0), 12)
    # Version 0 admits group 0 alone: groups 1 and 2 wait for the next.
    stale = Config(url=URL, concurrency=6, repeats=2, groups=Groups(max_staleness=0, batch=1), policy_version=0)
    bounded, out = await snapshot_at(stale, 3, 1)
    assert (bounded.in_flight, out, held(bounded), bounded.waiting) == (2, 2, (0, 0, 0, 4), 4)
    assert bounded.steering.waiting_on_policy_version == 4
    for statistics in (paused, limited, windowed, bounded):
        agent = statistics.agents["(no name)"]
        assert (agent.seen, agent.in_flight) == (True, statistics.in_flight)
        assert statistics.started == statistics.ended + statistics.in_flight + statistics.waiting
