"""What stops a command-line run from outside, or asks it how it goes: signals, and the reader of
standard output going away.

SIGINT, SIGTERM and SIGHUP stop the run (the first one: a second during the wind-down exits at
once); SIGUSR1, and SIGINFO (Ctrl-T) where the system has it, print a status block, as dd does.
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Callable

import trio

from rollfilter.cli.statuses import EXIT_STATUS_OF_STOP
from rollfilter.engine import RunControl, RunStatus, StopCause
from rollfilter.redact import printable

STATUS_SIGNALS = tuple(getattr(signal, name) for name in ("SIGUSR1", "SIGINFO") if hasattr(signal, name))
CAUSE_OF_SIGNAL = {
    signal.SIGINT: StopCause.INTERRUPTED,
    signal.SIGTERM: StopCause.TERMINATED,
    signal.SIGHUP: StopCause.HUNG_UP,
}


async def watch_signals(
    control: RunControl,
    show_status: Callable[[], None],
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    *,
    before_exit: Callable[[], None] | None = None,
) -> None:
    """Stop the run on the signals of CAUSE_OF_SIGNAL, show its status on a status signal.
    `before_exit` runs before a second signal ends the process at once (what must not be left)."""
    with trio.open_signal_receiver(*CAUSE_OF_SIGNAL, *STATUS_SIGNALS) as signals:
        task_status.started()
        async for signum in signals:
            if signum in STATUS_SIGNALS:
                show_status()
                continue
            cause = CAUSE_OF_SIGNAL[signal.Signals(signum)]
            if control.stopped_early:
                if before_exit is not None:
                    before_exit()
                os._exit(EXIT_STATUS_OF_STOP[cause])  # a signal during the wind-down: leave now
            control.stop(cause)


async def watch_reader_gone(fd: int, on_gone: Callable[[], None]) -> None:
    """Call `on_gone` once the reader of the pipe `fd` has gone: the write end of a pipe polls
    as an error then, so `| head` stops the run at once rather than at the next result."""
    await trio.lowlevel.wait_readable(fd)
    on_gone()


def is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


def status_lines(status: RunStatus | None) -> list[str]:
    """The status block that SIGUSR1 prints: the run's figures, then its oldest rollouts in flight."""
    if status is None:
        return ["status: starting, nothing sent yet"]
    held = f" ({status.held_by_limits:,} held by --rpm/--tpm)" if status.held_by_limits else ""
    paused = "paused, " if status.paused else ""
    lines = [
        f"status: {paused}{status.done:,} done, {status.failed:,} failed, {status.in_flight:,} in flight{held},"
        f" {status.rows_per_s:,.1f} rows/s, {status.elapsed_s:,.1f} s"
    ]
    held_by = "paused" if status.paused else "--rpm/--tpm"
    for rollout in status.oldest:
        agent = rollout.agent if rollout.agent is not None else "(no name)"
        lines.append(
            printable(
                f"  in flight {rollout.age_s:,.1f} s: {rollout.source}:{rollout.line} task {rollout.task_index}"
                f" rollout {rollout.rollout_index} agent {agent} attempt {rollout.attempt}"
                + (f" (not sent yet: {held_by})" if rollout.held else "")
            )
        )
    return lines
