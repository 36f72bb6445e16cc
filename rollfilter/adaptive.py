"""--adaptive: how many requests one agent may have in flight, found as the run goes.

Each agent gets a window, with `-j` as its ceiling. The design is TCP's, in brief:

- Start small and probe: while nothing says "too much", the window doubles every
  PROBE_SECONDS of wall time, not every round trip. Agents answer overload fast (a 429, a
  503, a refused connection), so an overshoot is caught within milliseconds; and an agent
  whose episodes take seconds still reaches a high ceiling in a fraction of a second.
- On overload (429, 503, a timeout, a failed connection), cut the window to BACKOFF times
  what is in flight, at most once per round trip (the requests already sent when the cut is
  decided are not a new signal), and each refused request takes one more slot away. Probing
  ends there.
- Latency climbing to twice its running baseline is a softer signal (longer episodes may be
  harder rows, not a busier agent): it cuts once per level, and probing only pauses.
- Otherwise, grow by about 1/16 of the window per round trip (at least one request), so a
  window cut by 10% is back within two round trips, and one probe in a few round trips
  finds out whether the agent's capacity has grown.

The window gates each attempt, not each row: a row waiting out a Retry-After holds a row
slot (-j) but no window slot, so the agent's capacity is spent on requests it can serve.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Callable

import trio

INITIAL_WINDOW = 8
MIN_WINDOW = 1.0
PROBE_SECONDS = 0.05  # while probing, the window doubles this often
BACKOFF = 0.9  # an overload cuts the window to this share of what is in flight
GROWTH_SHARE = 1 / 16  # the window grows by this share of itself per round trip once it has been cut
LATENCY_FACTOR = 2.0  # latency this many times its baseline is overload
SHORT_WEIGHT = 0.1  # the recent latency: an exponential average of about the last 10 answers
LONG_WEIGHT = 0.01  # the baseline: of about the last 100
LATENCY_SAMPLES = 20  # answers seen before latency is judged at all


class Signal(enum.Enum):
    """What one finished attempt says about the agent's load."""

    KEPT_UP = "kept_up"  # an answer (latency is judged too)
    OVERLOAD = "overload"  # 429, 503, a timeout, a failed connection
    NEUTRAL = "neutral"  # any other failure: says nothing about load


@dataclasses.dataclass(frozen=True, slots=True)
class WindowStats:
    final: int
    min: int
    max: int


class AdaptiveWindow:
    """Requests in flight to one agent, within a window that adapts to the agent's answers.

    `acquire()` waits for room in the window; `release(signal, latency)` gives the room back
    and adapts the window. `on_change(old, new)` is called when the whole-number window changes.
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
        self._probing = True
        self._timing = False  # a waiter is timing the next probe
        self._next_probe: float | None = None
        self._decided_at = -math.inf  # when the last cut was made
        self._short_latency: float | None = None
        self._baseline: float | None = None
        self._samples = 0
        self._lot = trio.lowlevel.ParkingLot()
        self._on_change = on_change
        self.min_seen = self.max_seen = self.limit

    @property
    def limit(self) -> int:
        return max(1, int(self._window))

    def stats(self) -> WindowStats:
        return WindowStats(self.limit, self.min_seen, self.max_seen)

    async def acquire(self) -> None:
        """Wait for room in the window (while probing, one waiter keeps the probe's time)."""
        while self.in_flight >= self.limit:
            if self._probing and not self._timing:
                await self._wait_to_probe()
            else:
                await self._lot.park()
        self.in_flight += 1
        if self._probing and not self._timing and self._lot.statistics().tasks_waiting:
            self._lot.unpark()  # someone must keep the probe's time now

    async def _wait_to_probe(self) -> None:
        now = trio.current_time()
        if self._next_probe is None:
            self._next_probe = now + PROBE_SECONDS
        self._timing = True
        try:
            with trio.move_on_at(self._next_probe):
                await self._lot.park()
        finally:
            self._timing = False
        now = trio.current_time()
        if self._probing and now >= self._next_probe:
            self._next_probe = now + PROBE_SECONDS
            self._set(self._window * 2)
            self._lot.unpark(count=max(0, self.limit - self.in_flight))

    def release(self, signal: Signal, latency: float | None = None) -> None:
        self.in_flight -= 1
        now = trio.current_time()
        if signal is Signal.KEPT_UP and latency is not None and self._latency_climbed(latency):
            self._brake(now)
        elif signal is Signal.OVERLOAD:
            self._cut(now)
        elif signal is Signal.KEPT_UP and not self._probing:  # while probing, the timer doubles it
            self._set(self._window + max(1.0, GROWTH_SHARE * self._window) / self._window)
        self._lot.unpark(count=max(0, self.limit - self.in_flight))

    def _cut(self, now: float) -> None:
        # Each overloaded request takes its own slot away, so a window past the agent's capacity
        # shrinks to it as fast as the agent refuses; the multiplicative cut backs off below it,
        # once per round trip (what was sent before the cut is not news).
        self._probing = False
        round_trip = self._baseline if self._baseline is not None else PROBE_SECONDS
        if now - self._decided_at >= max(round_trip, PROBE_SECONDS):
            self._decided_at = now
            self._set(BACKOFF * min(self._window, self.in_flight + 1))
        self._set(self._window - 1)

    def _brake(self, now: float) -> None:
        # Latency is a softer signal than a refusal: longer episodes may be harder rows, not a
        # busier agent. So it cuts once, and probing only waits a round trip, instead of ending.
        self._set(BACKOFF * min(self._window, self.in_flight + 1))
        if self._probing and self._baseline is not None:
            self._next_probe = now + max(self._baseline, PROBE_SECONDS)

    def _latency_climbed(self, latency: float) -> bool:
        self._samples += 1
        if self._short_latency is None or self._baseline is None:
            self._short_latency = self._baseline = latency
            return False
        self._short_latency += SHORT_WEIGHT * (latency - self._short_latency)
        self._baseline += LONG_WEIGHT * (latency - self._baseline)
        if self._samples <= LATENCY_SAMPLES or self._short_latency <= LATENCY_FACTOR * self._baseline:
            return False
        # One cut per level: the new latency becomes the baseline. If the agent was overloaded,
        # the smaller window brings latency back down; if its episodes just got longer (a harder
        # part of the data), nothing more is cut.
        self._baseline = self._short_latency
        return True

    def _set(self, window: float) -> None:
        old = self.limit
        self._window = min(float(self.ceiling), max(MIN_WINDOW, window))
        new = self.limit
        if new != old:
            self.min_seen = min(self.min_seen, new)
            self.max_seen = max(self.max_seen, new)
            if self._on_change is not None:
                self._on_change(old, new)
