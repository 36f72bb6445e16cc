"""The engine: the one nursery that takes jobs, sends them, and hands back what happened.

Up to `concurrency` workers each take a row, send it, hand back what happened, and take the
next. Backpressure is the limiter: a slot is acquired *before* the next job is read, and
given back only when the row's line has been written (the sink calls `release`), so rows
in memory are bounded by the concurrency however fast the input or slow the output.
Workers are started as rows keep them busy, a batch when none is left waiting, so a run
costs what it uses of its concurrency, not the bound itself.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol

import trio

from rollfilter.config import FailureLimit, Health, RecentLimit
from rollfilter.engine.client import Flight, JobClient, Waiting, internal_error_event
from rollfilter.engine.groups import ClosedGroup
from rollfilter.engine.judge import NotPersisted, judge
from rollfilter.engine.plan import Job, JobSource, describe
from rollfilter.engine.routing import Agent, Router
from rollfilter.engine.steering import StalenessGate, Steering
from rollfilter.engine.tally import Tally
from rollfilter.errors import ErrorKind
from rollfilter.figures.health import RecentShare
from rollfilter.figures.means import as_float
from rollfilter.formats.writers import Release
from rollfilter.outcomes import AttemptFailure
from rollfilter.redact import shown
from rollfilter.rows import field_value, is_masked
from rollfilter.stops import StopCause, StopControl

START_BATCH = 64  # workers started at once, when none is left waiting for a row
STATUS_OLDEST = 5  # rollouts in flight that a status names, oldest first


@dataclasses.dataclass(frozen=True, slots=True)
class InFlight:
    """One rollout taken and not ended, as a status shows it: in flight, or `waiting` to be sent."""

    source: str
    line: int
    task_index: Any
    rollout_index: int
    agent: str | None
    attempt: int  # this run's attempt at it, 1 for the first
    age_s: float  # since this run started sending it, its waits included
    # What it waits on, not sent: "pause", "rate limits" (its agent's, or under them a place among
    # the requests out) or "window" (its adaptive window); None while it is in flight.
    waiting: str | None = None


class RowSink(Protocol):
    """Where the engine hands each finished row: the sinks of `rollfilter.run.outputs`, the
    command's lines or the API's channel."""

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None: ...

    def failure(self, job: Job, failure: AttemptFailure, release: Release) -> None: ...

    def not_persisted(self, job: Job, attempts: int, release: Release) -> None:
        """A rollout the agent asked to keep nowhere (`_ng_no_persist`), after `attempts` requests:
        it leaves no line."""
        ...

    def group(self, closed: ClosedGroup, release: Release) -> None:
        """A group at its end (with `Config.groups`; see `rollfilter.engine.groups`)."""
        ...


class ResultStage(Protocol):
    """What takes a finished rollout in place of the sink: the groups of `rollfilter.engine.groups`."""

    def result(self, job: Job, result: dict[str, Any], latency: float, release: Release) -> None: ...

    def failure(self, job: Job, failure: AttemptFailure) -> None: ...


@dataclasses.dataclass(slots=True)
class Engine:
    """Runs every job from `planner` through `client` into `sink`, counting each in `tally`."""

    planner: JobSource
    router: Router
    client: JobClient
    sink: RowSink
    tally: Tally
    control: StopControl
    concurrency: int
    failure_limit: FailureLimit = dataclasses.field(default_factory=FailureLimit)
    health: Health = dataclasses.field(default_factory=Health)  # its limits stop the run
    on_event: Callable[[str], None] | None = None  # -v: one line per row event
    max_cost: float | None = None  # USD: the run stops once it has spent this much
    groups: ResultStage | None = None  # results held by group, counted when their group closes
    group_field: str | None = None  # a result must hold this numeric field (to tell uniform groups)
    waiting_rows: int = 0  # rows that may wait on a rate limit beside the `concurrency` in flight
    # Stop the run once a row has failed to connect to an agent judged down after its connections
    # failed for this many seconds (see `_check_unreachable`); None: never.
    unreachable_after: float | None = None
    steering: Steering = dataclasses.field(default_factory=Steering)  # the pause, the policy version
    staleness: StalenessGate | None = None  # with a staleness bound: which groups may be sent
    _in_flight: dict[Job, Flight] = dataclasses.field(default_factory=dict)  # sent or to be, in that order
    _limiter: trio.CapacityLimiter | None = None  # the slots of `concurrency`, once running
    _reading: trio.Lock = dataclasses.field(default_factory=trio.Lock)  # one worker at a time fills the planner
    _nursery: trio.Nursery | None = None
    _workers: int = 0  # running
    _most_workers: int = 0  # the rows that may be taken at once: no more workers than that
    _waiting: int = 0  # of the workers running, those without a row: waiting for a slot or for the planner

    def oldest_in_flight(self) -> tuple[InFlight, ...]:
        """The rollouts taken longest and not ended, oldest first (STATUS_OLDEST of them), as a
        status shows them; each says what it waits on, if it is not in flight."""
        now = time.monotonic()
        return tuple(
            InFlight(
                job.source,
                job.line,
                job.task_index,
                job.rollout_index,
                job.agent_name,
                attempt=flight.attempt,
                age_s=now - flight.since,
                waiting=flight.waiting.value if flight.waiting is not None else None,
            )
            for job, flight in itertools.islice(self._in_flight.items(), STATUS_OLDEST)
        )

    def taken_by_agent(self) -> collections.Counter[tuple[str | None, Waiting | None]]:
        """The rollouts taken and not ended now (those the staleness bound holds back aside), by
        their rows' agent names and what each waits on: None for those in flight."""
        return collections.Counter((job.agent_name, flight.waiting) for job, flight in self._in_flight.items())

    async def send_all(self) -> None:
        """Return when every job has ended, or when `control` stopped the run."""
        # The rows taken at once; with rate limits the client bounds the requests out among them.
        self._most_workers = self.concurrency + self.waiting_rows
        self._limiter = trio.CapacityLimiter(self._most_workers)
        with self.control.scope:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._start_workers()
        self._nursery = None

    def _start_workers(self) -> None:
        """Start a batch of workers, up to the rows that may be taken at once. Each batch runs in a
        scheduler step of its own, so a host loop (asyncio, for a guest run) gets turns between them."""
        assert self._nursery is not None
        assert self._limiter is not None
        batch = max(0, min(START_BATCH, self._most_workers - self._workers))
        for _ in range(batch):
            self._nursery.start_soon(self._worker, self._limiter, self._reading)
        self._workers += batch
        self._waiting += batch

    def set_concurrency(self, concurrency: int) -> None:
        """Bound the rows taken at once by `concurrency` from now on: a higher one lets more
        workers start, a lower one lets the excess finish (a slot freed is then not taken again)."""
        self.concurrency = concurrency
        if self._limiter is None:
            return
        self._most_workers = self._limiter.total_tokens = concurrency + self.waiting_rows
        if self._nursery is not None and not self._waiting:
            self._start_workers()

    async def _worker(self, limiter: trio.CapacityLimiter, reading: trio.Lock) -> None:
        # A worker that finishes a row takes the next one itself, in the same scheduler
        # step: in a burst of answers each slot is refilled at once, not after the whole
        # burst has been handled (the benchmark's scale scenario measures it).
        while True:
            slot = _Slot()
            try:
                limiter.acquire_on_behalf_of_nowait(slot)
            except trio.WouldBlock:
                await limiter.acquire_on_behalf_of(slot)  # the slot comes before the row: backpressure
            try:
                job = self.planner.next_job_nowait()  # the common case, without a coroutine
            except trio.WouldBlock:
                job = await self.planner.next_job(reading)
            release = functools.partial(limiter.release_on_behalf_of, slot)
            if job is None:
                release()
                self._workers -= 1
                self._waiting -= 1
                return
            self._waiting -= 1
            if not self._waiting and self._workers < self._most_workers:  # the next row would wait for one
                self._start_workers()
            self.tally.started()
            staleness = self.staleness
            if staleness is not None and job.failure is None:
                group = staleness.admits_now(job)  # asked in the order jobs are taken: the groups' numbering
                if group is not None:
                    await staleness.admit(group)
            route = job.failure or self.router.route(job.agent_name)
            if isinstance(route, AttemptFailure):
                self._fail(job, route, release)
                # A run of bad lines sends nothing: without this, a stop would not be
                # noticed until the buffered lines ran out.
                await trio.lowlevel.checkpoint()
            else:
                await self._run_job(job, route, release)
            self._waiting += 1

    async def _run_job(self, job: Job, agent: Agent, release: Release) -> None:
        started = trio.current_time()
        flight = self._in_flight[job] = Flight(time.monotonic())
        if self.on_event is not None:
            self.on_event(f"{describe(job)}: sent to agent {agent.name or shown(agent.replicas[0].url)}")
        try:
            answer = await self.client.send(job, agent, flight)
            if self.steering.version is not None or self.tally.metrics.spending is not None:
                self._stamp_and_spend(job, answer, flight)
            outcome = judge(job, answer, flight.attempt)
        except Exception as exc:  # a bug met by one row costs that row, never the run
            outcome = self._internal_failure(job, exc, flight.attempt)
        finally:
            del self._in_flight[job]
        if isinstance(outcome, AttemptFailure):
            if self.unreachable_after is not None:
                if self._cut_by_the_stop(agent, outcome):
                    release()  # cancelled, as the rows in flight are: --resume sends it
                    return
                self._check_unreachable(agent, outcome, self.unreachable_after)
            self._fail(job, outcome, release)
        elif isinstance(outcome, NotPersisted):
            self.tally.not_persisted(job)
            if self.on_event is not None:
                advice = "a resumed run runs it again"
                self.on_event(f"{describe(job)}: not persisted (the agent's _ng_no_persist); {advice}")
            self.sink.not_persisted(job, flight.attempt, release)
            if self.groups is not None:
                message = "the agent asked for this rollout not to be kept (_ng_no_persist)"
                self.groups.failure(job, AttemptFailure(ErrorKind.NOT_PERSISTED, message, attempts=flight.attempt))
            self._check_failure_limit()
        elif (
            self.group_field is not None
            and as_float(field_value(outcome, self.group_field)) is None
            and not is_masked(outcome, unhealthy=self.tally.mask_unhealthy)  # a masked one decides nothing
        ):
            message = f"the result has no number {self.group_field!r} to tell its group by"
            self._fail(
                job, AttemptFailure(ErrorKind.GROUP_FIELD, message, attempts=flight.attempt, answer=outcome), release
            )
        else:
            latency = trio.current_time() - started - flight.waited_s  # from sending, not from waiting to
            if self.on_event is not None:
                self.on_event(f"{describe(job)}: finished in {latency:.3f} s, reward {outcome.get('reward')}")
            if self.groups is not None:
                self.groups.result(job, outcome, latency, release)  # counted when its group closes
            else:
                self.tally.result(job, outcome, latency)
                self.sink.result(job, outcome, release)
        if self.tally.metrics.recent_unhealthy is not None:  # a limit on unhealthy or masked rollouts
            self._check_health_limits()

    def _stamp_and_spend(self, job: Job, answer: dict[str, Any] | AttemptFailure, flight: Flight) -> None:
        """With steering, stamp an answer (an unhealthy one's too) with the versions; with a
        budget, count what it cost."""
        answered = answer.answer if isinstance(answer, AttemptFailure) else answer
        if answered is None:
            return
        if self.steering.version is not None:
            self.steering.stamp(answered, flight.sent_version)
        if self.tally.metrics.spending is not None:
            self._spend(job, answered)

    def _spend(self, job: Job, answer: dict[str, Any]) -> None:
        """Count what an agent's answer cost (an agent-reported failure's too); stop at the budget."""
        spending = self.tally.metrics.spending
        assert spending is not None
        spending.add(job.agent_name, answer)
        if self.max_cost is not None and spending.total >= self.max_cost:
            self.control.stop(
                StopCause.LIMIT_REACHED, f"stopped after spending ${spending.total:.4f} of a ${self.max_cost:g} budget"
            )

    def _internal_failure(self, job: Job, exc: Exception, attempts: int) -> AttemptFailure:
        if self.on_event is not None:
            self.on_event(internal_error_event(job, exc))
        message = f"unexpected {type(exc).__name__} while handling this row"
        return AttemptFailure(ErrorKind.INTERNAL, message, attempts=attempts)

    def _fail(self, job: Job, failure: AttemptFailure, release: Release) -> None:
        self.tally.failure(job, failure)
        if self.on_event is not None:
            self.on_event(f"{describe(job)}: failed after {failure.attempts} attempts: {failure.kind.value}")
        self.sink.failure(job, failure, release)
        if self.groups is not None:
            self.groups.failure(job, failure)
        self._check_failure_limit()

    def _cut_by_the_stop(self, agent: Agent, failure: AttemptFailure) -> bool:
        """Whether `failure` is one more refused connection to an agent the run has stopped for:
        the rows that waited on it reach the bound together, and only the first is its failure."""
        return (
            self.control.cause is StopCause.AGENT_UNREACHABLE
            and failure.kind is ErrorKind.CONNECT
            and not agent.answered
        )

    def _check_unreachable(self, agent: Agent, failure: AttemptFailure, after: float) -> None:
        """Stop the run when `failure` ended a row on a connection to `agent`, and the agent is
        judged down (`Agent.unreachable`): no attempt of the run has got past connecting to it, each
        of its replicas has refused a connection, and its connections have failed a few times over
        `after` seconds. Its rows are sent again until then (the client holds them), so an agent
        down from the start is found then, not after every row of the input has failed the same
        way. A replica not yet refused may be up with its first episodes still running, and the
        agent then answers: its rows that failed are today's failures."""
        if failure.kind is not ErrorKind.CONNECT or not agent.unreachable(trio.current_time(), after):
            return
        urls = ", ".join(shown(replica.url) for replica in agent.replicas)
        who = f"agent {agent.name} ({urls})" if agent.name is not None else f"the agent at {urls}"
        reason = f"stopped: {who} refused or dropped every connection since the run began: {failure.message}"
        self.control.stop(StopCause.AGENT_UNREACHABLE, reason)

    def _check_health_limits(self) -> None:
        metrics = self.tally.metrics
        for limit, total, recent, what in (
            (self.health.max_unhealthy, metrics.unhealthy, metrics.recent_unhealthy, "unhealthy"),
            (self.health.max_masked, metrics.masked, metrics.recent_masked, "masked"),
        ):
            if limit is not None and recent is not None and _is_reached(limit, total, recent):
                reason = functools.partial(self._health_limit_reason, limit, what)
                self.control.stop(StopCause.UNHEALTHY, reason)
                return

    def _health_limit_reason(self, limit: RecentLimit, what: str) -> str:
        """Why a limit on unhealthy or masked rollouts stopped the run, naming the checks seen most."""
        metrics = self.tally.metrics
        if limit.count is not None:
            total = metrics.unhealthy if what == "unhealthy" else metrics.masked
            counts = f"after {total} {what} rollouts"
        else:
            recent = metrics.recent_unhealthy if what == "unhealthy" else metrics.recent_masked
            assert recent is not None
            counts = f"once {recent.count} of the last {len(recent)} ended rollouts were {what}"
        most = ", ".join(f"{check} ({count})" for check, count in metrics.unhealthy_by_check.most_common(3))
        seen = f"; the checks failed most: {most}" if most else ""
        return f"stopped {counts} (the limit: {limit.describe()}){seen}"

    def _check_failure_limit(self) -> None:
        metrics = self.tally.metrics
        if self.failure_limit.is_reached(metrics.failed + metrics.not_persisted, metrics.ended):
            self.control.stop(StopCause.LIMIT_REACHED, self._failure_limit_reason)

    def _failure_limit_reason(self) -> str:
        # Rows in flight when the limit was reached may fail before the stop lands: the
        # message quotes the counts as the summary gives them.
        metrics = self.tally.metrics
        counts = f"{metrics.failed} failed"
        if metrics.not_persisted:
            counts += f" and {metrics.not_persisted} not persisted"
        if self.failure_limit.fraction is not None:
            counts += f" rows of {metrics.ended} ended"
        else:
            counts += " rows"
        return f"stopped after {counts} (the limit: {self.failure_limit.describe()})"


def _is_reached(limit: RecentLimit, total: int, recent: RecentShare) -> bool:
    """Whether `total` rollouts of a kind reach `limit`'s count, or their share of the last WINDOW
    ended (`recent`) its fraction."""
    if limit.count is not None:
        return total >= limit.count
    share = recent.share()
    return share is not None and limit.fraction is not None and share >= limit.fraction


class _Slot:
    """A borrower for the limiter: a slot is taken by a worker and given back by a sink."""

    __slots__ = ()
