"""--adaptive: how many requests one agent may have in flight, found as the run goes.

Each agent gets a window, with `-j` as its ceiling. Agents front model servers, which meet
overload in two ways: some refuse (429, 503); most queue (latency rises, the rate stays flat)
and, far enough past their capacity, thrash (the rate falls). And rows differ: a harder row
takes longer, which is not overload. So latency alone never cuts the window; an experiment does.

- Start: the window doubles every PROBE_SECONDS until the first answer (a refusal comes back
  within milliseconds; an agent whose episodes take seconds still reaches a high ceiling in a
  fraction of a second). Then, as in TCP's slow start and BBR's startup, it grows to twice
  what has come back, at most twice the recent rate times the no-load latency, until a round
  brings no more answers than the one before.
- The no-load latency is the mean latency of a cohort: consecutive sends, measured once all
  are back, so long rows count as much as short ones. The first cohort met an idle agent;
  each drain measures another.
- Rounds (as long as the longest answer of the round before, within ROUND_SPAN no-load
  latencies) give the delivery rate and the mean latency. The window grows toward GAIN times
  rate x no-load latency (BBR: in flight = rate x minimum latency), and by a slot a round past
  it: short of capacity that is GAIN a round; at capacity, a small queue.
- A queue is suspected when the mean latency stays over QUEUE_FACTOR times the no-load
  latency (the queue estimate of Vegas and Gradient2), by more than the round's mix of long and
  short rows explains (QUEUE_SIGNIFICANT standard errors), for QUEUED_ROUNDS rounds. A drain halves
  the window, and compares the cohort sent after the cut with what a request saw before it
  (by Little's law: in flight over the rate). This is Envoy's min-RTT recalculation window,
  run when the queue estimate asks for it, not on a timer, so an agent that never queues never
  pays for it. Latency followed the window (by more than the spread of the cohort's rows can
  explain: a cohort of hard and easy rows is never judged on one lucky draw): the agent was
  queueing, and the window goes to GAIN x its rate before the drain x the new no-load latency
  (or drains again, if latency is still high). Latency stayed: the rows got harder; that is
  the new no-load latency, and the window goes back.
- Refusals (429, 503, a timeout, a failed connection) cut the window below what is in flight,
  once a round trip, and each refused request takes a slot more away. The level refused at is
  remembered: refused there again, the window goes just under it; it holds there
  PLATEAU_ROUNDS rounds (twice as long each time it is refused there again), then probes past
  it by one slot, two, four (as CUBIC and BBR probe), so a refusing agent is seldom refused and
  one that grew is found in a few rounds.

The window gates each attempt, not each row: a row waiting out a Retry-After holds a row
slot (-j) but no window slot, so the agent's capacity is spent on requests it can serve.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import math
from collections.abc import Callable

import trio

INITIAL_WINDOW = 8
MIN_WINDOW = 1.0
PROBE_SECONDS = 0.05  # before the first answer the window doubles this often; the shortest round
STARTUP_GROWTH = 1.25  # startup goes on while each round's rate grows by this factor
GAIN = 1.25  # the window aimed at: this times rate x no-load latency (capacity plus a small queue)
RATE_ROUNDS = 6  # the agent's rate: the median of this many rounds' (one odd round is not a trend)
ROUND_SPAN = 5.0  # a round lasts the longest answer of the round before, up to this many no-load latencies
ROUND_ANSWERS = 16  # a round needs this many answers: the mean of fewer is mostly which rows they were
QUEUE_FACTOR = 1.5  # mean latency this many times the no-load latency suggests a queue
QUEUED_ROUNDS = 2  # ... when it lasts this many rounds in a row (one round may be a few hard rows)
DRAIN_SHARE = 0.5  # a drain cuts the window to this share, to see whether latency follows
FOLLOWED = 0.7  # latency under this share of the latency before the drain: it followed the window
SIGNIFICANT = 3.0  # ... and by this many standard errors of the cohort's mean (rows of mixed lengths)
# A round over the queue estimate by this many standard errors of its mean suggests a queue: more
# than the drain's verdict asks, because a run tests every round (a hundred in half a minute). At 3,
# 24 s of lognormal rows on an agent with room met a false queue in about one trio scheduling
# order of eight; at 5, in none of 20, while a real queue is many times that over.
QUEUE_SIGNIFICANT = 5.0
DRAIN_PATIENCE = 10.0  # a drain gives up after this many latencies (a hung request, a stalled input)
BACKOFF = 0.9  # a refusal where none came before cuts the window to this share of what is in flight
PLATEAU_ROUNDS = 4  # rounds held just under the level refused at before probing past it ...
MAX_PLATEAU_ROUNDS = 16  # ... twice as many each time it is refused there again, up to this many


class Signal(enum.Enum):
    """What one finished attempt says about the agent's load."""

    KEPT_UP = "kept_up"  # an answer (its latency counts)
    OVERLOAD = "overload"  # 429, 503, a timeout, a failed connection
    NEUTRAL = "neutral"  # any other failure, or a cancelled attempt: says nothing about load


class _Phase(enum.Enum):
    BLIND = "blind"  # no answer yet: doubling on a timer
    STARTUP = "startup"  # doubling each round while the rate keeps growing
    STEADY = "steady"
    DRAIN = "drain"  # halved, to see whether latency follows the window


@dataclasses.dataclass(frozen=True, slots=True)
class WindowStats:
    final: int
    min: int
    max: int


@dataclasses.dataclass(slots=True)
class _Cohort:
    """Consecutive sends, measured once every one is back: their mean latency is fair to long
    and short rows alike (the answers of a moment are mostly the short rows)."""

    first_ticket: int
    size: int
    back: int = 0
    answers: int = 0
    latency_sum: float = 0.0
    latency_squares: float = 0.0

    def count(self, ticket: int, signal: Signal, latency: float) -> None:
        if self.first_ticket <= ticket < self.first_ticket + self.size:
            self.back += 1
            if signal is Signal.KEPT_UP:
                self.answers += 1
                self.latency_sum += latency
                self.latency_squares += latency * latency

    @property
    def complete(self) -> bool:
        return self.back >= self.size

    def mean(self) -> float | None:
        return self.latency_sum / self.answers if self.answers else None

    def least_mean(self, now: float, sent_at: float) -> float:
        """The least the cohort's mean can still come to, all sent by `sent_at`: each latency
        not back yet is at least the time since then."""
        waiting = self.size - self.back
        return (self.latency_sum + waiting * (now - sent_at)) / max(1, self.answers + waiting)

    def standard_error(self) -> float:
        """Of the mean: how far the mean of these rows may lie from the mean of all rows."""
        if self.answers < 2:
            return math.inf
        mean = self.latency_sum / self.answers
        variance = max(0.0, self.latency_squares / self.answers - mean * mean)
        return math.sqrt(variance / (self.answers - 1))


@dataclasses.dataclass(slots=True)
class _Drain:
    """A drain under way: what it cut, what it compares with, and the sends it measures."""

    phase_before: _Phase
    window_before: float
    latency_before: float
    rate_before: float
    cohort: _Cohort  # the sends just after the cut
    deadline: float
    cohort_sent_at: float | None = None  # when the cohort's last request was sent


class AdaptiveWindow:
    """Requests in flight to one agent, within a window that adapts to the agent's answers.

    `acquire()` waits for room in the window and returns the attempt's ticket;
    `release(ticket, signal, latency)` gives the room back and adapts the window, with
    `latency` the attempt's seconds from acquire to answer. Every acquire must be released.
    `on_change(old, new)` is called when the whole-number window changes.
    """

    def __init__(
        self,
        ceiling: int,
        *,
        initial: int = INITIAL_WINDOW,
        on_change: Callable[[int, int], None] | None = None,
    ) -> None:
        self.ceiling = ceiling
        self._window = float(min(initial, ceiling))
        self.in_flight = 0
        self._phase = _Phase.BLIND
        self._timing = False  # a waiter is timing the next blind doubling
        self._next_doubling: float | None = None
        self._tickets = 0
        self._answers = 0
        self._latency_sum = 0.0
        self._started = 0.0  # when the first answered request was sent
        self._recent_answers: collections.deque[float] = collections.deque()  # startup: times, over a no-load latency
        self._round_start = 0.0
        self._round_answers = 0
        self._round_latency = 0.0
        self._round_squares = 0.0  # of the latencies: the round's spread
        self._round_longest = 0.0
        self._round_length = PROBE_SECONDS
        self._rates: collections.deque[float] = collections.deque(maxlen=RATE_ROUNDS)
        self._last_rate = 0.0  # startup: the round before's rate
        self._no_load: float | None = None  # the no-load latency
        # The cohort whose mean becomes the no-load latency once it is all back: first, requests
        # that met an idle agent; later, a drain's, when its verdict came before its long rows.
        self._measuring: _Cohort | None = _Cohort(0, ROUND_ANSWERS)
        self._queued_rounds = 0
        self._easy_rounds = 0
        self._drain: _Drain | None = None
        self._refused_at: float | None = None  # the level the agent last refused at
        self._step = 1.0  # past the refused level, the next probe's size in slots
        self._plateau = 0  # rounds held at the refused level
        self._plateau_rounds = PLATEAU_ROUNDS  # how many, before the next probe past it
        self._cut_at = -float("inf")
        self._lot = trio.lowlevel.ParkingLot()
        self._on_change = on_change
        self.min_seen = self.max_seen = self.size

    @property
    def size(self) -> int:
        """Requests the window lets in flight now."""
        return max(1, int(self._window))

    def stats(self) -> WindowStats:
        return WindowStats(self.size, self.min_seen, self.max_seen)

    def set_ceiling(self, ceiling: int) -> None:
        """A new ceiling (the run's concurrency changed): a window over it comes down to it at
        once, letting what is in flight finish; under it, the window grows toward it as before."""
        self.ceiling = ceiling
        self._set(self._window)
        self._lot.unpark(count=max(0, self.size - self.in_flight))

    async def acquire(self) -> int:
        """Wait for room in the window; the attempt's ticket, for `release`."""
        while self.in_flight >= self.size:
            if self._phase is _Phase.BLIND and not self._timing:
                await self._wait_to_double()
            else:
                await self._lot.park()
        self.in_flight += 1
        if self._phase is _Phase.BLIND and not self._timing and self._lot.statistics().tasks_waiting:
            self._lot.unpark()  # someone must keep the doubling's time now
        self._tickets += 1
        drain = self._drain
        if drain is not None and self._tickets == drain.cohort.first_ticket + drain.cohort.size:
            drain.cohort_sent_at = trio.current_time()
        return self._tickets - 1

    async def _wait_to_double(self) -> None:
        now = trio.current_time()
        if self._next_doubling is None:
            self._next_doubling = now + PROBE_SECONDS
        self._timing = True
        try:
            with trio.move_on_at(self._next_doubling):
                await self._lot.park()
        finally:
            self._timing = False
        now = trio.current_time()
        if self._phase is _Phase.BLIND and now >= self._next_doubling:
            self._next_doubling = now + PROBE_SECONDS
            self._set(self._window * 2)
            self._lot.unpark(count=max(0, self.size - self.in_flight))

    def release(self, ticket: int, signal: Signal, latency: float) -> None:
        self.in_flight -= 1
        now = trio.current_time()
        first = self._measuring
        if first is not None:
            first.count(ticket, signal, latency)
            if first.complete:
                self._measuring = None
                mean = first.mean()
                if mean is not None:  # none answered (refused, timed out): keep what was known
                    self._no_load = mean
        drain = self._drain
        if drain is not None:
            drain.cohort.count(ticket, signal, latency)
        if signal is Signal.OVERLOAD:
            self._refused(now)
        elif signal is Signal.KEPT_UP:
            self._answered(now, latency)
        drain = self._drain
        if drain is not None:
            if drain.cohort.complete or now >= drain.deadline:
                self._judge(drain, now)
            elif drain.cohort_sent_at is not None:
                # The long rows of a cohort keep it out for long, with the window halved. Once
                # latency cannot have followed the window, whatever they take, the verdict is in.
                least = drain.cohort.least_mean(now, drain.cohort_sent_at)
                if least > FOLLOWED * drain.latency_before:
                    self._judge(drain, now, latency_stayed=least)
        self._lot.unpark(count=max(0, self.size - self.in_flight))

    def _answered(self, now: float, latency: float) -> None:
        if self._phase is _Phase.BLIND:
            self._phase = _Phase.STARTUP
            self._round_start = self._started = now - latency  # since that request was sent
        self._answers += 1
        self._latency_sum += latency
        if self._phase is _Phase.STARTUP:
            # Twice what has come back, as TCP's slow start doubles a round, but not on top of
            # what the blind doubling sent before anything came back; and at most twice the rate
            # so far times the no-load latency (BBR's startup bound). Until that is known, the
            # mean of the answers so far stands in: the short ones come first, so it errs low.
            no_load = self._no_load if self._no_load is not None else self._latency_sum / self._answers
            recent = self._recent_answers
            recent.append(now)
            while now - recent[0] > no_load:
                recent.popleft()
            rate = len(recent) / max(min(no_load, now - self._started), 1e-9)
            target = min(2.0 * self._answers, 2 * rate * no_load)
            if target > self._window:
                self._set(target)
        self._round_answers += 1
        self._round_latency += latency
        self._round_squares += latency * latency
        self._round_longest = max(self._round_longest, latency)
        if self._round_answers >= ROUND_ANSWERS and now - self._round_start >= self._round_length:
            self._end_round(now)

    def _end_round(self, now: float) -> None:
        rate = self._round_answers / max(now - self._round_start, 1e-9)
        answers = self._round_answers
        mean = self._round_latency / answers
        spread = math.sqrt(max(0.0, self._round_squares / answers - mean * mean) / max(1, answers - 1))
        # A round lasts as long as the longest answer of the round before, so that its answers are
        # a fair share of short and long rows, not the short ones alone; but a rare very long row
        # (or a deep queue) must not hold the next decision back for long.
        longest = self._round_longest
        if self._no_load is not None:
            longest = min(longest, ROUND_SPAN * self._no_load)
        self._round_length = max(PROBE_SECONDS, longest)
        self._round_start, self._round_answers, self._round_latency, self._round_longest = now, 0, 0.0, 0.0
        self._round_squares = 0.0
        self._rates.append(rate)
        if self._no_load is None or self._phase is _Phase.DRAIN:
            return  # nothing to compare with yet, or the drain's own requests decide
        # Rows that got easier lower the no-load latency; a round or two of easy rows does not.
        self._easy_rounds = self._easy_rounds + 1 if mean * QUEUE_FACTOR < self._no_load else 0
        if self._easy_rounds >= QUEUED_ROUNDS:
            self._no_load = mean
            self._easy_rounds = 0
        # Over the queue estimate by more than the round's own mix of long and short rows explains.
        queued = mean - QUEUE_FACTOR * self._no_load > QUEUE_SIGNIFICANT * spread
        self._queued_rounds = self._queued_rounds + 1 if queued else 0
        startup = self._phase is _Phase.STARTUP
        if self._queued_rounds >= (1 if startup else QUEUED_ROUNDS):
            self._start_drain(now, rate)
        elif startup:
            if rate < STARTUP_GROWTH * self._last_rate:  # more in flight brought no more answers
                self._phase = _Phase.STEADY
            self._last_rate = rate
        else:
            self._grow()

    def _grow(self) -> None:
        import statistics  # and fractions under it: loaded by an adaptive run, not at every start

        assert self._no_load is not None
        if self._refused_at is not None and self._window >= self._refused_at - 1:
            self._plateau += 1
            if self._plateau > self._plateau_rounds:
                self._set(self._window + self._step)
                self._step *= 2
            return
        # Below the target, straight to it; at it, one slot more a round, to find out whether the
        # agent has room (if not, latency climbs until a drain puts the window back).
        target = max(GAIN * statistics.median(self._rates) * self._no_load, self._window + 1)
        if self._refused_at is not None:
            target = min(target, self._refused_at - 1)
        if target > self._window:
            self._set(min(target, 2 * self._window))

    def _start_drain(self, now: float, rate: float, phase: _Phase | None = None) -> None:
        # The latency a request sent now would see, by Little's law: what is in flight over the
        # rate. The mean latency of the last rounds lags behind a queue that is still growing.
        latency = (self.in_flight + 1) / rate
        window_before = self._window
        size = max(int(window_before * DRAIN_SHARE), ROUND_ANSWERS)
        turns = 1 + size / max(1.0, window_before * DRAIN_SHARE)  # a small window sends its cohort in turns
        self._drain = _Drain(
            phase or self._phase,
            window_before,
            latency,
            rate,
            _Cohort(self._tickets, size),
            deadline=now + DRAIN_PATIENCE * turns * max(latency, PROBE_SECONDS),
        )
        self._phase = _Phase.DRAIN
        self._set(window_before * DRAIN_SHARE)

    def _judge(self, drain: _Drain, now: float, latency_stayed: float | None = None) -> None:
        """The drain's verdict; `latency_stayed` is the least the cohort's mean can come to,
        when that alone shows latency did not follow the window."""
        self._drain = None
        self._queued_rounds = 0
        self._easy_rounds = 0
        self._round_start, self._round_answers, self._round_latency, self._round_longest = now, 0, 0.0, 0.0
        self._round_squares = 0.0
        latency = latency_stayed if latency_stayed is not None else drain.cohort.mean()
        if latency is None or (latency_stayed is None and not drain.cohort.complete):  # gave up: nothing learnt
            self._phase = drain.phase_before
            self._set(drain.window_before)
            return
        assert self._no_load is not None
        fell_by = drain.latency_before - latency
        significant = latency_stayed is None and fell_by >= SIGNIFICANT * drain.cohort.standard_error()
        if latency > FOLLOWED * drain.latency_before or not significant:
            # Latency stayed: the rows got harder, and this is their no-load latency (at least,
            # until the cohort's long rows are back too).
            self._phase = drain.phase_before
            self._no_load = latency
            if latency_stayed is not None and self._measuring is None:
                self._measuring = drain.cohort
            self._set(drain.window_before)
        elif latency > QUEUE_FACTOR * self._no_load:
            # Latency followed the window down, and is still high: a queue at the drained window too.
            self._start_drain(now, drain.rate_before, drain.phase_before)
        else:
            # It fell, then stopped: the agent was queueing, and this is its no-load latency.
            # Aim at its rate before the drain (its capacity, or less if it thrashed); never under
            # the drained window, which has just been seen to hold no queue.
            self._phase = _Phase.STEADY
            self._no_load = min(self._no_load, latency)
            self._rates.clear()
            self._rates.append(drain.rate_before)
            self._set(min(drain.window_before, max(self._window, GAIN * drain.rate_before * latency)))

    def _refused(self, now: float) -> None:
        # One decision a round trip (what was sent before it is not news): refused at or above
        # the level it was refused at before, the agent's capacity is known, and the window goes
        # just under it (refused at the same level again, it waits twice as long before the next
        # probe); refused lower, the capacity fell, and the window is cut below what is in flight.
        # Each further refusal takes its own slot away, so a window past the capacity shrinks to
        # it as fast as the agent refuses.
        self._phase = _Phase.STEADY
        self._drain = None  # a refusal says more than a drain could
        level = min(self._window, self.in_flight + 1)
        round_trip = self._no_load if self._no_load is not None else PROBE_SECONDS
        if now - self._cut_at >= max(round_trip, PROBE_SECONDS):
            self._cut_at = now
            fell = self._refused_at is None or level < self._refused_at - 1
            again = not fell and self._refused_at is not None and level <= self._refused_at + 1
            self._plateau_rounds = min(2 * self._plateau_rounds, MAX_PLATEAU_ROUNDS) if again else PLATEAU_ROUNDS
            self._refused_at = level
            self._step = 1.0
            self._plateau = 0
            self._set(BACKOFF * level if fell else level - 1)
        else:
            self._refused_at = min(level, self._refused_at or level)
            self._set(self._window - 1)

    def _set(self, window: float) -> None:
        old = self.size
        self._window = min(float(self.ceiling), max(MIN_WINDOW, window))
        new = self.size
        if new != old:
            self.min_seen = min(self.min_seen, new)
            self.max_seen = max(self.max_seen, new)
            if self._on_change is not None:
                self._on_change(old, new)
