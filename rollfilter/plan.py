"""Lines to jobs: parse each row, apply limit, repeats, overrides and resume skips.

A job is one rollout: one input row sent once. A row repeated K times gives K adjacent
jobs (a a b b), numbered `(_ng_task_index, _ng_rollout_index)` as NeMo Gym numbers them.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import zlib
from collections.abc import Hashable, Iterable
from typing import Any, Protocol

import msgspec
import trio

from rollfilter.config import Config
from rollfilter.errors import ErrorKind, UsageError
from rollfilter.outcome import RowFailure
from rollfilter.source import InputLine

TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"

_decode = msgspec.json.Decoder().decode


@dataclasses.dataclass(slots=True, eq=False)
class Job:
    """One rollout to run: where the row came from, its indices, and the body to POST."""

    seq: int  # position among the run's jobs: the order of --ordered output
    source: str
    line: int
    task_index: Any
    rollout_index: int
    row: dict[str, Any] | None  # None when the line is not a JSON object
    body: bytes  # the row as sent (after overrides), or the raw line for bad input
    failure: RowFailure | None = None  # known before sending: bad input
    task_rollouts: int = 1  # how many rollouts of this task the run has (repeats less resume skips)


def parse_row(data: bytes) -> dict[str, Any] | str:
    """The row as a dict, or a short reason why the line is not a JSON object."""
    try:
        value = _decode(data)
    except msgspec.DecodeError as exc:
        return _describe_decode_error(data, exc)
    except msgspec.ValidationError as exc:  # numbers like 1e400
        return f"invalid JSON: {exc}"
    except RecursionError:
        return "invalid JSON: nested too deeply"
    if not isinstance(value, dict):
        return f"not a JSON object (a JSON {_json_type(value)})"
    return value


def _describe_decode_error(data: bytes, exc: msgspec.DecodeError) -> str:
    if data.startswith(b"\xef\xbb\xbf"):
        return "invalid JSON: starts with a byte order mark (BOM)"
    try:
        data.decode()
    except UnicodeDecodeError as err:
        return f"invalid UTF-8 at byte {err.start}"
    if b"NaN" in data or b"Infinity" in data:
        return f"invalid JSON (NaN and Infinity are not JSON): {exc}"
    return f"invalid JSON: {exc}"


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def apply_params(row: dict[str, Any], params: Iterable[tuple[str, Any]]) -> str | None:
    """Set `responses_create_params.KEY` (dotted KEYs reach into objects); a reason on failure."""
    for key, value in params:
        target = row.setdefault("responses_create_params", {})
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(target, dict):
                break
            target = target.setdefault(part, {})
        if not isinstance(target, dict):
            return f"cannot set -p {key}: responses_create_params.{key.rpartition('.')[0] or key} is not an object"
        target[leaf] = value
    return None


class ResumeIndex:
    """The (task, rollout) pairs already in a previous run's output file.

    Dense integer pairs live in a bitmap (a million pairs cost 125 KB, not 100 MB of
    tuples); anything else (odd task indices) falls back to a set.
    """

    def __init__(self, repeats: int) -> None:
        self._repeats = repeats
        self._bits = bytearray()
        self._other: set[tuple[Hashable, Hashable]] = set()
        self.count = 0

    def _slot(self, task: Any, rollout: Any) -> int | None:
        if type(task) is int and type(rollout) is int and 0 <= task < 1 << 40 and 0 <= rollout < self._repeats:
            return task * self._repeats + rollout
        return None

    def add(self, task: Any, rollout: Any) -> None:
        slot = self._slot(task, rollout)
        if slot is None:
            key = (_hashable(task), _hashable(rollout))
            if key not in self._other:
                self._other.add(key)
                self.count += 1
            return
        byte, bit = divmod(slot, 8)
        if byte >= len(self._bits):
            self._bits.extend(bytes(max(byte + 1 - len(self._bits), len(self._bits))))
        if not self._bits[byte] & (1 << bit):
            self._bits[byte] |= 1 << bit
            self.count += 1

    def __contains__(self, pair: tuple[Any, int]) -> bool:
        task, rollout = pair
        slot = self._slot(task, rollout)
        if slot is None:
            return (_hashable(task), _hashable(rollout)) in self._other
        byte, bit = divmod(slot, 8)
        return byte < len(self._bits) and bool(self._bits[byte] & (1 << bit))

    @classmethod
    def from_file(cls, path: str, repeats: int) -> ResumeIndex:
        """Read a results file; a line cut off by a kill (no newline, or not JSON) is ignored."""
        index = cls(repeats)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return index
        except OSError as exc:
            raise UsageError(f"cannot read {path} for --resume: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as file:
            for line in file:
                if not line.endswith(b"\n"):
                    break
                try:
                    result = _decode(line)
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                    continue
                if isinstance(result, dict) and TASK_INDEX in result and ROLLOUT_INDEX in result:
                    index.add(result[TASK_INDEX], result[ROLLOUT_INDEX])
        return index


def drop_torn_tail(path: str) -> int:
    """Cut a last line without a newline (a write cut off by a kill) off the file at `path`,
    so that appended results start on a line of their own; returns the bytes removed."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise UsageError(f"cannot resume from {path}: {exc.strerror}") from None
    try:
        size = end = os.fstat(fd).st_size
        if not size or os.pread(fd, 1, size - 1) == b"\n":
            return 0
        while end > 0:
            start = max(0, end - 65536)
            newline = os.pread(fd, end - start, start).rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        os.ftruncate(fd, end)
        return size - end
    finally:
        os.close(fd)


def shard_of(task_index: Any, shards: int) -> int:
    """The shard a task belongs to: its index mod N (a stable hash for non-integer indices)."""
    if type(task_index) is int:
        return task_index % shards
    return zlib.crc32(msgspec.json.encode(task_index)) % shards


def _hashable(value: Any) -> Hashable:
    return value if isinstance(value, Hashable) else msgspec.json.encode(value)


class LineSource(Protocol):
    """Where rows come from: a LineReader over files, or the API's feed of rows."""

    def next_line_nowait(self) -> InputLine | None:
        """A buffered line, None at the end, or trio.WouldBlock until `fill()` has run."""
        ...

    async def fill(self) -> None: ...


class Planner:
    """Turns input lines into jobs, one at a time, as the dispatcher asks for them."""

    def __init__(self, reader: LineSource, config: Config, resume: ResumeIndex | None = None) -> None:
        self._reader = reader
        self._config = config
        self._resume = resume
        self._pending: collections.deque[Job] = collections.deque()
        self._rows = 0  # non-empty lines seen: the default task index
        self._seq = 0
        self.skipped = 0

    def next_job_nowait(self) -> Job | None:
        """The next job if its line is buffered; None at the end of the input (or of --limit).

        Raises trio.WouldBlock when the source must `fill()` first.
        """
        while not self._pending:
            if self._config.limit is not None and self._rows >= self._config.limit:
                return None
            line = self._reader.next_line_nowait()
            if line is None:
                return None
            if line.data is not None and not line.data.strip():
                continue  # blank lines are not rows
            self._plan_row(line)
        return self._pending.popleft()

    async def fill(self) -> None:
        await self._reader.fill()

    async def next_job(self) -> Job | None:
        """The next job to run, or None at the end of the input (or of --limit)."""
        while True:
            try:
                return self.next_job_nowait()
            except trio.WouldBlock:
                await self.fill()

    def _plan_row(self, line: InputLine) -> None:
        task_index: Any = self._rows
        self._rows += 1
        failure: RowFailure | None = None
        row: dict[str, Any] | None = None
        if line.data is None:
            body = b""
            failure = RowFailure(ErrorKind.BAD_INPUT, line.problem or "unreadable line")
        else:
            body = line.data.strip()
            parsed = parse_row(body)
            if isinstance(parsed, str):
                failure = RowFailure(ErrorKind.BAD_INPUT, parsed)
            else:
                row = parsed
                task_index = row.get(TASK_INDEX, task_index)
                if self._config.params:
                    reason = apply_params(row, self._config.params)
                    if reason is not None:
                        failure = RowFailure(ErrorKind.BAD_INPUT, reason)
                    else:
                        body = msgspec.json.encode(row)
        shard = self._config.shard
        if shard is not None and shard_of(task_index, shard[1]) != shard[0]:
            return
        jobs = []
        for rollout in range(self._config.repeats):
            if self._resume is not None and (task_index, rollout) in self._resume:
                self.skipped += 1
                continue
            jobs.append(Job(self._seq, line.source, line.number, task_index, rollout, row, body, failure))
            self._seq += 1
        for job in jobs:
            job.task_rollouts = len(jobs)
        self._pending.extend(jobs)
