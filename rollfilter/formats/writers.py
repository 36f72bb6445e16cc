"""Writers of whole lines to a file descriptor: batched, and never a torn line.

A regular file (or /dev/null) is written directly: the page cache takes the write at
once. A pipe, terminal or socket can block for as long as its reader pleases, so those
are written from a worker thread, lines gathered for a moment and while a write is under
way: one thread hop per batch, not per line (a hop per line made 20,000 writes take seconds where
batches take milliseconds). Every write holds whole lines only, so `>>` from several
processes into one file never tears a line. A row's concurrency slot is given back once
its line is written, which bounds what is buffered by the concurrency.
"""

from __future__ import annotations

import errno
import os
import select
import stat
from collections.abc import Callable
from typing import Protocol

from rollfilter.errors import UsageError

Release = Callable[[], None]
GATHER_SECONDS = 0.002  # how long a threaded writer lets lines gather before a write


class LineWriter(Protocol):
    """Takes whole lines; `release` runs once the line is out of memory."""

    def write(self, line: bytes, release: Release | None = None) -> None: ...


class OutputClosed(Exception):
    """The reader of an output went away (EPIPE)."""


class OutputFailed(Exception):
    """An output could not be written: a full disk, a file size limit, an I/O error.

    Its message is the one line for the user: which output (`name`) and why.
    """

    def __init__(self, name: str, error: OSError) -> None:
        super().__init__(f"cannot write {name}: {error.strerror or error}")
        self.name = name
        self.error = error


def write_all(fd: int, data: bytes, name: str = "standard output") -> None:
    """Write all of `data` to `fd`, which the messages call `name`.

    Raises OutputClosed when the reader of a pipe went away, OutputFailed for any other
    error. A failure can come after part of `data` was written (a short write on a full
    disk): the output then ends in a torn line, and its writer must write no more to it.
    """
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:  # another process made the shared descriptor non-blocking
            poller = select.poll()
            poller.register(fd, select.POLLOUT)
            poller.poll()
            continue
        except OSError as exc:
            if exc.errno == errno.EPIPE:
                raise OutputClosed(name) from None
            raise OutputFailed(name, exc) from None
        view = view[written:]


def _never_blocks(fd: int) -> bool:
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False
    return stat.S_ISREG(mode) or (stat.S_ISCHR(mode) and os.path.samestat(os.fstat(fd), os.stat(os.devnull)))


class BatchWriter:
    """Writes lines to one file descriptor from a task of its own (`serve`).

    The first write that fails (OutputClosed, OutputFailed) is handed to `on_failure`,
    and the writer writes nothing more: a later write that succeeded (space freed
    meanwhile) would leave the torn line of the failed one in the middle of the output.
    Lines given to a failed writer are dropped, and their `release` runs at once.
    """

    def __init__(
        self,
        fd: int,
        *,
        name: str = "standard output",
        on_failure: Callable[[OutputClosed | OutputFailed], None] | None = None,
    ) -> None:
        # trio is imported by the writers that use it: the command's messages go through
        # write_all before it knows it will run, and --help and usage errors never load trio.
        import trio

        self.fd = fd
        self.name = name
        self._lines: list[bytes] = []
        self._releases: list[Release] = []
        self._wakeup = trio.Event()
        self._closing = False
        self.drained = trio.Event()
        self.broken = False
        self._on_failure = on_failure
        self._limiter = trio.CapacityLimiter(1)
        self._direct = _never_blocks(fd)

    def write(self, line: bytes, release: Release | None = None) -> None:
        """Queue one whole line (ending in a newline); `release` runs once it is written."""
        if self.broken:
            if release is not None:
                release()
            return
        self._lines.append(line)
        if release is not None:
            self._releases.append(release)
        self._wakeup.set()

    def close(self) -> None:
        """Write what is queued, then let `serve` return."""
        self._closing = True
        self._wakeup.set()

    async def serve(self) -> None:
        import trio

        try:
            while True:
                if not self._lines:
                    if self._closing:
                        return
                    await self._wakeup.wait()
                    self._wakeup = trio.Event()
                    continue
                if not self._direct and not self._closing:
                    await trio.sleep(GATHER_SECONDS)
                if self._direct:
                    self.flush_now()
                    await trio.lowlevel.checkpoint()
                    continue
                batch, self._lines = b"".join(self._lines), []
                releases, self._releases = self._releases, []
                try:
                    await trio.to_thread.run_sync(write_all, self.fd, batch, self.name, limiter=self._limiter)
                except (OutputClosed, OutputFailed) as failure:
                    releases += self._failed(failure)
                for release in releases:
                    release()
        finally:
            self.drained.set()

    def flush_now(self) -> None:
        """Write what is queued now, in the caller's step (a descriptor that never blocks, such as
        a regular file's, only): what comes after it is written after it."""
        assert self._direct, "a write that may block is made in a thread"
        if not self._lines:
            return
        batch, self._lines = b"".join(self._lines), []
        releases, self._releases = self._releases, []
        try:
            write_all(self.fd, batch, self.name)
        except (OutputClosed, OutputFailed) as failure:
            releases += self._failed(failure)
        for release in releases:
            release()

    def _failed(self, failure: OutputClosed | OutputFailed) -> list[Release]:
        """Write no more; the releases of what was queued since, to run now."""
        self.broken = True
        self._lines.clear()
        releases, self._releases = self._releases, []
        if self._on_failure is not None:
            self._on_failure(failure)
        return releases


class WholeFile:
    """A file written whole, and replaced at once (--metrics, --aggregate, the progress file).

    A regular file (or a path not there yet) is replaced by renaming a temporary file beside
    it over it: a reader, or a run killed mid-write, finds the old content or the new, never
    an empty or torn file, and nothing is created until there is content. A path that is not
    a regular file (a terminal, a pipe, /dev/stderr) is opened now and written in place, unless
    `regular_only` refuses it; so is `fd`, when given, for the path it stands for. A file made is
    made with `mode`, less the umask.
    Opening checks what it can before anything is sent, and raises UsageError.
    """

    def __init__(
        self, path: str, option: str, *, regular_only: bool = False, fd: int | None = None, mode: int = 0o666
    ) -> None:
        self.path = path
        self.mode = mode
        self.name = f"{option} {path}"
        self._fd: int | None = fd  # given: what the path names, written in place (and closed by close())
        if fd is not None:
            return
        try:
            parent = os.path.dirname(path)
            if parent:
                os.makedirs(parent, exist_ok=True)
            try:
                info = os.stat(path)
            except FileNotFoundError:
                info = None
            if info is not None and not stat.S_ISREG(info.st_mode):
                if regular_only:  # a file renamed into place: a pipe or a device cannot be one
                    raise UsageError(f"{self.name} must be a regular file (it is replaced whole, by a rename)")
                # Not blocking: a FIFO with no reader fails now (ENXIO) instead of hanging the start.
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK)
                os.set_blocking(self._fd, True)
            else:
                self.path = os.path.realpath(path)  # a symlink keeps pointing at the file
                directory = os.path.dirname(self.path)
                if not os.access(directory, os.W_OK | os.X_OK):
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        except OSError as exc:
            raise UsageError(f"cannot write {self.name}: {exc.strerror or exc}") from None

    def replace(self, data: bytes) -> None:
        """Make `data` the file's content; OutputFailed (or OutputClosed) when it cannot."""
        if self._fd is not None:
            write_all(self._fd, data, self.name)
            return
        directory, base = os.path.split(self.path)
        temporary = os.path.join(directory, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, self.mode)
        except OSError as exc:
            raise OutputFailed(self.name, exc) from None
        try:
            try:
                write_all(fd, data, self.name)
            finally:
                os.close(fd)
            os.replace(temporary, self.path)
        except OSError as exc:
            raise OutputFailed(self.name, exc) from None
        finally:
            if os.path.lexists(temporary):
                os.unlink(temporary)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
