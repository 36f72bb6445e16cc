"""What the command takes from the process it runs in: its standard descriptors, its environment
variables, and which of those descriptors are terminals.

The command's entry point (`cli/main.py`'s `main`) makes one `Environment` of the process, and
everything in `cli/` below it reads the standard streams, the variables (`ROLLFILTER_*`, the
Slurm array's, NeMo Gym's, `TERM`, `NO_COLOR`, `COLUMNS`) and the terminal only from the one it
is given. A test gives its own, descriptors of pipes it made and variables of its choosing, as
httpie's tests give `MockEnvironment`: the command then runs in the test's process without
touching that process's descriptors 0 to 2 or its `os.environ`.

What belongs to the process and stays there: the signal handlers, SIGPIPE, the open-file limit,
the garbage collector's settings, the working directory, the paths that name a standard
descriptor (/dev/stdout is the kernel's name for the process's descriptor 1), and the variables
read from the process itself (OpenSSL's SSL_CERT_FILE and SSL_CERT_DIR, tempfile's TMPDIR).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

DEFAULT_COLUMNS = 80  # as shutil.get_terminal_size's fallback, where neither COLUMNS nor a terminal says


class Environment:
    """The standard descriptors a command reads and writes, its environment variables, and
    whether each descriptor is a terminal (asked once, when it is made: `of_descriptors`).

    A plain class, not a dataclass: --help imports this module, and would load dataclasses
    for it alone."""

    __slots__ = (
        "stderr",
        "stderr_is_terminal",
        "stdin",
        "stdin_is_terminal",
        "stdout",
        "stdout_is_terminal",
        "variables",
    )

    def __init__(
        self,
        *,
        stdin: int = 0,
        stdout: int = 1,
        stderr: int = 2,
        variables: Mapping[str, str] | None = None,
        stdin_is_terminal: bool = False,
        stdout_is_terminal: bool = False,
        stderr_is_terminal: bool = False,
    ) -> None:
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.variables: Mapping[str, str] = {} if variables is None else variables
        self.stdin_is_terminal = stdin_is_terminal
        self.stdout_is_terminal = stdout_is_terminal
        self.stderr_is_terminal = stderr_is_terminal

    @classmethod
    def of_descriptors(
        cls, stdin: int = 0, stdout: int = 1, stderr: int = 2, *, variables: Mapping[str, str]
    ) -> Environment:
        """An environment of these descriptors and `variables`, each descriptor asked now
        whether it is a terminal."""
        return cls(
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            variables=variables,
            stdin_is_terminal=os.isatty(stdin),
            stdout_is_terminal=os.isatty(stdout),
            stderr_is_terminal=os.isatty(stderr),
        )

    @property
    def stderr_can_draw(self) -> bool:
        """Standard error is a terminal that can be drawn on: a live display, a chart (not TERM=dumb)."""
        return self.stderr_is_terminal and self.variables.get("TERM") != "dumb"

    def columns(self) -> int:
        """The width text is wrapped to, as `shutil.get_terminal_size` says it: COLUMNS when it
        holds a positive number, else the width of the terminal standard output is, else 80."""
        try:
            given = int(self.variables.get("COLUMNS", ""))
        except ValueError:
            given = 0
        if given > 0:
            return given
        try:
            return os.get_terminal_size(self.stdout).columns or DEFAULT_COLUMNS
        except OSError:
            return DEFAULT_COLUMNS


def of_process() -> Environment:
    """The process's own: descriptors 0, 1 and 2, and `os.environ`. Made once, by the entry point."""
    return Environment.of_descriptors(0, 1, 2, variables=os.environ)
