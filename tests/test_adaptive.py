"""The adaptive window alone, on trio's MockClock: scenarios in virtual time, no real sleeps."""

from __future__ import annotations

import dataclasses

import trio
import trio.testing

from rollfilter.adaptive import AdaptiveWindow, Signal


@dataclasses.dataclass
class Agent:
    """A stand-in agent: `latency` seconds an episode (or each row's own, from `latencies` in turn);
    above `capacity` in flight it answers 429 at once."""

    latency: float
    latencies: list[float] = dataclasses.field(default_factory=list)
    capacity: int | None = None
    in_flight: int = 0
    requests: int = 0
    throttled: int = 0
    most_in_flight: int = 0

    async def run(self, window: AdaptiveWindow | None) -> bool:
        if window is not None:
            await window.acquire()
        self.requests += 1
        if self.capacity is not None and self.in_flight >= self.capacity:
            self.throttled += 1
            await trio.sleep(0.001)
            if window is not None:
                window.release(Signal.OVERLOAD)
            return False
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        latency = self.latencies[self.requests % len(self.latencies)] if self.latencies else self.latency
        await trio.sleep(latency)
        self.in_flight -= 1
        if window is not None:
            window.release(Signal.KEPT_UP, latency)
        return True


async def collect(agent: Agent, rows: int, concurrency: int, window: AdaptiveWindow | None) -> float:
    """Run `rows` rollouts with `concurrency` rows in flight, each retried after a 1 s Retry-After."""
    rows_left = iter(range(rows))

    async def worker() -> None:
        for _ in rows_left:
            for _attempt in range(100):
                if await agent.run(window):
                    break
                await trio.sleep(1.0)  # the agent's Retry-After

    started = trio.current_time()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return trio.current_time() - started


def virtual(coroutine_function, *args):
    return trio.run(coroutine_function, *args, clock=trio.testing.MockClock(autojump_threshold=0))


def test_an_agent_that_throttles_above_40_is_found_and_kept_busy():
    """The issue's scenario: 429 above 40 in flight, 0.2 s episodes, 2,000 rows, -j 400: ideal 200 rows/s."""
    agent = Agent(latency=0.2, capacity=40)
    window = AdaptiveWindow(400)
    elapsed = virtual(collect, agent, 2000, 400, window)
    assert 2000 / elapsed >= 0.8 * 200
    assert agent.throttled <= 0.05 * agent.requests
    stats = window.stats()
    assert stats.max <= 2 * 40  # the probe overshoots by at most a doubling
    assert 30 <= stats.final <= 45


def test_fixed_concurrency_over_the_capacity_is_throttled_heavily():
    """The same agent without a window, for contrast: the scenario is a real test of the window."""
    agent = Agent(latency=0.2, capacity=40)
    virtual(collect, agent, 2000, 400, None)
    assert agent.throttled > 0.5 * agent.requests


def test_a_healthy_agent_gets_the_ceiling_at_little_cost():
    agent = Agent(latency=2.0)
    window = AdaptiveWindow(2000)
    elapsed = virtual(collect, agent, 20_000, 2000, window)
    assert window.stats().final == 2000
    assert agent.most_in_flight == 2000
    assert elapsed <= 1.05 * 20.0  # within 5% of a fixed -j 2000 (20 s)


def test_episodes_of_mixed_lengths_are_not_taken_for_overload():
    """Rows whose episodes differ (harder rows, later parts of the data) on an agent with room to spare."""
    for latencies in ([0.01] * 4 + [0.3], [0.01] * 200 + [0.3] * 200):  # mixed, then a harder second half
        fixed = virtual(collect, Agent(0, latencies=latencies), 1000, 64, None)
        window = AdaptiveWindow(64)
        adaptive = virtual(collect, Agent(0, latencies=latencies), 1000, 64, window)
        assert adaptive <= 1.2 * fixed, latencies[:6]
        assert window.stats().max == 64  # the ceiling, reached


def test_latency_climbing_past_its_baseline_shrinks_the_window():
    async def scenario() -> AdaptiveWindow:
        window = AdaptiveWindow(100)
        for _ in range(50):  # a steady agent
            await window.acquire()
            window.release(Signal.KEPT_UP, 0.1)
        before = window.limit
        for _ in range(20):  # then it slows down sharply
            await trio.sleep(0.5)
            await window.acquire()
            window.release(Signal.KEPT_UP, 1.0)
        assert window.limit < before
        return window

    virtual(scenario)


def test_neutral_failures_leave_the_window_alone_and_changes_are_reported():
    changes: list[tuple[int, int]] = []

    async def scenario() -> None:
        window = AdaptiveWindow(64, initial=8, on_change=lambda old, new: changes.append((old, new)))
        for _ in range(5):
            await window.acquire()
            window.release(Signal.NEUTRAL)
        assert window.limit == 8
        for _ in range(8):  # a full window in flight; one comes back throttled
            await window.acquire()
        window.release(Signal.OVERLOAD)  # probing ends: cut below what is in flight
        assert window.limit == 6
        for _ in range(7):  # the others come back fine: growth by successes from now on
            window.release(Signal.KEPT_UP, 0.1)
        assert window.limit == 7

    virtual(scenario)
    assert changes == [(8, 7), (7, 6), (6, 7)]


def test_the_window_never_passes_its_ceiling_or_lets_more_in():
    async def scenario() -> None:
        window = AdaptiveWindow(5, initial=2)
        inside = 0
        most = 0

        async def use() -> None:
            nonlocal inside, most
            for _ in range(20):
                await window.acquire()
                inside += 1
                most = max(most, inside, window.in_flight)
                assert window.in_flight <= window.limit <= 5
                await trio.sleep(0.01)
                inside -= 1
                window.release(Signal.KEPT_UP, 0.01)

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(use)
        assert most == 5

    virtual(scenario)


def test_the_command_finds_the_agents_capacity(start_demo):
    """End to end: a demo agent that throttles above 10 episodes at once; the window is seen in -v and the summary."""
    from tests.conftest import result_lines, rows_jsonl, run, simple_rows, summary_of

    agent = start_demo("--capacity", "10", "--latency", "0.05", "--retry-after", "0.2")
    proc = run(["-u", agent.url, "-j", "100", "--adaptive", "-v"], input=rows_jsonl(simple_rows(400)), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(result_lines(proc.stdout)) == 400
    stats = agent.stats()
    assert stats["throttled"] <= 0.1 * stats["requests"]
    windows = summary_of(proc.stderr)["rollfilter"]["windows"]
    assert set(windows) == {"(no name)"}
    assert windows["(no name)"]["max"] <= 2 * 10  # the probe overshoots by at most a doubling
    assert 5 <= windows["(no name)"]["final"] <= 15
    changes = [line for line in proc.stderr.decode().splitlines() if ": window " in line]
    assert changes
    assert changes[0].startswith("rollfilter: agent (no name): window 8 -> ")


def test_without_adaptive_the_same_agent_throttles_most_requests(start_demo):
    from tests.conftest import rows_jsonl, run, simple_rows

    agent = start_demo("--capacity", "10", "--latency", "0.05", "--retry-after", "0.2")
    run(["-u", agent.url, "-j", "100", "--retries", "1"], input=rows_jsonl(simple_rows(400)), timeout=120)
    stats = agent.stats()
    assert stats["throttled"] > 0.3 * stats["requests"]
