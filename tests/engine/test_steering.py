"""steering.py: pause, drain, live limits, policy versions and bounded staleness, on trio's MockClock.

The runs here send to `StandIn`, an agent in the test's own trio run (a transport, as the run's
is), whose episodes last seconds of the mock clock; so every admission is decided by the clock and
the events, never by the machine's speed.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from typing import Any

import pytest
import trio
import trio.testing

from rollfilter import Config, Failure, Group, Rollout, SteeringError
from rollfilter.api.in_trio import RolloutRun, _RowFeed, open_rollouts_in_trio
from rollfilter.config import ConfigError, Groups, Rates
from rollfilter.engine.adaptive import AdaptiveWindow
from rollfilter.http import Reply
from rollfilter.http.testing import ScriptedRequest, ScriptedTransport, scripted_reply
from rollfilter.outcomes import Outcome
from rollfilter.rows import POLICY_VERSION
from rollfilter.run.outputs import ChannelSink
from rollfilter.run.run import Run
from tests.conftest import URL


@dataclasses.dataclass
class Arrival:
    time: float
    row: dict[str, Any]
    out: int  # requests at the agent, this one included


class StandIn(ScriptedTransport):
    """An agent that logs each /run's arrival and answers after `latency(row)` seconds; with
    `refuse_first`, each row's first request is answered 503 at once."""

    def __init__(self, latency: Callable[[dict[str, Any]], float] = lambda row: 10.0, *, refuse_first: bool = False):
        super().__init__(self._answer_row)
        self.latency = latency
        self.refuse_first = refuse_first
        self.arrivals: list[Arrival] = []
        self.out = 0
        self._refused: set[tuple[Any, Any]] = set()

    async def _answer_row(self, request: ScriptedRequest) -> Reply:
        data = request.json()
        self.out += 1
        self.arrivals.append(Arrival(trio.current_time(), data, self.out))
        try:
            key = (data.get("id"), data.get("_ng_rollout_index"))
            if self.refuse_first and key not in self._refused:
                self._refused.add(key)
                return scripted_reply(503, headers=[("retry-after", "1")])
            await trio.sleep(self.latency(data))
        finally:
            self.out -= 1
        return scripted_reply(200, {"reward": 1.0, "id": data.get("id")})


def rows(count: int) -> list[dict[str, Any]]:
    return [{"id": number, "responses_create_params": {"input": f"row {number}"}} for number in range(count)]


async def collect(run: RolloutRun, into: list[Outcome]) -> None:
    async for outcome in run:
        into.append(outcome)  # noqa: PERF401  # one at a time: the test reads it as the run goes


async def test_once_paused_no_request_leaves_and_those_out_finish(autojump_clock: trio.testing.MockClock):
    agent = StandIn()
    async with open_rollouts_in_trio(rows(12), Config(url=URL, concurrency=4), transport=agent) as run:
        await trio.sleep(1)
        assert len(agent.arrivals) == 4
        run.pause()
        assert run.statistics().steering.paused
        first = [await anext(run) for _ in range(4)]  # what was out still comes
        await trio.sleep(1000)
        assert len(agent.arrivals) == 4
        run.resume()
        rest = [outcome async for outcome in run]
    assert all(isinstance(outcome, Rollout) for outcome in first + rest)
    assert len(first + rest) == 12
    assert len(agent.arrivals) == 12
    assert min(arrival.time for arrival in agent.arrivals[4:]) >= 1000


async def test_a_pause_holds_retries_too(autojump_clock: trio.testing.MockClock):
    agent = StandIn(refuse_first=True)
    async with open_rollouts_in_trio(rows(3), Config(url=URL, concurrency=3, retries=2), transport=agent) as run:
        await trio.sleep(0.01)  # the first attempts were refused, their retries wait a backoff
        assert len(agent.arrivals) == 3
        run.pause()
        await trio.sleep(1000)
        assert len(agent.arrivals) == 3
        run.resume()
        outcomes = [outcome async for outcome in run]
    assert all(isinstance(outcome, Rollout) for outcome in outcomes)
    assert len(agent.arrivals) == 6


async def test_drain_waits_for_what_is_out_within_its_timeout(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 10.0 * (row["id"] + 1))
    outcomes: list[Outcome] = []
    config = Config(url=URL, concurrency=3)
    async with open_rollouts_in_trio(rows(6), config, transport=agent) as run, trio.open_nursery() as nursery:
        nursery.start_soon(collect, run, outcomes)
        await trio.sleep(1)
        assert not await run.drain(5)  # the shortest episode takes 10 s
        assert run.statistics().steering.requests_out == 3
        assert await run.drain(100)
        stats = run.statistics().steering
        assert stats.paused
        assert stats.requests_out == 0
        await trio.testing.wait_all_tasks_blocked()  # the last answer's outcome on its way to the caller
        assert len(outcomes) == 3
        assert len(agent.arrivals) == 3
        run.resume()
    assert len(outcomes) == 6


async def test_a_resume_ends_a_drain_waiting_not_drained(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 10.0)
    outcomes: list[Outcome] = []
    drained: list[bool] = []
    config = Config(url=URL, concurrency=2)
    async with open_rollouts_in_trio(rows(4), config, transport=agent) as run, trio.open_nursery() as nursery:
        nursery.start_soon(collect, run, outcomes)
        await trio.sleep(1)

        async def drain() -> None:
            drained.append(await run.drain())  # no timeout: only the quiet, or a resume, ends it

        nursery.start_soon(drain)
        await trio.testing.wait_all_tasks_blocked()
        run.resume()  # another client's: what the drain waited for is gone
        await trio.testing.wait_all_tasks_blocked()
        assert drained == [False]
        assert run.statistics().steering.requests_out == 2
    assert len(outcomes) == 4


async def test_a_lower_concurrency_lets_the_excess_finish_and_a_higher_one_sends_more(
    autojump_clock: trio.testing.MockClock,
):
    agent = StandIn(lambda row: 5.0 + row["id"] % 7)
    outcomes: list[Outcome] = []
    config = Config(url=URL, concurrency=8)
    async with open_rollouts_in_trio(rows(200), config, transport=agent) as run, trio.open_nursery() as nursery:
        nursery.start_soon(collect, run, outcomes)
        await trio.sleep(1)
        assert agent.out == 8
        run.set_concurrency(3)
        assert run.statistics().steering.concurrency == 3
        assert agent.out == 8  # nothing in flight was cancelled
        await trio.sleep(20)  # the excess has finished by now
        lowered = [arrival.out for arrival in agent.arrivals if arrival.time > 12]
        assert lowered
        assert max(lowered) <= 3
        run.set_concurrency(12)
        await trio.sleep(1)
        assert agent.out == 12
    assert len(outcomes) == 200


def test_a_new_ceiling_brings_an_adaptive_window_down_at_once():
    window = AdaptiveWindow(16, initial=8)
    window.set_ceiling(3)
    assert window.size == 3
    window.set_ceiling(32)
    assert window.size == 3  # it grows toward a higher ceiling as it finds room, not at once
    assert window.ceiling == 32


async def test_a_concurrency_under_one_is_refused_and_changes_nothing(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 1.0)
    async with open_rollouts_in_trio(rows(2), Config(url=URL, concurrency=2), transport=agent) as run:
        for bad in (0, -1, 1.5, True):
            with pytest.raises(SteeringError, match="concurrency"):
                run.set_concurrency(bad)  # type: ignore[arg-type]
        assert run.statistics().steering.concurrency == 2
        assert len([outcome async for outcome in run]) == 2


async def test_a_rate_set_live_paces_the_rows_and_removing_it_lets_them_go(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 0.1)
    outcomes: list[Outcome] = []
    async with open_rollouts_in_trio(rows(40), Config(url=URL, concurrency=4), transport=agent) as run:
        run.set_rate(rpm=6)
        assert run.statistics().steering.rates == {"(no name)": {"rpm": 6, "tpm": None}}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, run, outcomes)
            await trio.sleep(100.05)
            assert 10 <= len(agent.arrivals) <= 11  # one in 10 s, after a burst of one
            run.set_rate(rpm=None)  # the rows waiting on it go at once
            await trio.sleep(3)
            assert len(agent.arrivals) == 40
            assert run.statistics().steering.rates == {}
    assert len(outcomes) == 40


async def test_a_rate_that_cannot_be_set_is_refused(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 1.0)
    async with open_rollouts_in_trio(rows(1), Config(url=URL), transport=agent) as run:
        with pytest.raises(SteeringError, match="rpm"):
            run.set_rate(rpm=0)
        with pytest.raises(SteeringError, match="tpm"):
            run.set_rate(tpm=math.inf)
        with pytest.raises(SteeringError, match="no agent 'other'"):
            run.set_rate("other", rpm=10)
        assert run.statistics().steering.rates == {}
        assert len([outcome async for outcome in run]) == 1


async def test_each_result_carries_the_version_it_was_sent_and_ended_under(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 10.0)
    config = Config(url=URL, concurrency=2, policy_version=3)
    async with open_rollouts_in_trio(rows(4), config, transport=agent) as run:
        await trio.sleep(5)
        run.set_policy_version(4)
        assert run.statistics().steering.policy_version == 4
        outcomes = [outcome async for outcome in run]
    stamps = {o.result["id"]: o.result[POLICY_VERSION] for o in outcomes if isinstance(o, Rollout)}
    assert stamps == {
        0: {"sent": 3, "ended": 4},
        1: {"sent": 3, "ended": 4},
        2: {"sent": 4, "ended": 4},
        3: {"sent": 4, "ended": 4},
    }


async def test_a_retried_rollout_is_stamped_by_its_last_send(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 1.0, refuse_first=True)
    async with open_rollouts_in_trio(rows(1), Config(url=URL, policy_version=0, retries=1), transport=agent) as run:
        await trio.sleep(0.001)  # refused at once; the retry waits its backoff
        run.set_policy_version(1)
        (outcome,) = [outcome async for outcome in run]
    assert isinstance(outcome, Rollout)
    assert outcome.result[POLICY_VERSION] == {"sent": 1, "ended": 1}


async def test_a_result_carries_no_version_unless_the_run_has_one(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 1.0)
    async with open_rollouts_in_trio(rows(1), Config(url=URL), transport=agent) as run:
        with pytest.raises(SteeringError, match="no policy version"):
            run.set_policy_version(1)
        (outcome,) = [outcome async for outcome in run]
    assert isinstance(outcome, Rollout)
    assert POLICY_VERSION not in outcome.result


async def test_a_version_never_goes_back(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 1.0)
    async with open_rollouts_in_trio(rows(1), Config(url=URL, policy_version=5), transport=agent) as run:
        with pytest.raises(SteeringError, match="cannot go back"):
            run.set_policy_version(4)
        with pytest.raises(SteeringError, match="whole number"):
            run.set_policy_version(5.5)  # type: ignore[arg-type]
        # Past 2**53 a version is not exact as JSON's doubles read it, and a Prometheus gauge's
        # float would overflow before long (a scrape that failed so ended the run).
        with pytest.raises(SteeringError, match=r"at most 9007199254740992"):
            run.set_policy_version(10**400)
        assert run.statistics().steering.policy_version == 5
        assert len([outcome async for outcome in run]) == 1


REPEATS = 2


def grouped(max_staleness: int, batch_groups: int, *, drop_uniform: bool = False, **extra: Any) -> Config:
    groups = Groups(drop_uniform=drop_uniform, max_staleness=max_staleness, batch=batch_groups)
    return Config(url=URL, concurrency=64, repeats=REPEATS, groups=groups, **extra)


async def test_groups_past_the_staleness_bound_wait_for_the_next_version(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 1.0)
    outcomes: list[Outcome] = []
    # K = 1, B = 2: under version 0 (the first), groups 0 to 3 may go; each version lets two more.
    async with open_rollouts_in_trio(rows(10), grouped(1, 2), transport=agent) as run, trio.open_nursery() as nursery:
        nursery.start_soon(collect, run, outcomes)
        await trio.sleep(100)
        assert {arrival.row["id"] for arrival in agent.arrivals} == {0, 1, 2, 3}
        stats = run.statistics().steering
        waiting = (stats.groups_waiting_on_policy_version, stats.waiting_on_policy_version)
        assert (stats.groups_admitted, *waiting) == (4, 6, 12)
        assert len(outcomes) == 4  # nothing is discarded, nothing more is sent
        run.set_policy_version(1)
        await trio.sleep(100)
        assert {arrival.row["id"] for arrival in agent.arrivals} == set(range(6))
        run.set_policy_version(3)
    assert len(outcomes) == 10
    assert all(isinstance(outcome, Group) and outcome.ok for outcome in outcomes)


def test_a_first_policy_version_past_2_to_the_53_is_refused():
    with pytest.raises(ConfigError, match=r"Config\.policy_version: expected `int` <= 9007199254740992"):
        Config(url=URL, policy_version=2**53 + 1)


def test_a_staleness_bound_is_of_groups_and_needs_both_its_figures():
    with pytest.raises(ConfigError, match=r"Config\.groups: needs Config\.repeats over 1"):
        Config(url=URL, groups=Groups(max_staleness=1, batch=2))
    with pytest.raises(ConfigError, match=r"Config\.groups\.batch: needs Config\.groups\.max_staleness"):
        Config(url=URL, repeats=2, groups=Groups(batch=2))
    assert grouped(1, 2).policy_version == 0  # the first version, when none is given


@pytest.mark.parametrize(("max_staleness", "batch_groups"), [(0, 1), (1, 2), (2, 3)])
async def test_a_trainer_never_gets_a_group_more_than_k_versions_old_and_gets_every_group(
    autojump_clock: trio.testing.MockClock, max_staleness: int, batch_groups: int
):
    """A stand-in trainer: takes B groups a step, trains, then sets the next version."""
    agent = StandIn(lambda row: 1.0 + (row["id"] * 7 + row["_ng_rollout_index"]) % 5)
    tasks = 30
    received: list[int] = []
    version = 10
    config = grouped(max_staleness, batch_groups, policy_version=version)
    async with open_rollouts_in_trio(rows(tasks), config, transport=agent) as run:
        batch: list[Group] = []
        async for group in run.groups():
            sent = min(rollout.result[POLICY_VERSION]["sent"] for rollout in group.rollouts)
            assert version - sent <= max_staleness
            received.append(group.rollouts[0].result["id"])
            batch.append(group)
            if len(batch) == batch_groups:
                await trio.sleep(3)  # a training step
                batch = []
                version += 1
                run.set_policy_version(version)
    assert sorted(received) == list(range(tasks))


class MixedGroups(StandIn):
    """Rows whose id is a multiple of 3 fail their second rollout (422, not retried); rows whose id
    is 1 more answer the same reward in every rollout (uniform); the others one reward a rollout."""

    def __init__(self) -> None:
        super().__init__(lambda row: 1.0 + row["id"] % 4)

    async def _answer_row(self, request: ScriptedRequest) -> Reply:
        data = request.json()
        await trio.sleep(self.latency(data))
        rollout = data["_ng_rollout_index"]
        if data["id"] % 3 == 0 and rollout == 1:
            return scripted_reply(422, {"detail": "no"})
        reward = 1.0 if data["id"] % 3 == 1 else float(rollout)
        return scripted_reply(200, {"reward": reward, "id": data["id"]})


@pytest.mark.parametrize(("max_staleness", "batch_groups"), [(0, 1), (1, 2)])
async def test_groups_not_handed_out_give_their_place_to_those_after_them(
    autojump_clock: trio.testing.MockClock, max_staleness: int, batch_groups: int
):
    """The trainer of the test above, where groups fail or are dropped as uniform: it never gets
    those, so counted they would keep it waiting for a batch that never fills, and the run
    waiting for the version that batch would bring."""
    tasks = 30
    received: list[int] = []
    version = 0
    config = grouped(max_staleness, batch_groups, drop_uniform=True, retries=0)
    with trio.fail_after(10_000):  # a deadlock: the mock clock jumps here at once
        async with open_rollouts_in_trio(rows(tasks), config, transport=MixedGroups()) as run:
            batch: list[Group] = []
            async for group in run.groups():
                sent = min(rollout.result[POLICY_VERSION]["sent"] for rollout in group.rollouts)
                assert version - sent <= max_staleness
                received.append(group.rollouts[0].result["id"])
                batch.append(group)
                if len(batch) == batch_groups:
                    await trio.sleep(3)
                    batch = []
                    version += 1
                    run.set_policy_version(version)
    assert sorted(received) == [number for number in range(tasks) if number % 3 == 2]
    assert run.summary is not None
    assert run.summary["rollfilter"]["groups"] == {
        "kept": 10,
        "dropped_uniform": 10,
        "dropped_masked": 0,
        "incomplete": 10,
        "cancelled": 0,
    }


async def test_a_failed_row_is_no_group_to_admit(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 1.0)
    lines = ["not json", *(json.dumps(row) for row in rows(2))]
    async with open_rollouts_in_trio(lines, grouped(0, 2), transport=agent) as run:
        outcomes = [outcome async for outcome in run]
    assert sum(isinstance(outcome, Group) and outcome.ok for outcome in outcomes) == 2
    assert not any(isinstance(outcome, Failure) for outcome in outcomes)


async def test_a_row_waiting_on_a_rate_limit_when_paused_is_not_sent(autojump_clock: trio.testing.MockClock):
    agent = StandIn(lambda row: 0.1)
    config = Config(url=URL, concurrency=5, rates=Rates(rpm=60))
    async with open_rollouts_in_trio(rows(5), config, transport=agent) as run:
        await trio.sleep(0.5)
        assert len(agent.arrivals) == 1  # the rest wait on the limit, one a second
        run.pause()
        await trio.sleep(100)
        assert len(agent.arrivals) == 1
        run.resume()
        assert len([outcome async for outcome in run]) == 5
    assert len(agent.arrivals) == 5


async def test_rows_that_start_while_paused_wait_before_their_rate_limit(autojump_clock: trio.testing.MockClock):
    """Held before the limit, not after it: once resumed they are paced, not sent in a burst."""
    agent = StandIn(lambda row: 0.1)
    config = Config(url=URL, concurrency=5, rates=Rates(rpm=60))
    async with open_rollouts_in_trio(rows(5), config, transport=agent) as run:
        run.pause()  # before the first row is taken
        await trio.sleep(100)
        assert agent.arrivals == []
        run.resume()
        await trio.sleep(2.5)
        assert len(agent.arrivals) == 3  # one a second, after a burst of one
        assert len([outcome async for outcome in run]) == 5


async def test_a_run_steered_before_it_knows_its_agents_keeps_what_it_was_told():
    config = Config(url=URL, concurrency=8, adaptive=True)
    sink = ChannelSink(None)  # type: ignore[arg-type]  # nothing is sent
    run = Run(config, source=_RowFeed([]), sink=sink, transport=StandIn())
    run.set_concurrency(3)
    run.steering.pause()
    with pytest.raises(SteeringError, match="does not know its agents yet"):
        run.set_rate(rpm=60)
    await run.connect()
    assert run.engine is not None
    assert run.engine.concurrency == 3
    assert run.router is not None
    assert [agent.window.ceiling for agent in run.router.agents_named(None) if agent.window is not None] == [3]
    assert run.statistics().steering.paused
