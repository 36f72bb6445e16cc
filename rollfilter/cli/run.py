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
from rollfilter.cli.environment import Environment
from rollfilter.cli.files import identity
from rollfilter.cli.files.outputs import (
    NamedOutputs,
    OpenedOutputs,
    OutputFiles,
    OutputKey,
    held_target,
    open_appended,
    replace_content,
    run_files,
)
from rollfilter.cli.files.progress_file import known_total, publish_progress
from rollfilter.cli.folding import FailureFolder
from rollfilter.cli.messages import failure_message, message_line, option_of, say, write_summary
from rollfilter.cli.signals import StopSignals, is_pipe, status_block, watch_reader_gone
from rollfilter.cli.statuses import RunEnd
from rollfilter.engine.client import DryRunClient, JobClient
from rollfilter.engine.plan import Job, describe
from rollfilter.engine.routing import Agent
from rollfilter.engine.sinks import BodySink, GroupOutputs, LineSink
from rollfilter.errors import ServiceError, UsageError
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
from rollfilter.redact import shown
from rollfilter.rows import ROLLOUT_INDEX, TASK_INDEX, agent_name
from rollfilter.run.connect import tls_context_for
from rollfilter.run.first_pass import RepeatsMissing
from rollfilter.run.run import ConfigWarning, Run, fit_to_open_files
from rollfilter.run.statistics import RunStatistics
from rollfilter.run.summary import summary_of
from rollfilter.stops import StopCause, StopControl

if TYPE_CHECKING:  # these, --control's socket and the demo agent are loaded by the runs that use them
    from rollfilter.cli.control import ControlSocket
    from rollfilter.cli.exporter import Exporter
    from rollfilter.cli.progress import ProgressDisplay
    from rollfilter.cli.progress_lines import ProgressLines
    from rollfilter.demo import DemoOptions

_encode = msgspec.json.Encoder().encode
# The stops whose reason is a fault, said on stderr wherever it goes; other reasons are notices.
FAULT_STOPS = frozenset({StopCause.OUTPUT_FAILED, StopCause.AGENT_UNREACHABLE})


async def run(
    command: CommandConfig,
    *,
    environment: Environment,
    stops: StopSignals | None = None,
) -> RunEnd:
    """Run the rollouts `command` describes; return how it ended. Prints the summary. `stops`
    (the command's stop signals) stop it from here on, unless `command` handles none. It reads and
    writes the standard streams of `environment` only."""
    stop_control = StopControl()
    if stops is not None and command.handle_signals:
        stops.attach(stop_control)
    else:
        stops = None
    check_inputs(command.inputs)
    if command.config.reverify is not None:  # before an output is opened: one may be that file (refused next)
        from rollfilter.run.reverify import check_materialized  # re-scoring's module, for a run that re-scores

        check_materialized(command.config.reverify.materialized)
    if not command.config.names_an_agent and command.demo is None:
        raise UsageError("no agent to send to: give -u URL, -e NAME=URL, --head-server URL, or --demo")
    outputs = (
        NamedOutputs.standard_streams(command, environment) if command.dry_run else NamedOutputs(command, environment)
    )
    outputs.check()
    tls = tls_context_for(command.config)  # read once, and refused before any file is touched
    if not command.dry_run:
        command = fit_open_files(command, files_per_connection=2 if command.demo else 1, stderr=environment.stderr)
    try:
        return await _run_with_files(command, environment, stop_control, stops, tls)
    except* ServiceError as group:  # the files it made are removed by now, as for any refusal
        refused = _first_error(group)
    return _refused_by_a_service(refused, environment, quiet=command.quiet)


async def _run_with_files(
    command: CommandConfig,
    environment: Environment,
    stop_control: StopControl,
    stops: StopSignals | None,
    tls: ssl.SSLContext | None,
) -> RunEnd:
    """`run`, once its inputs and outputs are checked: the outputs opened, the run made and executed."""
    with _control_socket(command.control_socket) as control, OutputFiles() as files:
        if command.dry_run:  # it changes no file: it reads what resume reads, and prints the rest
            command, _ = identity.command_as_recorded(command)
            opened, resume, earlier = OpenedOutputs.standard_streams(environment), _resume_state(command), _Earlier()
        else:
            opening = await _open_outputs(command, files, environment, stop_control)
            if opening is None:
                return _stopped_before_opening(stop_control, environment, quiet=command.quiet)
            command, opened, resume, earlier = opening
        async with _demo_agent(command.demo) as url:
            if url is not None:
                command = dataclasses.replace(command, config=dataclasses.replace(command.config, url=url))
            clrun = _CommandLineRun(command, environment, opened, resume, earlier, tls, stop_control)
            return await clrun.execute(stops, control)


def _first_error(group: BaseExceptionGroup[ServiceError]) -> ServiceError:
    """The first of the errors in `group`, however deep it is nested."""
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    assert isinstance(found, ServiceError)
    return found


def _refused_by_a_service(refused: ServiceError, environment: Environment, *, quiet: bool) -> RunEnd:
    """A run that a service it needs before sending (a head server, a resources server's
    /reverify_mode) stopped: its line, then the summary of nothing sent, last, as every run's is."""
    say(str(refused), environment.stderr)
    if not quiet:
        _write_nothing_sent(environment, stopped=str(refused))
    return RunEnd(refused=refused)


async def _open_outputs(
    command: CommandConfig, files: OutputFiles, environment: Environment, control: StopControl
) -> tuple[CommandConfig, OpenedOutputs, ResumeState | None, _Earlier] | None:
    """`command`'s outputs opened and locked, then read under the lock: its run record, and what
    earlier runs left (see `_earlier_runs`); the command as recorded. None when a stop came while
    --wait-lock waited."""
    appended: dict[OutputKey, int] = {}
    with control.stoppable():  # a stop while --wait-lock waits: the summary of nothing sent
        appended = await open_appended(command, files, environment.stderr, say)
    if control.cause is not None and "output" not in appended:
        return None
    for caveat in files.caveats:
        say(caveat, environment.stderr)
    command, record = identity.command_as_recorded(command)
    resume, earlier = _earlier_runs(command)
    return command, run_files(command, files, environment, appended, record), resume, earlier


def _stopped_before_opening(control: StopControl, environment: Environment, *, quiet: bool) -> RunEnd:
    """A run stopped while it waited to lock its outputs: nothing was sent, and its summary says so."""
    assert control.cause is not None
    if not quiet:
        _write_nothing_sent(environment, stopped=control.why_stopped)
    return RunEnd(control.cause)


def _write_nothing_sent(environment: Environment, *, stopped: str | None) -> None:
    """The summary of a run stopped before it sent anything, for `stopped`."""
    statistics = dataclasses.replace(RunStatistics.empty(), stopped=stopped)
    summary = _encode(summary_of(statistics)) + b"\n"
    write_summary(environment.stderr, summary_for(summary, environment.stderr_is_terminal))


def fitted_concurrency(wanted: int, *, files_per_connection: int) -> int:
    """How many of `wanted` requests at once fit under the open-file limit (raised as far as it goes)."""
    return fit_to_open_files(wanted, files_per_connection=files_per_connection)[0]


def fit_open_files(command: CommandConfig, *, files_per_connection: int, stderr: int) -> CommandConfig:
    """Raise the open-file limit as far as it goes; if -j still does not fit under it, say so
    once, before anything is sent, and run fewer rows at a time (the run fits it no further)."""
    fitted, problem = fit_to_open_files(
        command.config.concurrency, files_per_connection=files_per_connection, limit_name="ulimit -n"
    )
    if problem is None:
        return command
    say(f"-j {problem}", stderr)
    return dataclasses.replace(command, config=dataclasses.replace(command.config, concurrency=fitted))


def _control_socket(path: str | None) -> contextlib.AbstractContextManager[ControlSocket | None]:
    """--control's socket at `path` (None: none) while the block runs; removed after it."""
    if path is None:
        return contextlib.nullcontext()
    from rollfilter.cli.control import control_socket

    return control_socket(path)


@contextlib.asynccontextmanager
async def _demo_agent(options: DemoOptions | None) -> AsyncIterator[str | None]:
    """The demo agent, serving on a free loopback port while the block runs: its /run URL."""
    if options is None:
        yield None
        return
    from rollfilter.demo import DemoAgent
    from rollfilter.demo import serve as serve_demo

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


def _earlier_runs(command: CommandConfig) -> tuple[ResumeState | None, _Earlier]:
    """What earlier runs left in the outputs of a resumed run: its resume state, and what the
    summary, the aggregate and the materialized file take over (a torn last line cut off first)."""
    earlier = _Earlier()
    if not (command.resume and command.output):
        return None, earlier
    held = held_target(command)
    for path in (command.output, command.errors_file, command.materialized_file, command.dropped_file, held):
        if path is not None:
            drop_torn_tail(path)
    resume = _resume_state(command)
    assert resume is not None
    if held is not None and command.dropped_file is not None:
        resume.rebuild_dropped(command.dropped_file, held)
    if command.materialized_file is not None:
        earlier.materialized = read_pairs(command.materialized_file)
    earlier.results = command.output
    earlier.held = held
    return resume, earlier


def _resume_state(command: CommandConfig) -> ResumeState | None:
    """What a resumed run skips or retries, read from its outputs (after `drop_torn_tail` has cut a
    torn last line; reading them may also cut off -o a group left in part: `ResumeState.cut_bytes`)."""
    if not (command.resume and command.output):
        return None
    config, held = command.config, held_target(command)
    return ResumeState.from_files(
        command.output, command.errors_file, command.max_attempts, held=held, target_groups=config.target_groups
    )


class _CommandLineRun:
    """One command-line run over its opened files: the writers, the display, the run and the
    services around it, then the summary and the exit status."""

    def __init__(
        self,
        command: CommandConfig,
        environment: Environment,
        files: OpenedOutputs,
        resume: ResumeState | None,
        earlier: _Earlier,
        tls: ssl.SSLContext | None,
        control: StopControl,
    ) -> None:
        self.command, self.files, self.earlier = command, files, earlier
        self.environment = environment
        self.resume = resume
        self.control = control
        self.write_failures: list[OutputFailed] = []
        self.results = self._writer(files.results, files.results_name)
        self.stderr_lines = self._writer(environment.stderr, "standard error")
        self.errors = self._appended("errors_file") or self.stderr_lines
        self.per_task = self._appended("per_task_file")
        self.dropped = self._appended("dropped_file")
        self.held = self._appended("held_file")
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
        self.sink, client = self._dry_run_parts() if command.dry_run else (self._sink(), None)
        self.run = Run(
            command.config,
            source=self.reader,
            sink=self.sink,
            control=self.control,
            resume=resume,
            tls=tls,
            on_task=self._write_task if self.per_task is not None else None,
            on_event=self.say if command.verbose and client is None else None,
            on_warning=self.say,
            client=client,
            hold=self.held.write if self.held is not None else None,
            stop_when_unreachable=True,
        )
        self.exporter = self._exporter()
        self.control_socket: ControlSocket | None = None
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

    @property
    def _errors_out(self) -> LineWriter:
        """Where failures go: --errors, or stderr above the display."""
        return self.log if self.errors is self.stderr_lines else self.errors

    def _dry_run_parts(self) -> tuple[LineSink, JobClient]:
        """--dry-run's sink and client: each body printed where results go, each route said on
        stderr just before it, and nothing sent."""
        # An internal error's details are a -v event line, and a dry run has none.
        message_of = functools.partial(failure_message, details_hint=False)
        sink = BodySink(
            self.results,
            self._errors_out,
            repeats=self.command.config.max_repeats,
            stderr_line=message_line,
            message_of=message_of,
            fold=self.folder.admit,
        )
        return sink, DryRunClient(self.show_route)

    def _sink(self) -> LineSink:
        # An internal error's details are a -v event line.
        message_of = functools.partial(failure_message, details_hint=not self.command.verbose)
        results_fd = self.files.results
        groups = GroupOutputs(
            keep_incomplete=self.command.config.keep_incomplete,
            dropped=self.dropped,
            held=self.held,
            results_size=lambda: os.lseek(results_fd, 0, os.SEEK_CUR),
        )
        return LineSink(
            self.results,
            self._errors_out,
            records="errors_file" in self.files.appended,
            ordered=self.command.ordered,
            repeats=self.command.config.max_repeats,
            stderr_line=message_line,
            message_of=message_of,
            groups=groups,
            fold=self.folder.admit,
        )

    def _write_task(self, record: dict[str, object]) -> None:
        assert self.per_task is not None
        self.per_task.write(_encode(record) + b"\n")

    def _writer(self, fd: int, name: str) -> BatchWriter:
        return BatchWriter(fd, name=name, on_failure=self._output_failed)

    def _appended(self, key: OutputKey) -> BatchWriter | None:
        """The writer of the output `key` appends to, if the run has it."""
        fd = self.files.appended.get(key)
        return None if fd is None else self._writer(fd, self.files.names[key])

    def _output_failed(self, failure: OutputClosed | OutputFailed) -> None:
        # A write that fails stops the run as Ctrl-C does; a closed pipe stops it quietly.
        if isinstance(failure, OutputClosed):
            self.control.stop(StopCause.READER_GONE)
        else:
            self.write_failures.append(failure)
            self.control.stop(StopCause.OUTPUT_FAILED, str(failure))

    def _exporter(self) -> Exporter | None:
        """--prometheus and --prometheus-file's, when either is given (prometheus_client is imported then)."""
        prometheus_file = self.files.whole.get("prometheus_file")
        if not self.files.listening and prometheus_file is None:
            return None
        from rollfilter.cli.exporter import Exporter

        return Exporter(self.run, self.files.listening, prometheus_file)

    def _display(self) -> ProgressDisplay | None:
        command, config = self.command, self.command.config
        wanted = progress_wanted(command.progress, quiet=command.quiet, can_draw=self.environment.stderr_can_draw)
        if command.dry_run or not wanted or not self.environment.stderr_is_terminal:
            return None
        from rollfilter.cli.progress import ProgressDisplay

        return ProgressDisplay(
            fd=self.environment.stderr,
            variables=self.environment.variables,
            force_terminal=bool(command.progress),
            adaptive=config.adaptive,
            priced=bool(config.prices),
            limited=config.rate_limited,
            steered=self.command.control_socket is not None,
            fallback=self.stderr_lines,
        )

    def _progress_lines(self) -> ProgressLines | None:
        """--progress where stderr is no terminal (a batch job's log): plain lines, not the display."""
        if self.command.dry_run or not self.command.progress or self.environment.stderr_is_terminal:
            return None
        from rollfilter.cli.progress_lines import ProgressLines

        return ProgressLines(fd=self.environment.stderr)

    def say(self, text: str) -> None:
        self.log.write(message_line(text))

    def show_route(self, job: Job, agent: Agent) -> None:
        """--dry-run's line for a job it would send: where to."""
        url = ",".join(shown(replica.url) for replica in agent.replicas)
        self.log.write(message_line(f"{describe(job)} -> POST {url}"))

    def show_status(self) -> None:
        for line in status_block(self.run.statistics()):
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
        if not self.command.quiet:
            write_summary(self.environment.stderr, _encode(self.run.summary()) + b"\n")

    async def _serve(self, services: trio.Nursery) -> None:
        files, command, control, run = self.files, self.command, self.control, self.run
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
            from rollfilter.cli.control import ControlServer

            on_command = self.say if command.verbose else None
            per_connection = 2 if command.demo else 1  # the demo agent's end of each connection too
            fit = functools.partial(fitted_concurrency, files_per_connection=per_connection)
            services.start_soon(ControlServer(self.control_socket, run, on_command, fit).serve)
        await run.connect()  # a ConfigError, as for an agent the head server did not name, is said by its option
        planned = await self._plan_first() if files.materialized is not None and control.cause is None else None
        if self.display is not None:
            services.start_soon(self.display.run, run.statistics, self._total(planned))
        if self.progress_lines is not None:
            services.start_soon(self.progress_lines.run, run.statistics, self._total(planned))
        progress_file = files.whole.get("progress_file")
        if progress_file is not None:
            services.start_soon(publish_progress, progress_file, run.statistics, self.say)
        if self.earlier.results is not None:
            await trio.to_thread.run_sync(self._take_earlier_results, self.earlier.results)
        if control.cause is None:  # not stopped during the first pass: nothing sent then
            await run.send()
        self._drop_leftovers()
        await run.finish()  # --per-task's lines are written then, while its writer runs
        if control.stopped_early:
            self.sink.flush_backlog()  # what --ordered holds behind rows that never finished
        else:
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
        config, left_open = self.command.config, set()
        for result in self.resume.leftover_carried():
            if self.dropped is not None:
                self.dropped.write(_encode({**result, DROPPED_BECAUSE: CANCELLED}) + b"\n")
            rollout, size = result.get(ROLLOUT_INDEX), config.repeats_for(agent_name(result)) or 1
            left_open.add((_encode(result.get(TASK_INDEX)), rollout // size if type(rollout) is int else 0))
        if self.run.groups is not None:
            self.run.groups.cancel_earlier(len(left_open))

    async def _plan_first(self) -> int | None:
        """The materialized file's first pass (see `Run.plan_first`): the rollouts planned, or None
        when the file could not be written (the run is stopped then)."""
        command, path = self.command, self.files.materialized
        assert path is not None
        with self.control.stoppable():
            try:
                return await self.run.plan_first(
                    path,
                    name=f"--materialized {path}",
                    keep_existing=command.resume or command.append,
                    already=self.earlier.materialized,
                    on_staged=self.files.keep_locked,
                )
            except OutputFailed as failure:  # the materialized file, or the copy of stdin it needs
                self._output_failed(failure)
            except RepeatsMissing as missing:
                shown = ", ".join("rows naming no agent" if name is None else repr(name) for name in missing.agents)
                given = ", ".join(f"{name}={count}" for name, count in sorted(command.config.repeats_by_agent.items()))
                raise UsageError(
                    f"-r {given} gives no repeat count for {shown}, and no default -r K: give -r K for"
                    " the agents it does not name, or -r NAME=K for each; nothing was sent"
                ) from None
        return None

    def _total(self, planned: int | None) -> Callable[[], int | None]:
        """How the display finds the run's total, for its ETA."""
        if planned is not None:
            return lambda: planned
        config = self.command.config
        repeats = None if config.repeats_by_agent else config.max_repeats
        if config.reverify is not None:
            repeats = None if config.reverify.judge_failed_only else 1  # a line a rollout (of those re-scored)
        return known_total(self.command.inputs, limit=config.limit, shard=config.shard, repeats=repeats)

    def _take_earlier_results(self, path: str) -> None:
        for result in result_records(path):
            self.run.count_earlier(result)
        resume = self.resume
        if resume is not None and self.earlier.held is not None:
            for result in resume.dropped_results(self.earlier.held):  # dropped groups are real samples too
                self.run.count_earlier(result)

    def _finish(self) -> RunEnd:
        """How the run ended, with the summary and the files written whole at the end."""
        control, run, files, stderr = self.control, self.run, self.files, self.environment.stderr
        summary_object = run.summary()
        summary = _encode(summary_object) + b"\n"
        figures = run.statistics()
        incomplete = (  # an input lost, as cat says; an aggregate without some agent's answer or some results
            figures.failed
            or figures.not_persisted
            or self.reader.problems
            or (run.report is not None and not run.report.whole)
        )
        progress_file = files.whole.get("progress_file")
        if progress_file is not None:
            with contextlib.suppress(OutputClosed, OutputFailed):  # best effort, as while running
                progress_file.replace(b"%d\n" % figures.finished)
        if self.exporter is not None:
            self.exporter.finish()
        try:
            replace_content(files.whole.get("metrics_file"), summary)
            if run.report is not None:
                replace_content(files.whole.get("aggregate_file"), run.report.file_bytes())
        except OutputFailed as failure:
            self.write_failures.append(failure)
        # Why the run stopped is in the summary (`stopped`); a line of its own would come between a
        # pipe or a file and the one JSON line it is there to read, so it is said at a terminal only.
        # A fault (an output, an agent) is said wherever stderr goes.
        notice = control.reason if control.cause in FAULT_STOPS or self.environment.stderr_is_terminal else None
        messages = list(dict.fromkeys([notice, *map(str, self.write_failures)]))
        for message in filter(None, messages):
            say(message, stderr)
        for warning in run.warnings():
            say(warning_message(warning), stderr)
        summary_lost = False
        if not self.command.quiet:
            drawn = chart_lines(summary_object, can_draw=self.environment.stderr_can_draw)
            chart = b"".join(line.encode() + b"\n" for line in drawn)
            summary_lost = not write_summary(stderr, chart + summary_for(summary, self.environment.stderr_is_terminal))
        return RunEnd(
            control.cause, bool(incomplete), output_failed=bool(self.write_failures), summary_lost=summary_lost
        )


def warning_message(warning: ConfigWarning) -> str:
    """A run's warning as the command says it: naming the option the user gave."""
    option = option_of(warning.field) if warning.key is None else option_of(warning.field, warning.key)
    return f"{option}: {warning.problem}"


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
