"""The command's one error boundary: the command line parsed, its run executed, and every
outcome of either mapped to its documented exit status, with at most one line on stderr.

Below this module everything returns an `ExitStatus` or raises; the process exits here only
(`main`), or in `startup` before anything is imported, or on a second signal during a run's
wind-down (`signals.py`), where waiting is what the user asked not to do.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import typer

from rollfilter.cli import early_signals
from rollfilter.cli.environment import Environment, of_process
from rollfilter.cli.messages import message_line, option_message, say, write_stderr
from rollfilter.cli.options import HELP_MAX_WIDTH, typer_app
from rollfilter.errors import ExitStatus, RollfilterError
from rollfilter.formats.writers import OutputClosed, OutputFailed, write_all
from rollfilter.gc_policy import collect_garbage_for_a_run

if TYPE_CHECKING:
    from rollfilter.cli.signals import StopSignals
    from rollfilter.cli.statuses import RunEnd


def main() -> None:
    """The command: parse the options, run, exit. Whatever the moment of a Ctrl-C, and whatever
    state stdout and stderr are in, it ends with its documented status and at most one line."""
    code = run_command(sys.argv[1:], of_process())
    # Everything rollfilter writes is written by now (os.write, or flushed by run_command);
    # skipping the interpreter's teardown saves time on every run, which adds up under xargs.
    if sys.stderr is not None:  # None when started with descriptor 2 closed
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
    os._exit(code)


STATUS_OF_SIGNAL = {
    signal.SIGINT: ExitStatus.INTERRUPTED,
    signal.SIGTERM: ExitStatus.TERMINATED,
    signal.SIGHUP: ExitStatus.HUNG_UP,
}


def run_command(args: Sequence[str], environment: Environment) -> int:
    """Parse `args`, run, and return the exit status; the command reads and writes only the
    streams of `environment`, and takes its variables from it. Every outcome of parsing and of
    typer's own output is mapped here, and `execute` maps a run's.

    click writes --help, --version and shell completion to `sys.stdout`: for the call, that is
    `environment`'s standard output, whose failed writes raise as the command's own do."""
    saved_stdout = sys.stdout
    sys.stdout = _checked_stdout(environment.stdout, saved_stdout)
    try:
        return _parsed_and_run(list(args), environment)
    finally:
        with contextlib.suppress(Exception):  # a failed write was the command's to report, and it has
            sys.stdout.flush()
        sys.stdout = saved_stdout


def _parsed_and_run(args: list[str], environment: Environment) -> int:
    stderr = environment.stderr
    try:
        # The words as typed go with the context, so that a message names an option as it was given.
        code: Any = click_command()(
            args=args,
            prog_name="rollfilter",
            standalone_mode=False,
            obj={"argv": args, "environment": environment},
            terminal_width=help_width(environment),
        )
        sys.stdout.flush()
        if callable(code):  # the run the options ask for (else --help, --version: done)
            code = execute(code, environment)
        elif early_signals.received:  # a stop signal came while --help was written, say
            code = STATUS_OF_SIGNAL[signal.Signals(early_signals.received[0])]
    except RollfilterError as exc:  # the options cannot be honoured: nothing was started
        code = _report(exc, stderr)
    except typer.TyperException as exc:  # click's usage errors: one line, as for every other error
        say(f"{exc.format_message()} (see 'rollfilter --help')", stderr)
        code = exc.exit_code
    except (typer.Abort, KeyboardInterrupt):  # click turns a Ctrl-C in its parsing into Abort
        code = ExitStatus.INTERRUPTED
    except SystemExit as exit_:  # shell completion exits by itself
        code = exit_.code
    except OutputClosed:  # the reader of --help went away, as `| head` does: no message
        code = ExitStatus.BROKEN_PIPE
    except OutputFailed as exc:
        say(str(exc), stderr)
        code = ExitStatus.OUTPUT_FAILED
    if code is None:
        return 0
    if not isinstance(code, int):  # sys.exit("message"): print it, as Python would
        write_stderr(stderr, message_line(str(code), prefix=""))
        return 1
    return int(code)


def help_width(environment: Environment) -> int:
    """The width --help is wrapped to, as click works it out from the terminal's."""
    return max(min(environment.columns(), HELP_MAX_WIDTH) - 2, 50)


@functools.cache
def click_command() -> Any:
    """The command line as click parses it, built once: typer builds it from `typer_app`'s
    signature, the largest part of `--help`'s time, and a process running the command several
    times (the tests) pays for it once."""
    return typer.main.get_command(typer_app)


def _report(exc: RollfilterError, stderr: int) -> ExitStatus:
    say(_as_said(exc), stderr)
    return exc.exit_status


def _as_said(exc: RollfilterError) -> str:
    """`exc`'s line: a ConfigError's names the option of its field (`messages.option_message`)."""
    # Looked up, not imported: a ConfigError is raised only once config.py is loaded, and loading
    # it (httpx) here would slow every usage error down.
    config = sys.modules.get("rollfilter.config")
    if config is not None and isinstance(exc, config.ConfigError):
        return option_message(exc.field, exc.problem) or str(exc)
    return str(exc)


def execute(main: Callable[[StopSignals], Awaitable[RunEnd]], environment: Environment) -> ExitStatus:
    """Run `main` under trio to its end; the one place outcomes become exit statuses (with
    `statuses.exit_status` for the way a run ended). The stop signals are watched from the trio
    run's start to its end (`signals.StopSignals`): start-up's handler notes those that come
    outside it, and trio's own Ctrl-C handling is never set."""
    import trio  # here, with the run: --help, --version and usage errors never load it

    from rollfilter.cli.signals import StopSignals
    from rollfilter.cli.statuses import EXIT_STATUS_OF_STOP, exit_status

    stderr = environment.stderr
    status = ExitStatus.OK
    collect_garbage_for_a_run()
    stops = StopSignals()
    try:
        end = trio.run(_watching_signals, main, stops)
        status = exit_status(end) if end is not None else EXIT_STATUS_OF_STOP[stops.causes[0]]
        if stops.causes and stops.control is None:  # --summarize, told to stop before it started
            status = EXIT_STATUS_OF_STOP[stops.causes[0]]
    except* RollfilterError as group:
        status = _report(_first(group), stderr)  # type: ignore[arg-type]
    except* KeyboardInterrupt:  # a Ctrl-C under another handler than start-up's (run in-process)
        status = ExitStatus.INTERRUPTED
    except* (BrokenPipeError, OutputClosed):
        status = ExitStatus.BROKEN_PIPE
    except* OutputFailed as group:
        say(str(_first(group)), stderr)
        status = ExitStatus.OUTPUT_FAILED
    return status


async def _watching_signals(main: Callable[[StopSignals], Awaitable[RunEnd]], stops: StopSignals) -> RunEnd | None:
    """`main` with the stop signals watched; None when a signal cancelled it (it had no control)."""
    import trio

    from rollfilter.cli.signals import watch_signals

    async with trio.open_nursery() as nursery:
        await nursery.start(watch_signals, stops)
        end = None
        with stops.scope:
            end = await main(stops)
        nursery.cancel_scope.cancel()
    return end


def _first(group: BaseExceptionGroup[BaseException]) -> BaseException:
    exc: BaseException = group
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


class _StandardOutput(io.RawIOBase):
    """The command's standard output as typer writes to it (--help, --version, completion
    scripts): a failed write raises OutputClosed or OutputFailed, as the command's own writes
    do, so that `run_command` reports it."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def write(self, data: Any) -> int:
        chunk = bytes(data)
        write_all(self._fd, chunk)
        return len(chunk)


def _checked_stdout(fd: int, given: Any) -> io.TextIOWrapper:
    """`fd` as a text stream, in the encoding of `given` (the process's sys.stdout, None when the
    command was started with descriptor 1 closed)."""
    encoding = given.encoding if given is not None else "utf-8"
    errors = given.errors if given is not None else "strict"
    return io.TextIOWrapper(io.BufferedWriter(_StandardOutput(fd)), encoding=encoding, errors=errors)
