"""What stops a command-line run from outside, or asks it how it goes: signals, and the reader of
standard output going away.

SIGINT, SIGTERM and SIGHUP stop the run, from the moment the command starts (the first one: a
second during the wind-down prints the summary as it stands and exits at once); SIGUSR1, and
SIGINFO (Ctrl-T) where the system has it, print a status block, as dd does.
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Callable

import trio

from rollfilter.cli import early_signals
from rollfilter.cli.messages import back_in_open_groups, waiting_words
from rollfilter.cli.statuses import EXIT_STATUS_OF_STOP
from rollfilter.redact import printable
from rollfilter.run.statistics import RunStatistics, RunStatus
from rollfilter.stops import StopCause, StopControl

STATUS_SIGNALS = tuple(getattr(signal, name) for name in ("SIGUSR1", "SIGINFO") if hasattr(signal, name))
WAITING_ON = {"pause": "paused", "rate limits": "--rpm/--tpm", "window": "--adaptive's window"}  # InFlight.waiting
CAUSE_OF_SIGNAL = {
    signal.SIGINT: StopCause.INTERRUPTED,
    signal.SIGTERM: StopCause.TERMINATED,
    signal.SIGHUP: StopCause.HUNG_UP,
}


class StopSignals:
    """The stop signals (SIGINT, SIGTERM, SIGHUP) of one trio run of the command, from its first
    moment to its last, and those noted before it (`cli/early_signals.py`).

    A command-line run `attach`es its `StopControl` before it does anything else: a signal stops
    it, and one that came earlier stops it as soon as it is attached, so that every stop ends with
    the summary. A signal while the run is already stopping (a second Ctrl-C, when finished
    results wait on a blocked output) calls `leave` (the summary as it stands) and exits at once
    with that signal's status. Without a control (--summarize), a signal cancels `scope`.
    """

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.control: StopControl | None = None
        self.causes: list[StopCause] = []  # every stop signal taken, oldest first
        self.show_status: Callable[[], None] = lambda: None
        self.leave: Callable[[], None] | None = None

    def attach(self, control: StopControl) -> None:
        self.control = control
        if self.causes:
            control.stop(self.causes[0])

    def take(self, cause: StopCause) -> None:
        """What a stop signal does; see the class."""
        self.causes.append(cause)
        control = self.control
        if control is None:
            self.scope.cancel()
            return
        if control.stopped_early and self.leave is not None:
            self.leave()
            os._exit(EXIT_STATUS_OF_STOP[cause])  # a signal during the wind-down: leave now
        control.stop(cause)


async def watch_signals(stops: StopSignals, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Hand the stop signals to `stops` (those start-up noted first), and show the run's status on
    a status signal. A hang-up that start-up found ignored (nohup) stays ignored."""
    listened = [signum for signum in CAUSE_OF_SIGNAL if signal.getsignal(signum) is not signal.SIG_IGN]
    with trio.open_signal_receiver(*listened, *STATUS_SIGNALS) as signals:
        stops.causes.extend(CAUSE_OF_SIGNAL[signal.Signals(signum)] for signum in early_signals.take())
        task_status.started()
        async for signum in signals:
            if signum in STATUS_SIGNALS:
                stops.show_status()
            else:
                stops.take(CAUSE_OF_SIGNAL[signal.Signals(signum)])


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


def status_block(statistics: RunStatistics) -> list[str]:
    """The status block of a run's snapshot, as SIGUSR1 prints it (see `status_lines`)."""
    return status_lines(statistics.status() if statistics.connected else None)


def status_lines(status: RunStatus | None) -> list[str]:
    """The status block that SIGUSR1 prints: the run's figures (the rollouts taken and not sent,
    apart from those in flight), then its oldest rollouts taken and not ended, each waiting or in
    flight."""
    if status is None:
        return ["status: starting, nothing sent yet"]
    said = waiting_words(status)
    waiting = f" ({', '.join(said)})" if said else ""
    paused = "paused, " if status.paused else ""
    grouped = "".join(f", {words}" for words in back_in_open_groups(status))
    lines = [
        f"status: {paused}{status.ended:,} done, {status.failed:,} failed, {status.in_flight:,} in flight{waiting}"
        f"{grouped}, {status.rows_per_s:,.1f} rows/s, {status.elapsed_s:,.1f} s"
    ]
    for rollout in status.oldest:
        agent = rollout.agent if rollout.agent is not None else "(no name)"
        state = "waiting" if rollout.waiting else "in flight"
        lines.append(
            printable(
                f"  {state} {rollout.age_s:,.1f} s: {rollout.source}:{rollout.line} task {rollout.task_index}"
                f" rollout {rollout.rollout_index} agent {agent} attempt {rollout.attempt}"
                + (f" (not sent yet: {WAITING_ON[rollout.waiting]})" if rollout.waiting else "")
            )
        )
    return lines
