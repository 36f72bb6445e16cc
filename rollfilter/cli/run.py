"""The command-line run: files and descriptors, writers, signals, the demo agent, the summary.

`run` owns the services nursery (writers, signal and stdout watchers, the in-process demo
agent) around the engine's nursery, and returns the exit status. It raises only
`RollfilterError` (before anything is sent) and unexpected bugs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import signal
import ssl
import stat
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec
import trio

from rollfilter.aggregate import AggregateReport, aggregate_run
from rollfilter.cli import identity
from rollfilter.cli.fields import in_options
from rollfilter.cli.messages import failure_message, message_line, say, write_stderr
from rollfilter.cli.outputs import (
    STANDARD_STREAMS,
    Lock,
    OutputFiles,
    RunOutputs,
    Streams,
    refuse_earlier_lines,
    replace_content,
    summary_bytes,
)
from rollfilter.cli.statuses import EXIT_STATUS_OF_STOP, RunEnd
from rollfilter.config import CommandConfig, Config
from rollfilter.connect import tls_context_for, transport_for
from rollfilter.demo import DemoAgent, DemoOptions
from rollfilter.demo import serve as serve_demo
from rollfilter.engine import Engine, RunControl, RunStatus, StopCause, connect_engine, describe, reward_of
from rollfilter.errors import OutputInUse, UsageError
from rollfilter.keytable import KeyTable
from rollfilter.materialize import write_materialized
from rollfilter.metrics import Metrics
from rollfilter.passk import TaskStats
from rollfilter.plan import Job, Planner
from rollfilter.redact import printable, shown
from rollfilter.resume import (
    ResumeState,
    drop_torn_tail,
    read_pairs,
    result_records,
)
from rollfilter.routing import Agent, Router
from rollfilter.rows import TASK_INDEX, agent_name
from rollfilter.sinks import BodySink, LineSink
from rollfilter.source import STDIN, LineReader, check_inputs
from rollfilter.spool import ResultSpool
from rollfilter.writers import BatchWriter, LineWriter, OutputClosed, OutputFailed, WholeFile, write_all

if TYPE_CHECKING:
    from rollfilter.cli.progress import ProgressDisplay

_encode = msgspec.json.Encoder().encode
PROGRESS_SECONDS = 0.5  # how often the progress file is brought up to date


# A status on demand, as dd prints one: SIGUSR1, and SIGINFO (Ctrl-T) where the system has it.
STATUS_SIGNALS = tuple(getattr(signal, name) for name in ("SIGUSR1", "SIGINFO") if hasattr(signal, name))
CAUSE_OF_SIGNAL = {
    signal.SIGINT: StopCause.INTERRUPTED,
    signal.SIGTERM: StopCause.TERMINATED,
    signal.SIGHUP: StopCause.HUNG_UP,
}


async def _watch_signals(
    control: RunControl,
    show_status: Callable[[], None],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    with trio.open_signal_receiver(*CAUSE_OF_SIGNAL, *STATUS_SIGNALS) as signals:
        task_status.started()
        async for signum in signals:
            if signum in STATUS_SIGNALS:
                show_status()
                continue
            cause = CAUSE_OF_SIGNAL[signal.Signals(signum)]
            if control.scope.cancel_called:
                os._exit(EXIT_STATUS_OF_STOP[cause])  # a signal during the wind-down: leave now
            control.stop(cause)


async def _watch_reader_gone(fd: int, on_gone: Callable[[], None]) -> None:
    # The write end of a pipe polls as an error once its reader is gone, so `| head`
    # stops the run at once rather than at the next result.
    await trio.lowlevel.wait_readable(fd)
    on_gone()


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


async def _plan_first(
    command: CommandConfig, config: Config, router: Router, reader: LineReader, streams: Streams, earlier: _Earlier
) -> int:
    """The first pass of a run that writes the materialized file: every body into it before the
    first /run is sent. Standard input is read to its end first, into a temporary file that
    both passes read. Returns the number of rollouts the inputs hold. Raises UsageError, with
    nothing sent, when some rows have no repeat count (as NeMo Gym refuses them)."""
    assert command.materialized_file is not None
    stdin_fd = streams.stdin
    if STDIN in command.inputs:
        stdin_fd = await trio.to_thread.run_sync(_spooled, streams.stdin, abandon_on_cancel=True)
        reader.use_stdin(stdin_fd)
    first = LineReader(command.inputs, max_line_bytes=command.max_line_bytes, stdin_fd=stdin_fd)
    try:
        plan = await write_materialized(
            Planner(first, config),
            router,
            command.materialized_file,
            keep_existing=command.resume or command.append,
            already=earlier.materialized,
        )
    finally:
        first.close()
    if stdin_fd != streams.stdin:
        os.lseek(stdin_fd, 0, os.SEEK_SET)  # the second pass reads it again (its reader closes it)
    if plan.agents_without_repeats:
        names = sorted(plan.agents_without_repeats, key=lambda name: (name is not None, name or ""))
        shown_names = ", ".join("rows naming no agent" if name is None else repr(name) for name in names)
        given = ", ".join(f"{name}={count}" for name, count in sorted(config.repeats_by_agent.items()))
        raise UsageError(
            f"-r {given} gives no repeat count for {shown_names}, and no default -r K: give -r K for"
            " the agents it does not name, or -r NAME=K for each; nothing was sent"
        )
    return plan.rollouts


def _spooled(fd: int) -> int:
    """A temporary file holding all that `fd` gives until its end, read from the start."""
    try:
        spool = tempfile.TemporaryFile()  # noqa: SIM115 - the descriptor outlives the file object
    except OSError as exc:  # TMPDIR missing, or not writable
        raise OutputFailed("a temporary copy of standard input", exc) from None
    spool_fd = os.dup(spool.fileno())
    spool.close()
    while chunk := os.read(fd, 1 << 20):
        write_all(spool_fd, chunk, "a temporary copy of standard input")
    os.lseek(spool_fd, 0, os.SEEK_SET)
    return spool_fd


def take_earlier_results(path: str, metrics: Metrics, tasks: TaskStats | None, spool: ResultSpool | None) -> None:
    """An earlier run's results, for a resumed run's summary and aggregate, which cover the
    whole output: into the means (not this run's counters), the tasks, and the spool."""
    for result in result_records(path):
        agent = agent_name(result)
        metrics.add_earlier_result(result, agent)
        if tasks is not None and TASK_INDEX in result:
            tasks.rollout_ended(result[TASK_INDEX], reward_of(result))
        if spool is not None:
            spool.add(agent, result)


async def _publish_progress(
    file: WholeFile, finished: Callable[[], int], say: Callable[[str], None], *, seconds: float = PROGRESS_SECONDS
) -> None:
    """Keep `file` holding the number of finished rollouts, as NeMo Gym's `_progress` artifact:
    a plain integer, replaced at once. Best effort: a write that fails is reported once and
    the run goes on without it."""
    published = None
    while True:
        count = finished()
        if count != published:
            try:
                file.replace(b"%d\n" % count)
            except (OutputClosed, OutputFailed) as failure:
                say(f"{failure}; the run goes on without it")
                return
            published = count
        await trio.sleep(seconds)


@dataclasses.dataclass(frozen=True, slots=True)
class RunOptions:
    """How a command-line run goes beyond its `CommandConfig`: the demo agent it starts, whether it
    handles signals (off for a run inside another program's loop), what it shows on stderr, and
    whether it only prints what it would send (--dry-run)."""

    demo: DemoOptions | None = None
    handle_signals: bool = True
    quiet: bool = False
    progress: bool | None = None  # None: on when stderr is a terminal
    verbose: bool = False
    dry_run: bool = False


async def run(
    command: CommandConfig, *, streams: Streams = STANDARD_STREAMS, options: RunOptions = RunOptions()
) -> RunEnd:
    """Run the rollouts `command` describes; return how it ended. Prints the summary."""
    config = command.engine
    check_inputs(command.inputs)
    if not config.names_an_agent and options.demo is None:
        raise UsageError("no agent to send to: give -u URL, -e NAME=URL, --head-server URL, or --demo")
    outputs = RunOutputs(command, streams, dry_run=options.dry_run)
    outputs.check()
    tls = tls_context_for(config)  # the CA file, read once and refused before any file is touched
    with OutputFiles() as files:
        # Locked first: the record, the resume state and a torn tail are read under the lock.
        out_fd, err_fd, per_task_fd = (
            (None, None, None) if options.dry_run else await _open_appended(command, files, streams)
        )
        for caveat in files.caveats:
            say(caveat, streams.stderr)
        command, record = identity.settle(command)
        resume, earlier = _earlier_runs(command, dry_run=options.dry_run)
        if options.dry_run:  # it changes no file: it reads what resume reads, and prints the rest
            command = dataclasses.replace(
                command, output=None, errors_file=None, metrics_file=None, per_task_file=None,
                aggregate_file=None, materialized_file=None, progress_file=None, resume=False,
            )  # fmt: skip
            earlier, record = _Earlier(), None
        if command.materialized_file is not None:  # written by the first pass, when it is done
            if not (command.resume or command.append):
                refuse_earlier_lines(command.materialized_file, "--materialized")
            WholeFile(command.materialized_file, "--materialized", regular_only=True).close()  # its folder, checked
        files_fds = _Fds(
            out=streams.stdout if out_fd is None else out_fd,
            err=streams.stderr if err_fd is None else err_fd,
            metrics=files.whole(command.metrics_file, "--metrics"),
            per_task=per_task_fd,
            aggregate=files.whole(command.aggregate_file, "--aggregate"),
            progress=files.whole(command.progress_file, "--progress-file", regular_only=True),
            record=record,
        )
        if record is not None and command.output is not None:
            files.remove_if_refused(identity.record_path(command.output))
        return await _CommandLineRun(command, streams, files_fds, resume, earlier, options, tls).run()


LOCK_POLL_SECONDS = 0.2  # how often --wait-lock tries an output another run holds


async def _open_appended(command: CommandConfig, files: OutputFiles, streams: Streams) -> list[int | None]:
    """-o, --errors and --per-task, opened to append and locked: shared with --append (runs that
    only add lines may share a file), else exclusive. An output another run holds is refused
    (OutputInUse), or with --wait-lock waited for; they are locked in the order of their paths,
    so that two waiting runs never hold one each of what the other waits for."""
    fresh_only = not (command.resume or command.append)
    lock: Lock = "shared" if command.append and not command.resume else "exclusive"
    wanted = [
        (command.output, "-o", fresh_only),
        (command.errors_file, "--errors", fresh_only),
        (command.per_task_file, "--per-task", False),
    ]
    fds: dict[int, int | None] = {}
    for number in sorted(range(len(wanted)), key=lambda n: os.path.realpath(wanted[n][0] or "")):
        path, option, must_be_empty = wanted[number]
        said = False
        while True:
            try:
                fds[number] = files.open(path, option, must_be_empty=must_be_empty, lock=lock)
                break
            except OutputInUse as held:
                if not command.wait_lock:
                    raise
                if not said:
                    say(f"{held.output} is in use by {held.holder}: waiting for it (--wait-lock)", streams.stderr)
                    said = True
                await trio.sleep(LOCK_POLL_SECONDS)
    return [fds[number] for number in range(len(wanted))]


def _earlier_runs(command: CommandConfig, *, dry_run: bool) -> tuple[ResumeState | None, _Earlier]:
    """What earlier runs left in the outputs of a resumed run: its resume state, and what the
    summary, the aggregate and the materialized file take over (a torn last line cut off first)."""
    earlier = _Earlier()
    if not (command.resume and command.output):
        return None, earlier
    for path in (command.output, command.errors_file, command.materialized_file):
        if path is not None and not dry_run:
            drop_torn_tail(path)
    resume = ResumeState.from_files(command.output, command.errors_file, command.max_attempts)
    if command.materialized_file is not None:
        earlier.materialized = read_pairs(command.materialized_file)
    earlier.results = command.output
    return resume, earlier


@dataclasses.dataclass(frozen=True, slots=True)
class _Fds:
    out: int
    err: int
    metrics: WholeFile | None
    per_task: int | None
    aggregate: WholeFile | None
    progress: WholeFile | None
    record: identity.RunRecord | None  # written beside -o before anything is sent


@dataclasses.dataclass(slots=True)
class _Earlier:
    """What a resumed run takes over from the runs before it, beyond the resume state."""

    materialized: KeyTable | None = None  # pairs whose bodies the materialized file holds
    results: str | None = None  # the results file whose lines the summary and the aggregate cover too


class _CommandLineRun:
    """One command-line run over its opened files: the writers, the display, the engine and the
    services around it, then the summary and the exit status."""

    def __init__(
        self,
        command: CommandConfig,
        streams: Streams,
        fds: _Fds,
        resume: ResumeState | None,
        earlier: _Earlier,
        options: RunOptions,
        tls: ssl.SSLContext | None,
    ) -> None:
        self.command, self.streams, self.fds, self.resume, self.earlier, self.options = (
            command, streams, fds, resume, earlier, options,
        )  # fmt: skip
        self.config = config = command.engine
        self.control = RunControl()
        self.metrics = Metrics()
        self.write_failures: list[OutputFailed] = []
        self.results = self._writer(fds.out, f"-o {command.output}" if command.output else "standard output")
        self.stderr_lines = self._writer(streams.stderr, "standard error")
        self.errors = (
            self._writer(fds.err, f"--errors {command.errors_file}") if fds.err != streams.stderr else self.stderr_lines
        )
        self.per_task = (
            self._writer(fds.per_task, f"--per-task {command.per_task_file}") if fds.per_task is not None else None
        )
        outputs = (self.results, self.errors, self.stderr_lines, self.per_task)
        self.writers = list(dict.fromkeys(w for w in outputs if w is not None))
        self.display = self._display()
        # While the display is up, stderr lines are printed above it instead of through it.
        self.log: LineWriter = self.display if self.display is not None else self.stderr_lines
        errors_out = self.log if self.errors is self.stderr_lines else self.errors
        # An internal error's details are a -v event line, and a dry run has none.
        message_of = functools.partial(failure_message, details_hint=not (options.verbose or options.dry_run))
        self.sink = (
            BodySink(
                self.results, errors_out, repeats=config.max_repeats, stderr_line=message_line, message_of=message_of
            )
            if options.dry_run
            else LineSink(
                self.results,
                errors_out,
                records=command.errors_file is not None,
                ordered=command.ordered,
                repeats=config.max_repeats,
                stderr_line=message_line,
                message_of=message_of,
            )
        )
        self.tasks = None
        if config.max_repeats > 1:
            per_task = self.per_task
            on_task = (lambda record: per_task.write(_encode(record) + b"\n")) if per_task is not None else None
            self.tasks = TaskStats(config.max_repeats, config.pass_threshold, on_task)
        self.transport = transport_for(config, tls=tls, on_warning=self.say)
        self.reader = LineReader(
            command.inputs, max_line_bytes=command.max_line_bytes, stdin_fd=streams.stdin, on_problem=self.say
        )
        self.engine: Engine | None = None
        self.spool = ResultSpool() if config.aggregate and not options.dry_run else None
        self.report: AggregateReport | None = None
        self.earlier_done = resume.done_pairs if resume is not None else 0

    def _writer(self, fd: int, name: str) -> BatchWriter:
        return BatchWriter(fd, name=name, on_failure=self._output_failed)

    def _output_failed(self, failure: OutputClosed | OutputFailed) -> None:
        # A write that fails stops the run as Ctrl-C does; a closed pipe stops it quietly.
        if isinstance(failure, OutputClosed):
            self.control.stop(StopCause.READER_GONE)
        else:
            self.write_failures.append(failure)
            self.control.stop(StopCause.OUTPUT_FAILED, str(failure))

    def _display(self) -> ProgressDisplay | None:
        options = self.options
        if options.dry_run or not progress_wanted(options.progress, quiet=options.quiet, stderr_fd=self.streams.stderr):
            return None
        from rollfilter.cli.progress import ProgressDisplay

        return ProgressDisplay(
            self.metrics,
            fd=self.streams.stderr,
            force_terminal=bool(options.progress),
            adaptive=self.config.adaptive,
            priced=bool(self.config.prices),
            fallback=self.stderr_lines,
        )

    def say(self, text: str) -> None:
        self.log.write(message_line(in_options(text)))

    def show_route(self, job: Job, agent: Agent) -> None:
        """--dry-run's line for a job it would send: where to."""
        url = ",".join(shown(replica.url) for replica in agent.replicas)
        self.log.write(message_line(f"{describe(job)} -> POST {url}"))

    def finished(self) -> int:
        """The progress file's count: rollouts finished, earlier runs' included."""
        given_up = self.engine.planner.given_up if self.engine is not None else 0  # out of attempts: finished too
        return self.earlier_done + given_up + self.metrics.ended

    def show_status(self) -> None:
        for line in status_lines(self.engine.status() if self.engine is not None else None):
            self.say(line)

    async def run(self) -> RunEnd:
        try:
            async with trio.open_nursery() as services:
                await self._serve(services)
                services.cancel_scope.cancel()
        finally:
            self.reader.close()
            if self.spool is not None:
                self.spool.close()
            await self.transport.aclose()
        return self._finish()

    async def _serve(self, services: trio.Nursery) -> None:
        command, options, control, metrics, fds = self.command, self.options, self.control, self.metrics, self.fds
        for writer in self.writers:
            services.start_soon(writer.run)
        try:
            identity.keep(fds.record, command.output)
        except OutputFailed as failure:  # nothing is sent: the summary says so, and the exit status
            self._output_failed(failure)
        if options.handle_signals:
            await services.start(_watch_signals, control, self.show_status)
        if fds.out == self.streams.stdout and _is_pipe(fds.out):
            services.start_soon(_watch_reader_gone, fds.out, lambda: control.stop(StopCause.READER_GONE))
        if options.demo is not None:
            demo = options.demo
            port = await services.start(lambda task_status: serve_demo(DemoAgent(demo), task_status=task_status))
            self.config = dataclasses.replace(self.config, url=f"http://127.0.0.1:{port}/run")
        config = self.config
        self.engine = engine = await connect_engine(
            config,
            source=self.reader,
            sink=self.sink,
            transport=self.transport,
            control=control,
            metrics=metrics,
            tasks=self.tasks,
            resume=self.resume,
            on_event=self.say if options.verbose and not options.dry_run else None,
            spool=self.spool,
            dry_run=self.show_route if options.dry_run else None,
        )
        planned: int | None = None
        if command.materialized_file is not None and control.cause is None:
            with control.stoppable():
                try:
                    planned = await _plan_first(command, config, engine.router, self.reader, self.streams, self.earlier)
                except OutputFailed as failure:  # the materialized file, or the copy of stdin it needs
                    self._output_failed(failure)
        if self.display is not None:
            total = _known_total(command) if planned is None else lambda: planned
            services.start_soon(self.display.run, total)
        if fds.progress is not None:
            services.start_soon(_publish_progress, fds.progress, self.finished, self.say)
        if self.earlier.results is not None and not options.dry_run:
            await trio.to_thread.run_sync(take_earlier_results, self.earlier.results, metrics, self.tasks, self.spool)
        if control.cause is None:  # not stopped during the first pass: nothing sent then
            await engine.run()
        if self.tasks is not None:
            self.tasks.finish()  # --per-task's lines, while its writer runs
        metrics.expected = planned
        if planned is None and control.cause is None and not options.dry_run:
            metrics.expected = metrics.taken + metrics.skipped + metrics.not_retried  # all of it was read
        if control.cause is not None:
            self.sink.flush_held()
        elif self.spool is not None:
            with control.stoppable():
                self.report = await aggregate_run(self.spool, engine.router, config, self.transport)
            for problem in self.report.problems if self.report is not None else ():
                self.say(f"--aggregate: {problem}")
        # Standard error is closed last: a status asked for (SIGUSR1) while the other outputs are
        # still written, as when a wind-down waits on a full stdout, is printed, not dropped.
        others = [writer for writer in self.writers if writer is not self.stderr_lines]
        for group in (others, [self.stderr_lines]):
            for writer in group:
                writer.close()
            for writer in group:
                await writer.drained.wait()

    def _finish(self) -> RunEnd:
        """How the run ended, with the summary and the files written whole at the end."""
        control, metrics, engine, fds, stderr = self.control, self.metrics, self.engine, self.fds, self.streams.stderr
        metrics.replicas = engine.router.replica_counts() if engine is not None else []
        incomplete = metrics.failed or metrics.not_persisted or self.reader.problems  # an input lost, as cat says
        stopped = control.reason or (control.cause.value if control.cause is not None else None)
        stopped = in_options(stopped) if stopped is not None else None
        summary = summary_bytes(metrics, self.tasks, stopped, self.report)
        if fds.progress is not None:
            with contextlib.suppress(OutputClosed, OutputFailed):  # best effort, as while running
                fds.progress.replace(b"%d\n" % self.finished())
        try:
            replace_content(fds.metrics, summary)
            if self.report is not None:
                replace_content(fds.aggregate, self.report.file_bytes())
        except OutputFailed as failure:
            self.write_failures.append(failure)
        messages = list(dict.fromkeys([control.reason, *map(str, self.write_failures)]))
        for message in filter(None, messages):
            say(in_options(message), stderr)
        if engine is not None and control.cause is None:
            for name in sorted(set(self.config.repeats_by_agent) - engine.planner.agents_seen):
                say(f"-r {name}=K: no row named agent {name!r}", stderr)
        if not self.options.quiet:
            write_stderr(stderr, summary)
        return RunEnd(control.cause, bool(incomplete), output_failed=bool(self.write_failures))


def status_lines(status: RunStatus | None) -> list[str]:
    """The status block that SIGUSR1 prints: the run's figures, then its oldest rollouts in flight."""
    if status is None:
        return ["status: starting, nothing sent yet"]
    lines = [
        f"status: {status.done:,} done, {status.failed:,} failed, {status.in_flight:,} in flight,"
        f" {status.rows_per_s:,.1f} rows/s, {status.elapsed_s:,.1f} s"
    ]
    for rollout in status.oldest:
        agent = rollout.agent if rollout.agent is not None else "(no name)"
        lines.append(
            printable(
                f"  in flight {rollout.age_s:,.1f} s: {rollout.source}:{rollout.line} task {rollout.task_index}"
                f" rollout {rollout.rollout_index} agent {agent} attempt {rollout.attempt}"
            )
        )
    return lines


def progress_wanted(forced: bool | None, *, quiet: bool, stderr_fd: int = 2) -> bool:
    """Shown when stderr is a terminal (not TERM=dumb) unless -q; --progress/--no-progress decide."""
    if forced is not None:
        return forced
    return not quiet and os.isatty(stderr_fd) and os.environ.get("TERM") != "dumb"


def count_lines(paths: Sequence[str]) -> int | None:
    """Lines in regular files (None for stdin or a pipe): the run's total, for an ETA.
    Blank lines are counted too, so it is an estimate when the input has them."""
    total = 0
    for path in paths:
        if path == "-" or not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as file:
            last = b"\n"
            while chunk := file.read(1 << 20):
                total += chunk.count(b"\n")
                last = chunk[-1:]
            total += last != b"\n"
    return total


def _known_total(command: CommandConfig) -> Callable[[], int | None]:
    """How to count the run's rollouts, for the progress display's total and ETA."""
    config = command.engine

    def count() -> int | None:
        lines = None if config.limit is not None and STDIN in command.inputs else count_lines(command.inputs)
        if config.limit is not None:
            lines = config.limit if lines is None else min(lines, config.limit)
        if lines is None or config.repeats_by_agent:
            return None
        shards = config.shard[1] if config.shard else 1
        return -(-lines // shards) * config.max_repeats

    return count
