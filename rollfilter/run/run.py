"""One run, put together in one place: the parts a `Config` asks for, built once, and the summary
they make. The command line and the Python API reach the engine through it, and through nothing else.

    run = Run(config, source=rows, sink=outcomes)   # the tally, the tasks, the spool, the transport
    await run.connect()     # the agents (a head server asked once), the router, the engine
    await run.plan_first(path, ...)  # with a materialized file: every body written first
    await run.send()        # earlier runs' results counted; the engine, until every row has ended or a stop
    await run.finish()      # the rows counted, the tasks' figures, /aggregate_metrics
    run.warnings()          # what the run found wrong in its config, for its caller to say
    run.statistics()        # the snapshot every view renders; run.summary() renders the summary
    await run.end_tracking(status)  # with Config.trackers: the final figures, and how the run ended
    await run.aclose()

The Python API (`api/in_trio.py`) gives it its rows and a channel (`ChannelSink`); the command
line (`cli/collect.py`) its input files, the writers over the files it opened (`RunOutputs`, of which
`writing_run` makes the run) and what earlier runs left in them (`Earlier`); `--summarize`
(`cli/summarize.py`) a run that sends nothing (`connect(send=False)`), whose counts it feeds from
result files (`count_result`, `count_failure`). What a run does around the engine, and what its
summary says, is computed here, and only here.
"""

from __future__ import annotations

import dataclasses
import ssl
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import trio

from rollfilter.config import Config, ConfigError
from rollfilter.engine.client import AgentClient, JobClient
from rollfilter.engine.groups import GroupStage
from rollfilter.engine.nursery import Engine, RowSink
from rollfilter.engine.plan import GroupPlan, JobSource, LineSource, Planner
from rollfilter.engine.rate_limits import SendSlots
from rollfilter.engine.routing import KEEP as KEEP
from rollfilter.engine.routing import Router, adaptive_windows, check_rates
from rollfilter.engine.steering import StalenessGate, Steering
from rollfilter.engine.tally import Tally
from rollfilter.errors import SteeringError
from rollfilter.figures.passk import TaskStats
from rollfilter.formats.resume import ResumeState
from rollfilter.formats.source import LineReader
from rollfilter.formats.spool import ResultSpool
from rollfilter.formats.writers import Release
from rollfilter.http import AgentTransport, connections_that_fit, raise_open_file_limit
from rollfilter.outcomes import AttemptFailure
from rollfilter.run.connect import transport_for
from rollfilter.run.earlier import Earlier
from rollfilter.run.first_pass import expected_rollouts, plan_first
from rollfilter.run.headserver import resolve_endpoints
from rollfilter.run.outputs import LineSink, RunOutputs
from rollfilter.run.statistics import RunStatistics, statistics_of
from rollfilter.run.summary import summary_of
from rollfilter.stops import StopControl

# Re-scoring and /aggregate_metrics are loaded by the runs that use them, not at every start.
if TYPE_CHECKING:
    from rollfilter.figures.compare import Comparison, RunComparison
    from rollfilter.run.aggregate import AggregateReport
    from rollfilter.run.reverify import MaterializedIndex
    from rollfilter.run.tracking import RunTracking


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


class _OpenFileFit:
    """A run's concurrency, or as many requests at once as fit under the open-file limit, as the
    command fits -j (more would only wait in the transport for a descriptor); the first cut is
    kept as a `warning`. A run that connects to no agent (`fits` false) is not fitted."""

    def __init__(self, fits: bool) -> None:
        self.fits = fits
        self.warning: ConfigWarning | None = None

    def __call__(self, concurrency: int) -> int:
        if not self.fits:
            return concurrency
        fitted, problem = fit_to_open_files(concurrency)
        if problem is not None and self.warning is None:
            self.warning = ConfigWarning("concurrency", None, problem)
        return fitted


def task_figures(config: Config, on_task: Callable[[dict[str, Any]], None] | None) -> TaskStats | None:
    """mean@K and pass@k over tasks, with repeats; with none, a re-scoring run's error bars
    clustered by the task each line names; else None."""
    largest, threshold = config.repeats.largest, config.repeats.pass_threshold
    if largest > 1:
        return TaskStats(largest, threshold, on_task)
    return TaskStats(1, threshold, clusters_only=True) if config.reverify is not None else None


def _planner(
    config: Config,
    source: LineSource,
    resume: ResumeState | None,
    tasks: TaskStats | None,
    on_group: Callable[[GroupPlan], None] | None,
    index: MaterializedIndex | None,
    tally: Tally,
) -> JobSource:
    """What turns the run's rows into jobs: a re-scoring run's lines, each with its materialized
    body (`index`), or the rows, each into its rollouts (the failures resume gives up counted by `tally`)."""
    if config.reverify is None:
        return Planner(source, config, resume, tasks, on_group, tally.standing_failure)
    from rollfilter.run.reverify import ReverifyPlanner

    assert index is not None, "indexed when connected"
    return ReverifyPlanner(source, index, config, resume, tasks)


def _tracking(
    config: Config, tally: Tally, tracked: Mapping[str, Any] | None, key: str, on_warning: Callable[[str], None] | None
) -> RunTracking | None:
    if config.trackers is None:
        return None
    from rollfilter.run.tracking import RunTracking  # a run that tracks loads it

    return RunTracking.of_run(config, tally, tracked, key, on_warning)


class Run:
    """One run of `config`: its parts, and the summary they make.

    Built at once: `metrics`, `tasks` (mean@K and pass@k, with repeats; `on_task` gets each
    task's record), `spool` (the results for /aggregate_metrics), the `tally` that counts into
    them, and `transport` (with `tls` and `on_warning`; one given is sent through instead, as a
    test's `ScriptedTransport`). Built by `connect`: `router` and `engine`, which takes its rows
    from `source` and hands its outcomes to `sink`, and with `config.groups`, `groups` (`hold`
    gets each finished rollout's line, with the `release` to run once it is written). Built by
    `finish`: `report`, the aggregate. `earlier` is what earlier runs left, and `on_event` gets the
    -v line of each row event. A `client` given takes each routed job in place of the agents'
    client: a dry run's (`DryRunClient`), which sends nothing, one job at a time, keeps no spool,
    send slots or adaptive windows, counts no task figures, and counts what it would send. With
    `stop_when_unreachable`, an agent that refused every connection since the start, for the
    connect timeout and a few times, stops the run. `tracking` (`config.trackers`) logs `tracked`
    (the run's record) under `tracking_key`, until `end_tracking`. A run that sends fits its
    concurrency to the open-file limit, and says so in `warnings`. `baseline` and `shards` are --summarize's: a
    comparison with another run's results, and the shards its files cover. `aclose` closes what
    the run owns: its transport, spool and index.
    """

    def __init__(
        self,
        config: Config,
        *,
        source: LineSource | None = None,
        sink: RowSink | None = None,
        control: StopControl | None = None,
        earlier: Earlier | None = None,
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
        tracked: Mapping[str, Any] | None = None,
        tracking_key: str = "",
    ) -> None:
        self.config = config
        self.control = control if control is not None else StopControl()
        self.tasks = task_figures(config, on_task)
        self.spool = ResultSpool() if config.aggregate and client is None else None
        answered = self.tasks if client is None else None  # a dry run's rollouts are planned, never answered
        self.tally = Tally.for_config(config, answered, self.spool)
        self.metrics = self.tally.metrics
        if transport is None and (source is not None or self.spool is not None):
            transport = transport_for(config, tls=tls, on_warning=on_warning)
        self.transport: AgentTransport | None = transport
        self.router: Router | None = None
        self.engine: Engine | None = None
        self.report: AggregateReport | None = None
        self.groups: GroupStage | None = None
        self._fit = _OpenFileFit(source is not None and client is None)  # a run that connects
        self.concurrency = self._fit(config.concurrency)  # as set_concurrency last set it
        self.send_slots = SendSlots(self.concurrency) if config.rates.limited and client is None else None
        self.steering = Steering(config.policy_version)
        self.staleness = StalenessGate.for_config(self.steering, config)
        self.index: MaterializedIndex | None = None  # with config.reverify: the materialized inputs, indexed
        self.unsafe = False  # re-scored at a resources server that does not say it is stateless (forced)
        self.planned: int | None = None  # the rollouts the first pass planned (a materialized file)
        self.expected: int | None = None  # every (task, rollout) pair of the input, once it is known
        self._skipped_unread = 0  # pairs an earlier run finished, skipped without being read
        self._source, self._sink, self._earlier = source, sink, earlier
        self._resume = earlier.resume if earlier is not None else None
        self._on_event, self._on_warning, self._client, self._hold = on_event, on_warning, client, hold
        self._stop_when_unreachable = stop_when_unreachable
        self._baseline, self._shards = baseline, shards
        self._comparison: Comparison | None = None  # with a baseline, once finished
        self._timed = True  # a run counted from result files has no timings
        # A dry run is not tracked; --summarize's count is.
        self.tracking = _tracking(config, self.tally, tracked, tracking_key, on_warning) if client is None else None

    async def connect(self, *, send: bool = True) -> None:
        """Find the agents (a head server asked once), build the router, and with `send` the engine;
        without, the caller feeds the counts (`count_result`: results read back), and there are no
        timings. UsageError or ServiceError, before anything is sent, when rows could not be
        routed at all, or a service needed first cannot be used."""
        config = self.config
        self._timed = send
        if send and not config.names_an_agent:
            raise ConfigError("url", "is not given, nor Config.endpoints or Config.head_server: no agent for the rows")
        if self.tracking is not None:
            await self.tracking.start()
        if self.transport is None:
            return
        if config.reverify is not None:
            from rollfilter.run.reverify import verifier_routes

            endpoints, config, self.index, self.unsafe = await verifier_routes(
                config, self.transport, send=send, ask_modes=self._client is None, on_warning=self._on_warning
            )
            head = None
        else:
            endpoints, head = await resolve_endpoints(config, self.transport)
        adaptive = config.adaptive and self._client is None
        window_for = adaptive_windows(self.concurrency, self._on_event) if adaptive else None
        self.router = Router(config, endpoints, head, window_for=window_for)
        self.steering.requests_out = self.router.requests_out
        if send:
            assert self._source is not None, "a run that sends has a source"
            assert self._sink is not None, "and a sink"
            self.engine = self._engine(config, self._source, self._sink, self.router, self.transport)

    async def plan_first(
        self, path: str, *, name: str, keep_existing: bool, on_staged: Callable[[int], None] | None = None
    ) -> int:
        """Before sending: write every body of the run's inputs to the materialized file `path`
        (see `first_pass.plan_first`, which says what it raises), but those earlier runs wrote
        there; the rollouts planned, which the summary gives as `expected`."""
        assert self.router is not None, "connect() builds the router"
        assert isinstance(self._source, LineReader), "a first pass reads the run's input files"
        already = self._earlier.materialized if self._earlier is not None else None
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

    def _engine(
        self, config: Config, source: LineSource, sink: RowSink, router: Router, transport: AgentTransport
    ) -> Engine:
        sends, resume = self._client is None, self._resume
        # An agent is given as long to come up as one connection is given to be made.
        unreachable_after = config.timeout.connect if self._stop_when_unreachable and sends else None
        client = self._client or AgentClient(
            config,
            transport,
            tally=self.tally,
            on_event=self._on_event,
            send_slots=self.send_slots,
            steering=self.steering,
            unreachable_after=unreachable_after,
        )
        if config.groups:
            on_close = self.staleness.group_closed if self.staleness is not None else None
            self.groups = GroupStage.for_run(
                config, sink, self.tally, self.control, resume=resume, hold=self._hold, on_close=on_close
            )
            if self.groups.target_reached and resume is not None:  # no row is read: it skips them all
                self._skipped_unread = resume.finished_pairs
        on_group = self.groups.planned if self.groups is not None else None
        return Engine(
            planner=_planner(config, source, resume, self.tasks, on_group, self.index, self.tally),
            router=router,
            client=client,
            sink=sink,
            tally=self.tally,
            control=self.control,
            # A dry run shows each row's route, then its body, one row at a time: in input order.
            concurrency=self.concurrency if sends else 1,
            failure_limit=config.max_failures,
            health=config.health,
            max_cost=config.cost.max_usd,
            on_event=self._on_event,
            groups=self.groups,
            group_field=config.groups.field if config.groups and config.groups.drop_uniform else None,
            waiting_rows=self.send_slots.waiting_rows if self.send_slots is not None else 0,
            unreachable_after=unreachable_after,
            steering=self.steering,
            staleness=self.staleness,
        )

    async def send(self) -> None:
        """Count the results earlier runs left (in a thread: they are read from files), then run
        the engine until every row has ended, or the run was stopped (a stop before it: nothing is
        sent). Then the groups still open are cancelled, with those earlier runs left open that
        this run did not read, and what the sink holds behind rows that never ended is written."""
        assert self.engine is not None, "connect() builds the engine"
        if self._earlier is not None:
            await trio.to_thread.run_sync(self._earlier.count, self.tally)
        try:
            if self.control.cause is None:
                if self.tracking is not None:
                    await self.tracking.beside(self.engine.send_all, self.statistics)
                else:
                    await self.engine.send_all()
        finally:
            if self.groups is not None:
                self.groups.cancel_open()
        if self.groups is not None and self._earlier is not None:
            self.groups.cancel_earlier(self._earlier.left_open(self.config.repeats.for_agent))
        if self.control.stopped_early and isinstance(self._sink, LineSink):
            self._sink.flush_backlog()  # what --ordered holds behind rows that never finished

    async def end_tracking(self, status: str, *, on_warning: Callable[[str], None] | None = None) -> None:
        """The trackers' final figures, their runs ended with `status` (FINISHED, KILLED or
        FAILED: see `rollfilter.run.tracking`), once; it waits a few seconds at most, which a stop
        of a run not stopped before cuts short. What went wrong with them is said before it
        returns, by `on_warning` (None: the run's)."""
        if self.tracking is not None:
            control = self.control
            with trio.CancelScope() if control.stopped_early else control.stoppable():
                await self.tracking.end(self.summary(), self.statistics(), status, on_warning=on_warning)

    async def finish(self) -> None:
        """After `send`: the rows counted (the summary's `expected` and `not_started`: see
        `expected_rollouts`), the tasks' figures made (each task's record to `on_task`), the
        comparison with a baseline, then the agents' aggregate (see `aggregate_run`), unless the
        run was stopped. A stop during the count or the aggregate ends them."""
        control = self.control
        if self.engine is not None and self.planned is None:
            whole = control.cause is None and not control.stopped_early and self._client is None
            read = self.statistics().rows_read if whole else None
            self.expected = await expected_rollouts(self._source, self.config, control, read_whole=read)
        elif self.engine is not None:
            self.expected = self.planned
        if self.tasks is not None:
            self.tasks.finish()
        if self._baseline is not None:
            self._comparison = self._baseline.comparison()
        if self.spool is None or self.router is None or self.transport is None or control.stopped_early:
            return
        from rollfilter.run.aggregate import aggregate_run

        with control.stoppable():
            self.report = await aggregate_run(self.spool, self.router, self.config, self.transport)

    def warnings(self) -> list[ConfigWarning]:
        """What in the config the run could not do as given: a concurrency over what the open-file
        limit lets it have (said once, however often it was asked for). And what the rows showed
        to be of no use, once the run has ended: each agent given a repeat count that no row named
        (none when the run was stopped before its end)."""
        said = [self._fit.warning] if self._fit.warning is not None else []
        if self.engine is None or self.control.stopped_early:
            return said
        unnamed = sorted(set(self.config.repeats.by_agent) - self.engine.planner.agents_seen)
        return [*said, *(ConfigWarning("repeats.by_agent", name, f"no row named agent {name!r}") for name in unnamed)]

    def set_concurrency(self, concurrency: int) -> None:
        """Bound the requests out at once by `concurrency` from now on (with adaptive windows,
        their ceiling), or by as many as fit under the open-file limit (see `warnings`). A lower
        bound cancels nothing: what is out finishes, and its slots are not taken again until the
        run is under the new bound. SteeringError for less than 1."""
        if type(concurrency) is not int or concurrency < 1:
            raise SteeringError(f"the concurrency is a whole number of at least 1, not {concurrency!r}")
        concurrency = self.concurrency = self._fit(concurrency)
        if self.send_slots is not None:
            self.send_slots.slots.total_tokens = concurrency
        if self.engine is not None:
            self.engine.set_concurrency(concurrency)
        if self.router is not None:
            self.router.set_ceiling(concurrency)

    def set_rate(self, agent: str | None = None, *, rpm: float | None = KEEP, tpm: float | None = KEEP) -> None:
        """Change the requests (`rpm`) or tokens (`tpm`) a minute rows of `agent` may use (None:
        every agent of the run), for the requests waiting too; None removes a limit, and one not
        given stays. SteeringError for an agent the run does not have, or a rate under its least."""
        check_rates(rpm=rpm, tpm=tpm)
        if self.router is None:
            raise SteeringError("the run does not know its agents yet: try again once it has started")
        self.router.set_rates(agent, rpm=rpm, tpm=tpm)

    def set_policy_version(self, version: int) -> None:
        """The policy version the agents serve from now on (see `Steering.set_version`)."""
        self.steering.set_version(version)

    def statistics(self) -> RunStatistics:
        """The run's figures now, a frozen snapshot that every view renders (see
        `rollfilter.run.statistics`): counts, rates, each agent's figures, what is in force, and
        what the run says of itself (why it stopped, the tasks' figures once finished, ...)."""
        return statistics_of(
            self.metrics,
            engine=self.engine,
            router=self.router,
            groups=self.groups,
            steering=self.steering,
            staleness=self.staleness,
            concurrency=self.concurrency,
            tasks=self.tasks,
            expected=self.expected,
            skipped_unread=self._skipped_unread,
            finished_earlier=self._resume.done_pairs if self._resume is not None else 0,
            stopped=self.control.why_stopped,
            unsafe=self.unsafe,
            would_send=self.metrics.succeeded if self._client is not None else None,
            key_metrics=self.report.key_metrics if self.report is not None else None,
            shards=self._shards,
            comparison=self._comparison,
            timed=self._timed,
        )

    def count_result(self, record: dict[str, Any]) -> None:
        """A result line read back from a results file (a run that sends nothing), as it was
        counted; and with a baseline, compared with it."""
        self.tally.written_result(record)
        if self._baseline is not None:
            self._baseline.add(record)

    def count_failure(self, failure: AttemptFailure, record: dict[str, Any] | None = None) -> None:
        """A failed row read back: its errors record (None: a line that is not a result), as it was counted."""
        self.tally.written_failure(failure, record)

    def summary(self) -> dict[str, Any]:
        """The summary object (`summary_of`), rendered from the run's snapshot, the tasks' figures
        computed first (before its end too: a summary asked for then covers what has ended)."""
        if self.tasks is not None:
            self.tasks.finish()
        return summary_of(self.statistics())

    async def aclose(self) -> None:
        """Close the transport, the spool and the index (call it shielded from cancellation)."""
        if self.spool is not None:
            self.spool.close()
        if self.index is not None:
            self.index.close()
        if self.transport is not None:
            await self.transport.aclose()


def writing_run(
    config: Config,
    outputs: RunOutputs,
    *,
    source: LineSource,
    earlier: Earlier | None,
    dry_run: bool,
    control: StopControl,
    tls: ssl.SSLContext | None,
    on_event: Callable[[str], None] | None,
    on_warning: Callable[[str], None],
    tracked: Mapping[str, Any] | None = None,
) -> Run:
    """The run of `config` whose outcomes go to `outputs` (the command line's writers, over the
    files it opened): its sink made of them, a task's line and a held rollout written there, and
    an agent that never answers stopping it. With `dry_run`, nothing is sent: each route is said
    on `outputs.log` and each body written where results go (no -v events: a dry run has none).
    `tracked` is the run's record, its trackers' params."""
    sink, client = outputs.dry_run(config) if dry_run else (outputs.sink(config), None)
    return Run(
        config,
        source=source,
        sink=sink,
        control=control,
        earlier=earlier,
        tls=tls,
        on_task=outputs.write_task if outputs.per_task is not None else None,
        on_event=on_event if client is None else None,
        on_warning=on_warning,
        client=client,
        hold=outputs.held.write if outputs.held is not None else None,
        stop_when_unreachable=True,
        tracked=tracked,
    )
