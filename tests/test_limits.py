"""limits.py: requests and tokens a minute, paced, on trio's mock clock."""

from __future__ import annotations

import trio
import trio.testing

from rollfilter.limits import AgentLimits, Pacer, usage_tokens


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
    pacer = Pacer(3000 / 60)
    arrivals: list[float] = []

    async def request() -> None:
        await pacer.take(1)
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
    limits = AgentLimits(None, 600_000)  # 10,000 tokens a second
    answer = {"response": {"usage": {"total_tokens": 1000}}, "reward": 1.0}
    sent: list[float] = []

    async def row() -> None:
        charged = await limits.acquire()
        sent.append(trio.current_time())
        await trio.sleep(0.5)  # the episode
        limits.settle(charged, answer)

    async with trio.open_nursery() as nursery:
        for _ in range(300):
            nursery.start_soon(row)
    assert sent[1] - sent[0] >= 0.5  # the second waited for the first reply: there was no mean before it
    assert limits.estimate == 1000
    steady = sent[1:]
    assert (len(steady) - 1) / (steady[-1] - steady[0]) >= 9
    assert most_in_a_window(sent, 5.0) <= 60


async def test_a_reply_without_usage_is_charged_the_estimate_and_counted(autojump_clock: trio.testing.MockClock):
    limits = AgentLimits(60, 60_000)
    first = await limits.acquire()
    limits.settle(first, {"response": {"usage": {"input_tokens": 300, "output_tokens": 100}}})
    charged = await limits.acquire()
    assert charged == 400
    limits.settle(charged, {"reward": 1.0})  # no usage
    limits.settle(await limits.acquire(), None)  # no answer at all: not a reply
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
