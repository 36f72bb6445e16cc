"""demo/agent.py: the demo agent's slots, queue, thrashing and schedule."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import pytest
import trio
import trio.testing

from rollfilter.demo import DemoAgent, DemoOptions
from tests.conftest import demo_row_body


def finish_times(agent: DemoAgent, starts: Sequence[float]) -> list[float]:
    """When each of the requests sent at `starts` (seconds) is answered, in virtual time."""
    done: list[float] = [0.0] * len(starts)

    async def one(i: int, at: float) -> None:
        await trio.sleep(at)
        answer = await agent.answer("POST", "/run", demo_row_body(None))
        assert isinstance(answer, tuple)
        assert answer[0] == 200
        done[i] = trio.current_time()

    async def scenario() -> None:
        async with trio.open_nursery() as outer:
            outer.start_soon(agent.run_timers)
            async with trio.open_nursery() as nursery:
                for i, at in enumerate(starts):
                    nursery.start_soon(one, i, at)
            outer.cancel_scope.cancel()

    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))
    return [round(t, 6) for t in done]


def test_the_demo_agents_slots_queue_requests_first_come_first_served():
    agent = DemoAgent(DemoOptions(latency=1.0, slots=2))
    assert finish_times(agent, [0.0, 0.0, 0.1, 0.2, 0.3]) == [1.0, 1.0, 2.0, 2.0, 3.0]
    assert agent.in_system == 0
    stats = trio.run(agent.answer, "GET", "/stats", b"")
    assert isinstance(stats, tuple)
    assert msgspec.json.decode(stats[2])["busy_s"] == 3.0  # from the first request to the last answer


def test_the_demo_agent_thrashes_past_twice_its_slots():
    """Six in the system with two slots: two past twice the slots, so episodes start 1 + 0.5 x 2/2 slower."""
    agent = DemoAgent(DemoOptions(latency=1.0, slots=2, thrash=0.5))
    # The first pair starts with six in the system (1.5 s); the next with four and the last with
    # two, no more than twice the slots (1 s each).
    assert sorted(finish_times(agent, [0.0] * 6)) == [1.5, 1.5, 2.5, 2.5, 3.5, 3.5]


def test_the_demo_agents_schedule_changes_its_slots():
    agent = DemoAgent(DemoOptions(latency=1.0, slots=1, schedule=((0.5, 3),)))
    # One slot until 0.5 s after the first request, then three: the two waiting start at 0.5,
    # and the one sent at 0.6 waits for the first to end.
    assert sorted(finish_times(agent, [0.0, 0.0, 0.0, 0.6])) == [1.0, 1.5, 1.5, 2.0]


def test_the_demo_agent_refuses_bad_slot_options(capsys):
    from rollfilter.demo import main

    for argv, message in [
        (["--slots", "4", "--capacity", "4"], "two kinds of server"),
        (["--schedule", "10=20"], "give one of them"),
        (["--slots", "4", "--schedule", "ten=20"], "is not T=N"),
        (["--slots", "4", "--schedule", "10=0"], "at least 1"),
        (["--slots", "0"], "at least 1"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
