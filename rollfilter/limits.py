"""Request and token rate limits of an agent (`Config.rpm`, `Config.tpm`), for paid model APIs.

A limit is paced as GCRA paces it (the generic cell rate algorithm, a token bucket kept as one
time): requests leave at most at the limit's rate, with a burst of BURST_SECONDS of it at once.
Providers enforce their per-minute limits over shorter windows, so a minute's worth let through at
the start would be refused; a fifth of a second of burst keeps any one-second window within a
fifth over the rate, and a five-second one within 4%. Requests leave one at a time, each when the
clock says so: a scheduler that wakes late sends the next request later, never a burst to catch up.

A request waiting on a limit gives its concurrency slot to the run while it waits (`SlotLending`,
up to `lent_slots` of them): an agent held back by its limit does not hold back the others, whose
rows come after its rows in the input. The rows waiting so are held in memory, which is why their
number is bounded.

Tokens are known only once a reply is back. Each request is charged the agent's mean tokens a
reply so far when it is sent, and the difference when its reply comes (a reply without usage is
charged the estimate and counted). Until a first reply is back there is no mean: the first request
goes alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import trio

from rollfilter.sums import running_mean

BURST_SECONDS = 0.2
LENT_SLOTS_AT_LEAST = 1024


def lent_slots(concurrency: int) -> int:
    """How many requests waiting on a limit may give their slot to the run: four times its
    concurrency, and at least LENT_SLOTS_AT_LEAST (a waiting request holds its row, a few KB)."""
    return max(4 * concurrency, LENT_SLOTS_AT_LEAST)


class Pacer:
    """GCRA over `per_second` units a second, a burst of BURST_SECONDS' worth (at least one unit).

    `take(cost)` waits until `cost` units may go, and reserves them at once, so that waiters leave
    in the order they came; `adjust(units)` charges more (or gives back) afterwards."""

    def __init__(self, per_second: float) -> None:
        self._interval = 1.0 / per_second
        self._tolerance = max(1.0, BURST_SECONDS * per_second) * self._interval
        self._tat = -math.inf  # the theoretical time at which what was taken so far has left
        self._turn = trio.Lock()  # fair: requests leave in the order they came

    def delay(self, now: float, cost: float) -> float:
        """How long a request of `cost` units made `now` would wait, without taking it."""
        return max(0.0, max(self._tat, now) + cost * self._interval - self._tolerance - now)

    async def take(self, cost: float) -> float:
        """Wait until `cost` units may go; the seconds waited."""
        started = trio.current_time()
        async with self._turn:
            wait = self.delay(trio.current_time(), cost)
            if wait > 0:
                await trio.sleep(wait)
            now = trio.current_time()
            self._tat = max(self._tat, now) + cost * self._interval  # from when it leaves, late or not
        return now - started

    def adjust(self, units: float) -> None:
        self._tat += units * self._interval


def usage_tokens(answer: Mapping[str, Any] | None) -> int | None:
    """The tokens an answer's `response.usage` reports (total, else input and output), or None."""
    response = answer.get("response") if answer is not None else None
    usage = response.get("usage") if isinstance(response, dict) else None
    if not isinstance(usage, dict):
        return None
    total = usage.get("total_tokens")
    if type(total) is int and total >= 0:
        return total
    parts = [usage.get("input_tokens"), usage.get("output_tokens")]
    if all(type(part) is int and part >= 0 for part in parts):
        return sum(parts)  # type: ignore[arg-type]
    return None


class SlotLending:
    """Lets a request waiting on a rate limit give its concurrency slot to the run: the run's
    limiter (`limiter`, set by the engine) gets one more token while it waits, up to `most`."""

    def __init__(self, most: int) -> None:
        self.most = most
        self.lent = 0
        self.limiter: trio.CapacityLimiter | None = None

    def lend(self) -> bool:
        """One slot more for the run while the caller waits; False when no more can be lent."""
        if self.limiter is None or self.lent >= self.most:
            return False
        self.lent += 1
        self.limiter.total_tokens += 1
        return True

    def give_back(self) -> None:
        assert self.limiter is not None
        self.lent -= 1
        self.limiter.total_tokens -= 1


class AgentLimits:
    """An agent's `rpm` and `tpm` (either may be None), and what rows waited on them."""

    def __init__(self, rpm: float | None, tpm: float | None, lending: SlotLending | None = None) -> None:
        self._lending = lending
        self.rpm, self.tpm = rpm, tpm
        self._requests = Pacer(rpm / 60.0) if rpm is not None else None
        self._tokens = Pacer(tpm / 60.0) if tpm is not None else None
        self.estimate: float | None = None  # mean tokens a reply, once one reported usage
        self._with_usage = 0
        self.without_usage = 0  # replies that reported no usage: charged the estimate
        self.waiting = 0  # requests waiting on a limit now
        self.waited_s = 0.0  # over every request
        self._first: trio.Event | None = trio.Event() if tpm is not None else None  # set once a reply is back
        self._first_out = False

    async def acquire(self) -> float:
        """Wait until a request may go; the tokens it was charged (settle them with `settle`)."""
        self.waiting += 1
        lent = self._lending is not None and self.held(trio.current_time()) and self._lending.lend()
        try:
            waited = 0.0
            if self._first is not None and not self._first.is_set():
                if self._first_out:
                    started = trio.current_time()
                    await self._first.wait()
                    waited += trio.current_time() - started
                else:
                    self._first_out = True
            charged = 0.0
            if self._tokens is not None:
                charged = self.estimate or 0.0
                waited += await self._tokens.take(charged)
            if self._requests is not None:
                waited += await self._requests.take(1)
            self.waited_s += waited
            return charged
        finally:
            self.waiting -= 1
            if lent:
                assert self._lending is not None
                self._lending.give_back()

    def settle(self, charged: float, answer: Mapping[str, Any] | None) -> None:
        """A request charged `charged` tokens has ended with `answer` (None: no 2xx answer)."""
        if self._tokens is None:
            return
        tokens = usage_tokens(answer)
        if tokens is None:
            if answer is not None:
                self.without_usage += 1
        else:
            self._with_usage += 1
            self.estimate = running_mean(self.estimate or 0.0, float(tokens), self._with_usage)
            self._tokens.adjust(tokens - charged)
        if self._first is not None and not self._first.is_set():
            self._first.set()

    def held(self, now: float) -> bool:
        """Whether a request made now would wait on a limit."""
        if self._first is not None and self._first_out and not self._first.is_set():
            return True
        return self.waiting > 1 or any(pacer.delay(now, cost) > 0 for pacer, cost in self._pacers())

    def _pacers(self) -> list[tuple[Pacer, float]]:
        pacers = [(self._requests, 1.0), (self._tokens, self.estimate or 0.0)]
        return [(pacer, cost) for pacer, cost in pacers if pacer is not None]

    def figures(self) -> dict[str, Any]:
        """The summary's entry: the limits, the seconds requests waited on them, and with a token
        limit the estimate and the replies without usage."""
        figures: dict[str, Any] = {"rpm": self.rpm, "tpm": self.tpm, "waited_s": round(self.waited_s, 3)}
        if self.tpm is not None:
            figures["tokens_a_reply"] = None if self.estimate is None else round(self.estimate, 1)
            figures["replies_without_usage"] = self.without_usage
        return figures
