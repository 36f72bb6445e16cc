"""limits.py: requests and tokens a minute, paced, on trio's mock clock."""

from __future__ import annotations

import math

import pytest
import trio
import trio.testing

from rollfilter.config import Config, ConfigError, Rates
from rollfilter.engine.rate_limits import RateLimits, usage_tokens


def most_in_a_window(times: list[float], seconds: float) -> int:
    """The most arrivals any window of `seconds` holds (windows starting at an arrival)."""
    most = 0
    end = 0
    for start, at in enumerate(times):
        while end < len(times) and times[end] < at + seconds:
            end += 1
        most = max(most, end - start)
    return most


async def test_requests_a_minute_are_paced_with_a_small_burst(autojump_clock: trio.testing.MockClock):
    limits = RateLimits(3000, None)
    arrivals: list[float] = []

    async def request() -> None:
        await limits.acquire()
        arrivals.append(trio.current_time())

    async with trio.open_nursery() as nursery:
        for _ in range(500):
            nursery.start_soon(request)
    rate = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    assert abs(rate - 50) <= 0.05 * 50
    assert most_in_a_window(arrivals, 1.0) <= 60
    assert most_in_a_window(arrivals, 5.0) <= 262


async def test_tokens_are_charged_by_the_mean_so_far_and_the_first_request_goes_alone(
    autojump_clock: trio.testing.MockClock,
):
    limits = RateLimits(None, 600_000)  # 10,000 tokens a second
    answer = {"response": {"usage": {"total_tokens": 1000}}, "reward": 1.0}
    sent: list[float] = []

    async def row() -> None:
        charged = await limits.acquire()
        sent.append(trio.current_time())
        await trio.sleep(0.5)  # the episode
        limits.correct_charge(charged, answer)

    async with trio.open_nursery() as nursery:
        for _ in range(300):
            nursery.start_soon(row)
    assert sent[1] - sent[0] >= 0.5  # the second waited for the first reply: there was no mean before it
    assert limits.estimate == 1000
    steady = sent[1:]
    assert (len(steady) - 1) / (steady[-1] - steady[0]) >= 9
    assert most_in_a_window(sent, 5.0) <= 60


async def test_a_reply_without_usage_is_charged_the_estimate_and_counted(autojump_clock: trio.testing.MockClock):
    limits = RateLimits(60, 60_000)
    first = await limits.acquire()
    limits.correct_charge(first, {"response": {"usage": {"input_tokens": 300, "output_tokens": 100}}})
    charged = await limits.acquire()
    assert charged == 400
    limits.correct_charge(charged, {"reward": 1.0})  # no usage
    limits.correct_charge(await limits.acquire(), None)  # no answer at all: not a reply
    figures = limits.figures()
    assert figures["replies_without_usage"] == 1
    assert figures["tokens_a_reply"] == 400
    assert (figures["rpm"], figures["tpm"]) == (60, 60_000)


def test_usage_tokens_reads_the_total_or_its_parts():
    assert usage_tokens({"response": {"usage": {"total_tokens": 7, "input_tokens": 1}}}) == 7
    assert usage_tokens({"response": {"usage": {"input_tokens": 3, "output_tokens": 4}}}) == 7
    assert usage_tokens({"response": {"usage": {"input_tokens": 3}}}) is None
    assert usage_tokens({"response": {"usage": {"total_tokens": True}}}) is None
    assert usage_tokens({"response": "text"}) is None
    assert usage_tokens(None) is None


async def test_until_a_reply_tells_the_tokens_requests_go_one_at_a_time(autojump_clock: trio.testing.MockClock):
    limits = RateLimits(None, 600_000)
    sent: list[float] = []

    async def row(answer: dict | None) -> None:
        charged = await limits.acquire()
        sent.append(trio.current_time())
        await trio.sleep(1.0)  # the episode
        limits.correct_charge(charged, answer)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(row, {"reward": 1.0})  # no usage
        await trio.sleep(0.1)
        nursery.start_soon(row, None)  # no reply at all (a failed attempt)
        await trio.sleep(0.1)
        nursery.start_soon(row, {"response": {"usage": {"total_tokens": 1000}}})
        await trio.sleep(0.1)
        for _ in range(5):
            nursery.start_soon(row, {"response": {"usage": {"total_tokens": 1000}}})
    assert sent[:3] == [0.0, 1.0, 2.0]  # each alone: until the third, no reply told the tokens a reply takes
    assert all(at < 3.5 for at in sent[3:])  # then they go, paced: 10,000 tokens a second, 1,000 each
    assert limits.without_usage == 1


@pytest.mark.parametrize("reported", [10**400, 10**30, int(1e300)])
async def test_a_reply_claiming_absurd_usage_holds_the_agent_back_a_minute_at_most(
    autojump_clock: trio.testing.MockClock, reported: int
):
    limits = RateLimits(None, 600_000)
    charged = await limits.acquire()
    limits.correct_charge(charged, {"response": {"usage": {"total_tokens": reported}}})  # no OverflowError
    assert limits.estimate == 600_000
    start = trio.current_time()
    await limits.acquire()
    assert trio.current_time() - start <= 60.0
    assert math.isfinite(limits.waited_s)


async def test_a_limit_that_does_not_bind_waits_for_nothing(autojump_clock: trio.testing.MockClock):
    limits = RateLimits(1e300, None)

    async def in_turn(*_: object) -> float:
        raise AssertionError("a request its limit lets go took the way of one that waits (the lock)")

    limits._acquire_in_turn = in_turn  # type: ignore[method-assign]
    async with trio.open_nursery() as nursery:
        for _ in range(1000):
            nursery.start_soon(limits.acquire)
    assert limits.waited_s == 0.0
    assert trio.current_time() == 0.0


async def test_the_seconds_waited_count_a_wait_cut_short(autojump_clock: trio.testing.MockClock):
    limits = RateLimits(60, None)
    await limits.acquire()
    with trio.move_on_after(0.5):
        await limits.acquire()  # its turn was 1 s away: cancelled after half of it
    assert limits.waited_s == pytest.approx(0.5)
    assert limits.waiting == 0


@pytest.mark.parametrize("rate", [5e-324, 1e-320, 0.0009])
def test_a_rate_too_small_to_pace_is_refused(rate: float):
    with pytest.raises(ConfigError, match=r"^Config\.rates\.rpm: "):
        Config(url="http://127.0.0.1:9/run", rates=Rates(rpm=rate))
