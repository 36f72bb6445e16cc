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
import enum
import functools
import itertools
import math
import time
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import trio

from rollfilter.config import FailureLimit
from rollfilter.engine.client import Flight, JobClient, Waiting
from rollfilter.engine.metrics import Metrics, as_float
from rollfilter.engine.plan import Job, JobSource
from rollfilter.engine.routing import Agent, Router
from rollfilter.engine.sinks import RowSink
from rollfilter.engine.steering import StalenessGate, Steering
from rollfilter.errors import ErrorKind
from rollfilter.figures.passk import TaskStats
from rollfilter.formats.spool import ResultSpool
from rollfilter.formats.writers import Release
from rollfilter.outcomes import AttemptFailure, Retry
from rollfilter.redact import printable, shown
from rollfilter.rows import AGENT_REF, ATTEMPT_INDEX, ROLLOUT_INDEX, TASK_INDEX, agent_name, field_value, is_masked

ERROR_REASON_CHARS = 200  # how much of an agent's failure_reason a message quotes
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


@dataclasses.dataclass(frozen=True, slots=True)
class RunStatus:
    """A run in progress, as a status block shows it: its counts, and the oldest rollouts taken
    and not ended (`rollfilter.engine.statistics.RunStatistics.status()` makes it from a run's
    snapshot). `in_flight` counts the rollouts sent and not ended; those taken and not sent are
    counted by what they wait on (the `waiting_on_` figures)."""

    done: int
    failed: int
    in_flight: int
    rows_per_s: float
    elapsed_s: float
    oldest: tuple[InFlight, ...]
    # Rows waiting on an agent's rate limit (Config.rpm, Config.tpm), or under them for a place
    # among the requests out.
    waiting_on_rate_limits: int = 0
    paused: bool = False  # no new request leaves (the run's pause)
    waiting_on_pause: int = 0  # rows taken and not sent because the run is paused
    waiting_on_window: int = 0  # rows waiting for room in their agent's adaptive window
    waiting_on_policy_version: int = 0  # rows whose group the staleness bound does not admit yet


class StopCause(enum.Enum):
    """Why a run was stopped before its rows ran out; the value is how the summary says it."""

    LIMIT_REACHED = "limit reached"  # the failure limit, or the budget
    INTERRUPTED = "interrupted"  # the signals the command line stops on
    TERMINATED = "terminated"
    HUNG_UP = "hung up"
    READER_GONE = "broken pipe"  # the reader of the results went away
    TARGET_REACHED = "target reached"  # as many groups written as Config.target_groups asks
    OUTPUT_FAILED = "output failed"  # an output could not be written
    AGENT_UNREACHABLE = "agent unreachable"  # an agent refused or dropped every connection since the start


class StopControl:
    """Stops a run from anywhere (a signal, a closed stdout, the failure limit).

    The first stop wins: its cause is the run's, and its reason is reported. A reason given as
    a function is asked when it is reported, so that counts it quotes include the rows that
    ended while the stop took effect.
    `scope` bounds the engine; `stoppable()` gives more scopes that a stop cancels too.
    """

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self._scopes = [self.scope]
        self.cause: StopCause | None = None
        self._reason: str | Callable[[], str] | None = None

    @property
    def reason(self) -> str | None:
        return self._reason() if callable(self._reason) else self._reason

    def stop(self, cause: StopCause, reason: str | Callable[[], str] | None = None) -> None:
        # A target reached ends the engine only: what follows a finished run (the aggregate) runs,
        # and a stop after it (a signal during the aggregate) is the run's.
        if self.cause is None or (self.cause is StopCause.TARGET_REACHED and cause is not StopCause.TARGET_REACHED):
            self.cause = cause
            self._reason = reason
        if cause is StopCause.TARGET_REACHED:
            self.scope.cancel()
        else:
            self.cancel()

    @property
    def stopped_early(self) -> bool:
        """Whether the run was stopped before its end (a target reached is an end)."""
        if self.cause is StopCause.TARGET_REACHED:
            return False
        return self.cause is not None or self.scope.cancel_called

    @property
    def why_stopped(self) -> str | None:
        """Why the run stopped, as its summary and its callers say it: the reason the stop gave,
        else its cause's own words, else that the caller left early; None when it was not stopped."""
        reason = self.reason
        if reason:
            return reason
        if self.cause is not None:
            return self.cause.value
        return "stopped early by the caller" if self.scope.cancel_called else None

    def cancel(self) -> None:
        """Cancel the engine and what runs after it, without a stop status (the caller left)."""
        for scope in self._scopes:
            scope.cancel()

    def stoppable(self) -> trio.CancelScope:
        """A cancel scope for work after the engine (the aggregate calls) that a stop cancels."""
        scope = trio.CancelScope()
        if self.stopped_early:
            scope.cancel()
        self._scopes.append(scope)
        return scope


class ResultStage(Protocol):
    """What takes a finished rollout in place of the sink: the groups of `rollfilter.engine.groups`."""

    def result(self, job: Job, result: dict[str, Any], latency: float, release: Release) -> None: ...

    def failure(self, job: Job, failure: AttemptFailure) -> None: ...


@dataclasses.dataclass(slots=True)
class Engine:
    """Runs every job from `planner` through `client` into `sink`, counting in `metrics`."""

    planner: JobSource
    router: Router
    client: JobClient
    sink: RowSink
    metrics: Metrics
    control: StopControl
    concurrency: int
    failure_limit: FailureLimit = dataclasses.field(default_factory=FailureLimit)
    tasks: TaskStats | None = None  # mean@K and pass@k, with --repeats K > 1
    on_event: Callable[[str], None] | None = None  # -v: one line per row event
    spool: ResultSpool | None = None  # successful results for /aggregate_metrics
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

    async def run(self) -> None:
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
            self.metrics.taken += 1
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
            answer = await self.client.run(job, agent, flight)
            if self.steering.version is not None and not isinstance(answer, AttemptFailure):
                self.steering.stamp(answer, flight.sent_version)
            if self.metrics.spending is not None and not isinstance(answer, AttemptFailure):
                self._spend(job, answer)
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
        elif isinstance(outcome, _NotPersisted):
            self.metrics.add_not_persisted(job.agent_name)
            if self.on_event is not None:
                advice = "a resumed run runs it again"
                self.on_event(f"{describe(job)}: not persisted (the agent's _ng_no_persist); {advice}")
            self._ended(job, None)
            self.sink.not_persisted(job, flight.attempt, release)
            if self.groups is not None:
                message = "the agent asked for this rollout not to be kept (_ng_no_persist)"
                self.groups.failure(job, AttemptFailure(ErrorKind.NOT_PERSISTED, message, attempts=flight.attempt))
            self._check_failure_limit()
        elif (
            self.group_field is not None
            and as_float(field_value(outcome, self.group_field)) is None
            and not is_masked(outcome)  # a masked rollout decides nothing: it need not say it
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
                self.count_result(job, outcome, latency)
                self.sink.result(job, outcome, release)

    def count_result(self, job: Job, result: dict[str, Any], latency: float | None) -> None:
        """Put a result into the run's figures: the means, the tasks, the spool."""
        self.metrics.add_result(result, latency, job.agent_name)
        if self.tasks is not None:  # without repeats, no reward to read
            self._ended(job, reward_of(result), result)
        if self.spool is not None:  # by the result's agent, as an earlier run's results are spooled
            self.spool.add(agent_name(result), result)

    def _spend(self, job: Job, answer: dict[str, Any]) -> None:
        """Count what an agent's answer cost (an agent-reported failure's too); stop at the budget."""
        spending = self.metrics.spending
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

    def _ended(self, job: Job, reward: float | None, result: dict[str, Any] | None = None) -> None:
        if self.tasks is not None:
            masked = result is not None and is_masked(result)
            self.tasks.rollout_ended(job.task_index, reward, job.rollout_index, result, job.agent_name, masked=masked)

    def _fail(self, job: Job, failure: AttemptFailure, release: Release) -> None:
        self.metrics.add_failure(failure, job.agent_name)
        if self.on_event is not None:
            self.on_event(f"{describe(job)}: failed after {failure.attempts} attempts: {failure.kind.value}")
        self._ended(job, None)
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

    def _check_failure_limit(self) -> None:
        failed = self.metrics.failed + self.metrics.not_persisted
        if self.failure_limit.is_reached(failed, self.metrics.ended):
            self.control.stop(StopCause.LIMIT_REACHED, self._failure_limit_reason)

    def _failure_limit_reason(self) -> str:
        # Rows in flight when the limit was reached may fail before the stop lands: the
        # message quotes the counts as the summary gives them.
        metrics = self.metrics
        counts = f"{metrics.failed} failed"
        if metrics.not_persisted:
            counts += f" and {metrics.not_persisted} not persisted"
        if self.failure_limit.fraction is not None:
            counts += f" rows of {metrics.ended} ended"
        else:
            counts += " rows"
        return f"stopped after {counts} (the limit: {self.failure_limit.describe()})"


class _NotPersisted:
    """The outcome of a rollout whose answer carries `_ng_no_persist`."""


NOT_PERSISTED = _NotPersisted()


def judge(
    job: Job, answer: dict[str, Any] | AttemptFailure, attempts: int
) -> dict[str, Any] | AttemptFailure | _NotPersisted:
    """What the agent's answer, after `attempts` requests, makes of the rollout: a result stamped
    with the row's indices and agent (as NeMo Gym stamps them), the agent's own failure, or not
    persisted."""
    if isinstance(answer, AttemptFailure):
        return answer
    stamp(job, answer)
    if answer.get("_ng_no_persist"):
        return NOT_PERSISTED
    failure_class = answer.get("_ng_failure_class")
    if failure_class is None:
        return answer
    failure_class = failure_class if isinstance(failure_class, str) else msgspec_text(failure_class)
    reason = answer.get("failure_reason")
    message = f"the agent reported failure class {failure_class!r}" + (
        f": {reason[:ERROR_REASON_CHARS]!r}" if isinstance(reason, str) and reason else ""
    )
    return AttemptFailure(
        ErrorKind.AGENT_FAILURE,
        message,
        attempts=attempts,
        failure_class=failure_class,
        retry=Retry.NEVER if answer.get("_ng_failure_terminal") else Retry.LATER,
        answer=answer,
    )


def stamp(job: Job, result: dict[str, Any]) -> None:
    """Put the row's indices, agent_ref and pass-through keys on its result."""
    result[TASK_INDEX] = job.task_index
    result[ROLLOUT_INDEX] = job.rollout_index
    row = job.row or {}
    if AGENT_REF in row:
        result[AGENT_REF] = row[AGENT_REF]
    if "skills_ref" in row:
        result["skills_ref"] = row["skills_ref"]
    if job.attempt_index is not None:
        result[ATTEMPT_INDEX] = job.attempt_index
    if "_ng_rollout_id" in row:
        result["_ng_rollout_id"] = row["_ng_rollout_id"]


def describe(job: Job) -> str:
    return f"{job.source}:{job.line} task {job.task_index} rollout {job.rollout_index}"


def internal_error_event(job: Job, exc: Exception) -> str:
    """The -v line for a row's unexpected error (its text may quote a server: escaped)."""
    return f"{describe(job)}: internal error: {type(exc).__name__}: {printable(str(exc))}"


def reward_of(result: dict[str, Any]) -> float:
    """A result's reward for pass@k; a result without a finite numeric one counts as 0."""
    reward = result.get("reward")
    if type(reward) is float:  # the common case, without a call
        return reward if math.isfinite(reward) else 0.0
    number = as_float(reward)
    return 0.0 if number is None else number


def msgspec_text(value: Any) -> str:
    return msgspec.json.encode(value).decode()


class _Slot:
    """A borrower for the limiter: a slot is taken by a worker and given back by a sink."""

    __slots__ = ()
