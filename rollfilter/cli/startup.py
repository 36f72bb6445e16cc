"""The `rollfilter` command's start-up: `python -m rollfilter` and the installed script both run `main`.

Before the command's modules are imported (most of a second, cold), what no later code
could do: a Ctrl-C exits 130 at once, without a traceback, whenever the trio run is not
going (which handles it itself: `rollfilter.cli.main.execute`); a status signal (SIGUSR1) is ignored until
the run listens for it, rather than killing the command; and a standard descriptor the
command was started without (`>&-`, `2>&-`, `<&-`) is taken up, so that no file or socket
opened later gets its number. And httpx is kept from loading its own command line.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import signal
import sys
from collections.abc import Sequence
from types import FrameType, ModuleType

STATUS_SIGNAL_NAMES = ("SIGUSR1", "SIGINFO")  # as rollfilter.cli.run's STATUS_SIGNALS (importing it would load trio)


def exit_interrupted(signum: int, frame: FrameType | None) -> None:
    os._exit(130)  # ExitStatus.INTERRUPTED; rollfilter.errors is not imported yet


class WithoutHttpxCommandLine(importlib.abc.MetaPathFinder):
    """Refuses `httpx._main`, the `httpx` command, which the httpx package imports when rich, click
    and pygments are installed (typer brings them), and which rollfilter never runs: on the
    ImportError httpx puts a stub in its place. It is a sixth of the command's start-up."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "httpx._main":
            raise ImportError("rollfilter does not run the httpx command", name=fullname)
        return None


def main() -> None:
    signal.signal(signal.SIGINT, exit_interrupted)
    for name in STATUS_SIGNAL_NAMES:  # a status asked for while starting is not one to die of
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    from rollfilter.cli.descriptors import hold_closed_streams

    hold_closed_streams()
    sys.meta_path.insert(0, WithoutHttpxCommandLine())
    from rollfilter.cli.main import main as run_command

    run_command()
