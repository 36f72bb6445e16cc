"""Where finished rollouts go: result lines and error records (the command), or a channel (the API).

Each sink takes a job's outcome and a `release`, which it must arrange to run once the
row is out of memory (written, or handed over): until then the row holds a concurrency
slot. That is what bounds memory by the concurrency, however slow the output.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import trio

from rollfilter.errors import ErrorKind
from rollfilter.outcomes import AttemptFailure, Failure, Outcome
from rollfilter.plan import Job
from rollfilter.rows import encode_json as _encode
from rollfilter.writers import LineWriter, Release


class RowSink(Protocol):
    """Where the engine hands each finished row."""

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None: ...

    def failure(self, job: Job, failure: AttemptFailure, release: Release) -> None: ...

    def not_persisted(self, job: Job, attempts: int, release: Release) -> None:
        """A rollout the agent asked to keep nowhere (`_ng_no_persist`), after `attempts` requests:
        it leaves no line."""
        ...


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
        """Run every held action in order, skipping the gaps of rows that never finished."""
        for seq in sorted(self._waiting):
            self._waiting.pop(seq)()


class LineSink:
    """The command's sink: results as JSON lines, failures as errors-record lines or stderr lines,
    in input order with --ordered.

    `message_of` is how the command says a failure's message (the settings it names, as options),
    and `stderr_line` makes a failure's one-line report (`Failure.line`) a line for stderr."""

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
    ) -> None:
        self._results = results
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

    def report(self, failure: Failure) -> None:
        """Write one failure: a record with --errors, else a line on stderr."""
        message = failure.message if self._message_of is None else self._message_of(failure)
        if message != failure.message:
            failure = dataclasses.replace(failure, message=message)
        if self._records:
            self._errors.write(_encode(failure.record()) + b"\n")
        else:
            self._errors.write(self._stderr_line(failure.line(repeated=self._repeated)))

    def not_persisted(self, job: Job, attempts: int, release: Release) -> None:
        self._release(job, release)

    def _release(self, job: Job, release: Release) -> None:
        if self._reorderer is None:
            release()
        else:
            self._reorderer.emit(job.seq, release)

    def flush_held(self) -> None:
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
    ) -> None:
        super().__init__(
            bodies,
            errors,
            records=False,
            ordered=False,
            repeats=repeats,
            stderr_line=stderr_line,
            message_of=message_of,
        )

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None:
        self._results.write(job.body + b"\n")
        # Given back at once, not when written: a dry run's one worker would otherwise wait
        # for the writer's next batch after every row.
        release()


class ChannelSink:
    """The API's sink: outcomes into a channel; a row's slot is given back when the consumer takes it."""

    def __init__(self, send: trio.MemorySendChannel[tuple[Outcome, Release]]) -> None:
        self._send = send

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None:
        self._send.send_nowait((job.as_rollout(result), release))

    def failure(self, job: Job, failure: AttemptFailure, release: Release) -> None:
        self._send.send_nowait((job.as_failure(failure), release))

    def not_persisted(self, job: Job, attempts: int, release: Release) -> None:
        message = "the agent asked for this rollout not to be kept (_ng_no_persist)"
        failure = AttemptFailure(ErrorKind.NOT_PERSISTED, message, attempts=attempts)
        self._send.send_nowait((job.as_failure(failure), release))
