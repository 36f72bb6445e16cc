"""Request and token rate limits of an agent (`Config.rpm`, `Config.tpm`), for paid model APIs.

A limit is paced as GCRA paces it (the generic cell rate algorithm, a token bucket kept as one
time): requests leave at most at the limit's rate, with a burst of BURST_SECONDS of it at once.
Providers enforce their per-minute limits over shorter windows, so a minute's worth let through at
the start would be refused; a fifth of a second of burst keeps any one-second window within a
fifth over the rate, and a five-second one within 4%. Requests leave one at a time, each when the
clock says so: a scheduler that wakes late sends the next request later, never a burst to catch up.

Under a limit, the run's concurrency bounds the requests out at once, not the rows held
(`SendSlots`): rows waiting on a limit are held beside those in flight, up to `waiting_rows` of
them, so that an agent held back by its limit does not hold back the others, whose rows come after
its rows in the input. A request takes its slot once its limits let it go, and its limits are
checked again once it has it: it is sent when both say so, never in a burst of requests that
waited for slots.

Tokens are known only once a reply is back. Each request is charged the agent's mean tokens a
reply so far when it is sent, and the difference when its reply comes (a reply without usage is
charged the estimate and counted; a reply's count is believed up to a minute's budget). Until a
reply has told the tokens a reply takes there is no mean: one request goes at a time.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import trio

from rollfilter.figures.sums import running_mean

BURST_SECONDS = 0.2
WAITING_ROWS_AT_LEAST = 1024
MAX_TOKENS_A_REPLY = 10**12  # more than any reply: a number past it (or past floats) is not believed whole


def waiting_rows(concurrency: int) -> int:
    """How many rows may wait on a limit beside those in flight: four times the concurrency, and
    at least WAITING_ROWS_AT_LEAST (a waiting row holds its body, a few KB)."""
    return max(4 * concurrency, WAITING_ROWS_AT_LEAST)


class Pacer:
    """GCRA over `per_second` units a second, a burst of BURST_SECONDS' worth (at least one unit):
    `delay` says how long units would wait, `charge` takes them as they leave, `adjust` charges
    more (or gives back) afterwards. It does not wait itself: `RateLimits` orders the waiters."""

    def __init__(self, per_second: float) -> None:
        self._interval = 1.0 / per_second
        self._tolerance = max(1.0, BURST_SECONDS * per_second) * self._interval
        self._tat = -math.inf  # the theoretical time at which what was taken so far has left

    def due(self, cost: float) -> float:
        """When `cost` units may leave (a time past: at once). Units more than a burst's worth
        never fit in one: they may leave once everything taken before them has left."""
        return self._tat + min(cost * self._interval, self._tolerance) - self._tolerance

    def delay(self, now: float, cost: float) -> float:
        """How long `cost` units made `now` would wait."""
        return max(0.0, self.due(cost) - now)

    def charge(self, now: float, cost: float) -> None:
        self._tat = max(self._tat, now) + cost * self._interval  # from when they leave, late or not

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


class SendSlots:
    """Under rate limits, the run's concurrency bounds the requests out at once (`slots`), and rows
    are held beside them (`waiting_rows` more) while they wait on a limit: an agent held back by its
    limit does not hold back the others, whose rows come after its rows in the input."""

    def __init__(self, concurrency: int) -> None:
        self.slots = trio.CapacityLimiter(concurrency)
        self.waiting_rows = waiting_rows(concurrency)

    def take_now(self, request: object) -> bool:
        try:
            self.slots.acquire_on_behalf_of_nowait(request)
        except trio.WouldBlock:
            return False
        return True

    async def take(self, request: object) -> None:
        await self.slots.acquire_on_behalf_of(request)

    def give_back(self, request: object) -> None:
        self.slots.release_on_behalf_of(request)


class RateLimits:
    """An agent's `rpm` and `tpm` (either may be None), and what rows waited on them.

    Requests wait their turn in the order they came (one lock), each until every limit lets it
    go; it is charged as it leaves. With a token limit and no reply yet that told the tokens a
    reply takes, one request goes at a time (a probe): the rest wait for its reply."""

    def __init__(self, rpm: float | None, tpm: float | None) -> None:
        self.rpm, self.tpm = rpm, tpm
        self._requests = Pacer(rpm / 60.0) if rpm is not None else None
        self._tokens = Pacer(tpm / 60.0) if tpm is not None else None
        self._changed = trio.Event()  # set when the limits are changed: the waiters look again
        self._turn = trio.Lock()  # fair: requests leave in the order they came
        self.estimate: float | None = None  # mean tokens a reply, once one reported usage
        self._with_usage = 0
        self.without_usage = 0  # replies that reported no usage: charged the estimate
        self.waiting = 0  # requests waiting on a limit now
        self.waited_s = 0.0  # over every request, those cancelled while waiting included
        self._probe_out = False  # a request is out while the tokens a reply takes are unknown
        self._probe_back = trio.Event()

    async def acquire(self, out: SendSlots | None = None, request: object = None) -> float:
        """Wait until a request may go and, with `out`, take its slot there on behalf of `request`
        (the caller gives it back when the attempt ends); the tokens it was charged (corrected
        by `correct_charge`)."""
        now = trio.current_time()
        if not self.would_wait(now):  # the common case under a limit that does not bind: no lock
            if out is not None and not out.take_now(request):
                await out.take(request)  # in line with every other request for a place
                now = trio.current_time()
                if self.would_wait(now):  # the limit binds by now: wait for it without holding a place
                    out.give_back(request)
                    return await self._acquire_in_turn(now, out, request)
            return self._leave(now)
        return await self._acquire_in_turn(now, out, request)

    async def _acquire_in_turn(self, now: float, out: SendSlots | None, request: object) -> float:
        """`acquire` when the limits hold the request back: in turn, then a place among those out."""
        self.waiting += 1
        waited_until: float | None = None
        taken = False
        try:
            async with self._turn:
                while self._tokens is not None and self.estimate is None and self._probe_out:
                    await self._probe_back.wait()
                await self._until_due(self.estimate or 0.0)
                waited_until = trio.current_time()
                if out is not None:
                    await out.take(request)
                    taken = True
                    await self._until_due(self.estimate or 0.0)  # a reply settled meanwhile may have charged more
                return self._leave(trio.current_time())
        except BaseException:
            if taken:
                assert out is not None
                out.give_back(request)
            raise
        finally:
            self.waiting -= 1
            self.waited_s += (waited_until if waited_until is not None else trio.current_time()) - now

    def set(self, rpm: float | None, tpm: float | None) -> None:
        """New limits (None: none), in force for the requests waiting too. A limit changed starts
        afresh, with its burst; a token limit keeps the tokens a reply takes learnt so far."""
        if rpm != self.rpm:
            self.rpm, self._requests = rpm, Pacer(rpm / 60.0) if rpm is not None else None
        if tpm != self.tpm:
            self.tpm, self._tokens = tpm, Pacer(tpm / 60.0) if tpm is not None else None
        if self._tokens is None and self._probe_out:  # nothing waits on a probe without a token limit
            self._probe_out = False
            self._probe_back.set()
            self._probe_back = trio.Event()
        changed, self._changed = self._changed, trio.Event()
        changed.set()

    def _leave(self, now: float) -> float:
        """A request goes: it is charged the estimate (the tokens), and is the probe if there is none."""
        cost = self.estimate or 0.0
        for pacer, units in self._pacers(cost):
            pacer.charge(now, units)
        if self._tokens is not None and self.estimate is None:
            self._probe_out = True
        return cost

    async def _until_due(self, cost: float) -> None:
        """Sleep until every limit lets a request of `cost` tokens go."""
        while True:  # again after a wake: a settled reply may have charged more meanwhile
            now = trio.current_time()
            due = max((pacer.due(units) for pacer, units in self._pacers(cost)), default=now)
            if due <= now:  # times compared, not their difference: no wait rounds to nothing forever
                return
            with trio.move_on_at(due):
                await self._changed.wait()

    def correct_charge(self, charged: float, answer: Mapping[str, Any] | None) -> None:
        """Correct the tokens a request was charged (`charged`) to what its `answer` says it used
        (None: no 2xx answer), and learn from it the tokens a reply takes."""
        if self._tokens is None:
            return
        assert self.tpm is not None
        tokens = usage_tokens(answer)
        if tokens is None:
            if answer is not None:
                self.without_usage += 1
        else:
            # The agent's word, believed up to a minute's budget: a reply that says more (a bug, a
            # hostile server) would otherwise hold every request back for as long as it says.
            counted = min(float(min(tokens, MAX_TOKENS_A_REPLY)), self.tpm)
            self._with_usage += 1
            self.estimate = running_mean(self.estimate or 0.0, counted, self._with_usage)
            self._tokens.adjust(counted - charged)
        if self._probe_out:  # the probe is back: with usage the rest go, without it the next probe
            self._probe_out = False
            self._probe_back.set()
            self._probe_back = trio.Event()

    def would_wait(self, now: float) -> bool:
        """Whether a request made now would wait on a limit."""
        if self._turn.locked() or (self._probe_out and self.estimate is None):
            return True
        return any(pacer.delay(now, cost) > 0 for pacer, cost in self._pacers(self.estimate or 0.0))

    def _pacers(self, tokens: float) -> list[tuple[Pacer, float]]:
        pacers = [(self._requests, 1.0), (self._tokens, tokens)]
        return [(pacer, cost) for pacer, cost in pacers if pacer is not None]

    def figures(self) -> dict[str, Any]:
        """The summary's entry: the limits, the seconds requests waited on them, and with a token
        limit the estimate and the replies without usage."""
        figures: dict[str, Any] = {"rpm": self.rpm, "tpm": self.tpm, "waited_s": round(self.waited_s, 3)}
        if self.tpm is not None:
            figures["tokens_a_reply"] = None if self.estimate is None else round(self.estimate, 1)
            figures["replies_without_usage"] = self.without_usage
        return figures
