"""One run, put together in one place: the parts a `Config` asks for, built once, and the summary
they make.

    run = Run(config, source=rows, sink=outcomes)   # metrics, task stats, spool, transport
    await run.connect()     # the agents (a head server asked once), the router, the engine
    await run.plan_first(path, ...)  # with a materialized file: every body written first
    await run.send()        # the engine's nursery, until every row has ended or a stop
    await run.finish()      # the rows counted, the tasks' figures, /aggregate_metrics
    run.warnings()          # what the run found wrong in its config, for its caller to say
    run.summary()           # the summary object, with why the run stopped (`control.why_stopped`)
    await run.aclose()

The command line (`cli/run.py`), the Python API (`api/in_trio.py`) and `--summarize` (a run
whose source is result files and which sends nothing: `connect(send=False)`, its counts fed by
the caller) wrap a `Run` with their own inputs and outputs. What a run does around the engine,
and what its summary says, is computed here, and only here.
"""

from __future__ import annotations

import dataclasses
import math
import ssl
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from rollfilter.config import MIN_RATE, Config, ConfigError
from rollfilter.cost import Spending
from rollfilter.engine.adaptive import AdaptiveWindow
from rollfilter.engine.client import AgentClient, JobClient
from rollfilter.engine.groups import ClosedGroup, GroupStage, trained_on
from rollfilter.engine.metrics import UNNAMED_AGENT, Metrics
from rollfilter.engine.nursery import Engine, internal_error_event
from rollfilter.engine.plan import Job, JobSource, LineSource, Planner, describe
from rollfilter.engine.rate_limits import RateLimits, SendSlots
from rollfilter.engine.routing import Router
from rollfilter.engine.sinks import RowSink
from rollfilter.engine.steering import StalenessGate, Steering
from rollfilter.engine.tally import Tally
from rollfilter.errors import ServiceError, SteeringError, UsageError
from rollfilter.figures.passk import TaskStats
from rollfilter.formats.keytable import KeyTable
from rollfilter.formats.resume import ResumeState
from rollfilter.formats.source import LineReader
from rollfilter.formats.spool import ResultSpool
from rollfilter.formats.writers import Release
from rollfilter.http import AgentTransport, connections_that_fit, raise_open_file_limit
from rollfilter.outcomes import AttemptFailure
from rollfilter.redact import origin, printable
from rollfilter.run.connect import transport_for
from rollfilter.run.first_pass import Rereadable, count_rollouts, plan_first
from rollfilter.run.headserver import HEAD_SERVER_TIMEOUT, fetch_config, resolve_endpoints
from rollfilter.run.statistics import RunStatistics, statistics_of
from rollfilter.run.summary import summary_of
from rollfilter.stops import StopCause, StopControl

# Re-scoring and /aggregate_metrics are loaded by the runs that use them, not at every start.
if TYPE_CHECKING:
    from rollfilter.figures.compare import Comparison, RunComparison
    from rollfilter.run.aggregate import AggregateReport
    from rollfilter.run.reverify import MaterializedIndex

KEEP: Any = ...  # set_rate's default: the limit stays as it is
# The stops after which the rows are counted again, when they can be read again: the summary's
# not_started, the rows never sent. After other stops the count would wait on a run being left.
COUNTED_AFTER = frozenset({StopCause.TARGET_REACHED, StopCause.AGENT_UNREACHABLE})


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigWarning:
    """Something in a run's config that it could not do as given, or that its rows showed to be of
    no use: `field`, the Config field, and `key`, the entry of it if any, said by `problem`. The
    run goes on; its caller says it."""

    field: str
    key: str | None
    problem: str

    def __str__(self) -> str:
        entry = f"[{self.key!r}]" if self.key is not None else ""
        return f"Config.{self.field}{entry}: {self.problem}"


def fit_to_open_files(
    wanted: int, *, files_per_connection: int = 1, limit_name: str = "RLIMIT_NOFILE"
) -> tuple[int, str | None]:
    """How many of `wanted` requests at once fit under the process's open-file limit, raised as
    far as it goes; and when that is fewer, what to say of it ("1500 needs more open files ..."),
    naming the limit as `limit_name` (the command line names the shell's `ulimit`)."""
    open_files = raise_open_file_limit()
    fitted = connections_that_fit(wanted, open_files, files_per_connection=files_per_connection)
    if fitted == wanted:
        return fitted, None
    problem = (
        f"{wanted} needs more open files than this process may have ({open_files}, see {limit_name}):"
        f" running {fitted} rows at a time"
    )
    return fitted, problem


class Run:
    """One run of `config`: its parts, and the summary they make.

    Built at once: `metrics`, `tasks` (mean@K and pass@k, with repeats over 1; `on_task` gets
    each task's record when they are computed), `spool` (the results for /aggregate_metrics,
    with `config.aggregate`) and `transport` (what every request goes through, with `tls` and
    `on_warning`). Built by `connect`: `router` and `engine`, which takes its rows from `source`
    and hands its outcomes to `sink`. Built by `aggregate`: `report`.

    `resume` is what earlier runs left (their pairs are skipped or retried), `on_event` the -v
    line for each row event, and `client`, when given, takes each routed job in place of the
    agents' client: a dry run's (`DryRunClient`), which sends nothing. Such a run sends one job at
    a time, in input order, keeps no spool, send slots or adaptive windows, counts no task
    figures, and its summary counts what it would send. With `config.groups`, `connect` builds
    `groups` too, which hands the sink whole groups, and `hold` gets each finished rollout's line
    (the command's held file), with the `release` to run once it is written. `transport`, when
    given, is what the run sends through instead of the one `config` asks for (a test's
    `rollfilter.http.testing.ScriptedTransport`). With `stop_when_unreachable`, an agent that
    refused or dropped every connection since the start, for at least the connect timeout
    (`Config.timeout.connect`) and a few times, stops the run (`StopCause.AGENT_UNREACHABLE`); its
    rows are sent again until then. A run that sends fits its concurrency to the open-file limit
    (`fit_to_open_files`), and says so in `warnings`. The run owns its transport and spool:
    `aclose` closes them.
    """

    def __init__(
        self,
        config: Config,
        *,
        source: LineSource | None = None,
        sink: RowSink | None = None,
        control: StopControl | None = None,
        resume: ResumeState | None = None,
        tls: ssl.SSLContext | None = None,
        on_task: Callable[[dict[str, Any]], None] | None = None,
        on_event: Callable[[str], None] | None = None,
        on_warning: Callable[[str], None] | None = None,
        client: JobClient | None = None,
        hold: Callable[[bytes, Release | None], None] | None = None,
        transport: AgentTransport | None = None,
        stop_when_unreachable: bool = False,
        baseline: RunComparison | None = None,
        shards: Mapping[str, Any] | None = None,
    ) -> None:
        self.config = config
        self.control = control if control is not None else StopControl()
        self.metrics = Metrics()
        if config.prices:
            self.metrics.spending = Spending(config.prices)
        self.tasks = TaskStats(config.max_repeats, config.pass_threshold, on_task) if config.max_repeats > 1 else None
        self.spool = ResultSpool() if config.aggregate and client is None else None
        # A dry run's rollouts are planned for the tasks, and never answered.
        answered = self.tasks if client is None else None
        self.tally = Tally(self.metrics, answered, self.spool, repeats_for=config.repeats_for)
        talks = source is not None or self.spool is not None
        if transport is None and talks:
            transport = transport_for(config, tls=tls, on_warning=on_warning)
        self.transport: AgentTransport | None = transport
        self.router: Router | None = None
        self.engine: Engine | None = None
        self.report: AggregateReport | None = None
        self.groups: GroupStage | None = None
        self._fits_open_files = source is not None and client is None  # a run that connects
        self._open_files_warning: ConfigWarning | None = None
        self.concurrency = self._fitted(config.concurrency)  # as set_concurrency last set it
        self.send_slots = SendSlots(self.concurrency) if config.rate_limited and client is None else None
        self.steering = Steering(config.policy_version)
        self.staleness: StalenessGate | None = None
        if config.max_staleness is not None and config.batch_groups is not None:
            self.staleness = StalenessGate(self.steering, config.max_staleness, config.batch_groups)
        self.index: MaterializedIndex | None = None  # with config.reverify: the materialized inputs, indexed
        self.unsafe = False  # re-scored at a resources server that does not say it is stateless (forced)
        self.planned: int | None = None  # the rollouts the first pass planned (a materialized file)
        self.expected: int | None = None  # every (task, rollout) pair of the input, once it is known
        self._skipped_unread = 0  # pairs an earlier run finished, skipped without being read
        self._source, self._sink, self._resume = source, sink, resume
        self._on_event, self._client, self._hold = on_event, client, hold
        self._stop_when_unreachable = stop_when_unreachable
        self._on_warning = on_warning
        self._baseline, self._shards = baseline, shards
        self._comparison: Comparison | None = None  # with a baseline, once finished
        self._timed = True  # a run counted from result files has no timings

    async def connect(self, *, send: bool = True) -> None:
        """Find the agents (one request to the head server, when the config names one), and
        build the router, and with `send` the engine. Without `send`, the run's counts are fed
        by its caller (`count_result`, `count_failure`: results read back), and have no timings.

        Raises UsageError or ServiceError, before anything is sent, when rows could not be
        routed at all or the head server cannot be used."""
        config = self.config
        self._timed = send
        if send and not config.names_an_agent:
            raise ConfigError("url", "is not given, nor Config.endpoints or Config.head_server: no agent for the rows")
        if self.transport is None:
            return
        if config.reverify is not None:
            endpoints, head, config = await self._verifiers(config, self.transport, send=send)
        else:
            endpoints, head = await resolve_endpoints(config, self.transport)
        window_for = self._window_for if config.adaptive and self._client is None else None
        self.router = Router(config, endpoints, head, window_for=window_for)
        self.steering.requests_out = self.router.requests_out
        if send:
            assert self._source is not None, "a run that sends has a source"
            assert self._sink is not None, "and a sink"
            self.engine = self._engine(self._source, self._sink, self.router, self.transport)

    async def _verifiers(
        self, config: Config, transport: AgentTransport, *, send: bool
    ) -> tuple[dict[str, tuple[str, ...]], None, Config]:
        """Re-scoring's routes: each agent's resources server (from the head server's config, under
        Config.endpoints), and the config whose url is the one for every rollout (Config.url, or a
        config's one resources server). Then, with `send`, each server's /reverify_mode asked, and
        the materialized inputs indexed. ReverifyRefused when a server is not stateless (unless
        Config.reverify.force: then `on_warning` says so once, and the summary says unsafe)."""
        from rollfilter.run.reverify import (
            MaterializedIndex,
            ReverifyRefused,
            refusal,
            reverify_modes,
            verifiers_from_config,
            verify_urls,
        )

        settings = config.reverify
        assert settings is not None
        endpoints = dict(config.endpoints)
        default = config.url
        if config.head_server is not None:
            with trio.move_on_after(HEAD_SERVER_TIMEOUT) as scope:
                head_config = await fetch_config(config.head_server, transport)
            if scope.cancelled_caught:
                raise ServiceError(f"the head server at {origin(config.head_server)} did not answer in time")
            verifiers, only = verifiers_from_config(head_config, f"the head server at {origin(config.head_server)}")
            endpoints = {name: (url,) for name, url in verifiers.items()} | endpoints
            default = default or only
        if not send:
            return endpoints, None, config
        self.index = MaterializedIndex(settings.materialized)  # a file that cannot be indexed is refused first
        why = refusal(await reverify_modes(verify_urls(config, endpoints, default), transport))
        if why is not None and not settings.force:
            raise ReverifyRefused(why)
        if why is not None:
            self.unsafe = True
            if self._on_warning is not None:
                self._on_warning(f"{why}; re-scored there anyway (forced): the summary says unsafe")
        try:
            await trio.to_thread.run_sync(self.index.build)  # one pass over a file: not abandoned with its descriptor
        except OSError as exc:
            problem = f"cannot read the materialized inputs {printable(settings.materialized)}: {exc.strerror}"
            raise UsageError(problem) from None
        return endpoints, None, dataclasses.replace(config, url=default) if default != config.url else config

    async def plan_first(
        self,
        path: str,
        *,
        name: str,
        keep_existing: bool,
        already: KeyTable | None,
        on_staged: Callable[[int], None] | None = None,
    ) -> int:
        """Before sending: write every body of the run's inputs to the materialized file `path`
        (see `first_pass.plan_first`, which says what it raises); the rollouts planned, which the
        summary gives as `expected`."""
        assert self.router is not None, "connect() builds the router"
        assert isinstance(self._source, LineReader), "a first pass reads the run's input files"
        self.planned = await plan_first(
            self._source,
            self.config,
            self.router,
            path,
            name=name,
            keep_existing=keep_existing,
            already=already,
            on_staged=on_staged,
        )
        return self.planned

    def _engine(self, source: LineSource, sink: RowSink, router: Router, transport: AgentTransport) -> Engine:
        config, sends = self.config, self._client is None
        # An agent is given as long to come up as one connection is given to be made.
        unreachable_after = config.timeout.connect if self._stop_when_unreachable and sends else None
        client: JobClient = (
            self._client
            if self._client is not None
            else AgentClient(
                config,
                transport,
                on_retry=self._count_retry,
                on_internal_error=self._internal_error,
                send_slots=self.send_slots,
                steering=self.steering,
                unreachable_after=unreachable_after,
            )
        )
        if config.groups:
            self.groups = GroupStage(
                sink,
                self._target_reached,
                self.tally,
                field=config.group_field,
                drop_uniform=config.drop_uniform,
                target=config.target_groups,
                hold=self._hold,
                kept_before=self._resume.kept_groups if self._resume is not None else 0,
                dropped_before=self._resume.dropped_groups if self._resume is not None else 0,
                masked_before=self._resume.masked_groups if self._resume is not None else 0,
                in_order=config.max_staleness is not None,
                on_close=self._group_closed if self.staleness is not None else None,
            )
            self.groups.start()  # a target earlier runs met stops the run before anything is sent
            if self.groups.target_reached and self._resume is not None:  # no row is read: it skips them all
                self._skipped_unread = self._resume.finished_pairs
        on_group = self.groups.planned if self.groups is not None else None
        planner: JobSource = Planner(source, config, self._resume, self.tasks, on_group)
        if config.reverify is not None:
            from rollfilter.run.reverify import ReverifyPlanner

            assert self.index is not None, "indexed when connected"
            planner = ReverifyPlanner(
                source, self.index, config.reverify, self._resume, self.tasks, config.limit, config.shard
            )
        return Engine(
            planner=planner,
            router=router,
            client=client,
            sink=sink,
            tally=self.tally,
            control=self.control,
            # A dry run shows each row's route, then its body, one row at a time: in input order.
            concurrency=self.concurrency if sends else 1,
            failure_limit=config.max_failures,
            max_cost=config.max_cost,
            on_event=self._on_event,
            groups=self.groups,
            group_field=config.group_field if config.drop_uniform else None,
            waiting_rows=self.send_slots.waiting_rows if self.send_slots is not None else 0,
            unreachable_after=unreachable_after,
            steering=self.steering,
            staleness=self.staleness,
        )

    def _target_reached(self) -> None:
        reason = f"stopped once {self.config.target_groups} groups were kept (the target)"
        self.control.stop(StopCause.TARGET_REACHED, reason)

    def _group_closed(self, closed: ClosedGroup) -> None:
        assert self.staleness is not None
        handed_out = trained_on(closed.fate, keep_incomplete=self.config.keep_incomplete)
        self.staleness.group_closed(closed, trained_on=handed_out)

    def _window_for(self, name: str | None) -> AdaptiveWindow:
        label = name if name is not None else UNNAMED_AGENT
        on_event = self._on_event

        def changed(old: int, new: int) -> None:
            if on_event is not None:
                on_event(f"agent {label}: window {old} -> {new}")

        return AdaptiveWindow(self.concurrency, on_change=changed)

    def _count_retry(self, job: Job, failure: AttemptFailure, delay: float) -> None:
        self.tally.retry(job, failure)
        if self._on_event is not None:
            self._on_event(f"{describe(job)}: retry in {delay:.2f} s after {failure.kind.value}: {failure.message}")

    def _internal_error(self, job: Job, exc: Exception) -> None:
        if self._on_event is not None:
            self._on_event(internal_error_event(job, exc))

    async def send(self) -> None:
        """Run the engine until every row has ended, or the run was stopped."""
        assert self.engine is not None, "connect() builds the engine"
        try:
            await self.engine.run()
        finally:
            if self.groups is not None:
                self.groups.cancel_open()

    async def finish(self) -> None:
        """After `send`: the rows counted (the summary's `expected` and `not_started`), the tasks'
        figures made (each task's record to `on_task`), then the agents' aggregate, unless the
        run was stopped. A stop during the count or the aggregate ends them."""
        if self.engine is not None:
            await self._count_expected()
        if self.tasks is not None:
            self.tasks.finish()
        if self._baseline is not None:
            self._comparison = self._baseline.comparison()
        await self.aggregate()

    async def _count_expected(self) -> None:
        """`expected`: every pair of the input, when it is known: planned by the first pass, read
        whole by a run that ran to its end, or counted again after a stop that left rows unread."""
        control = self.control
        self.expected = self.planned
        if self.planned is not None:
            return
        if control.cause is None and not control.stopped_early and self._client is None:
            self.expected = self.statistics().rows_read  # all of it was read
        elif control.cause in COUNTED_AFTER:
            again = self._source.read_again() if isinstance(self._source, Rereadable) else None
            if again is None:
                return
            # After another stop, a scope of the control's is cancelled already: the command line
            # ends at a second signal then (its signals' way out), so the count is not stoppable.
            scope = control.stoppable() if control.cause is StopCause.TARGET_REACHED else trio.CancelScope()
            with scope:
                self.expected = await count_rollouts(again, self.config)

    def warnings(self) -> list[ConfigWarning]:
        """What in the config the run could not do as given: a concurrency over what the open-file
        limit lets it have (said once, however often it was asked for). And what the rows showed
        to be of no use, once the run has ended: each agent given a repeat count that no row named
        (none when the run was stopped before its end)."""
        said = [self._open_files_warning] if self._open_files_warning is not None else []
        if self.engine is None or self.control.stopped_early:
            return said
        unnamed = sorted(set(self.config.repeats_by_agent) - self.engine.planner.agents_seen)
        return [*said, *(ConfigWarning("repeats_by_agent", name, f"no row named agent {name!r}") for name in unnamed)]

    def _fitted(self, concurrency: int) -> int:
        """`concurrency`, or as many requests at once as fit under the open-file limit, as the
        command fits -j (more would only wait in the transport for a descriptor). The first cut
        is a warning."""
        if not self._fits_open_files:
            return concurrency
        fitted, problem = fit_to_open_files(concurrency)
        if problem is not None and self._open_files_warning is None:
            self._open_files_warning = ConfigWarning("concurrency", None, problem)
        return fitted

    def set_concurrency(self, concurrency: int) -> None:
        """Bound the requests out at once by `concurrency` from now on (with adaptive windows,
        their ceiling), or by as many as fit under the open-file limit (see `warnings`). A lower
        bound cancels nothing: what is out finishes, and its slots are not taken again until the
        run is under the new bound. SteeringError for less than 1."""
        if type(concurrency) is not int or concurrency < 1:
            raise SteeringError(f"the concurrency is a whole number of at least 1, not {concurrency!r}")
        concurrency = self.concurrency = self._fitted(concurrency)
        if self.send_slots is not None:
            self.send_slots.slots.total_tokens = concurrency
        if self.engine is not None:
            self.engine.set_concurrency(concurrency)
        for agent in self.router.agents_named(None) if self.router is not None else ():
            if agent.window is not None:
                agent.window.set_ceiling(concurrency)

    def set_rate(self, agent: str | None = None, *, rpm: float | None = KEEP, tpm: float | None = KEEP) -> None:
        """Change the requests (`rpm`) or tokens (`tpm`) a minute rows of `agent` may use (None:
        every agent of the run), for the requests waiting too; None removes a limit, and one not
        given stays. SteeringError for an agent the run does not have, or a rate under its least."""
        for name, rate in (("rpm", rpm), ("tpm", tpm)):
            if rate is not KEEP and rate is not None and not _pace_able(rate):
                raise SteeringError(f"{name} is a number of at least {MIN_RATE:g}, not {rate!r}")
        if self.router is None:
            raise SteeringError("the run does not know its agents yet: try again once it has started")
        try:
            targets = self.router.agents_named(agent)
        except LookupError:
            raise SteeringError(f"the run has no agent {agent!r}") from None
        for target in targets:
            limits = target.rate_limits
            new_rpm = (limits.rpm if limits is not None else None) if rpm is KEEP else rpm
            new_tpm = (limits.tpm if limits is not None else None) if tpm is KEEP else tpm
            if limits is not None:
                limits.set(new_rpm, new_tpm)  # the requests waiting on them look again
                if new_rpm is None and new_tpm is None:  # a plain path again (its figures stay in the summary)
                    target.rate_limits, target.former_rate_limits = None, limits
            elif new_rpm is not None or new_tpm is not None:
                target.rate_limits, target.former_rate_limits = RateLimits(new_rpm, new_tpm), None

    def set_policy_version(self, version: int) -> None:
        """The policy version the agents serve from now on (see `Steering.set_version`)."""
        self.steering.set_version(version)

    def statistics(self) -> RunStatistics:
        """The run's figures now, a frozen snapshot that every view renders (see
        `rollfilter.run.statistics`): counts, rates, each agent's figures, what is in force, and
        what the run says of itself (why it stopped, the tasks' figures once finished, ...)."""
        engine, settings = self.engine, self.config.reverify
        passed_over = None
        if settings is not None and settings.judge_failed_only and engine is not None:
            from rollfilter.run.reverify import ReverifyPlanner

            assert isinstance(engine.planner, ReverifyPlanner)
            passed_over = engine.planner.passed_over
        return statistics_of(
            self.metrics,
            engine=engine,
            router=self.router,
            groups=self.groups,
            steering=self.steering,
            staleness=self.staleness,
            concurrency=self.concurrency,
            tasks=self.tasks,
            expected=self.expected,
            skipped_unread=self._skipped_unread,
            finished_before=self._resume.done_pairs if self._resume is not None else 0,
            stopped=self.control.why_stopped,
            unsafe=self.unsafe,
            would_send=self.metrics.succeeded if self._client is not None else None,
            not_judge_failed=passed_over,
            key_metrics=self.report.key_metrics if self.report is not None else None,
            shards=self._shards,
            comparison=self._comparison,
            timed=self._timed,
        )

    def count_earlier(self, result: dict[str, Any]) -> None:
        """An earlier run's result: in the figures, not in this run's counters (`Tally.earlier`)."""
        self.tally.earlier(result)

    def count_result(self, record: dict[str, Any]) -> None:
        """A result line read back from a results file (a run that sends nothing), as it was
        counted; and with a baseline, compared with it."""
        self.tally.written_result(record)
        if self._baseline is not None:
            self._baseline.add(record)

    def count_failure(self, failure: AttemptFailure, record: dict[str, Any] | None = None) -> None:
        """A failed row read back: its errors record (None: a line that is not a result), as it was counted."""
        self.tally.written_failure(failure, record)

    async def aggregate(self) -> None:
        """Ask each agent for its aggregate metrics (see `aggregate_run`), unless the run was
        stopped; a stop during the calls ends them."""
        if self.spool is None or self.router is None or self.transport is None or self.control.stopped_early:
            return
        from rollfilter.run.aggregate import aggregate_run

        with self.control.stoppable():
            self.report = await aggregate_run(self.spool, self.router, self.config, self.transport)

    def summary(self) -> dict[str, Any]:
        """The summary object (`summary_of`), rendered from the run's snapshot, the tasks' figures
        computed first (before its end too: a summary asked for then covers what has ended)."""
        if self.tasks is not None:
            self.tasks.finish()
        return summary_of(self.statistics())

    async def aclose(self) -> None:
        """Close the transport and the spool (call it shielded from cancellation)."""
        if self.spool is not None:
            self.spool.close()
        if self.index is not None:
            self.index.close()
        if self.transport is not None:
            await self.transport.aclose()


def _pace_able(rate: Any) -> bool:
    return type(rate) in (int, float) and math.isfinite(rate) and rate >= MIN_RATE
