"""client.py: one row's attempts, retries, redirects and messages, over scripted transports and real servers."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httptools
import httpx
import pytest
import trio

from rollfilter.config import (
    DEFAULT_RETRY_STATUSES,
    Config,
    Wire,
)
from rollfilter.engine.budget import RetryBudget
from rollfilter.engine.client import (
    BACKOFF_CAP,
    MAX_REDIRECTS,
    RETRY_AFTER_CAP,
    AgentClient,
    backoff_delay,
    internal_error_event,
    parse_retry_after,
)
from rollfilter.engine.plan import Job
from rollfilter.engine.routing import UNREACHABLE_AFTER_FAILURES, Agent, Replica
from rollfilter.errors import ErrorKind
from rollfilter.http import BadReply, CertificateError, Reply
from rollfilter.outcomes import AttemptFailure
from tests.conftest import URL, closed_port_urls

BODY = b'{"id": 7}'


HANG = "hang"


@dataclasses.dataclass(frozen=True)
class Call:
    time: float
    url: httpx.URL
    body: bytes
    credentials: bool


Step = Reply | BaseException | str | Callable[[httpx.URL], Reply | BaseException]


class ScriptedTransport:
    """Answers each post with the next step of its script (the last one repeats): a Reply,
    an exception to raise, HANG, or a function of the URL giving either."""

    def __init__(self, *steps: Step) -> None:
        self.steps = list(steps)
        self.calls: list[Call] = []

    async def post(
        self,
        url: httpx.URL,
        body: bytes,
        *,
        credentials: bool = True,
        row: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Reply:
        self.calls.append(Call(trio.current_time(), url, body, credentials))
        step = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        if callable(step):
            step = step(url)
        if step == HANG:
            await trio.sleep_forever()
        if isinstance(step, BaseException):
            raise step
        assert isinstance(step, Reply)
        return step

    async def aclose(self) -> None:
        pass

    def gaps(self) -> list[float]:
        return [b.time - a.time for a, b in zip(self.calls, self.calls[1:], strict=False)]


def answer(status: int = 200, body: bytes = b'{"reward": 1.0}', **headers: str) -> Reply:
    raw = [(name.replace("_", "-").encode(), value.encode("latin-1")) for name, value in headers.items()]
    return Reply.whole(status, raw, body)


def job(body: bytes = BODY) -> Job:
    """A rollout of one row, as the planner makes them."""
    return Job(seq=0, source="<test>", line=1, task_index=0, rollout_index=0, row=None, body=body)


def agent(*urls: str) -> Agent:
    return Agent(None, [Replica(httpx.URL(url)) for url in urls or (URL,)])


async def send(transport: ScriptedTransport, config: Config | None = None, **options: Any) -> dict | AttemptFailure:
    client = AgentClient(config or Config(url=URL), transport, rng=random.Random(1), **options)
    return await client.send(job(), agent())


RETRIED_BY_DEFAULT = [408, 429, 500, 502, 503, 504]  # as the man page documents them, written out again


SECRET_URL = "http://us3r:pa55word@127.0.0.1:8000/run?key=k3y-value"


def test_the_default_retry_statuses_are_the_documented_ones():
    assert sorted(DEFAULT_RETRY_STATUSES) == RETRIED_BY_DEFAULT


@pytest.mark.parametrize("status", RETRIED_BY_DEFAULT)
async def test_each_default_retry_status_is_retried(status: int, autojump_clock):
    transport = ScriptedTransport(answer(status, b"busy"))
    failure = await send(transport, Config(url=URL, retries=2))
    assert isinstance(failure, AttemptFailure)
    assert (failure.kind, failure.status, failure.attempts) == (ErrorKind.HTTP_STATUS, status, 3)
    assert len(transport.calls) == 3


@pytest.mark.parametrize("status", [400, 401, 404, 409, 422, 501])
async def test_other_statuses_are_not_retried(status: int, autojump_clock):
    transport = ScriptedTransport(answer(status, b"no"))
    failure = await send(transport, Config(url=URL, retries=3))
    assert isinstance(failure, AttemptFailure)
    assert (failure.kind, failure.status, failure.attempts) == (ErrorKind.HTTP_STATUS, status, 1)
    assert len(transport.calls) == 1


async def test_a_retry_that_succeeds_returns_the_result(autojump_clock):
    transport = ScriptedTransport(answer(503), httpx.ConnectError("refused"), answer(200, b'{"reward": 0.5}'))
    assert await send(transport) == {"reward": 0.5}
    assert len(transport.calls) == 3


async def test_timeout_is_its_own_kind_and_is_retried(autojump_clock):
    transport = ScriptedTransport(HANG)
    failure = await send(transport, Config(url=URL, timeout=5, retries=1))
    assert isinstance(failure, AttemptFailure)
    assert failure.kind is ErrorKind.TIMEOUT
    assert failure.message == "no answer within 5 s"
    assert failure.attempts == 2
    assert transport.gaps()[0] >= 5


class DayLongTransport(ScriptedTransport):
    """Each reply a day after its request."""

    async def post(self, url: httpx.URL, body: bytes, **options: Any) -> Reply:
        await trio.sleep(86400)
        return await super().post(url, body, **options)


async def test_without_a_timeout_an_attempt_waits_as_long_as_the_agent_takes(autojump_clock):
    # Without a bound the attempt enters no cancel scope: it follows the redirect and waits out
    # the two day-long replies all the same, as it does under a bound longer than both.
    for timeout in (None, 2 * 86400 + 1):
        transport = DayLongTransport(answer(307, Location="/v2/run"), answer(200, b'{"reward": 0.5}'))
        start = trio.current_time()
        assert await send(transport, Config(url=URL, timeout=timeout)) == {"reward": 0.5}
        assert [str(call.url) for call in transport.calls] == [URL, URL.removesuffix("/run") + "/v2/run"]
        assert trio.current_time() - start == 2 * 86400


@pytest.mark.parametrize(
    ("error", "kind", "attempts"),
    [
        (httpx.ConnectError("Connection refused"), ErrorKind.CONNECT, 3),
        (httpx.ConnectTimeout("connecting took over 10 s"), ErrorKind.CONNECT, 3),
        (httpx.ReadError("connection lost: Connection reset by peer"), ErrorKind.CONNECT, 3),
        (BadReply("malformed reply: Invalid character in chunk size"), ErrorKind.BAD_RESPONSE, 1),
        (httpx.RemoteProtocolError("peer closed connection"), ErrorKind.BAD_RESPONSE, 1),
        (CertificateError("certificate verify failed: self-signed certificate"), ErrorKind.CONNECT, 1),
    ],
)
async def test_transport_errors_have_their_kind_and_only_the_worth_while_are_resent(
    error: Exception, kind: ErrorKind, attempts: int, autojump_clock
):
    transport = ScriptedTransport(error)
    failure = await send(transport, Config(url=URL, retries=2))
    assert isinstance(failure, AttemptFailure)
    assert (failure.kind, failure.attempts, len(transport.calls)) == (kind, attempts, attempts)


async def test_a_certificate_failure_says_how_to_trust_the_ca(autojump_clock):
    failure = await send(ScriptedTransport(CertificateError("certificate verify failed: self-signed certificate")))
    assert isinstance(failure, AttemptFailure)
    assert "self-signed certificate" in failure.message
    assert "(its CA is not trusted: give its CA certificates in a file" in failure.message
    assert "SSL_CERT_FILE" in failure.message


async def test_backoff_pauses_are_the_jittered_delays(autojump_clock):
    transport = ScriptedTransport(httpx.ConnectError("refused"))
    await send(transport, Config(url=URL, retries=3))
    rng = random.Random(1)
    expected = [backoff_delay(attempt, rng) for attempt in (1, 2, 3)]
    assert transport.gaps() == pytest.approx(expected)
    assert all(0 <= gap <= 0.5 * 2 ** (i) for i, gap in enumerate(transport.gaps()))


@pytest.mark.parametrize(
    ("retry_after", "bound", "pause"),
    [
        ("7", None, 7.0),
        ("86400", None, RETRY_AFTER_CAP),  # a day is legal; the wait is capped
        ("9" * 400, None, RETRY_AFTER_CAP),  # float("9" * 400) is inf
        ("86400", 10.0, 10.0),  # --timeout bounds the wait too
        ("7", 3.0, 3.0),
    ],
)
async def test_retry_after_sets_the_pause_capped_and_bounded_by_timeout(
    retry_after: str, bound: float | None, pause: float, autojump_clock
):
    transport = ScriptedTransport(answer(429, b"slow down", Retry_After=retry_after), answer(200))
    config = Config(url=URL, timeout=bound)
    assert await send(transport, config) == {"reward": 1.0}
    assert transport.gaps() == [pytest.approx(pause)]


async def test_retry_after_as_a_date(autojump_clock):
    when = datetime.now(UTC) + timedelta(seconds=40)
    transport = ScriptedTransport(answer(503, Retry_After=format_datetime(when, usegmt=True)), answer(200))
    assert await send(transport) == {"reward": 1.0}
    assert 35 <= transport.gaps()[0] <= 41


@pytest.mark.parametrize("value", ["²", "¹²", "-5", "1.5e3", " ", "Wed, 99 Foo 2026", "Mon, 01 Jan 99999 00:00:00 GMT"])
async def test_a_retry_after_that_does_not_parse_counts_as_none(value: str, autojump_clock):
    assert parse_retry_after(value) is None
    transport = ScriptedTransport(answer(503, Retry_After=value), answer(200))
    assert await send(transport) == {"reward": 1.0}
    assert transport.gaps()[0] <= 0.5  # the first back-off only


async def test_a_replica_whose_connections_fail_cools_down(autojump_clock):
    bad, good = (base + "/run" for base in closed_port_urls(2))
    transport = ScriptedTransport(lambda url: httpx.ConnectError("refused") if str(url) == bad else answer(200))
    client = AgentClient(Config(url=URL), transport, rng=random.Random(1))
    replicas = agent(bad, good)
    assert await client.send(job(), replicas) == {"reward": 1.0}
    assert [str(c.url) for c in transport.calls] == [bad, good]  # the failed replica is avoided for the retry
    transport.calls.clear()
    assert await client.send(job(), replicas) == {"reward": 1.0}
    assert [str(c.url) for c in transport.calls] == [good]  # cooling down: not tried at all
    await trio.sleep(replicas.replicas[0].cooldown + 0.01)
    transport.calls.clear()
    assert await client.send(job(), replicas) == {"reward": 1.0}
    assert [str(c.url) for c in transport.calls] == [bad, good]  # tried again once its cool-down is over
    assert replicas.replicas[0].cooldown == 2.0  # and it failed again: the cool-down doubles


@pytest.mark.parametrize(
    "error",
    [
        RuntimeError("boom"),
        httptools.HttpParserUpgrade("77"),
        UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"),
        KeyError("retry-after"),
    ],
)
async def test_anything_unexpected_fails_only_its_row_as_internal(error: Exception, autojump_clock):
    seen: list[str] = []
    transport = ScriptedTransport(error)
    client = AgentClient(Config(url=URL), transport, on_event=seen.append)
    row_7 = job()
    failure = await client.send(row_7, agent())
    assert isinstance(failure, AttemptFailure)
    assert failure.kind is ErrorKind.INTERNAL
    assert failure.attempts == 1
    assert type(error).__name__ in failure.message
    assert str(error) not in failure.message or not str(error)  # the detail goes to the -v line only
    assert seen == [internal_error_event(row_7, error)]


async def test_an_unexpected_reply_object_fails_its_row_without_a_callback(autojump_clock):
    class Broken(Reply):
        def header(self, name: bytes) -> bytes | None:
            raise ValueError("broken")

    reply = Broken.whole(503, [], b"")
    failure = await send(ScriptedTransport(reply))
    assert isinstance(failure, AttemptFailure)
    assert failure.kind is ErrorKind.INTERNAL


async def test_cancellation_is_not_swallowed(autojump_clock):
    client = AgentClient(Config(url=URL), ScriptedTransport(HANG))
    with trio.move_on_after(1) as scope:
        await client.send(job(), agent())
    assert scope.cancelled_caught


@pytest.mark.parametrize(
    "step",
    [
        httpx.ConnectError("Connection refused"),
        httpx.ConnectTimeout("connecting took over 10 s"),
        httpx.ReadError("connection lost"),
        BadReply("malformed reply"),
        CertificateError("certificate verify failed: self-signed certificate"),
        answer(500, b"oops"),
        answer(302, Location="http://us3r:pa55word@127.0.0.1:8000/elsewhere?key=k3y-value"),
        answer(307, Location="http://us3r:pa55word@10.9.9.9:8000/run?key=k3y-value"),
    ],
)
async def test_messages_never_show_url_credentials_or_query(step: Step, autojump_clock):
    transport = ScriptedTransport(step)
    client = AgentClient(Config(url=SECRET_URL, retries=0), transport)
    failure = await client.send(job(), agent(SECRET_URL))
    assert isinstance(failure, AttemptFailure)
    if not isinstance(step, Reply):
        assert "http://127.0.0.1:8000" in failure.message  # where it failed is shown...
    for secret in ("us3r", "pa55word", "k3y-value"):
        assert secret not in failure.message  # ...but never a secret of the URL


async def test_a_307_or_308_is_followed_with_the_same_body(autojump_clock):
    transport = ScriptedTransport(answer(307, Location="/run/"), answer(308, Location="/v2/run"), answer(200))
    assert await send(transport) == {"reward": 1.0}
    assert [str(c.url) for c in transport.calls] == [URL, URL + "/", "http://127.0.0.1:8000/v2/run"]
    assert all(c.body == BODY and c.credentials for c in transport.calls)


async def test_a_same_origin_redirect_keeps_url_credentials(autojump_clock):
    url = "http://u:p@127.0.0.1:8000/run"
    transport = ScriptedTransport(answer(307, Location="http://127.0.0.1:8000/run/"), answer(200))
    client = AgentClient(Config(url=url), transport)
    assert await client.send(job(), agent(url)) == {"reward": 1.0}
    assert (transport.calls[1].url.username, transport.calls[1].url.password) == ("u", "p")
    assert transport.calls[1].credentials


@pytest.mark.parametrize(
    ("url", "location"),
    [
        ("http://u:p@127.0.0.1/run", "http://127.0.0.1:80/run/"),  # the default port, written out
        ("https://u:p@127.0.0.1:443/run", "https://127.0.0.1/v2/run"),  # ... or left out
    ],
)
async def test_a_redirect_within_the_origin_however_written_keeps_credentials(url, location, autojump_clock):
    transport = ScriptedTransport(answer(307, Location=location), answer(200))
    assert await AgentClient(Config(url=url), transport).send(job(), agent(url)) == {"reward": 1.0}
    assert transport.calls[1].credentials


async def test_a_redirect_to_another_scheme_on_the_same_port_is_another_origin(autojump_clock):
    url = "http://u:p@127.0.0.1:443/run"
    transport = ScriptedTransport(answer(307, Location="https://127.0.0.1/run"), answer(200))
    config = Config(url=url, wire=Wire(cross_origin_redirects=True))
    assert await AgentClient(config, transport).send(job(), agent(url)) == {"reward": 1.0}
    assert not transport.calls[1].credentials


async def test_a_redirect_to_another_origin_is_followed_only_when_asked(autojump_clock):
    elsewhere = answer(307, Location="http://127.0.0.1:9000/run")
    transport = ScriptedTransport(elsewhere)
    failure = await send(transport)
    assert isinstance(failure, AttemptFailure)
    assert (failure.kind, failure.status, len(transport.calls)) == (ErrorKind.HTTP_STATUS, 307, 1)
    assert "(cross-origin redirects are not followed)" in failure.message
    assert "http://127.0.0.1:9000/run" in failure.message
    transport = ScriptedTransport(elsewhere, answer(200))
    assert await send(transport, Config(url=URL, wire=Wire(cross_origin_redirects=True))) == {"reward": 1.0}
    assert transport.calls[1].url == httpx.URL("http://127.0.0.1:9000/run")
    assert not transport.calls[1].credentials  # Authorization stays with its origin


async def test_other_redirects_fail_with_their_location(autojump_clock):
    transport = ScriptedTransport(answer(302, Location="/elsewhere"))
    failure = await send(transport)
    assert isinstance(failure, AttemptFailure)
    assert (failure.kind, failure.status, len(transport.calls)) == (ErrorKind.HTTP_STATUS, 302, 1)
    assert "Location: /elsewhere" in failure.message


async def test_redirects_are_followed_a_few_hops_at_most(autojump_clock):
    transport = ScriptedTransport(answer(307, Location="/run"))
    failure = await send(transport, Config(url=URL, retries=3))
    assert isinstance(failure, AttemptFailure)
    assert failure.kind is ErrorKind.HTTP_STATUS
    assert f"more than {MAX_REDIRECTS} redirects" in failure.message
    assert len(transport.calls) == MAX_REDIRECTS + 1


@pytest.mark.parametrize(
    ("location", "reason"),
    [(None, "without a Location"), ("ftp://127.0.0.1/x", "not an http(s) URL")],
)
async def test_a_redirect_that_cannot_be_followed_fails(location: str | None, reason: str, autojump_clock):
    reply = answer(308) if location is None else answer(308, Location=location)
    failure = await send(ScriptedTransport(reply))
    assert isinstance(failure, AttemptFailure)
    assert failure.kind is ErrorKind.HTTP_STATUS
    assert reason in failure.message


async def test_server_text_in_messages_has_control_characters_escaped(autojump_clock):
    hostile = b"\x1b[2J\x1b]0;pwned\x07 gone"
    failure = await send(ScriptedTransport(answer(500, hostile)), Config(url=URL, retries=0))
    assert isinstance(failure, AttemptFailure)
    assert "\x1b" not in failure.message
    assert "\x07" not in failure.message
    assert "\\x1b[2J" in failure.message
    failure = await send(ScriptedTransport(answer(302, Location="/a\x1b[2Jb")))
    assert isinstance(failure, AttemptFailure)
    assert "\x1b" not in failure.message
    failure = await send(ScriptedTransport(BadReply("a body in Content-Encoding \x1b[2J")), Config(url=URL))
    assert isinstance(failure, AttemptFailure)
    assert "\x1b" not in failure.message


@pytest.mark.parametrize("status", [200, 201, 202])
async def test_any_2xx_carries_the_result(status: int, autojump_clock):
    transport = ScriptedTransport(answer(status, b'{"reward": 0.5}'))
    assert await AgentClient(Config(url=URL), transport).send(job(), agent()) == {"reward": 0.5}


def test_backoff_stays_capped_past_a_thousand_retries():
    rng = random.Random(1)
    assert all(0 <= backoff_delay(attempt, rng) <= BACKOFF_CAP for attempt in (1, 64, 1025, 10**6))


@pytest.mark.parametrize("adaptive", [True, False])
async def test_an_adaptive_window_paces_refusals_the_budget_would_hold_back(adaptive: bool, autojump_clock):
    from rollfilter.engine.adaptive import AdaptiveWindow

    window = AdaptiveWindow(4) if adaptive else None
    paced = Agent(None, [Replica(httpx.URL(URL))], window, spent_budget())
    transport = ScriptedTransport(answer(429, b"busy"), answer(503, b"busy"), answer(200, b'{"reward": 1.0}'))
    client = AgentClient(Config(url=URL, retries=3), transport, rng=random.Random(1))
    outcome = await client.send(job(), paced)
    if adaptive:
        assert outcome == {"reward": 1.0}  # the window paced the refusals' retries itself
    else:
        assert isinstance(outcome, AttemptFailure)
        assert "retry budget is spent" in outcome.message
        assert len(transport.calls) == 1


def test_retry_after_seconds_and_dates():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = datetime(2026, 1, 1, tzinfo=UTC)
    date = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(date, now=now.timestamp()) == pytest.approx(30)


def test_backoff_is_jittered_capped_and_never_under_retry_after():
    rng = random.Random(0)
    delays = [backoff_delay(1, rng) for _ in range(200)]
    assert all(0 <= d <= 0.5 for d in delays)
    assert len(set(delays)) > 100
    assert all(backoff_delay(30, rng) <= 30 for _ in range(50))
    assert backoff_delay(1, rng, retry_after=2.0) >= 2.0


def spent_budget() -> RetryBudget:
    budget = RetryBudget(0.0)
    while budget.withdraw():
        pass  # the reserve spent: no retry may come from the budget
    return budget


async def test_an_agent_never_answered_is_tried_until_it_can_be_judged_down(autojump_clock):
    """In a run that stops for an agent that never answered, a connection failure to one not yet
    judged down is tried again, beyond the retries and the budget, until its connections have
    failed for `unreachable_after` seconds and a few times: then the row's failure returns."""
    transport = ScriptedTransport(httpx.ConnectError("Connection refused"))
    refusing = Agent(None, [Replica(httpx.URL(URL))], None, spent_budget())
    client = AgentClient(Config(url=URL, retries=0), transport, rng=random.Random(1), unreachable_after=10.0)
    failure = await client.send(job(), refusing)
    assert isinstance(failure, AttemptFailure)
    assert failure.kind is ErrorKind.CONNECT
    assert "budget" not in failure.message
    assert failure.attempts == len(transport.calls) >= UNREACHABLE_AFTER_FAILURES
    first, last = transport.calls[0].time, transport.calls[-1].time
    assert last - first == pytest.approx(10.0)  # refused over the whole bound, judged at its end
    assert refusing.unreachable(last, 10.0)
    assert not refusing.unreachable(last, 10.0 + last - first + 0.01)


async def test_an_agent_that_comes_up_within_the_bound_costs_no_row(autojump_clock):
    transport = ScriptedTransport(
        lambda url: httpx.ConnectError("Connection refused") if trio.current_time() < 6.0 else answer()
    )
    client = AgentClient(Config(url=URL, retries=0), transport, rng=random.Random(1), unreachable_after=10.0)
    assert await client.send(job(), Agent(None, [Replica(httpx.URL(URL))], None, spent_budget())) == {"reward": 1.0}
    assert len(transport.calls) > 2


@pytest.mark.parametrize(
    "step",
    [
        answer(503, b"busy"),  # an agent that answers a status answers: it is up
        httpx.ConnectError("Connection refused"),  # without the stop, the retries are as configured
    ],
)
async def test_only_an_agent_never_answered_in_a_run_that_stops_for_it_is_tried_beyond_the_retries(
    step: Step, autojump_clock
):
    transport = ScriptedTransport(step)
    after = 10.0 if isinstance(step, Reply) else None
    client = AgentClient(Config(url=URL, retries=1), transport, rng=random.Random(1), unreachable_after=after)
    answering = agent()
    failure = await client.send(job(), answering)
    assert isinstance(failure, AttemptFailure)
    assert failure.attempts == len(transport.calls) == 2
    assert answering.answered == isinstance(step, Reply)
