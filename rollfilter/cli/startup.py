"""The `rollfilter` command's start-up: `python -m rollfilter` and the installed script both run `main`.

Before the command's modules are imported (most of a second, cold), what no later code
could do: a Ctrl-C exits 130 at once, without a traceback, whenever the trio run is not
going (which handles it itself: `rollfilter.cli.main.execute`); a status signal (SIGUSR1) is ignored until
the run listens for it, rather than killing the command; and a standard descriptor the
command was started without (`>&-`, `2>&-`, `<&-`) is taken up, so that no file or socket
opened later gets its number.
"""

from __future__ import annotations

import os
import signal
from types import FrameType

CLOSED_STREAM_STAND_INS = ((0, os.O_WRONLY), (1, os.O_RDONLY), (2, os.O_RDONLY))  # each opened the wrong way round
STATUS_SIGNAL_NAMES = ("SIGUSR1", "SIGINFO")  # as rollfilter.cli.run's STATUS_SIGNALS (importing it would load trio)


def exit_interrupted(signum: int, frame: FrameType | None) -> None:
    os._exit(130)  # ExitStatus.INTERRUPTED; rollfilter.errors is not imported yet


def hold_closed_streams() -> None:
    """Put /dev/null on each closed standard descriptor, opened for the other direction: the
    descriptor is taken (trio's epoll or an -o file would get it otherwise, and results or the
    summary would go there), and reading or writing it still fails with EBADF, as on a closed
    one, so the command reports that output (or input) as it reports any that cannot be used."""
    for fd, flags in CLOSED_STREAM_STAND_INS:
        try:
            os.fstat(fd)
        except OSError:
            held = os.open(os.devnull, flags)
            if held != fd:
                os.dup2(held, fd)
                os.close(held)


def main() -> None:
    signal.signal(signal.SIGINT, exit_interrupted)
    for name in STATUS_SIGNAL_NAMES:  # a status asked for while starting is not one to die of
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    hold_closed_streams()
    from rollfilter.cli.main import main as run_command

    run_command()
