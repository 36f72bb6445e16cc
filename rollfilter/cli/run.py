"""The command-line run: a `rollfilter.run.run.Run` wrapped with the command's files, writers,
signals, display and demo agent, and the summary at the end.

`run` checks and opens the outputs (`cli/files/outputs.py`), reads what earlier runs left, and hands
them to `_CommandLineRun`, which owns the services nursery (writers, signal and stdout watchers,
the display, the progress file) around the run's engine, and returns how the run ended. It
raises only `RollfilterError` (before anything is sent) and unexpected bugs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import ssl
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import msgspec
import trio

from rollfilter.cli.chart import chart_lines
from rollfilter.cli.command import CommandConfig
from rollfilter.cli.control import ControlServer, ControlSocket, control_socket
from rollfilter.cli.environment import Environment
from rollfilter.cli.files import identity
from rollfilter.cli.files.outputs import (
    OutputFiles,
    RunFiles,
    RunOutputs,
    dry_run_files,
    held_target,
    open_appended,
    replace_content,
    run_files,
)
from rollfilter.cli.files.progress_file import known_total, publish_progress
from rollfilter.cli.first_pass import count_rollouts, plan_first
from rollfilter.cli.folding import FailureFolder
from rollfilter.cli.messages import failure_message, message_line, say, write_summary
from rollfilter.cli.signals import StopSignals, is_pipe, status_lines, watch_reader_gone
from rollfilter.cli.statuses import RunEnd
from rollfilter.config import Config, ConfigError
from rollfilter.demo import DemoAgent, DemoOptions
from rollfilter.demo import serve as serve_demo
from rollfilter.engine.metrics import Metrics
from rollfilter.engine.nursery import RunControl, StopCause, describe
from rollfilter.engine.plan import Job
from rollfilter.engine.routing import Agent
from rollfilter.engine.sinks import BodySink, GroupOutputs, LineSink
from rollfilter.errors import UsageError
from rollfilter.formats.keytable import KeyTable
from rollfilter.formats.resume import (
    CANCELLED,
    DROPPED_BECAUSE,
    ResumeState,
    drop_torn_tail,
    read_pairs,
    result_records,
)
from rollfilter.formats.source import LineReader, check_inputs
from rollfilter.formats.writers import BatchWriter, LineWriter, OutputClosed, OutputFailed
from rollfilter.http import connections_that_fit, raise_open_file_limit
from rollfilter.redact import shown
from rollfilter.rows import ROLLOUT_INDEX, TASK_INDEX, agent_name
from rollfilter.run.connect import tls_context_for
from rollfilter.run.run import Run

if TYPE_CHECKING:
    from rollfilter.cli.exporter import Exporter
    from rollfilter.cli.progress import ProgressDisplay
    from rollfilter.cli.progress_lines import ProgressLines

_encode = msgspec.json.Encoder().encode
# The options of the Config fields a run checks once it knows its agents (Run.connect).
OPTION_OF_FIELD = {"rpm_by_agent": "--rpm NAME=N", "tpm_by_agent": "--tpm NAME=N"}
# The stops whose reason is a fault, said on stderr wherever it goes; other reasons are notices.
FAULT_STOPS = frozenset({StopCause.OUTPUT_FAILED, StopCause.AGENT_UNREACHABLE})


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
    command: CommandConfig,
    *,
    environment: Environment,
    options: RunOptions = RunOptions(),
    stops: StopSignals | None = None,
) -> RunEnd:
    """Run the rollouts `command` describes; return how it ended. Prints the summary. `stops`
    (the command's stop signals) stop it from here on, unless `options` say it handles none. It
    reads and writes the standard streams of `environment` only."""
    run_control = RunControl()
    if stops is not None and options.handle_signals:
        stops.attach(run_control)
    else:
        stops = None
    check_inputs(command.inputs)
    if not command.engine.names_an_agent and options.demo is None:
        raise UsageError("no agent to send to: give -u URL, -e NAME=URL, --head-server URL, or --demo")
    RunOutputs(command, environment, dry_run=options.dry_run).check()
    tls = cacert_context(command.engine)  # read once, and refused before any file is touched
    if not options.dry_run:
        command = fit_open_files(command, files_per_connection=2 if options.demo else 1, stderr=environment.stderr)
    with control_socket(command.control_socket) as control, OutputFiles() as files:
        # Locked first: the record, the resume state and a torn tail are read under the lock.
        appended: list[int | None] = [None] * 5
        with run_control.stoppable():  # a stop while --wait-lock waits: the summary of nothing sent
            if not options.dry_run:
                appended = await open_appended(command, files, environment.stderr, say)
        if run_control.cause is not None and not options.dry_run and None in appended[:1]:
            return _stopped_before_opening(run_control, environment, quiet=options.quiet)
        for caveat in files.caveats:
            say(caveat, environment.stderr)
        command, record = identity.command_as_recorded(command)
        resume, earlier = _earlier_runs(command, dry_run=options.dry_run)
        if options.dry_run:  # it changes no file: it reads what resume reads, and prints the rest
            opened, earlier = dry_run_files(environment), _Earlier()
        else:
            opened = run_files(command, files, environment, appended, record)
        async with _demo_agent(options.demo) as url:
            if url is not None:
                command = dataclasses.replace(command, engine=dataclasses.replace(command.engine, url=url))
            clrun = _CommandLineRun(command, environment, opened, resume, earlier, options, tls, run_control)
            return await clrun.execute(stops, control)


def _stopped_before_opening(control: RunControl, environment: Environment, *, quiet: bool) -> RunEnd:
    """A run stopped while it waited to lock its outputs: nothing was sent, and its summary says so."""
    assert control.cause is not None
    if not quiet:
        write_summary(environment.stderr, _encode(Metrics().summary(stopped=control.cause.value)) + b"\n")
    return RunEnd(control.cause)


def cacert_context(config: Config) -> ssl.SSLContext | None:
    """The TLS context of --cacert's file (see `tls_context_for`); UsageError naming the option."""
    try:
        return tls_context_for(config)
    except ConfigError as exc:
        raise UsageError(f"--cacert {exc.problem}") from None


def fitted_concurrency(wanted: int, *, files_per_connection: int) -> int:
    """How many of `wanted` requests at once fit under the open-file limit (raised as far as it goes)."""
    return connections_that_fit(wanted, raise_open_file_limit(), files_per_connection=files_per_connection)


def fit_open_files(command: CommandConfig, *, files_per_connection: int, stderr: int) -> CommandConfig:
    """Raise the open-file limit as far as it goes; if -j still does not fit under it, say so
    once and run fewer rows at a time, so that no row fails for this machine's limit."""
    limit = raise_open_file_limit()
    wanted = command.engine.concurrency
    fitted = connections_that_fit(wanted, limit, files_per_connection=files_per_connection)
    if fitted == wanted:
        return command
    say(
        f"-j {wanted} needs more open files than this process may have ({limit},"
        f" see ulimit -n): running {fitted} rows at a time",
        stderr,
    )
    return dataclasses.replace(command, engine=dataclasses.replace(command.engine, concurrency=fitted))


@contextlib.asynccontextmanager
async def _demo_agent(options: DemoOptions | None) -> AsyncIterator[str | None]:
    """The demo agent, serving on a free loopback port while the block runs: its /run URL."""
    if options is None:
        yield None
        return
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve_demo(DemoAgent(options), task_status=task_status))
        yield f"http://127.0.0.1:{port}/run"
        nursery.cancel_scope.cancel()


@dataclasses.dataclass(slots=True)
class _Earlier:
    """What a resumed run takes over from the runs before it, beyond the resume state."""

    materialized: KeyTable | None = None  # pairs whose bodies the materialized file holds
    results: str | None = None  # the results file whose lines the summary and the aggregate cover too
    held: str | None = None  # the held file, whose dropped groups the summary covers too


def _earlier_runs(command: CommandConfig, *, dry_run: bool) -> tuple[ResumeState | None, _Earlier]:
    """What earlier runs left in the outputs of a resumed run: its resume state, and what the
    summary, the aggregate and the materialized file take over (a torn last line cut off first)."""
    earlier = _Earlier()
    if not (command.resume and command.output):
        return None, earlier
    held = held_target(command)
    for path in (command.output, command.errors_file, command.materialized_file, command.dropped_file, held):
        if path is not None and not dry_run:
            drop_torn_tail(path)
    resume = ResumeState.from_files(
        command.output, command.errors_file, command.max_attempts, held=held, target_groups=command.engine.target_groups
    )
    if held is not None and command.dropped_file is not None and not dry_run:
        resume.rebuild_dropped(command.dropped_file, held)
    if command.materialized_file is not None:
        earlier.materialized = read_pairs(command.materialized_file)
    earlier.results = command.output
    earlier.held = held
    return resume, earlier


class _CommandLineRun:
    """One command-line run over its opened files: the writers, the display, the run and the
    services around it, then the summary and the exit status."""

    def __init__(
        self,
        command: CommandConfig,
        environment: Environment,
        files: RunFiles,
        resume: ResumeState | None,
        earlier: _Earlier,
        options: RunOptions,
        tls: ssl.SSLContext | None,
        control: RunControl,
    ) -> None:
        self.command, self.files, self.earlier, self.options = command, files, earlier, options
        self.environment = environment
        self.resume = resume
        self.control = control
        self.write_failures: list[OutputFailed] = []
        self.results = self._writer(files.results, files.results_name)
        self.stderr_lines = self._writer(environment.stderr, "standard error")
        self.errors = self.stderr_lines if files.errors is None else self._writer(files.errors, files.errors_name)
        self.per_task = (
            None if files.per_task is None else self._writer(files.per_task, f"--per-task {command.per_task_file}")
        )
        self.dropped = (
            None if files.dropped is None else self._writer(files.dropped, f"--dropped {command.dropped_file}")
        )
        self.held = None if files.held is None else self._writer(files.held, f"the held file {command.held_file}")
        self.writers = list(
            dict.fromkeys(
                w for w in (self.results, self.errors, self.stderr_lines, self.per_task, self.dropped, self.held) if w
            )
        )
        self.display = self._display()
        self.folder = FailureFolder(trio.current_time, message_line)
        self.progress_lines = self._progress_lines()
        self.reader = LineReader(
            command.inputs, max_line_bytes=command.max_line_bytes, stdin_fd=environment.stdin, on_problem=self.say
        )
        self.sink = self._sink()
        self.run = Run(
            command.engine,
            source=self.reader,
            sink=self.sink,
            control=self.control,
            resume=resume,
            tls=tls,
            on_task=self._write_task if self.per_task is not None else None,
            on_event=self.say if options.verbose and not options.dry_run else None,
            on_warning=self.say,
            dry_run=self.show_route if options.dry_run else None,
            hold=self.held.write if self.held is not None else None,
            stop_when_unreachable=True,
        )
        self.exporter = self._exporter()
        self.control_socket: ControlSocket | None = None
        self.earlier_done = resume.done_pairs if resume is not None else 0
        if resume is not None and resume.reopened:
            self.say(
                f"--resume: cut {resume.cut_bytes} bytes of results off -o {command.output}, from the first"
                f" group written incomplete whose failed rollouts run again ({resume.reopened} in all): those"
                " groups are written again, whole, with the groups after them"
            )
        elif resume is not None and resume.cut_bytes:
            self.say(
                f"--resume: cut {resume.cut_bytes} bytes of results off -o {command.output} that may be a group"
                " a kill left in part: they are written again with their group"
            )

    @property
    def log(self) -> LineWriter:
        """Where stderr lines go: above the display while it is up, so as not to tear it."""
        return self.display if self.display is not None else self.stderr_lines

    def _sink(self) -> LineSink:
        errors_out = self.log if self.errors is self.stderr_lines else self.errors
        # An internal error's details are a -v event line, and a dry run has none.
        details_hint = not (self.options.verbose or self.options.dry_run)
        message_of = functools.partial(failure_message, details_hint=details_hint)
        repeats = self.command.engine.max_repeats
        fold = self.folder.admit
        if self.options.dry_run:
            return BodySink(
                self.results, errors_out, repeats=repeats, stderr_line=message_line, message_of=message_of, fold=fold
            )
        results_fd = self.files.results
        groups = GroupOutputs(
            keep_incomplete=self.command.engine.keep_incomplete,
            dropped=self.dropped,
            held=self.held,
            results_size=lambda: os.lseek(results_fd, 0, os.SEEK_CUR),
        )
        return LineSink(
            self.results,
            errors_out,
            records=self.files.errors is not None,
            ordered=self.command.ordered,
            repeats=repeats,
            stderr_line=message_line,
            message_of=message_of,
            groups=groups,
            fold=fold,
        )

    def _write_task(self, record: dict[str, object]) -> None:
        assert self.per_task is not None
        self.per_task.write(_encode(record) + b"\n")

    def _writer(self, fd: int, name: str) -> BatchWriter:
        return BatchWriter(fd, name=name, on_failure=self._output_failed)

    def _output_failed(self, failure: OutputClosed | OutputFailed) -> None:
        # A write that fails stops the run as Ctrl-C does; a closed pipe stops it quietly.
        if isinstance(failure, OutputClosed):
            self.control.stop(StopCause.READER_GONE)
        else:
            self.write_failures.append(failure)
            self.control.stop(StopCause.OUTPUT_FAILED, str(failure))

    def _exporter(self) -> Exporter | None:
        """--prometheus and --prometheus-file's, when either is given (prometheus_client is imported then)."""
        if not self.files.listening and self.files.prometheus is None:
            return None
        from rollfilter.cli.exporter import Exporter

        return Exporter(self.run, self.files.listening, self.files.prometheus)

    def _display(self) -> ProgressDisplay | None:
        options, config = self.options, self.command.engine
        wanted = progress_wanted(options.progress, quiet=options.quiet, can_draw=self.environment.stderr_can_draw)
        if options.dry_run or not wanted or not self.environment.stderr_is_terminal:
            return None
        from rollfilter.cli.progress import ProgressDisplay

        return ProgressDisplay(
            fd=self.environment.stderr,
            variables=self.environment.variables,
            force_terminal=bool(options.progress),
            adaptive=config.adaptive,
            priced=bool(config.prices),
            limited=config.rate_limited,
            steered=self.command.control_socket is not None,
            fallback=self.stderr_lines,
        )

    def _progress_lines(self) -> ProgressLines | None:
        """--progress where stderr is no terminal (a batch job's log): plain lines, not the display."""
        if self.options.dry_run or not self.options.progress or self.environment.stderr_is_terminal:
            return None
        from rollfilter.cli.progress_lines import ProgressLines

        return ProgressLines(fd=self.environment.stderr, finished=self.finished)

    def say(self, text: str) -> None:
        self.log.write(message_line(text))

    def show_route(self, job: Job, agent: Agent) -> None:
        """--dry-run's line for a job it would send: where to."""
        url = ",".join(shown(replica.url) for replica in agent.replicas)
        self.log.write(message_line(f"{describe(job)} -> POST {url}"))

    def finished(self) -> int:
        """The progress file's count: rollouts finished, earlier runs' included."""
        engine = self.run.engine
        given_up = engine.planner.given_up if engine is not None else 0  # out of attempts: finished too
        return self.earlier_done + given_up + self.run.metrics.ended

    def show_status(self) -> None:
        engine = self.run.engine
        for line in status_lines(engine.status() if engine is not None else None):
            self.say(line)

    async def execute(self, stops: StopSignals | None, control: ControlSocket | None = None) -> RunEnd:
        """Run, with `stops` shown the status and told how to leave in a hurry, and `control`
        (--control's socket) served from the start to the end; then the summary."""
        self.control_socket = control
        if stops is not None:
            stops.show_status, stops.leave = self.show_status, self.leave_now
        try:
            async with trio.open_nursery() as services:
                await self._serve(services)
                services.cancel_scope.cancel()
        finally:
            self.reader.close()
            with trio.CancelScope(shield=True):
                await self.run.aclose()
        if stops is not None:
            stops.leave = None  # the summary is written next, once
        return self._finish()

    def leave_now(self) -> None:
        """A stop signal during the wind-down, as when finished results wait on an output nobody
        reads: the summary as it stands, before the command exits at once. Results not written by
        then are lost (--resume runs them again), and a line says so. --control's socket is
        removed first: no exit leaves it behind."""
        if self.control_socket is not None:
            self.control_socket.remove()
        say("stopped again: results not yet written are dropped (--resume runs them again)", self.environment.stderr)
        if not self.options.quiet:
            control = self.control
            stopped = control.reason or (control.cause.value if control.cause is not None else None)
            write_summary(self.environment.stderr, _encode(self.run.summary(stopped=stopped)) + b"\n")

    async def _serve(self, services: trio.Nursery) -> None:
        files, options, control, run = self.files, self.options, self.control, self.run
        for writer in self.writers:
            services.start_soon(writer.run)
        try:
            identity.keep(files.record, files.output)
        except OutputFailed as failure:  # nothing is sent: the summary says so, and the exit status
            self._output_failed(failure)
        if files.results == self.environment.stdout and is_pipe(files.results):
            services.start_soon(watch_reader_gone, files.results, lambda: control.stop(StopCause.READER_GONE))
        if self.exporter is not None:
            self.exporter.start(services, self.say)
        if self.control_socket is not None:  # served from now: a run may be paused before it sends
            on_command = self.say if options.verbose else None
            per_connection = 2 if options.demo else 1  # the demo agent's end of each connection too
            fit = functools.partial(fitted_concurrency, files_per_connection=per_connection)
            services.start_soon(ControlServer(self.control_socket, run, on_command, fit).serve)
        try:
            await run.connect()
        except ConfigError as exc:  # an agent the head server did not name, say
            raise UsageError(f"{OPTION_OF_FIELD.get(exc.field, exc.field)} {exc.problem}") from None
        planned = await self._plan_first() if files.materialized is not None and control.cause is None else None
        if self.display is not None:
            services.start_soon(self.display.run, run.metrics, self._total(planned), lambda: run.steering.paused)
        if self.progress_lines is not None:
            services.start_soon(self.progress_lines.run, run.metrics, self._total(planned))
        if files.progress is not None:
            services.start_soon(publish_progress, files.progress, self.finished, self.say)
        if self.earlier.results is not None:
            await trio.to_thread.run_sync(self._take_earlier_results, self.earlier.results)
        if control.cause is None:  # not stopped during the first pass: nothing sent then
            await run.send()
        self._drop_leftovers()
        if run.tasks is not None:
            run.tasks.finish()  # --per-task's lines, while its writer runs
        await self._expect(planned)
        if control.stopped_early:
            self.sink.flush_held()  # what --ordered holds behind rows that never finished
        else:
            await run.aggregate()
            for problem in run.report.problems if run.report is not None else ():
                self.say(f"--aggregate: {problem}")
            if run.report is not None and run.report.unnamed:
                self.say("--aggregate: to name the rows' agent, give -a NAME beside -u (or -e NAME=URL -a NAME)")
        unsaid = self.folder.unsaid()
        if unsaid:
            self.log.write(unsaid)
        # Standard error is closed last: a status asked for (SIGUSR1) while the other outputs are
        # still written, as when a wind-down waits on a full stdout, is printed, not dropped. The
        # held file is closed after the results: it is told how far they hold whole groups.
        last = (self.held, self.stderr_lines)
        others = [writer for writer in self.writers if writer not in last]
        for group in (others, [self.held] if self.held is not None else [], [self.stderr_lines]):
            for writer in group:
                writer.close()
            for writer in group:
                await writer.drained.wait()

    def _drop_leftovers(self) -> None:
        """The rollouts an earlier run finished whose groups this run left open (it stopped before
        reading them): into --dropped, as the open groups this run cancelled, and counted so in
        the summary's groups, as the dropped file shows them."""
        if self.resume is None or (self.dropped is None and self.run.groups is None):
            return
        config, left_open = self.command.engine, set()
        for result in self.resume.leftover_held():
            if self.dropped is not None:
                self.dropped.write(_encode({**result, DROPPED_BECAUSE: CANCELLED}) + b"\n")
            rollout, size = result.get(ROLLOUT_INDEX), config.repeats_for(agent_name(result)) or 1
            left_open.add((_encode(result.get(TASK_INDEX)), rollout // size if type(rollout) is int else 0))
        if self.run.groups is not None:
            self.run.groups.cancel_earlier(len(left_open))

    async def _plan_first(self) -> int | None:
        """The materialized file's first pass (see `first_pass.plan_first`): the rollouts planned,
        or None when the file could not be written (the run is stopped then)."""
        command, run = self.command, self.run
        assert self.files.materialized is not None
        assert run.router is not None
        with self.control.stoppable():
            try:
                return await plan_first(
                    self.files.materialized,
                    inputs=command.inputs,
                    config=command.engine,
                    router=run.router,
                    reader=self.reader,
                    stdin_fd=self.environment.stdin,
                    max_line_bytes=command.max_line_bytes,
                    keep_existing=command.resume or command.append,
                    already=self.earlier.materialized,
                    on_staged=self.files.keep_locked,
                )
            except OutputFailed as failure:  # the materialized file, or the copy of stdin it needs
                self._output_failed(failure)
        return None

    def _total(self, planned: int | None) -> Callable[[], int | None]:
        """How the display finds the run's total, for its ETA."""
        if planned is not None:
            return lambda: planned
        config = self.command.engine
        repeats = None if config.repeats_by_agent else config.max_repeats
        if config.reverify is not None:
            repeats = None if config.reverify.judge_failed_only else 1  # a line a rollout (of those re-scored)
        return known_total(self.command.inputs, limit=config.limit, shard=config.shard, repeats=repeats)

    def _take_earlier_results(self, path: str) -> None:
        for result in result_records(path):
            self.run.add_earlier_result(result)
        resume = self.resume
        if resume is not None and self.earlier.held is not None:
            for result in resume.dropped_results(self.earlier.held):  # dropped groups are real samples too
                self.run.add_earlier_result(result)

    async def _expect(self, planned: int | None) -> None:
        """What the summary gives as `expected`: every pair of the input, when it is known."""
        metrics, control = self.run.metrics, self.control
        metrics.expected = planned
        if planned is None and control.cause is None and not self.options.dry_run:
            metrics.expected = metrics.taken + metrics.skipped + metrics.not_retried  # all of it was read
        elif planned is None and control.cause in (StopCause.TARGET_REACHED, StopCause.AGENT_UNREACHABLE):
            # The summary's not_started: the rows not sent, counted when they can be read again.
            command = self.command
            # After a stop, a scope of the control's would be cancelled already: a signal now
            # is a second one, which ends the process (cli/signals.py).
            scope = self.control.stoppable() if control.cause is StopCause.TARGET_REACHED else trio.CancelScope()
            with scope:
                metrics.expected = await count_rollouts(command.inputs, command.engine, command.max_line_bytes)

    def _finish(self) -> RunEnd:
        """How the run ended, with the summary and the files written whole at the end."""
        control, run, files, stderr = self.control, self.run, self.files, self.environment.stderr
        incomplete = (  # an input lost, as cat says; results the agents' aggregate left out
            run.metrics.failed
            or run.metrics.not_persisted
            or self.reader.problems
            or (run.report is not None and run.report.unnamed)
        )
        stopped = control.reason or (control.cause.value if control.cause is not None else None)
        summary_object = run.summary(stopped=stopped)
        summary = _encode(summary_object) + b"\n"
        if files.progress is not None:
            with contextlib.suppress(OutputClosed, OutputFailed):  # best effort, as while running
                files.progress.replace(b"%d\n" % self.finished())
        if self.exporter is not None:
            self.exporter.finish()
        try:
            replace_content(files.metrics, summary)
            if run.report is not None:
                replace_content(files.aggregate, run.report.file_bytes())
        except OutputFailed as failure:
            self.write_failures.append(failure)
        # Why the run stopped is in the summary (`stopped`); a line of its own would come between a
        # pipe or a file and the one JSON line it is there to read, so it is said at a terminal only.
        # A fault (an output, an agent) is said wherever stderr goes.
        notice = control.reason if control.cause in FAULT_STOPS or self.environment.stderr_is_terminal else None
        messages = list(dict.fromkeys([notice, *map(str, self.write_failures)]))
        for message in filter(None, messages):
            say(message, stderr)
        if run.engine is not None and not control.stopped_early:
            for name in sorted(set(self.command.engine.repeats_by_agent) - run.engine.planner.agents_seen):
                say(f"-r {name}=K: no row named agent {name!r}", stderr)
        summary_lost = False
        if not self.options.quiet:
            drawn = chart_lines(summary_object, can_draw=self.environment.stderr_can_draw)
            chart = b"".join(line.encode() + b"\n" for line in drawn)
            summary_lost = not write_summary(stderr, chart + summary_for(summary, self.environment.stderr_is_terminal))
        return RunEnd(
            control.cause, bool(incomplete), output_failed=bool(self.write_failures), summary_lost=summary_lost
        )


def summary_for(summary: bytes, at_terminal: bool) -> bytes:
    """The summary line as it is shown: indented for a person at a terminal; elsewhere (a pipe, a
    file) the one JSON line as it is, for jq and `tail -n 1`."""
    if not at_terminal:
        return summary
    return msgspec.json.format(summary, indent=2) + b"\n"


def progress_wanted(forced: bool | None, *, quiet: bool, can_draw: bool) -> bool:
    """Shown when stderr is a terminal that can draw (not TERM=dumb) unless -q;
    --progress/--no-progress decide."""
    if forced is not None:
        return forced
    return not quiet and can_draw
