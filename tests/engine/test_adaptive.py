"""adaptive.py: each agent's window on trio's MockClock."""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence

import trio
import trio.testing

from rollfilter.demo import DemoAgent, DemoOptions
from rollfilter.engine.adaptive import AdaptiveWindow, Signal
from tests.conftest import demo_row_body

RETRY_AFTER = 1.0


class Run:
    """`rows` rollouts through `agent` with `concurrency` rows in flight, each one's attempts
    gated by `window` (None: a fixed -j); a 429 is retried after RETRY_AFTER, as Retry-After asks.

    `latencies(i)` gives row i's episode length (None: the agent's --latency). `watch` is called
    every half second of the run with (seconds since the start, the window's limit).
    """

    def __init__(
        self,
        agent: DemoAgent,
        rows: int,
        concurrency: int,
        window: AdaptiveWindow | None,
        latencies: Callable[[int], float | None] = lambda i: None,
        watch: Callable[[float, int], None] | None = None,
    ) -> None:
        self.agent, self.rows, self.concurrency, self.window = agent, rows, concurrency, window
        self.latencies, self.watch = latencies, watch
        self.succeeded = 0
        self.elapsed = 0.0

    async def _row(self, i: int) -> None:
        row = demo_row_body(self.latencies(i))
        for _ in range(100):
            ticket = await self.window.acquire() if self.window is not None else 0
            started = trio.current_time()
            answer = await self.agent.answer("POST", "/run", row)
            assert isinstance(answer, tuple)
            signal = Signal.KEPT_UP if answer[0] == 200 else Signal.OVERLOAD
            if self.window is not None:
                self.window.release(ticket, signal, trio.current_time() - started)
            if answer[0] == 200:
                self.succeeded += 1
                return
            assert answer[0] == 429
            await trio.sleep(RETRY_AFTER)

    async def __call__(self) -> Run:
        rows = iter(range(self.rows))

        async def worker() -> None:
            for i in rows:
                await self._row(i)

        async def watcher(started: float) -> None:
            assert self.window is not None
            assert self.watch is not None
            while True:
                await trio.sleep(0.5)
                self.watch(trio.current_time() - started, self.window.size)

        started = trio.current_time()
        async with trio.open_nursery() as outer:
            outer.start_soon(self.agent.run_timers)
            if self.watch is not None:
                outer.start_soon(watcher, started)
            async with trio.open_nursery() as workers:
                for _ in range(self.concurrency):
                    workers.start_soon(worker)
            outer.cancel_scope.cancel()
        self.elapsed = trio.current_time() - started
        assert self.succeeded == self.rows  # no row failed
        return self

    @property
    def rate(self) -> float:
        return self.rows / self.elapsed


SCHEDULING_SEED = 0


def virtual(run: Run) -> Run:
    """`run` on a MockClock that jumps ahead whenever every task waits, its tasks in one fixed order.

    trio runs each batch of ready tasks in an order of its own random choosing. Here hundreds of
    tasks wake at the same virtual instants, so that order decides which answers the window sees
    first, and with them a run's length by a little: the bounds below would be statements about
    luck. trio's own test of its scheduler (trio/_tests/test_scheduler_determinism.py) makes the
    order a function of a seed through these two knobs; so does this, and every run of a scenario
    gives the same figures. The knobs are private: a trio without them fails here, never at random.
    """
    scheduler = trio._core._run
    allowed, state = scheduler._ALLOW_DETERMINISTIC_SCHEDULING, scheduler._r.getstate()
    scheduler._ALLOW_DETERMINISTIC_SCHEDULING = True
    scheduler._r.seed(SCHEDULING_SEED)
    try:
        return trio.run(run, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        scheduler._ALLOW_DETERMINISTIC_SCHEDULING = allowed
        scheduler._r.setstate(state)


def queueing(**changes: object) -> DemoAgent:
    """The issue's model server: 40 slots, 0.2 s episodes, a queue, thrashing past 80 in the system."""
    options: dict[str, object] = {"latency": 0.2, "slots": 40, "thrash": 0.2, **changes}
    return DemoAgent(DemoOptions(**options))  # type: ignore[arg-type]


def best_fixed(make_agent: Callable[[], DemoAgent], rows: int, sweep: Sequence[int], **kw: object) -> float:
    return max(virtual(Run(make_agent(), rows, j, None, **kw)).rate for j in sweep)  # type: ignore[arg-type]


def virtual_scenario(scenario: Callable[[], object]) -> None:
    trio.run(scenario, clock=trio.testing.MockClock(autojump_threshold=0))  # type: ignore[arg-type]


def test_a_queueing_thrashing_server_is_held_near_its_capacity():
    """-j 320 against 40 slots: a fixed -j 320 thrashes; the window holds what the slots serve."""
    # Long enough that start-up is a small share of the run and the window has settled for most of
    # it; a window that never drains or never learns a lower no-load latency still fails here.
    rows = 2000
    best = best_fixed(queueing, rows, (20, 40, 80, 160, 320))
    fixed_320 = virtual(Run(queueing(), rows, 320, None)).rate
    assert fixed_320 < 0.6 * best  # the scenario is a real test: the ceiling thrashes
    limits: list[int] = []
    adaptive = virtual(Run(queueing(), rows, 320, AdaptiveWindow(320), watch=lambda t, w: limits.append(w)))
    assert adaptive.rate >= 0.9 * best
    assert 40 <= statistics.median(limits) <= 80  # the slots kept full, short of thrashing


def test_the_window_follows_a_capacity_that_halves_and_comes_back():
    """Slots 40, then 20 from 6 s, then 40 again from 12 s: the ideal is the slots over 0.2 s, integrated."""
    limits: list[tuple[float, int]] = []
    window = AdaptiveWindow(320)
    run = Run(queueing(schedule=((6.0, 20), (12.0, 40))), 4000, 320, window, watch=lambda t, w: limits.append((t, w)))
    virtual(run)
    ideal_rows = 200 * 6 + 100 * 6 + 200 * (run.elapsed - 12)
    assert run.rows / ideal_rows >= 0.85
    during_20 = [w for t, w in limits if 9 <= t < 12]
    after = [w for t, w in limits if t >= 15]
    assert max(during_20) <= 2 * 20  # down with the slots, short of thrashing them
    assert min(after) >= 30  # and back up when they return


def test_a_refusing_agent_is_found_and_rarely_refused():
    """429 with Retry-After above 40 episodes at once, 0.2 s each, -j 400: ideal 200 rows/s."""
    agent = DemoAgent(DemoOptions(latency=0.2, capacity=40, retry_after=RETRY_AFTER))
    window = AdaptiveWindow(400)
    run = virtual(Run(agent, 4000, 400, window))
    assert run.rate >= 0.9 * 200
    assert agent.throttled <= 0.02 * agent.requests
    stats = window.stats()
    assert stats.max <= 2 * 40  # the blind doubling overshoots by at most a doubling
    assert 36 <= stats.final <= 42


def test_fixed_concurrency_over_the_capacity_is_refused_heavily():
    """The same agent without a window, for contrast: the scenario is a real test of the window."""
    agent = DemoAgent(DemoOptions(latency=0.2, capacity=40, retry_after=RETRY_AFTER))
    virtual(Run(agent, 2000, 400, None))
    assert agent.throttled > 0.5 * agent.requests


def test_a_refusing_agent_that_grows_is_followed_up():
    agent = DemoAgent(DemoOptions(latency=0.2, capacity=40, retry_after=RETRY_AFTER, schedule=((5.0, 80),)))
    limits: list[tuple[float, int]] = []
    window = AdaptiveWindow(400)
    virtual(Run(agent, 4000, 400, window, watch=lambda t, w: limits.append((t, w))))
    assert max(w for t, w in limits if t < 5) <= 45
    assert min(w for t, w in limits if t >= 9) >= 70


def test_a_refusing_agent_that_shrinks_is_followed_down():
    agent = DemoAgent(DemoOptions(latency=0.2, capacity=40, retry_after=RETRY_AFTER, schedule=((5.0, 20),)))
    limits: list[tuple[float, int]] = []
    window = AdaptiveWindow(400)
    virtual(Run(agent, 3000, 400, window, watch=lambda t, w: limits.append((t, w))))
    assert max(w for t, w in limits if t >= 7) <= 22
    assert agent.throttled <= 0.02 * agent.requests


def test_a_healthy_agent_gets_the_ceiling_at_little_cost():
    window = AdaptiveWindow(1000)
    run = virtual(Run(DemoAgent(DemoOptions(latency=2.0)), 10_000, 1000, window))
    assert window.stats().final == 1000
    assert run.elapsed <= 1.03 * 20.0  # within 3% of a fixed -j 1000 (ten waves of 2 s)


def test_long_episodes_get_the_ceiling():
    window = AdaptiveWindow(500)
    run = virtual(Run(DemoAgent(DemoOptions(latency=30.0)), 2000, 500, window))
    assert window.stats().final == 500
    assert run.elapsed <= 1.03 * 120.0


def test_latency_noise_is_not_taken_for_a_queue():
    """Episode lengths drawn at random over a wide spread (lognormal: some rows 10x the median)."""
    rng = random.Random(1)
    lengths = [rng.lognormvariate(math.log(0.2), 1.0) for _ in range(12_000)]
    fixed = virtual(Run(DemoAgent(), 12_000, 200, None, latencies=lengths.__getitem__))
    limits: list[tuple[float, int]] = []
    window = AdaptiveWindow(200)
    adaptive = virtual(
        Run(DemoAgent(), 12_000, 200, window, latencies=lengths.__getitem__, watch=lambda t, w: limits.append((t, w)))
    )
    # The window starts low and reaches the ceiling in about a second (4% of this run). In some
    # orders of trio's scheduler (other seeds) a round of noise looks like a queue: the drain that
    # finds none halves the window for about a second. One such is within these bounds; the defect
    # they guard against (the window at half for 5 s, and 1.12 to 1.16 times the fixed -j) is not.
    assert adaptive.elapsed <= 1.07 * fixed.elapsed
    steady = [w for t, w in limits if 3 <= t < adaptive.elapsed - 3]
    assert sum(w == 200 for w in steady) >= 0.9 * len(steady)  # at the ceiling, and kept there


def test_a_noisy_scenario_gives_the_same_figures_in_every_run():
    """What lets the bounds here be tight: without `virtual`'s fixed order of tasks, each run of
    this scenario ends at another virtual time. The scheduler's generator is left in another state
    before each run, as the tests that ran before leave it: only `virtual`'s seed makes them agree."""
    rng = random.Random(1)
    lengths = [rng.lognormvariate(math.log(0.2), 1.0) for _ in range(1000)]
    generator = trio._core._run._r
    state = generator.getstate()

    def figures(earlier: int) -> tuple[float, object]:
        generator.seed(earlier)
        window = AdaptiveWindow(200)
        run = virtual(Run(DemoAgent(), 1000, 200, window, latencies=lengths.__getitem__))
        return run.elapsed, window.stats()

    try:
        assert len({figures(earlier) for earlier in range(3)}) == 1
    finally:
        generator.setstate(state)


def test_latency_noise_on_a_queueing_server_still_finds_its_capacity():
    rng = random.Random(2)
    lengths = [rng.lognormvariate(math.log(0.2), 1.0) for _ in range(6000)]
    best = best_fixed(queueing, 6000, (40, 80), latencies=lengths.__getitem__)
    window = AdaptiveWindow(320)
    adaptive = virtual(Run(queueing(), 6000, 320, window, latencies=lengths.__getitem__))
    assert adaptive.rate >= 0.9 * best


def test_episodes_of_mixed_lengths_are_not_taken_for_overload():
    """Harder rows on an agent with room to spare: mixed at random, then a harder second half, then
    an easier one. None is congestion, and the window keeps to the ceiling."""
    rng = random.Random(3)
    mixed = [rng.choice((0.01, 0.01, 0.01, 0.01, 0.3)) for _ in range(6000)]
    for name, lengths in {
        "mixed": mixed.__getitem__,
        "harder second half": lambda i: 0.01 if i < 3000 else 0.3,
        "easier second half": lambda i: 0.3 if i < 3000 else 0.01,
    }.items():
        fixed = virtual(Run(DemoAgent(), 6000, 64, None, latencies=lengths))
        window = AdaptiveWindow(64)
        adaptive = virtual(Run(DemoAgent(), 6000, 64, window, latencies=lengths))
        assert adaptive.elapsed <= 1.1 * fixed.elapsed, name
        assert window.stats().final == 64, name


def test_neutral_failures_leave_the_window_alone_and_changes_are_reported():
    changes: list[tuple[int, int]] = []

    async def scenario() -> None:
        window = AdaptiveWindow(64, initial=8, on_change=lambda old, new: changes.append((old, new)))
        for _ in range(5):
            window.release(await window.acquire(), Signal.NEUTRAL, 0.1)
        assert window.size == 8
        tickets = [await window.acquire() for _ in range(8)]  # a full window in flight; one is refused
        window.release(tickets.pop(), Signal.OVERLOAD, 0.01)
        assert window.size == 7  # cut below what was in flight (90% of 8)

    virtual_scenario(scenario)
    assert changes == [(8, 7)]


def test_the_window_never_passes_its_ceiling_or_lets_more_in():
    async def scenario() -> None:
        window = AdaptiveWindow(5, initial=2)
        most = 0

        async def use() -> None:
            nonlocal most
            for _ in range(20):
                ticket = await window.acquire()
                most = max(most, window.in_flight)
                assert window.in_flight <= window.size <= 5
                await trio.sleep(0.01)
                window.release(ticket, Signal.KEPT_UP, 0.01)

        async with trio.open_nursery() as nursery:
            for _ in range(10):
                nursery.start_soon(use)
        assert most == 5

    virtual_scenario(scenario)
