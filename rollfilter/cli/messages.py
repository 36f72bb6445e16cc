"""The command line's lines on stderr, made and written in one place.

Every line the command writes to stderr is made by `message_line`: one prefix, and the text with
control characters and undecodable bytes escaped by `redact.printable`, so that neither a
server's text nor a file's name can drive the terminal (escaping undecodable bytes alone,
as `errors="backslashreplace"` does, lets an ESC or a CR through). `say` writes such a line
at once; during a run, the lines go through the run's batched writer instead (or above the
progress display, which draws itself through rich), made by the same `message_line`; `write_stderr`
writes what is already whole lines, the summary.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from rollfilter.errors import ErrorKind
from rollfilter.formats.writers import OutputClosed, OutputFailed, write_all
from rollfilter.redact import printable

if TYPE_CHECKING:
    from rollfilter.outcomes import Failure

PREFIX = "rollfilter: "


def message_line(text: str, prefix: str = PREFIX) -> bytes:
    """`text` as one line of the command's on stderr: the prefix, the text escaped, a newline.
    A line that is not the command's own (a SystemExit's message) has no prefix."""
    return f"{prefix}{printable(text)}\n".encode(errors="backslashreplace")


def say(text: str, fd: int) -> None:
    """One line on stderr (`fd`) at once. stderr may be closed or full: then the line is lost,
    and the exit status tells."""
    write_stderr(fd, message_line(text))


def write_stderr(fd: int, data: bytes) -> None:
    """Whole lines on stderr (`fd`), at once and best effort, as `say` writes them."""
    with contextlib.suppress(OutputClosed, OutputFailed):
        write_all(fd, data, "standard error")


def write_summary(fd: int, data: bytes) -> bool:
    """The summary (and its chart) on stderr (`fd`): True once written. The summary is an output
    of the run, as its results are: where it cannot be written, the exit status says so."""
    try:
        write_all(fd, data, "standard error")
    except (OutputClosed, OutputFailed):
        return False
    return True


def failure_message(failure: Failure, *, details_hint: bool) -> str:
    """A failure's message as the command says it: the settings it names as their options, and
    for an internal error, with `details_hint`, where its details are (the library has no -v)."""
    message = failure.message
    if details_hint and failure.kind is ErrorKind.INTERNAL:
        message += " (-v shows it)"
    return message
