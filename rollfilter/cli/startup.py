"""The `rollfilter` command's start-up: `python -m rollfilter` and the installed script both run `main`.

Before the command's modules are imported, what no later code could do: a stop signal (SIGINT,
SIGTERM, SIGHUP) is noted, without a traceback, and stops the run as soon as it starts, which then
prints its summary and exits with the signal's status (`cli/early_signals.py`); a status signal
(SIGUSR1) is ignored until the run listens for it, rather than killing the command; and a standard
descriptor the command was started without (`>&-`, `2>&-`, `<&-`) is taken up, so that no file or
socket opened later gets its number. And httpx is kept from loading its own command line.

This module, `early_signals` and the package above them import nothing but `signal` (and `gc`,
`os` and `sys`, which every Python has loaded before it runs a line): the handlers are set within
a millisecond of the interpreter's own start-up, where a traceback would otherwise name whatever
was being imported.
"""

from __future__ import annotations

import gc
import os
import signal
import sys

from rollfilter.cli import early_signals

TYPE_CHECKING = False  # not typing's: importing typing would take longer than all of this module
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

STATUS_SIGNAL_NAMES = ("SIGUSR1", "SIGINFO")  # as rollfilter.cli.signals' STATUS_SIGNALS (importing it would load trio)


class WithoutHttpxCommandLine:
    """An import finder (sys.meta_path) that refuses `httpx._main`, the `httpx` command, which the
    httpx package imports when rich, click and pygments are installed (typer brings them), and
    which rollfilter never runs: on the ImportError httpx puts a stub in its place, and the start
    is shorter by what loading that command line would take (docs/benchmarks.md, start-up). It is
    not an importlib.abc.MetaPathFinder because that module loads tempfile and shutil."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname == "httpx._main":
            raise ImportError("rollfilter does not run the httpx command", name=fullname)
        return None


def main() -> None:
    early_signals.set_handlers()
    for name in STATUS_SIGNAL_NAMES:  # a status asked for while starting is not one to die of
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_IGN)
    # (Not while a shell asks the command to complete its words: typer answers that.)
    if sys.argv[1:] == ["--version"] and "_ROLLFILTER_COMPLETE" not in os.environ and _print_version():
        os._exit(0)
    # The imports ahead make a few hundred thousand objects and no garbage, so the collections
    # they would set off free nothing and only cost time. A run turns the collector back on, as
    # it wants it (rollfilter.gc_policy).
    gc.disable()
    from rollfilter.cli.files.descriptors import hold_closed_streams

    hold_closed_streams()
    sys.meta_path.insert(0, WithoutHttpxCommandLine())
    from rollfilter.cli.main import main as run_command

    run_command()


def _print_version() -> bool:
    """`rollfilter --version`, the way scripts ask it, answered before the command line is built
    (building it is most of what `--help` costs): True once written. Where it cannot be
    (standard output closed, full, or its reader gone), the command answers it, and reports the
    failure as for any other output."""
    from rollfilter._version import __version__

    line = f"rollfilter {__version__}\n".encode()
    try:
        return os.write(1, line) == len(line)
    except OSError:
        return False
