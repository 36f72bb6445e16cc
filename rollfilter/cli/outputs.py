"""The command line's files and descriptors: opened and checked before anything is sent, and
written whole at the end (the summary, --metrics, --aggregate)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import stat
from typing import Literal

import msgspec

from rollfilter.aggregate import AggregateReport
from rollfilter.cli import identity
from rollfilter.errors import RollfilterError, UsageError
from rollfilter.metrics import Metrics
from rollfilter.passk import TaskStats
from rollfilter.writers import WholeFile

_encode = msgspec.json.Encoder().encode
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT


@dataclasses.dataclass(frozen=True, slots=True)
class Streams:
    """The descriptors a run reads and writes; tests pass their own."""

    stdin: int = 0
    stdout: int = 1
    stderr: int = 2


STANDARD_STREAMS = Streams()


def refuse_earlier_lines(path: str, option: str) -> None:
    """UsageError when `path` is a regular file that already holds lines: a second run's lines
    must never be mixed silently into a first run's (give --resume or --append)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"cannot write {option} {path}: {exc.strerror}") from None
    if stat.S_ISREG(info.st_mode) and info.st_size > 0:
        raise UsageError(
            f"{option} {path} already holds lines of another run: give --resume to finish that run,"
            " --append to add to it, or a new file"
        )


def open_for_append(path: str, option: str, *, must_be_empty: bool = False) -> int:
    """Open `path` to append, creating it and its missing parent folders.

    With `must_be_empty`, a regular file that already holds lines is refused: a second run's
    lines must never be mixed silently into a first run's (give --resume or --append)."""
    try:
        parent = os.path.dirname(path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        fd = os.open(path, APPEND_FLAGS, 0o666)
    except OSError as exc:
        raise UsageError(f"cannot write {option} {path}: {exc.strerror}") from None
    if must_be_empty:
        try:
            refuse_earlier_lines(path, option)
        except UsageError:
            os.close(fd)
            raise
    return fd


class OutputFiles(contextlib.ExitStack):
    """The files a run appends to, opened (and checked) before anything is sent. A run refused
    after they were opened (a RollfilterError: nothing was sent) leaves no file it created."""

    def __init__(self) -> None:
        super().__init__()
        self._created: list[str] = []  # removed on a refusal while still empty
        self._written: list[str] = []  # removed on a refusal

    def remove_if_refused(self, path: str) -> None:
        """`path` is about to be written by this run: a refused run removes it, unless it was there already."""
        if not os.path.lexists(path):
            self._written.append(path)

    def open(self, path: str | None, option: str, *, must_be_empty: bool = False) -> int | None:
        if path is None:
            return None
        existed = os.path.lexists(path)
        fd = open_for_append(path, option, must_be_empty=must_be_empty)
        self.callback(os.close, fd)
        if not existed:
            self._created.append(path)
        return fd

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> Literal[False]:
        super().__exit__(kind, error, tb)  # type: ignore[arg-type]  # its callbacks close files: nothing is suppressed
        refused = isinstance(error, RollfilterError) or (
            isinstance(error, BaseExceptionGroup) and error.subgroup(RollfilterError) is not None
        )
        for path in self._created if refused else ():
            with contextlib.suppress(OSError):
                if os.stat(path).st_size == 0:
                    os.unlink(path)
        for path in self._written if refused else ():
            with contextlib.suppress(OSError):
                os.unlink(path)
        return False

    def whole(self, path: str | None, option: str, *, regular_only: bool = False) -> WholeFile | None:
        """A file written whole when there is content (see WholeFile), checked now."""
        if path is None:
            return None
        file = WholeFile(path, option, regular_only=regular_only)
        self.callback(file.close)
        return file


def summary_bytes(
    metrics: Metrics,
    tasks: TaskStats | None,
    stopped: str | None,
    report: AggregateReport | None = None,
    *,
    timings: bool = True,
    shards: identity.ShardCoverage | None = None,
) -> bytes:
    summary = metrics.summary(stopped=stopped, tasks=tasks, timings=timings)
    if report is not None:
        report.add_to(summary)
    if shards is not None:
        summary["rollfilter"]["shards"] = shards.summary()
    return _encode(summary) + b"\n"


def replace_content(file: WholeFile | None, data: bytes) -> None:
    """Replace the content of a file written whole (--metrics, --aggregate); OutputFailed when it cannot."""
    if file is not None:
        file.replace(data)
