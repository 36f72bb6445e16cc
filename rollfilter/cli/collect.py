"""Collecting rollouts, the command's main job: its files, writers, signals, display and demo agent
around the `Run` that `rollfilter.run` makes of them.

`collect` checks the inputs and outputs, opens and locks the outputs and reads what earlier runs left
in them (`cli/files/outputs.py`), and hands both to `_CommandLineRun`, which makes writers over
the files, has the run made of them (`writing_run`), and serves the writers, the signal and stdout
watchers, the views (`cli/views.py`) and --control's socket around it; then `cli/report.py` says
how the run ended. It raises only `RollfilterError` (before anything is sent) and unexpected bugs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import ssl
from typing import TYPE_CHECKING

import msgspec
import trio

from rollfilter.cli.command import CommandConfig
from rollfilter.cli.environment import Environment
from rollfilter.cli.files import identity
from rollfilter.cli.files.open_files import files_per_connection, fit_open_files, fitted_concurrency
from rollfilter.cli.files.outputs import (
    NamedOutputs,
    OpenedOutputs,
    OutputFiles,
    OutputWriters,
    open_outputs,
    resume_cuts,
)
from rollfilter.cli.folding import FailureFolder
from rollfilter.cli.messages import message_line, repeats_missing, say, write_summary
from rollfilter.cli.report import aggregate_lines, report_end, report_refused, report_unsent
from rollfilter.cli.resume_line import resume_line
from rollfilter.cli.signals import StopSignals, is_pipe, status_block, watch_reader_gone
from rollfilter.cli.statuses import RunEnd, tracker_status
from rollfilter.cli.views import RunViews
from rollfilter.errors import ServiceError, UsageError
from rollfilter.formats.source import STDIN, LineReader, check_inputs
from rollfilter.formats.writers import LineWriter, OutputClosed, OutputFailed
from rollfilter.run.connect import tls_context_for
from rollfilter.run.earlier import Earlier
from rollfilter.run.first_pass import RepeatsMissing
from rollfilter.run.outputs import tracked_config
from rollfilter.run.run import writing_run
from rollfilter.stops import StopCause, StopControl

if TYPE_CHECKING:  # --control's socket and the demo agent are loaded by the runs that use them
    from rollfilter.cli.control import ControlSocket
    from rollfilter.demo import DemoOptions

_encode = msgspec.json.Encoder().encode


async def collect(
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
    named = NamedOutputs.standard_streams if command.dry_run else NamedOutputs
    named(command, environment).check()
    tls = tls_context_for(command.config)  # read once, and refused before any file is touched
    if not command.dry_run:
        command = fit_open_files(command, stderr=environment.stderr)
    return await _run_with_files(command, environment, stop_control, stops, tls)


async def _run_with_files(
    command: CommandConfig,
    environment: Environment,
    stop_control: StopControl,
    stops: StopSignals | None,
    tls: ssl.SSLContext | None,
) -> RunEnd:
    """`collect`, once its inputs and outputs are checked: the outputs opened, the run made and
    executed. A run stopped before its outputs are opened, or refused by a service it needs before
    sending (a head server, a resources server's /reverify_mode: said once the files it made are
    removed, as for any refusal), gives the summary of nothing sent, last, as every run's is."""
    made: _CommandLineRun | None = None
    with _control_socket(command.control_socket) as control:
        try:
            with OutputFiles() as files:
                opened = await open_outputs(command, files, environment, stop_control)
                if opened is None:  # stopped while --wait-lock waited
                    return await report_unsent(command.config, stop_control, tls, environment, quiet=command.quiet)
                command, opened_files, earlier = opened
                async with _demo_agent(command.demo) as url:
                    if url is not None:
                        command = dataclasses.replace(command, config=dataclasses.replace(command.config, url=url))
                    made = _CommandLineRun(command, environment, opened_files, earlier, tls, stop_control)
                    return await made.execute(stops, control)
        except* ServiceError as group:
            refusals = group
    assert made is not None, "a service is asked once the run is made"
    return await report_refused(refusals, made.run, environment, quiet=command.quiet)


def _control_socket(path: str | None) -> contextlib.AbstractContextManager[ControlSocket | None]:
    """--control's socket at `path` (None: none) while the block runs; removed after it."""
    if path is None:
        return contextlib.nullcontext()
    from rollfilter.cli.control import control_socket

    return control_socket(path)


def _demo_agent(options: DemoOptions | None) -> contextlib.AbstractAsyncContextManager[str | None]:
    """The demo agent, serving on a free loopback port while the block runs: its /run URL."""
    if options is None:
        return contextlib.nullcontext()
    from rollfilter.demo import DemoAgent, serving

    return serving(DemoAgent(options))


class _CommandLineRun:
    """A command-line run over its opened files: the writers over them (`OutputWriters`), the run
    made of them (`writing_run`), the services and views around it, then the summary and how the
    run ended."""

    def __init__(
        self,
        command: CommandConfig,
        environment: Environment,
        files: OpenedOutputs,
        earlier: Earlier | None,
        tls: ssl.SSLContext | None,
        control: StopControl,
    ) -> None:
        self.command, self.environment, self.files, self.control = command, environment, files, control
        self.write_failures: list[OutputFailed] = []
        self.writers = OutputWriters(files, environment.stderr, self._output_failed)
        self.views = RunViews(command, environment, files, self.writers.stderr)
        self.log: LineWriter = self.views.display or self.writers.stderr  # above the display, not through it
        self.folder = FailureFolder(trio.current_time, message_line)
        self.reader = LineReader(
            command.inputs, max_line_bytes=command.max_line_bytes, stdin_fd=environment.stdin, on_problem=self.say
        )
        outputs = self.writers.run_outputs(command, log=self.log, fold=self.folder.admit)
        config, tracked = tracked_config(command.config, files.record, resume=command.resume)
        self.run = writing_run(
            config,
            outputs,
            source=self.reader,
            earlier=earlier,
            dry_run=command.dry_run,
            control=control,
            tls=tls,
            on_event=self.say if command.verbose else None,
            on_warning=self.say,
            tracked=tracked,
        )
        self.control_socket: ControlSocket | None = None
        self.dropped = "results not yet written are dropped (--resume runs them again)"  # by a second stop
        for line in resume_cuts(command, earlier):
            self.say(line)

    def _output_failed(self, failure: OutputClosed | OutputFailed) -> None:
        # A write that fails stops the run as Ctrl-C does; a closed pipe stops it quietly.
        if isinstance(failure, OutputClosed):
            self.control.stop(StopCause.READER_GONE)
        else:
            self.write_failures.append(failure)
            self.control.stop(StopCause.OUTPUT_FAILED, str(failure))

    def say(self, text: str) -> None:
        self.log.write(message_line(text))

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
        except BaseException:  # refused after its trackers started (an agent no head server knows): they end FAILED
            said_now = functools.partial(say, fd=self.environment.stderr)  # not through a writer the end closed
            with trio.CancelScope(shield=True):
                await self.run.end_tracking(tracker_status(None, failed=True), on_warning=said_now)
            raise
        finally:
            self.reader.close()
            with trio.CancelScope(shield=True):
                await self.run.aclose()
        self.dropped = "the trackers are left as they are"  # all is written: only their wait is left
        self.views.finish(self.run.statistics())
        failures, quiet = self.write_failures, self.command.quiet
        inputs_lost = bool(self.reader.problems)
        try:
            return await report_end(
                self.run, self.environment, self.files, failures=failures, inputs_lost=inputs_lost, quiet=quiet,
                resumed_by=resume_line(self.command.argv, from_stdin=STDIN in self.command.inputs),
            )  # fmt: skip
        finally:
            if stops is not None:
                stops.leave = None  # the summary is written, once

    def leave_now(self) -> None:
        """A stop signal during the wind-down, as when finished results wait on an output nobody
        reads: the summary as it stands, before the command exits at once; results not written by
        then are lost (--resume runs them again), a line says. --control's socket goes first."""
        if self.control_socket is not None:
            self.control_socket.remove()
        say(f"stopped again: {self.dropped}", self.environment.stderr)
        if not self.command.quiet:
            write_summary(self.environment.stderr, _encode(self.run.summary()) + b"\n")

    async def _serve(self, services: trio.Nursery) -> None:
        files, command, control, run = self.files, self.command, self.control, self.run
        for writer in self.writers.every:
            services.start_soon(writer.serve)
        try:
            identity.keep(files.record, files.beside)
        except OutputFailed as failure:  # nothing is sent: the summary says so, and the exit status
            self._output_failed(failure)
        if files.results == self.environment.stdout and is_pipe(files.results):
            services.start_soon(watch_reader_gone, files.results, lambda: control.stop(StopCause.READER_GONE))
        self.views.serve(services, run, self.say)
        if self.control_socket is not None:  # served from now: a run may be paused before it sends
            from rollfilter.cli.control import ControlServer

            on_command = self.say if command.verbose else None
            fit = functools.partial(fitted_concurrency, files_per_connection=files_per_connection(command))
            services.start_soon(ControlServer(self.control_socket, run, on_command, fit).serve)
        try:
            await run.connect()  # a ConfigError, as for an agent the head server did not name, is said by its option
        except ServiceError as refused:
            control.refuse(str(refused))  # the summary says why nothing was sent
            raise
        planned = await self._plan_first() if files.materialized is not None and control.cause is None else None
        self.views.show(services, run.statistics, planned, self.say)
        await run.send()  # nothing is sent after a stop in the first pass
        await run.finish()  # --per-task's lines are written then, while its writer runs
        for line in aggregate_lines(run.report if not control.stopped_early else None):
            self.say(line)
        unsaid = self.folder.unsaid()
        if unsaid:
            self.log.write(unsaid)
        await self.writers.close()

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
                    on_staged=self.files.keep_locked,
                )
            except OutputFailed as failure:  # the materialized file, or the copy of stdin it needs
                self._output_failed(failure)
            except RepeatsMissing as missing:
                raise UsageError(repeats_missing(missing.agents, command.config.repeats.by_agent)) from None
        return None
