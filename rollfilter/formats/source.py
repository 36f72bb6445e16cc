"""Bytes in, lines out: JSONL input read in chunks from files and stdin, in order, like `cat`.

Reading happens in a worker thread, a large chunk per hop, and the chunk is split into lines on
the trio side: a hop to a thread and back for every line would cost more than the rest of the
run at millions of lines (docs/benchmarks.md, "Reading the input").
Memory holds one chunk's lines plus at most one partial line, never the whole input.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import stat
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import trio

from rollfilter.errors import UsageError

T = TypeVar("T")
CHUNK_BYTES = 256 * 1024
STDIN = "-"


@dataclasses.dataclass(frozen=True, slots=True)
class InputLine:
    """One input line without its newline; `data` is None when it was longer than allowed."""

    source: str  # the FILE as given, "<stdin>" for standard input
    number: int  # 1-based line number within `source`
    data: bytes | None
    problem: str | None = None  # why `data` is None: too long, or (from the API) not encodable
    terminated: bool = True  # False for a file's last line without a newline


async def next_when_ready(
    take_nowait: Callable[[], T], fill: Callable[[], Awaitable[None]], filling: trio.Lock | None = None
) -> T:
    """`take_nowait()` as soon as it stops raising trio.WouldBlock, calling `fill()` until it does.

    With `filling`, one task fills at a time; the others wait for it and then find its lines
    buffered. This is the one loop that the reader, the planner and the engine's workers share.
    """
    while True:
        try:
            return take_nowait()
        except trio.WouldBlock:
            pass
        if filling is None:
            await fill()
            continue
        async with filling:
            try:
                return take_nowait()
            except trio.WouldBlock:
                await fill()


def display_name(path: str) -> str:
    return "<stdin>" if path == STDIN else path


def check_inputs(paths: Sequence[str]) -> None:
    """Raise UsageError for a FILE that cannot be read, before anything is sent."""
    for path in paths:
        if path == STDIN:
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror}") from None
        if stat.S_ISDIR(mode):
            raise UsageError(f"cannot read {path}: Is a directory")
        if not os.access(path, os.R_OK):
            raise UsageError(f"cannot read {path}: Permission denied")


class _Unterminated(bytes):
    """A file's last line, which had no newline: NeMo Gym's numbering tells it from the same text
    with one."""


class _TooLong:
    __slots__ = ("length",)

    def __init__(self, length: int) -> None:
        self.length = length


class LineReader:
    """Reads the inputs in order and hands out their lines one at a time.

    Each FILE is opened only when its turn comes; `-` is standard input (fd 0, never closed
    here). A line longer than `max_line_bytes` is dropped as it streams by and handed out
    with `data=None`, so a 100 MB line costs no more memory than the limit. An input that
    cannot be opened or read when its turn comes (it vanished) is skipped, as `cat` skips it,
    and the one-line reason is kept in `problems` and given to `on_problem`.
    """

    def __init__(
        self,
        paths: Sequence[str],
        *,
        max_line_bytes: int,
        chunk_bytes: int = CHUNK_BYTES,
        stdin_fd: int = 0,
        read: Callable[[int, int], bytes] = os.read,
        on_problem: Callable[[str], None] | None = None,
    ) -> None:
        self.inputs = tuple(paths)
        self.max_line_bytes = max_line_bytes
        self._paths = collections.deque(paths)
        self._max_line_bytes = max_line_bytes
        self._chunk_bytes = chunk_bytes
        self._stdin_fd = stdin_fd
        self._owned_stdin: int | None = None
        self._read = read
        self._fd: int | None = None
        self._name = ""
        self._line_number = 0
        self._ready: collections.deque[bytes | _TooLong] = collections.deque()
        self._partial: list[bytes] = []
        self._partial_bytes = 0
        self._partial_too_long = False
        # Reading has its own thread limiter: trio's default one is global and shared.
        self._limiter = trio.CapacityLimiter(1)
        self.problems: list[str] = []
        self._on_problem = on_problem

    def next_line_nowait(self) -> InputLine | None:
        """The next buffered line; None once every input is exhausted.

        Raises trio.WouldBlock when `fill()` must read first.
        """
        if not self._ready:
            if self._fd is None and not self._paths:
                return None
            raise trio.WouldBlock
        item = self._ready.popleft()
        self._line_number += 1
        if isinstance(item, _TooLong):
            problem = f"line is {item.length} bytes, over the {self._max_line_bytes}-byte limit"
            return InputLine(self._name, self._line_number, None, problem)
        if type(item) is _Unterminated:
            return InputLine(self._name, self._line_number, bytes(item), terminated=False)
        return InputLine(self._name, self._line_number, item)

    async def fill(self) -> None:
        """Read the next chunk, opening the next input once one is exhausted."""
        if self._fd is None and not self._open_next():
            return
        await self._fill()

    async def next_line(self) -> InputLine | None:
        """The next line, or None once every input is exhausted."""
        return await next_when_ready(self.next_line_nowait, self.fill)

    def _open_next(self) -> bool:
        while self._paths:
            path = self._paths.popleft()
            self._name = display_name(path)
            self._line_number = 0
            if path == STDIN:
                self._fd = self._stdin_fd
                return True
            try:
                self._fd = os.open(path, os.O_RDONLY)
            except OSError as exc:  # checked at start, but files can vanish
                self._problem(f"cannot read {path}: {exc.strerror}")
                continue
            return True
        return False

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        if self._on_problem is not None:
            self._on_problem(message)

    async def _fill(self) -> None:
        assert self._fd is not None
        try:
            chunk = await trio.to_thread.run_sync(
                self._read, self._fd, self._chunk_bytes, limiter=self._limiter, abandon_on_cancel=True
            )
        except OSError as exc:  # an I/O error mid-file: the rest of this input is lost, said once
            self._problem(f"cannot read {self._name} after line {self._line_number + len(self._ready)}: {exc.strerror}")
            chunk = b""
        if not chunk:
            if self._partial or self._partial_too_long:
                self._finish_line(b"", terminated=False)  # a last line without a newline is a row too
            if self._fd != self._stdin_fd:
                os.close(self._fd)
            self._fd = None
            return
        pieces = chunk.split(b"\n")
        if len(pieces) == 1:
            self._add_partial(chunk)
            return
        self._finish_line(pieces[0])
        for line in pieces[1:-1]:
            self._ready.append(line if len(line) <= self._max_line_bytes else _TooLong(len(line)))
        if pieces[-1]:
            self._add_partial(pieces[-1])

    def _add_partial(self, piece: bytes) -> None:
        self._partial_bytes += len(piece)
        if self._partial_too_long:
            return
        if self._partial_bytes > self._max_line_bytes:
            self._partial_too_long = True
            self._partial.clear()
        else:
            self._partial.append(piece)

    def _finish_line(self, tail: bytes, *, terminated: bool = True) -> None:
        total = self._partial_bytes + len(tail)
        if self._partial_too_long or total > self._max_line_bytes:
            self._ready.append(_TooLong(total))
        else:
            self._partial.append(tail)
            line = b"".join(self._partial)
            self._ready.append(line if terminated else _Unterminated(line))
        self._partial = []
        self._partial_bytes = 0
        self._partial_too_long = False

    @property
    def stdin_fd(self) -> int:
        """Where `-` is read from."""
        return self._stdin_fd

    def read_again(self) -> LineReader | None:
        """A reader of the same inputs from their first line; None when one cannot be read twice
        (standard input, a pipe, one gone)."""
        for path in self.inputs:
            try:
                if path == STDIN or not stat.S_ISREG(os.stat(path).st_mode):
                    return None
            except OSError:
                return None
        return LineReader(
            self.inputs, max_line_bytes=self.max_line_bytes, chunk_bytes=self._chunk_bytes, read=self._read
        )

    def use_stdin(self, fd: int) -> None:
        """Read `-` from `fd` (a copy of standard input), which `close` closes; before any reading."""
        assert self._fd is None
        assert self._owned_stdin is None
        self._stdin_fd = self._owned_stdin = fd

    def close(self) -> None:
        if self._fd is not None and self._fd != self._stdin_fd:
            os.close(self._fd)
        self._fd = None
        if self._owned_stdin is not None:
            os.close(self._owned_stdin)
            self._owned_stdin = None
