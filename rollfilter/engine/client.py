"""How a row gets to its agent: one POST with retries, redirects, and every failure's kind.

Every failure becomes an `AttemptFailure` with an `ErrorKind`; nothing here raises for a row.
Header values are secrets: no message built here ever contains them.
"""

from __future__ import annotations

import dataclasses
import email.utils
import enum
import http
import math
import random
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx
import msgspec
import trio

from rollfilter.config import Config, is_decimal
from rollfilter.engine.adaptive import AdaptiveWindow, Signal
from rollfilter.engine.plan import Job, describe
from rollfilter.engine.rate_limits import SendSlots
from rollfilter.engine.routing import Agent, Replica, affinity_value, task_key
from rollfilter.engine.steering import Steering
from rollfilter.engine.tally import Tally
from rollfilter.errors import ErrorKind
from rollfilter.figures.health import failed_checks
from rollfilter.http import AgentTransport, CertificateError, Reply, origin_of
from rollfilter.outcomes import OVERLOAD_STATUSES, AttemptFailure, Retry
from rollfilter.redact import origin, printable, shown
from rollfilter.rows import HEALTH, decode_exact

BACKOFF_BASE = 0.5  # seconds before the first retry (times full jitter)
BACKOFF_CAP = 30.0  # the longest jittered pause between two attempts
ERROR_BODY_CHARS = 200  # how much of an error response's body a message quotes
# The longest wait a Retry-After header can ask for (a day is legal); --timeout, when
# shorter, bounds it too. Documented in the man page under --retries.
RETRY_AFTER_CAP = 120.0
MAX_REDIRECTS = 5  # 307/308 hops followed within one attempt
BUDGET_SPENT = "the agent's retry budget is spent"
TRUST_ADVICE = (
    "its CA is not trusted: give its CA certificates in a file (SSL_CERT_FILE=FILE does too), or skip the check"
)

_decode = msgspec.json.Decoder().decode


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header: delta-seconds or an HTTP date.
    Anything else (it is server text: "²" is a digit to Python) counts as no header."""
    if not value:
        return None
    value = value.strip()
    if is_decimal(value):
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
        if when.tzinfo is None:
            return None
        return max(0.0, when.timestamp() - (time.time() if now is None else now))
    except (TypeError, ValueError, OverflowError, IndexError):
        return None


def backoff_delay(attempt: int, rng: random.Random, retry_after: float | None = None) -> float:
    """Full-jitter exponential backoff before attempt `attempt + 1`, never under Retry-After
    (itself capped at RETRY_AFTER_CAP)."""
    jittered = rng.uniform(0, min(BACKOFF_CAP, BACKOFF_BASE * 2 ** min(attempt - 1, 64)))  # 2.0**1024 overflows
    return max(jittered, min(retry_after or 0.0, RETRY_AFTER_CAP))


class _Request:
    """An attempt, as the borrower of its slot among the requests out (SendSlots)."""

    __slots__ = ()


class Waiting(enum.Enum):
    """What a job taken from the input waits on before its request leaves: while it does, it is
    not in flight (its value is how a status names it)."""

    PAUSE = "pause"
    RATE_LIMITS = "rate limits"  # its agent's limits, or under limits a place among the requests out
    WINDOW = "window"  # its agent's adaptive window


class Flight:
    """A job taken: when (the engine's clock), the attempt under way, which the client counts as
    it makes them, and what it waits on before the attempt is sent, if anything. It is the one
    count of a job's attempts: the engine reads it for the status, and for the outcome of a job
    that did not fail in the client."""

    __slots__ = ("attempt", "sent_version", "since", "waited_s", "waiting")

    def __init__(self, since: float = 0.0) -> None:
        self.since = since
        self.attempt = 1
        self.waiting: Waiting | None = None  # None: sent, or between two attempts
        self.waited_s = 0.0  # how long it waited so, over its attempts: not sent, so not its latency
        self.sent_version: int | None = None  # the policy version when its last attempt was sent


async def _window_turn(window: AdaptiveWindow, flight: Flight) -> int:
    """Wait for room in an agent's adaptive window, `flight` counted meanwhile as waiting on it;
    the attempt's ticket."""
    flight.waiting = Waiting.WINDOW
    try:
        return await window.acquire()
    finally:
        flight.waiting = None


class JobClient(Protocol):
    """What the engine hands each routed job to: it returns the agent's answer or the failure,
    and counts the attempts it makes in `flight`."""

    async def send(self, job: Job, agent: Agent, flight: Flight | None = None) -> dict[str, Any] | AttemptFailure: ...


class AgentClient:
    """POSTs rows to agents through the transport, retrying what is worth retrying.

    The transport (which carries the request headers) is owned by the caller. Each attempt
    sent again is counted in `tally`, and said to `on_event` (-v) before its pause. `send` never
    raises for a row: an unexpected exception while sending it or handling its reply ends that
    row as an `internal` failure, and is said to `on_event` (its text may quote the server, so it
    is not put in the failure's message).
    """

    def __init__(
        self,
        config: Config,
        transport: AgentTransport,
        *,
        rng: random.Random | None = None,
        tally: Tally | None = None,
        on_event: Callable[[str], None] | None = None,
        send_slots: SendSlots | None = None,
        steering: Steering | None = None,
        unreachable_after: float | None = None,
    ) -> None:
        self._transport = transport
        self._unreachable_after = unreachable_after
        self._steering = steering if steering is not None else Steering()
        self._send_slots = send_slots  # under rate limits: what bounds the requests out at once
        self._retries = config.retries.count
        self._retry_statuses = config.retries.statuses
        self._timeout = config.timeout.attempt if config.timeout.attempt is not None else math.inf
        self._cross_origin_redirects = config.wire.cross_origin_redirects
        self._affinity_header = config.routing.affinity_header
        self._fail_unhealthy = config.health.unhealthy == "fail"
        # Re-scoring sends a saved response again: no retry or resumed run can change its verdict.
        self._unhealthy_retry = Retry.NEVER if config.reverify is not None else Retry.NOW
        self._rng = rng or random.Random()
        self._tally = tally
        self._on_event = on_event

    async def send(self, job: Job, agent: Agent, flight: Flight | None = None) -> dict[str, Any] | AttemptFailure:
        """Send `job`'s body until it succeeds or its retries are spent, counting the attempts in
        `flight`."""
        body = job.body
        row = f"{job.source}:{job.line}"  # how a warning from the transport names it
        task = task_key(job.task_index) if agent.placement is not None else None
        headers = ((self._affinity_header, affinity_value(job.task_index)),) if self._affinity_header else ()
        replica: Replica | None = None
        if flight is None:
            flight = Flight()
        steering = self._steering
        try:
            while True:
                attempt = flight.attempt
                if steering.paused:  # before the waits below, so that a paused row holds no window or charge
                    await self._paused(flight)
                window = agent.window
                ticket = await _window_turn(window, flight) if window is not None else 0
                limits, out = agent.rate_limits, self._send_slots
                request, charged = None, 0.0
                if limits is not None or out is not None:  # under rate limits only: no work on a plain run's path
                    request = _Request()
                    charged = await self._turn(agent, flight, request)
                if steering.paused:  # paused while this attempt waited: from here on nothing waits until it is sent
                    await self._paused(flight)
                if attempt == 1 and agent.budget is not None:
                    agent.budget.deposit()
                flight.sent_version = steering.version
                started = trio.current_time()  # nothing waits from here to the request: one reading of the clock
                replica = agent.pick(started, avoid=replica, task=task)
                replica.outstanding += 1
                replica.requests += 1
                signal = Signal.NEUTRAL  # a cancelled attempt says nothing about the agent
                answer: dict[str, Any] | None = None
                try:
                    outcome, retry_after = await self._attempt(replica.url, body, row, headers)
                    signal = load_signal(outcome)
                    answer = outcome if not isinstance(outcome, AttemptFailure) else outcome.answer
                finally:
                    replica.outstanding -= 1
                    if steering.paused:
                        steering.attempt_ended()
                    if window is not None:
                        window.release(ticket, signal, trio.current_time() - started)
                    if limits is not None:
                        limits.correct_charge(charged, answer)
                    if out is not None:
                        out.give_back(request)
                if got_past_connecting(outcome):
                    agent.answered = True
                if not isinstance(outcome, AttemptFailure):
                    unhealthy = self._judge_health(outcome)
                    if unhealthy is None:
                        if replica.cooldown:
                            replica.connection_worked()
                        return outcome
                    outcome = unhealthy
                replica.failures += 1
                if outcome.kind is ErrorKind.CONNECT:
                    agent.connection_failed(replica, trio.current_time(), sent=started)
                failure = outcome.with_attempts(attempt)
                delay = self._pause_before_retry(failure, agent, retry_after)
                if isinstance(delay, AttemptFailure):
                    return delay
                if self._tally is not None:
                    self._tally.retry(job, failure)
                if self._on_event is not None:
                    self._on_event(
                        f"{describe(job)}: retry in {delay:.2f} s after {failure.kind.value}: {failure.message}"
                    )
                flight.attempt = attempt + 1  # under way from the pause on, as the status shows it
                await trio.sleep(delay)
        except Exception as exc:  # one row's surprise must not end the run
            if self._on_event is not None:
                self._on_event(internal_error_event(job, exc))
            message = f"unexpected {type(exc).__name__} while sending the row or reading its reply"
            return AttemptFailure(ErrorKind.INTERNAL, message, attempts=flight.attempt)

    def _judge_health(self, answer: dict[str, Any]) -> AttemptFailure | None:
        """Mark `answer` with the health checks it fails (`_rf_health`), if any; with "fail", an
        unhealthy answer is a failure, returned, sent again as an HTTP 5xx is (when re-scoring, a
        terminal one). An answer that reports the agent's own failure, or asks to be kept nowhere,
        is judged by that instead."""
        if "_ng_failure_class" in answer or "_ng_no_persist" in answer:
            return None
        checks = failed_checks(answer)
        if checks is None:
            answer.pop(HEALTH, None)  # an earlier run's verdict, echoed with the row's fields
            return None
        answer[HEALTH] = checks
        if not self._fail_unhealthy:
            return None
        message = f"the result failed the health checks {', '.join(checks)}"
        return AttemptFailure(ErrorKind.UNHEALTHY, message, retry=self._unhealthy_retry, answer=answer)

    def _pause_before_retry(
        self, failure: AttemptFailure, agent: Agent, retry_after: float | None
    ) -> float | AttemptFailure:
        """How long to wait before sending the row again after `failure`, or the failure that ends
        the row: retries spent, or withheld by the agent's budget."""
        if failure.retry is not Retry.NOW:
            return failure
        attempt = failure.attempts
        until_judged = self._until_judged(failure, agent)
        if until_judged is None:  # else sent again beyond the retries and the budget
            if attempt > self._retries:
                return failure
            # With --adaptive, the agent's window paces the retries of a refusal (429, 503) itself:
            # the budget holds back the rest, as it does every retry without a window.
            paced = agent.window is not None and failure.status in OVERLOAD_STATUSES
            budget = agent.budget
            if budget is not None and not paced and not budget.withdraw():
                return budget_spent(failure, attempt)
        # --timeout bounds one attempt, and so the wait before the next one too.
        delay = min(backoff_delay(attempt, self._rng, retry_after), self._timeout)
        return min(delay, until_judged) if until_judged else delay

    def _until_judged(self, failure: AttemptFailure, agent: Agent) -> float | None:
        """When `failure` is a connection to an agent that has never answered and is not yet judged
        down (`Agent.unreachable`), in a run that stops for such an agent: the seconds until it may
        be judged (none left once only failures are missing). Else None.

        Such a row is sent again until then, beyond its retries and the budget: a burst of refusals
        at the start of a run (a listen backlog overflowing, a machine too loaded to accept) then
        fails no row of a live agent, and an agent that is down stops the run on time, after a few
        attempts, rather than on one burst; its rows wait meanwhile rather than fail one by one."""
        after = self._unreachable_after
        if after is None or failure.kind is not ErrorKind.CONNECT or agent.answered:
            return None
        now = trio.current_time()
        if agent.unreachable(now, after):
            return None
        assert agent.refused_since is not None, "a connection failed"
        return max(0.0, agent.refused_since + after - now)

    async def _paused(self, flight: Flight) -> None:
        """Wait out a pause, counted in `flight` as time waited."""
        flight.waiting, since = Waiting.PAUSE, trio.current_time()
        try:
            await self._steering.wait_unpaused()
        finally:
            flight.waiting = None
            flight.waited_s += trio.current_time() - since

    async def _turn(self, agent: Agent, flight: Flight, request: _Request) -> float:
        """Wait for the agent's rate limits, and under limits for a slot among the requests out
        (given back when the attempt ends), counting the wait in `flight`; the tokens the request
        was charged."""
        flight.waiting, since = Waiting.RATE_LIMITS, trio.current_time()
        try:
            if agent.rate_limits is not None:
                return await agent.rate_limits.acquire(self._send_slots, request)
            if self._send_slots is not None:
                await self._send_slots.take(request)
            return 0.0
        finally:
            flight.waiting = None
            flight.waited_s += trio.current_time() - since

    async def _attempt(
        self, url: httpx.URL, body: bytes, row: str | None = None, headers: tuple[tuple[str, str], ...] = ()
    ) -> tuple[dict[str, Any] | AttemptFailure, float | None]:
        """One attempt within --timeout: the POST (with `headers` besides the run's), and the
        307/308 redirects it is sent on to; its outcome, and the pause its reply asks for."""
        if self._timeout == math.inf:  # no bound, so no cancel scope: one is dear on a row's path (docs/benchmarks.md)
            return await self._post(url, body, row, headers)
        with trio.move_on_after(self._timeout):
            return await self._post(url, body, row, headers)
        message = f"no answer within {self._timeout:g} s"
        return AttemptFailure(ErrorKind.TIMEOUT, message, retry=Retry.NOW), None

    async def _post(
        self, url: httpx.URL, body: bytes, row: str | None, headers: tuple[tuple[str, str], ...]
    ) -> tuple[dict[str, Any] | AttemptFailure, float | None]:
        """The POST and the redirects it is sent on to, without a bound of their own."""
        target, credentials, status = url, True, 0
        for _ in range(MAX_REDIRECTS + 1):
            try:
                reply = await self._transport.post(target, body, credentials=credentials, row=row, headers=headers)
            except httpx.TransportError as exc:
                return transport_failure(target, exc), None
            status = reply.status
            if status not in (307, 308):
                return self._outcome(reply)
            moved = redirect_target(target, reply, cross_origin=self._cross_origin_redirects)
            if isinstance(moved, AttemptFailure):
                return moved, None
            if origin_of(moved) != origin_of(target):
                credentials = False  # as curl and httpx: Authorization stays with its origin
            elif credentials and not moved.userinfo and target.userinfo:
                moved = moved.copy_with(username=target.username, password=target.password)
            target = moved
        message = f"HTTP {status} {_reason_phrase(status)}: more than {MAX_REDIRECTS} redirects"
        return AttemptFailure(ErrorKind.HTTP_STATUS, message, status), None

    def _outcome(self, reply: Reply) -> tuple[dict[str, Any] | AttemptFailure, float | None]:
        status = reply.status
        content = reply.body
        if 200 <= status < 300:  # any 2xx carries the result, as NeMo Gym's raise_for_status has it
            if not content:
                message = f"HTTP {status} {_reason_phrase(status)}: a reply with no body, where a result was due"
                return AttemptFailure(ErrorKind.BAD_RESPONSE, message, status), None
            try:
                result = _decode(content)
            except msgspec.ValidationError:  # a number msgspec cannot hold: kept whole
                try:
                    result = decode_exact(content)
                except (ValueError, RecursionError):
                    message = f"{status} with a body that is not JSON: {_snippet(content)}"
                    return AttemptFailure(ErrorKind.BAD_RESPONSE, message, status), None
            except (msgspec.DecodeError, RecursionError):
                message = f"{status} with a body that is not JSON: {_snippet(content)}"
                return AttemptFailure(ErrorKind.BAD_RESPONSE, message, status), None
            if not isinstance(result, dict):
                message = f"{status} with a JSON body that is not an object"
                return AttemptFailure(ErrorKind.BAD_RESPONSE, message, status), None
            return result, None
        retry = Retry.NOW if status in self._retry_statuses else Retry.LATER
        retry_header = reply.header(b"retry-after") if retry is Retry.NOW else None
        retry_after = parse_retry_after(retry_header.decode("latin-1")) if retry_header else None
        message = f"HTTP {status} {_reason_phrase(status)}"
        location = reply.header(b"location") if 300 <= status < 400 else None
        if location is not None:
            message += f", Location: {_shown_location(location)}"
        if content:
            message += f": {_snippet(content)}"
        return AttemptFailure(ErrorKind.HTTP_STATUS, message, status, retry=retry), retry_after


def budget_spent(failure: AttemptFailure, attempts: int) -> AttemptFailure:
    """`failure`, after `attempts` requests, whose retry the agent's budget withheld: its message
    says what happened once (how many attempts, and why no more), as a line shows it whole."""
    tried = "not retried" if attempts == 1 else f"after {attempts} attempts, not retried again"
    return dataclasses.replace(failure, message=f"{failure.message} ({tried}: {BUDGET_SPENT})", budget_spent=True)


def got_past_connecting(outcome: dict[str, Any] | AttemptFailure) -> bool:
    """Whether an attempt's agent took the connection: anything but a connection refused, timed
    out or dropped before a reply. A certificate that fails its check is a connect failure too, but
    its server did answer the handshake (and it is the one connect failure not retried)."""
    if not isinstance(outcome, AttemptFailure) or outcome.kind is not ErrorKind.CONNECT:
        return True
    return outcome.retry is not Retry.NOW


def load_signal(outcome: dict[str, Any] | AttemptFailure) -> Signal:
    """What an attempt's outcome says about the agent's load, for --adaptive."""
    if not isinstance(outcome, AttemptFailure):
        return Signal.KEPT_UP
    if outcome.kind in (ErrorKind.TIMEOUT, ErrorKind.CONNECT) or outcome.status in OVERLOAD_STATUSES:
        return Signal.OVERLOAD
    return Signal.NEUTRAL


def transport_failure(url: httpx.URL, exc: httpx.TransportError) -> AttemptFailure:
    """What a transport error means for the row: its kind, and whether sending again can help."""
    if isinstance(exc, CertificateError):
        return AttemptFailure(ErrorKind.CONNECT, f"cannot connect to {origin(url)}: {exc} ({TRUST_ADVICE})")
    if isinstance(exc, (httpx.ConnectTimeout, httpx.ConnectError)):
        return AttemptFailure(ErrorKind.CONNECT, f"cannot connect to {origin(url)}: {exc}", retry=Retry.NOW)
    if isinstance(exc, httpx.RemoteProtocolError):  # the agent answered: sending again would replay the episode
        return AttemptFailure(ErrorKind.BAD_RESPONSE, f"{origin(url)}: {printable(str(exc))}")
    return AttemptFailure(ErrorKind.CONNECT, f"{origin(url)}: {printable(str(exc))}", retry=Retry.NOW)


def redirect_target(url: httpx.URL, reply: Reply, *, cross_origin: bool) -> httpx.URL | AttemptFailure:
    """Where a 307/308 reply to `url` sends the request, or why it is not followed."""
    status = f"HTTP {reply.status} {_reason_phrase(reply.status)}"
    location = reply.header(b"location")
    if location is None:
        return AttemptFailure(ErrorKind.HTTP_STATUS, f"{status} without a Location", reply.status)
    try:
        target = url.join(location.decode("latin-1").strip())
    except (httpx.InvalidURL, ValueError, UnicodeError):
        return AttemptFailure(ErrorKind.HTTP_STATUS, f"{status} to a Location that is not a URL", reply.status)
    if target.scheme not in ("http", "https") or not target.host:
        message = f"{status} to {_shown_location(location)}, which is not an http(s) URL"
        return AttemptFailure(ErrorKind.HTTP_STATUS, message, reply.status)
    if not cross_origin and origin_of(target) != origin_of(url):
        message = (
            f"{status} to another origin, {origin(target)} (cross-origin redirects are not followed):"
            f" Location: {shown(target)}"
        )
        return AttemptFailure(ErrorKind.HTTP_STATUS, message, reply.status)
    return target


def _shown_location(location: bytes) -> str:
    text = location.decode("latin-1").strip()
    try:
        return shown(httpx.URL(text))
    except (httpx.InvalidURL, ValueError, UnicodeError):
        return repr(text.split("?", 1)[0][:ERROR_BODY_CHARS])


def _reason_phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "error"


def _snippet(content: bytes) -> str:
    """The start of a body from the server, on one line, in quotes (as repr() quotes it, control
    characters escaped): quoted text is the server's, which the command line leaves as it is."""
    text = content[: ERROR_BODY_CHARS * 4].decode(errors="replace")
    text = " ".join(text.split())
    return repr(text[:ERROR_BODY_CHARS]) + ("..." if len(text) > ERROR_BODY_CHARS else "")


def internal_error_event(job: Job, exc: Exception) -> str:
    """The -v line for a row's unexpected error (its text may quote a server: escaped)."""
    return f"{describe(job)}: internal error: {type(exc).__name__}: {printable(str(exc))}"
