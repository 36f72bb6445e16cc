"""The files a viewer shows, indexed: where each line starts and a few fields of each rollout
(task, rollout, reward, output tokens, tool calls, agent, verdicts), kept in arrays so that the
memory a rollout takes is a few dozen bytes whatever its transcript holds. The figures are the
summary --summarize makes of the same files (`run.recount`), counted in the pass that indexes them.

Files that grow (the -o of a running collection) are indexed on from where the index stopped;
a file that shrank, was replaced, or was written again in place (the count checks a CRC of the
lines the index holds) is indexed again from its start. The figures are counted
again whenever a file changed: a pair that failed may have a result by now."""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import zlib
from array import array
from collections.abc import Callable, Iterator
from typing import Any

import trio

from rollfilter.config import Config
from rollfilter.formats.source import InputLine
from rollfilter.outcomes import failure_of
from rollfilter.rows import AGENT_REF, POLICY_VERSION, ROLLOUT_INDEX, TASK_INDEX, parse_row
from rollfilter.run.recount import ResultCounter
from rollfilter.run.run import Run

CHUNK_BYTES = 1 << 20  # read a file a chunk at a time, never whole
NO_INDEX = -1  # a line without a task or rollout index
FAILED, UNHEALTHY = 1, 2  # flags of a line: an errors record; a result with `_rf_health` verdicts
HEALTH = "_rf_health"


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One indexed line: its place (`position` in the catalog), file and bytes, and its fields."""

    position: int
    file: int
    offset: int
    length: int
    task: int
    rollout: int
    reward: float  # NaN: none
    tokens: int
    tool_calls: int
    agent: str
    flags: int
    version: int  # the policy version it was sent under, NO_INDEX when none

    @property
    def failed(self) -> bool:
        return bool(self.flags & FAILED)

    @property
    def unhealthy(self) -> bool:
        return bool(self.flags & UNHEALTHY)


def numbered_lines(path: str, start: int, max_line_bytes: int) -> Iterator[tuple[int, int, InputLine]]:
    """The whole lines of `path` from byte `start` on, each with its offset and length in bytes
    (a last line without its newline is not whole yet: the file is being written). A line is
    kept in its chunks' pieces, each chunk searched once, and dropped once past `max_line_bytes`:
    a long line costs neither time nor memory past its length."""
    number = 0
    with open(path, "rb") as file:
        file.seek(start)
        offset, size = start, 0
        pieces: list[bytes] = []
        while chunk := file.read(CHUNK_BYTES):
            *ended, rest = chunk.split(b"\n")
            for piece in ended:
                size += len(piece)
                data = b"".join((*pieces, piece)) if size <= max_line_bytes else None
                number += 1
                yield offset, size + 1, InputLine(path, number, data, problem="too long")
                offset += size + 1
                pieces, size = [], 0
            size += len(rest)
            pieces = [*pieces, rest] if size <= max_line_bytes else []


def _line_ends_at(path: str, end: int) -> bool:
    """Whether a line of `path` ends at byte `end` (the index's end), as when it was indexed: a file
    emptied and written again past it most likely has another byte there."""
    if end == 0:
        return True
    with open(path, "rb") as file:
        file.seek(end - 1)
        return file.read(1) == b"\n"


def _whole(value: Any, absent: int) -> int:
    """`value` if it is a whole number a column can hold (64 bits), else `absent`: a line may hold
    any integer, and one past the columns' range must not stop the indexing of every line."""
    return value if type(value) is int and -(1 << 63) <= value < 1 << 63 else absent


class _Rewritten(Exception):
    """A file's lines up to the index's end are not those indexed: it was written again in place."""


def _digest(line: InputLine, length: int, digest: int) -> int:
    """`digest` (a CRC) carried over `line`: what the index's end of a file is checked with."""
    return zlib.crc32(line.data if line.data is not None else length.to_bytes(8, "little"), digest)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else math.nan


def fields_of(record: dict[str, Any]) -> tuple[int, int, float, int, int, str, int, int]:
    """task, rollout, reward, output tokens, tool calls, agent, flags and policy version of a line's record."""
    task, rollout = record.get(TASK_INDEX), record.get(ROLLOUT_INDEX)
    response = record.get("response")
    response = response if isinstance(response, dict) else {}
    usage = response.get("usage")
    tokens = usage.get("output_tokens") if isinstance(usage, dict) else None
    output = response.get("output")
    items = output if isinstance(output, list) else ()  # a line's output may be any JSON value
    calls = sum(isinstance(item, dict) and item.get("type") == "function_call" for item in items)
    agent = record.get(AGENT_REF)
    name = agent.get("name") if isinstance(agent, dict) else None
    flags = (FAILED if failure_of(record) is not None else 0) | (UNHEALTHY if record.get(HEALTH) else 0)
    version = record.get(POLICY_VERSION)
    sent = version.get("sent") if isinstance(version, dict) else None
    return (
        _whole(task, NO_INDEX),
        _whole(rollout, NO_INDEX),
        _number(record.get("reward")),
        _whole(tokens, 0),
        calls if isinstance(output, list) else 0,
        name if isinstance(name, str) else "",
        flags,
        _whole(sent, NO_INDEX),
    )


class _Columns:
    """The fields of every indexed line, a typed array each."""

    def __init__(self) -> None:
        self.file, self.offset, self.length = array("l"), array("q"), array("q")
        self.task, self.rollout, self.reward = array("q"), array("q"), array("d")
        self.tokens, self.tool_calls, self.agent = array("q"), array("q"), array("l")
        self.flags, self.version = array("b"), array("q")
        self.agents: list[str] = []
        self.agent_numbers: dict[str, int] = {}

    def add(self, file: int, offset: int, length: int, record: dict[str, Any]) -> None:
        task, rollout, reward, tokens, calls, agent, flags, version = fields_of(record)
        number = self.agent_numbers.get(agent)
        if number is None:
            number = self.agent_numbers[agent] = len(self.agents)
            self.agents.append(agent)
        # One append a column, spelled out: this runs once a line of the files.
        self.file.append(file)
        self.offset.append(offset)
        self.length.append(length)
        self.task.append(task)
        self.rollout.append(rollout)
        self.reward.append(reward)
        self.tokens.append(tokens)
        self.tool_calls.append(calls)
        self.agent.append(number)
        self.flags.append(flags)
        self.version.append(version)

    def entry(self, position: int) -> Entry:
        return Entry(
            position, self.file[position], self.offset[position], self.length[position], self.task[position],
            self.rollout[position], self.reward[position], self.tokens[position], self.tool_calls[position],
            self.agents[self.agent[position]], self.flags[position], self.version[position],
        )  # fmt: skip

    def __len__(self) -> int:
        return len(self.offset)


class Catalog:
    """The lines of `paths` (result files, errors records), indexed, and the summary of them made
    as --summarize makes it under `config` (with `baseline`'s files, its comparison). Safe to use
    from several threads: `refresh` and the reads hold one lock. Reads only; never writes a file."""

    def __init__(
        self,
        paths: tuple[str, ...],
        config: Config,
        *,
        max_line_bytes: int,
        baseline: Catalog | None = None,
    ) -> None:
        self.paths = paths
        self.config = dataclasses.replace(config, aggregate=False)
        self.baseline = baseline
        self._max_line_bytes = max_line_bytes
        self.lock = threading.RLock()
        self.problems: list[str] = []  # the lines the count could not use, as --summarize says them
        self.generation = 0  # counted again: what was drawn from the index is drawn again
        self.drawn: dict[str, tuple[int, str]] = {}  # what pages drew, by name, with its generation
        self._columns = _Columns()
        self._ends = [0] * len(paths)  # how far each file is indexed
        self._identities: list[tuple[int, int] | None] = [None] * len(paths)
        self._stamps: list[tuple[int, int] | None] = [None] * len(paths)  # size and time of change
        self._digests = [0] * len(paths)  # a CRC of each file's lines up to its end
        self.summary: dict[str, Any] = {}
        self._counted = False
        self._baseline_counted = 0  # the baseline's generation the figures were counted with

    def __len__(self) -> int:
        return len(self._columns)

    def refresh(self) -> None:
        """Index what the files gained since the last refresh (all of them, the first time, or once
        one shrank or was replaced), and count the figures again if anything changed."""
        with self.lock:
            if self.baseline is not None:
                self.baseline.refresh()
                if self.baseline.generation != self._baseline_counted:  # the comparison changes with it
                    self._baseline_counted = self.baseline.generation
                    self._counted = False
            changes = [self._change(number, path) for number, path in enumerate(self.paths)]
            if "replaced" in changes:
                self._columns = _Columns()
                self._ends = [0] * len(self.paths)
                self._counted = False
            elif "grew" in changes:
                self._counted = False
            if not self._counted:
                self._count()

    def _change(self, number: int, path: str) -> str:
        status = os.stat(path)
        identity = (status.st_dev, status.st_ino)
        before = self._identities[number]
        self._identities[number] = identity
        end = self._ends[number]
        if before is not None and (before != identity or status.st_size < end or not _line_ends_at(path, end)):
            return "replaced"
        # Written again in place to the same size or more: counted again, and the count checks the index.
        stamp, self._stamps[number] = self._stamps[number], (status.st_size, status.st_mtime_ns)
        return "grew" if status.st_size > end or stamp != self._stamps[number] else ""

    def _count(self) -> None:
        """The figures counted again, and the index extended; made again from the files' starts
        when one of them was written again in place (its lines up to the index's end changed)."""
        try:
            self._count_pass()
        except _Rewritten:
            self._columns, self._ends, self._digests = _Columns(), [0] * len(self.paths), [0] * len(self.paths)
            self._count_pass()
        self._counted = True
        self.generation += 1

    def _count_pass(self) -> None:
        """One pass over every file: each line counted into a fresh run; the lines past the index's
        end indexed as they are read, and those before it checked against the index's CRC."""
        columns, ends, digests = self._columns, self._ends, self._digests

        def each_line(counter: ResultCounter) -> None:
            for number, path in enumerate(self.paths):
                end, digest, reached, checked = ends[number], 0, 0, ends[number] == 0
                for offset, length, line in numbered_lines(path, 0, self._max_line_bytes):
                    record = counter.line(line)
                    if not checked and offset + length > end:  # the first line past the index's end
                        _check_prefix(offset == end and digest == digests[number])
                        checked = True
                    digest, reached = _digest(line, length, digest), offset + length
                    if offset >= end:
                        if record is not None:
                            columns.add(number, offset, length, record)
                        ends[number] = reached
                if not checked:
                    _check_prefix(reached == end and digest == digests[number])
                digests[number] = digest

        self.summary, self.problems = summary_of_files(self.config, each_line, self.baseline)

    def drawing(self, name: str, draw: Callable[[], str]) -> str:
        """`draw()`, made once a count: a chart over every rollout is drawn again only when the files changed."""
        kept = self.drawn.get(name)
        if kept is None or kept[0] != self.generation:
            kept = self.drawn[name] = (self.generation, draw())
        return kept[1]

    def entries(self) -> Iterator[Entry]:
        with self.lock:
            columns = self._columns
            count = len(columns)
        for position in range(count):
            yield columns.entry(position)

    def entry(self, position: int) -> Entry:
        return self._columns.entry(position)

    def column(self, name: str) -> array[Any]:
        found: array[Any] = getattr(self._columns, name)
        return found

    def positions_of_task(self, task: int) -> list[int]:
        tasks = self._columns.task
        return [position for position in range(len(tasks)) if tasks[position] == task]

    def first_of_pairs(self, positions: list[int]) -> set[int]:
        """Those of `positions` whose task and rollout no earlier line has: what `find` finds (a pair
        may have several lines: a failed attempt in --errors, its result in the results)."""
        columns = self._columns
        tasks = {columns.task[position] for position in positions}
        first: dict[tuple[int, int], int] = {}
        for position, task in enumerate(columns.task):
            if task in tasks:
                first.setdefault((task, columns.rollout[position]), position)
        return {p for p in positions if first[columns.task[p], columns.rollout[p]] == p}

    def find(self, task: int, rollout: int) -> Entry | None:
        columns = self._columns
        for position in self.positions_of_task(task):
            if columns.rollout[position] == rollout:
                return columns.entry(position)
        return None

    def line(self, entry: Entry) -> bytes:
        """The bytes of `entry`'s line, read from its file now."""
        with open(self.paths[entry.file], "rb") as file:
            file.seek(entry.offset)
            return file.read(entry.length).rstrip(b"\n")

    def record(self, entry: Entry) -> dict[str, Any]:
        record = parse_row(self.line(entry), exact=True)
        return record if isinstance(record, dict) else {}

    def lines(self, positions: list[int]) -> Iterator[tuple[int, bytes]]:
        """The lines at `positions` (in file order), each file opened once: a streaming scan."""
        columns, handles = self._columns, {}
        try:
            for position in positions:
                number = columns.file[position]
                if number not in handles:
                    handles[number] = open(self.paths[number], "rb")  # noqa: SIM115 - closed below
                handle = handles[number]
                handle.seek(columns.offset[position])
                yield position, handle.read(columns.length[position])
        finally:
            for handle in handles.values():
                handle.close()

    def agent_number(self, name: str) -> int | None:
        return self._columns.agent_numbers.get(name)


def _check_prefix(same: bool) -> None:
    if not same:
        raise _Rewritten


def summary_of_files(
    config: Config, each_line: Callable[[ResultCounter], None], baseline: Catalog | None = None
) -> tuple[dict[str, Any], list[str]]:
    """The summary --summarize makes under `config` of the lines `each_line` gives its counter
    (with `baseline`'s lines, its comparison), and what it says of the lines it could not use."""

    async def count() -> tuple[dict[str, Any], list[str]]:
        comparison = None
        if baseline is not None:
            from rollfilter.figures.compare import RunComparison

            comparison = RunComparison()
            for _, line in baseline.lines(list(range(len(baseline)))):
                record = parse_row(line.rstrip(b"\n"), exact=True)
                if isinstance(record, dict):
                    comparison.add_baseline(record)
        run = Run(config, baseline=comparison)
        await run.connect(send=False)
        counter = ResultCounter(run)
        try:
            each_line(counter)
        except BaseException:
            counter.close()
            raise
        counter.finish()
        await run.finish()
        return run.summary(), counter.unusable.problems()

    return trio.run(count)
