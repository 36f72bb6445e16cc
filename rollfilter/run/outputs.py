"""Where a run's outcomes go: the command's lines and files, or the API's channel.

Each sink takes a job's outcome and a `release`, which it must arrange to run once the
row is out of memory (written, or handed over): until then the row holds a concurrency
slot. That is what bounds memory by the concurrency, however slow the output.

The command line opens its files and makes a writer over each; it hands them over as one
`RunOutputs`, of which the sink is made here (`LineSink`, or for a dry run `BodySink` and the
`DryRunClient` that sends nothing and says each route instead). The Python API's outcomes go
to a channel (`ChannelSink`). Beside -o's run record go its trackers' ids (`tracked_config`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from typing import Any, Protocol

import msgspec
import trio

from rollfilter.config import Config
from rollfilter.engine.client import Flight
from rollfilter.engine.groups import ClosedGroup, Fate, trained_on
from rollfilter.engine.plan import Job, describe
from rollfilter.engine.routing import Agent
from rollfilter.errors import ErrorKind
from rollfilter.formats.resume import DROPPED_BECAUSE, KEPT, WRITTEN_THROUGH
from rollfilter.formats.writers import LineWriter, Release
from rollfilter.outcomes import AttemptFailure, Failure, Group, Outcome
from rollfilter.redact import shown
from rollfilter.rows import encode_json as _encode


class HeldWriter(LineWriter, Protocol):
    """The held file's writer: it can write what it holds at once (a regular file never blocks)."""

    def flush_now(self) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class RunOutputs:
    """Where a command-line run's lines go, as the command opened them: a writer each.

    `results` takes the result lines (a dry run's: each body it would send); `errors` the
    failures, as errors records with `records`, else as lines for stderr that `stderr_line`
    makes of each failure's line, its message said by `message_of` and shortened by `fold`
    (b"": nothing); `log` the message lines (a dry run's routes, made by `stderr_line` too).
    `per_task` takes a line a task, `dropped` the rollouts of groups not written, `held` each
    rollout of a group as it finished, told `results_size()` (how far the results are written)
    as groups are written. With `ordered`, results are written in input order."""

    results: LineWriter
    errors: LineWriter
    log: LineWriter
    stderr_line: Callable[[str], bytes]
    records: bool = False
    ordered: bool = False
    per_task: LineWriter | None = None
    dropped: LineWriter | None = None
    held: HeldWriter | None = None
    results_size: Callable[[], int] | None = None
    message_of: Callable[[Failure], str] | None = None
    fold: Callable[[Failure, bytes], bytes] | None = None

    def sink(self, config: Config) -> LineSink:
        """The sink of a run of `config` that writes its outcomes here."""
        keep_incomplete = config.groups is not None and config.groups.keep_incomplete
        groups = GroupOutputs(keep_incomplete, self.dropped, self.held, self.results_size)
        return LineSink(
            self.results,
            self.errors,
            records=self.records,
            ordered=self.ordered,
            repeats=config.repeats.largest,
            stderr_line=self.stderr_line,
            message_of=self.message_of,
            groups=groups,
            fold=self.fold,
        )

    def dry_run(self, config: Config) -> tuple[BodySink, DryRunClient]:
        """A dry run's sink and client: each body written where results go, each route said on
        `log` just before it, and nothing sent."""
        sink = BodySink(
            self.results,
            self.errors,
            repeats=config.repeats.largest,
            stderr_line=self.stderr_line,
            message_of=self.message_of,
            fold=self.fold,
        )
        return sink, DryRunClient(lambda job, agent: self.log.write(self.stderr_line(route_line(job, agent))))

    def write_task(self, record: dict[str, Any]) -> None:
        """A task's line, to `per_task`."""
        assert self.per_task is not None
        self.per_task.write(_encode(record) + b"\n")


def route_line(job: Job, agent: Agent) -> str:
    """Where a job would be sent, as a dry run says it: the row, then the agent's replicas' URLs."""
    return f"{describe(job)} -> POST {','.join(shown(replica.url) for replica in agent.replicas)}"


class DryRunClient:
    """Sends nothing: each job's route goes to `on_route`, and the answer is empty (--dry-run)."""

    def __init__(self, on_route: Callable[[Job, Agent], None]) -> None:
        self._on_route = on_route

    async def send(self, job: Job, agent: Agent, flight: Flight | None = None) -> dict[str, Any] | AttemptFailure:
        self._on_route(job, agent)
        # A row taken from the planner's buffer never waits otherwise: let writers and signals in.
        await trio.lowlevel.checkpoint()
        return {}


class Reorderer:
    """Holds finished rows until every earlier row has finished, for --ordered.

    `emit(seq, action)` runs `action` when `seq` is next; actions run in seq order.
    """

    def __init__(self) -> None:
        self._next = 0
        self._waiting: dict[int, Callable[[], None]] = {}

    def emit(self, seq: int, action: Callable[[], None]) -> None:
        if seq != self._next:
            self._waiting[seq] = action
            return
        action()
        self._next += 1
        while self._next in self._waiting:
            self._waiting.pop(self._next)()
            self._next += 1

    def flush(self) -> None:
        """Run every waiting action in order, skipping the gaps of rows that never finished."""
        for seq in sorted(self._waiting):
            self._waiting.pop(seq)()


@dataclasses.dataclass(frozen=True, slots=True)
class GroupOutputs:
    """Where the command writes what whole groups leave beside their results.

    `dropped` takes the rollouts of groups not written, each stamped with why. With `held` (the
    held file, which holds each rollout as it finished), a group reaches the results only once
    its rollouts have reached `held`, and `held` is told `results_size()` each time a group has
    been written, and which group when it was kept: a resumed run then knows the results file's
    whole groups from a torn one, and how many were kept."""

    keep_incomplete: bool = False
    dropped: LineWriter | None = None
    held: HeldWriter | None = None
    results_size: Callable[[], int] | None = None


class LineSink:
    """The command's sink: results as JSON lines, failures as errors-record lines or stderr lines,
    in input order with --ordered; with `groups`, whole groups (`group`).

    `message_of` is how the command says a failure's message (the settings it names, as options),
    and `stderr_line` makes a failure's one-line report (`Failure.line`) a line for stderr; `fold`,
    given the failure and that line, says what of it to write there (b"": nothing)."""

    def __init__(
        self,
        results: LineWriter,
        errors: LineWriter,
        *,
        records: bool,
        ordered: bool,
        repeats: int,
        stderr_line: Callable[[str], bytes],
        message_of: Callable[[Failure], str] | None = None,
        groups: GroupOutputs | None = None,
        fold: Callable[[Failure, bytes], bytes] | None = None,
    ) -> None:
        self._results = results
        self._fold = fold
        self._groups = groups if groups is not None else GroupOutputs()
        self._vouched = -1  # the results' size the held file was last told
        self._message_of = message_of
        self._stderr_line = stderr_line
        self._errors = errors
        self._records = records
        self._repeated = repeats > 1
        self._reorderer = Reorderer() if ordered else None

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None:
        line = _encode(result) + b"\n"
        if self._reorderer is None:
            self._results.write(line, release)
        else:
            self._reorderer.emit(job.seq, lambda: self._results.write(line, release))

    def failure(self, job: Job, failure: AttemptFailure, release: Release) -> None:
        self.report(job.as_failure(failure))
        self._release(job, release)

    def group(self, closed: ClosedGroup, release: Release) -> None:
        """A group at its end: its rollouts written together (kept, or incomplete with
        keep_incomplete), else to `dropped`, each stamped with why."""
        outputs = self._groups
        members = closed.members
        if trained_on(closed.fate, keep_incomplete=outputs.keep_incomplete):
            if members:
                lines = b"".join(_encode(member.result) + b"\n" for member in members)
                kept = [closed.task_index, closed.first] if closed.fate is Fate.KEPT else None
                self._write_group(lines, release, kept)
                return
        elif outputs.dropped is not None and members:
            why = closed.fate.value
            lines = b"".join(_encode({**member.result, DROPPED_BECAUSE: why}) + b"\n" for member in members)
            outputs.dropped.write(lines, release)
            return
        release()

    def _write_group(self, lines: bytes, release: Release, kept: list[Any] | None) -> None:
        held, results_size = self._groups.held, self._groups.results_size
        if held is None or results_size is None:
            self._results.write(lines, release)
            return

        def written() -> None:
            release()
            size = results_size()
            if size != self._vouched or kept is not None:  # a kept group's own; else once for one write's groups
                self._vouched = size
                marker: dict[str, Any] = {WRITTEN_THROUGH: size}
                if kept is not None:
                    marker[KEPT] = kept
                held.write(_encode(marker) + b"\n")

        held.flush_now()  # the group's rollouts are in the held file before any of its lines is in the results
        self._results.write(lines, written)

    def report(self, failure: Failure) -> None:
        """Write one failure: a record with --errors, else a line on stderr."""
        message = failure.message if self._message_of is None else self._message_of(failure)
        if message != failure.message:
            failure = dataclasses.replace(failure, message=message)
        if self._records:
            self._errors.write(_encode(failure.record()) + b"\n")
        else:
            line = self._stderr_line(failure.line(repeated=self._repeated))
            if self._fold is not None:
                line = self._fold(failure, line)
            if line:
                self._errors.write(line)

    def not_persisted(self, job: Job, attempts: int, release: Release) -> None:
        self._release(job, release)

    def _release(self, job: Job, release: Release) -> None:
        if self._reorderer is None:
            release()
        else:
            self._reorderer.emit(job.seq, release)

    def flush_backlog(self) -> None:
        """Write what --ordered still holds behind unfinished rows (the run was stopped)."""
        if self._reorderer is not None:
            self._reorderer.flush()


class BodySink(LineSink):
    """--dry-run's sink: each row's body as it would be sent, in place of its result; failures
    as `LineSink` writes them on stderr."""

    def __init__(
        self,
        bodies: LineWriter,
        errors: LineWriter,
        *,
        repeats: int,
        stderr_line: Callable[[str], bytes],
        message_of: Callable[[Failure], str] | None = None,
        fold: Callable[[Failure, bytes], bytes] | None = None,
    ) -> None:
        super().__init__(
            bodies,
            errors,
            records=False,
            ordered=False,
            repeats=repeats,
            stderr_line=stderr_line,
            message_of=message_of,
            fold=fold,
        )

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None:
        self._results.write(job.body + b"\n")
        # Given back at once, not when written: a dry run's one worker would otherwise wait
        # for the writer's next batch after every row.
        release()


class ChannelSink:
    """The API's sink: outcomes into a channel; a row's slot is given back when the consumer takes it.

    With `grouped`, a failure is handed out in its group (`Group.failures`), not alone."""

    def __init__(
        self,
        send: trio.MemorySendChannel[tuple[Outcome, Release]],
        *,
        grouped: bool = False,
        keep_incomplete: bool = False,
    ) -> None:
        self._send = send
        self._grouped = grouped
        self._keep_incomplete = keep_incomplete

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None:
        self._send.send_nowait((job.as_rollout(result), release))

    def failure(self, job: Job, failure: AttemptFailure, release: Release) -> None:
        if self._grouped:
            release()
        else:
            self._send.send_nowait((job.as_failure(failure), release))

    def not_persisted(self, job: Job, attempts: int, release: Release) -> None:
        if self._grouped:
            release()
            return
        message = "the agent asked for this rollout not to be kept (_ng_no_persist)"
        failure = AttemptFailure(ErrorKind.NOT_PERSISTED, message, attempts=attempts)
        self._send.send_nowait((job.as_failure(failure), release))

    def group(self, closed: ClosedGroup, release: Release) -> None:
        rollouts = tuple(member.job.as_rollout(member.result) for member in closed.members if member.job is not None)
        failures = tuple(job.as_failure(failure) for job, failure in closed.failures)
        ok = trained_on(closed.fate, keep_incomplete=self._keep_incomplete)
        self._send.send_nowait((Group(closed.task_index, closed.fate.value, rollouts, failures, ok), release))


def tracked_config(config: Config, record: Any | None, *, resume: bool) -> tuple[Config, dict[str, Any] | None]:
    """`config`, its trackers' ids kept beside -o's run record `record` (`OUT.jsonl.trackers.json`)
    when -o keeps one, and the record as its trackers log it (params). Without `resume`, ids an
    earlier run left there are forgotten: the run is a new one."""
    trackers = config.trackers
    if trackers is None or trackers.ids_file is None:
        return config, None
    if record is None:  # -o keeps no record (--append, /dev/null): nor ids
        return dataclasses.replace(config, trackers=dataclasses.replace(trackers, ids_file=None)), None
    if not resume:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(trackers.ids_file)
    return config, msgspec.to_builtins(record)
