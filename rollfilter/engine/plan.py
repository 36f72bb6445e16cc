"""Lines to jobs: number rows as NeMo Gym does, build each rollout's body, repeat, shard, and skip
what resume says is done.

A job is one rollout: one input row sent once. A row repeated K times gives K adjacent
jobs (a a b b). Each body is the row "materialized" as NeMo Gym's collector builds it: the
row's own keys, `agent_ref` filled from -a when the row names no agent, the -p overrides,
`_ng_task_index`, `_ng_rollout_index`, the seed with --repeat-seeds, and `_ng_attempt_index`
on a resumed retry.
"""

from __future__ import annotations

import collections
import dataclasses
import zlib
from array import array
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import msgspec
import trio

from rollfilter.config import Config
from rollfilter.errors import ErrorKind
from rollfilter.figures.passk import TaskStats
from rollfilter.formats.keytable import KeyTable
from rollfilter.formats.resume import ResumeState
from rollfilter.formats.source import InputLine, next_when_ready
from rollfilter.outcomes import AttemptFailure, Failure, Retry, Rollout
from rollfilter.rows import (
    AGENT_REF,
    ATTEMPT_INDEX,
    ROLLOUT_ID,
    ROLLOUT_INDEX,
    TASK_INDEX,
    add_seed,
    agent_name,
    apply_params,
    check_seedable,
    parse_row,
    rollout_id_problem,
)

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


class Job(msgspec.Struct, frozen=True, kw_only=True, eq=False):
    """One rollout to run: where the row came from, its indices, and the body to POST.

    Built once, with every field known; what changes from one attempt to the next is the
    engine's. A Struct, not a frozen dataclass: one is built per rollout, and a frozen
    dataclass's `__init__` (`object.__setattr__` per field) costs over ten times as much.
    Compared by identity (eq=False): the engine keys its rollouts in flight by job.
    """

    seq: int  # position among the run's jobs: the order of --ordered output
    source: str
    line: int
    task_index: Any
    rollout_index: int
    row: dict[str, Any] | None  # the row shared by the task's rollouts; None when the line is not a JSON object
    body: bytes  # this rollout's body as sent, or the raw line for bad input
    agent_name: str | None = None  # the row's agent_ref.name (after -a filled it), the route by name
    attempt_index: Any = None  # _ng_attempt_index as sent, if any
    failure: AttemptFailure | None = None  # known before sending: bad input
    group: int = 0  # the first rollout index of its line: with the task, the key of its group

    def as_rollout(self, result: dict[str, Any]) -> Rollout:
        """This rollout finished with `result`: the row as sent, and the result."""
        return Rollout(_decode(self.body), result, self.task_index, self.rollout_index)

    def as_failure(self, failure: AttemptFailure) -> Failure:
        """This rollout failed for `failure`: the row as sent (or the line's text), where it came from, and why."""
        row = _decode(self.body) if self.row is not None else None
        raw = self.body.decode(errors="backslashreplace") if row is None else None
        return Failure(
            row, self.task_index, self.rollout_index, failure.kind, failure.message, failure.status, failure.attempts,
            self.line, failure.failure_class, terminal=failure.retry is Retry.NEVER, answer=failure.answer,
            source=self.source, raw=raw, attempt_index=self.attempt_index, budget_spent=failure.budget_spent,
        )  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class GroupPlan:
    """A line's rollouts as one group: what this run sends, and what earlier runs left of it."""

    task_index: Any
    first: int  # its first rollout index: with the task, the group's key (Job.group)
    sent: tuple[int, ...]  # rollout indices this run sends
    earlier: dict[int, dict[str, Any]]  # finished by an earlier run, their group then still open
    done: int  # written whole by an earlier run
    dropped: int  # dropped by an earlier run (uniform)
    given_up: int  # out of attempts, or terminal: the group can never be whole
    counted: bool = False  # written whole by an earlier run, and counted by the resume state (kept_groups)


def shard_of(task_index: Any, shards: int) -> int:
    """The shard a task belongs to: its index mod N (a stable hash for non-integer indices)."""
    if type(task_index) is int:
        return task_index % shards
    return zlib.crc32(_encode(task_index)) % shards


class InputRow(NamedTuple):
    """An input line read as a row, before it is planned."""

    row: dict[str, Any] | None  # the JSON object, None when the line is none
    body: bytes  # the line's text, as the errors record quotes it
    task: Any  # its task index: the row's own, or NeMo Gym's numbering of its line
    agent: str | None  # the name of the agent the row goes to, if it names one
    failure: AttemptFailure | None  # why it cannot be sent: a bad line, a -p that does not apply, ...


class LineSource(Protocol):
    """Where rows come from: a LineReader over files, or the API's feed of rows."""

    def next_line_nowait(self) -> InputLine | None:
        """A buffered line, None at the end, or trio.WouldBlock until `fill()` has run."""
        ...

    async def fill(self) -> None: ...


class JobSource(Protocol):
    """Where the engine takes its jobs: a `Planner` over rows, or re-scoring's planner over rollouts."""

    skipped: int  # pairs an earlier run finished (--resume)
    given_up: int  # pairs not run again: terminal, or out of attempts (--resume)
    passed_over: int | None  # lines re-scoring leaves alone, not judged failed (None: it leaves none)
    agents_seen: set[str]  # the agents the rows named

    def next_job_nowait(self) -> Job | None:
        """The next job if its line is buffered; None at the end. trio.WouldBlock until filled."""
        ...

    async def next_job(self, filling: trio.Lock | None = None) -> Job | None: ...


def line_key(line: InputLine) -> bytes:
    """What numbering tells lines apart by: their text and whether it ended in a newline, as NeMo
    Gym's collector keys on each line read with its newline."""
    assert line.data is not None
    # A line that ended in a newline holds none, so marking the one without a newline by
    # appending one tells every distinct line apart (any other byte could be in the text).
    return line.data if line.terminated else line.data + b"\n"


class TaskNumbering:
    """Task and rollout indices as NeMo Gym's collector gives them, in flat memory.

    A row's own `_ng_task_index` is kept. Other rows are numbered by their text:
    byte-identical lines share one index, and the counter counts only the distinct lines
    without an index of their own. Rollout indices are counted per task index, so a task
    met again continues its count (0, 1, then 2, 3). About 30 bytes a distinct line.
    """

    def __init__(self) -> None:
        # 4 bytes a value: 4,294,967,296 distinct lines, and as many rollouts of one task.
        self._lines = KeyTable(("I",))  # line text -> its task index
        self._next_rollout = array("I")  # by numbered task index
        self._given = KeyTable(("I",))  # a row's own task index (as JSON) -> its next rollout index

    def task_for_line(self, text: bytes) -> int:
        task = self._lines.setdefault(text, len(self._next_rollout))
        if task == len(self._next_rollout):
            self._next_rollout.append(0)
        return task

    def new_task(self) -> int:
        """An index no other line shares (a line too long to keep, whose text is unknown)."""
        self._next_rollout.append(0)
        return len(self._next_rollout) - 1

    def take_rollouts(self, task: Any, count: int) -> int:
        """Reserve `count` rollout indices of `task`; returns the first."""
        numbered = type(task) is int and 0 <= task < len(self._next_rollout)
        key = _encode(task) if self._given.count or not numbered else b""
        handle = self._given.find(key) if self._given.count else -1
        if handle < 0 and numbered:
            first: int = self._next_rollout[task]
            self._next_rollout[task] = first + count
            return first
        if handle < 0:
            handle = self._given.add(key)[0]
        first = self._given.value(handle)
        self._given.set_value(handle, first + count)
        return first


class Planner:
    """Turns input lines into jobs, one at a time, as the engine asks for them."""

    def __init__(
        self,
        reader: LineSource,
        config: Config,
        resume: ResumeState | None = None,
        tasks: TaskStats | None = None,
        on_group: Callable[[GroupPlan], None] | None = None,
        on_standing_failure: Callable[[Any, int], None] | None = None,
    ) -> None:
        self._reader = reader
        self._on_group = on_group  # told each line's group before any of its jobs runs
        self._tasks = tasks  # told each task's rollouts
        self._on_standing_failure = on_standing_failure  # told each failed rollout resume gives up
        self._config = config
        self._resume = resume
        self._numbering = TaskNumbering()
        self._pending: collections.deque[Job] = collections.deque()
        self._rows = 0  # non-empty lines seen, for --limit
        self._seq = 0
        self.skipped = 0  # pairs an earlier run finished (--resume)
        self.given_up = 0  # pairs not run again: terminal, or out of attempts (--resume)
        self.passed_over: int | None = None  # it runs every row
        self.agents_seen: set[str] = set()
        self.agents_without_repeats: set[str | None] = set()  # rows that no repeat count covers

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

    async def next_job(self, filling: trio.Lock | None = None) -> Job | None:
        """The next job to run, or None at the end of the input (or of --limit); with `filling`,
        one task at a time reads more input."""
        return await next_when_ready(self.next_job_nowait, self.fill, filling)

    def _read_row(self, line: InputLine) -> InputRow:
        """The line read as a row: see `InputRow`."""
        config = self._config
        row: dict[str, Any] | None = None
        name: str | None = None
        failure: AttemptFailure | None = None
        if line.data is None:
            body = b""
            task: Any = self._numbering.new_task()
            failure = AttemptFailure(ErrorKind.BAD_INPUT, line.problem or "unreadable line")
            return InputRow(row, body, task, name, failure)
        body = line.data.strip()
        parsed = parse_row(body)
        if isinstance(parsed, str):
            task = self._numbering.task_for_line(line_key(line))
            return InputRow(row, body, task, name, AttemptFailure(ErrorKind.BAD_INPUT, parsed))
        row = parsed
        if config.agent is not None and AGENT_REF not in row:
            row[AGENT_REF] = {"name": config.agent}
        name = agent_name(row)
        if name is not None:
            self.agents_seen.add(name)
        reason = apply_params(row, config.params) if config.params else None
        if reason is None and config.repeats.seeds:
            reason = check_seedable(row)
        if reason is None and ROLLOUT_ID in row:
            reason = rollout_id_problem(row)
        if reason is not None:
            failure = AttemptFailure(ErrorKind.BAD_INPUT, reason)
        if TASK_INDEX in row:
            task = row[TASK_INDEX]
        else:
            task = row[TASK_INDEX] = self._numbering.task_for_line(line_key(line))
        # Made by tuple's own constructor: a NamedTuple's is a Python function, called once a row.
        return tuple.__new__(InputRow, (row, body, task, name, failure))

    def _plan_row(self, line: InputLine) -> None:
        self._rows += 1
        config = self._config
        row, body, task, name, failure = self._read_row(line)
        shard = config.shard
        if shard is not None and shard_of(task, shard[1]) != shard[0]:
            return
        repeats = config.repeats.for_agent(name)
        if repeats is None:
            self.agents_without_repeats.add(name)
            repeats = 1
            if failure is None:
                failure = AttemptFailure(ErrorKind.BAD_INPUT, missing_repeats_reason(name))
        first = self._numbering.take_rollouts(task, repeats)
        if self._tasks is not None:
            self._tasks.planned(task, repeats)
        sent = row if failure is None else None
        prefix = _encoded_prefix(sent, seeds=config.repeats.seeds) if sent is not None else None
        given_attempt = row.get(ATTEMPT_INDEX) if row is not None else None
        jobs = []
        earlier: dict[int, dict[str, Any]] = {}
        done = dropped = given_up = 0
        for rollout in range(first, first + repeats):
            attempt = 0
            if self._resume is not None:
                attempt = self._resume.decide(task, rollout)
                if attempt < 0:
                    self.skipped += attempt != ResumeState.GIVE_UP
                    if attempt == ResumeState.DONE:
                        done += 1
                    elif attempt == ResumeState.DROPPED:
                        dropped += 1
                    elif attempt == ResumeState.EARLIER:
                        earlier[rollout] = self._resume.take_earlier(task, rollout)
                    else:
                        given_up += 1
                        self.given_up += 1
                        if self._on_standing_failure is not None:
                            self._on_standing_failure(task, rollout)
                    continue
            rollout_body = body
            attempt_index = None
            if sent is not None:
                if prefix is not None:
                    tail = b',"_ng_attempt_index":%d}' % attempt if attempt else b"}"
                    rollout_body = b'%s,"_ng_rollout_index":%d%s' % (prefix, rollout, tail)
                else:
                    rollout_body = _encoded_rollout(sent, rollout, attempt, seeds=config.repeats.seeds)
                attempt_index = attempt or given_attempt
            jobs.append(
                Job(
                    seq=self._seq,
                    source=line.source,
                    line=line.number,
                    task_index=task,
                    rollout_index=rollout,
                    row=row,
                    body=rollout_body,
                    agent_name=name,
                    attempt_index=attempt_index,
                    failure=failure,
                    group=first,
                )
            )
            self._seq += 1
        if self._on_group is not None:
            sending = tuple(job.rollout_index for job in jobs)
            counted = done > 0 and self._resume is not None and self._resume.counted_kept(task, first)
            self._on_group(GroupPlan(task, first, sending, earlier, done, dropped, given_up, counted))
        self._pending.extend(jobs)


def missing_repeats_reason(agent: str | None) -> str:
    """Why a row of `agent` is not run: repeat counts are given by agent, and none covers it."""
    if agent is None:
        return "no repeat count covers a row that names no agent: give a default count"
    return f"no repeat count covers agent {agent!r}: give a default count, or one for {agent!r}"


def _encoded_prefix(row: dict[str, Any], *, seeds: bool) -> bytes | None:
    """The row encoded once without its closing brace, for each rollout's keys to be spliced on;
    None when a rollout's keys are already in the row (set in place, they keep their position)."""
    if seeds or ROLLOUT_INDEX in row or ATTEMPT_INDEX in row:
        return None
    return _encode(row)[:-1]


def _encoded_rollout(row: dict[str, Any], rollout: int, attempt: int, *, seeds: bool) -> bytes:
    """One rollout's body built whole: a copy of the row with its keys set (and its seed)."""
    copy = dict(row)
    copy[ROLLOUT_INDEX] = rollout
    if seeds:
        add_seed(copy, rollout)
    if attempt:
        copy[ATTEMPT_INDEX] = attempt
    return _encode(copy)


def describe(job: Job) -> str:
    return f"{job.source}:{job.line} task {job.task_index} rollout {job.rollout_index}"
