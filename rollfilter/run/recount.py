"""Result lines and errors records counted back into a run's figures, as --summarize counts them
and as the viewer does: one way of counting a file of results, wherever it is read."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollfilter.errors import ErrorKind
from rollfilter.formats.resume import StandingFailures
from rollfilter.formats.source import InputLine
from rollfilter.outcomes import AttemptFailure, failure_of
from rollfilter.redact import printable
from rollfilter.rows import ROLLOUT_INDEX, TASK_INDEX, parse_row
from rollfilter.run.run import Run


class ResultCounter:
    """Each line given to `line` counted into `run` (a run that sends nothing): a result (given to
    `on_result` too), a failed attempt (once per pair, unless a result has the pair: counted by
    `finish`), or a line that cannot be used (`unusable`). OutputFailed when the failures cannot
    be held; `close` lets them go when the count ends early."""

    def __init__(self, run: Run, on_result: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.run = run
        self.unusable = UnusableLines()
        self._on_result = on_result
        self._failures: StandingFailures | None = None  # made when the count starts

    def line(self, line: InputLine) -> dict[str, Any] | None:
        """Count `line`; its record (a result or an errors record), None for a blank or unusable line."""
        run = self.run
        if self._failures is None:
            self._failures = StandingFailures()
        if line.data is None:  # over --max-line-bytes
            self.unusable.add(line, line.problem or "too long", run)
            return None
        if not line.data.strip():
            return None
        record = parse_row(line.data, exact=True)  # a result rollfilter wrote, numbers of every size kept
        if isinstance(record, str):
            self.unusable.add(line, record, run)
            return None
        failure = failure_of(record)
        if failure is not None and TASK_INDEX not in record:  # no pair to count it once for
            run.count_failure(failure, record)
        elif failure is not None:
            self._failures.failure(line.data)  # counted once every result is known
        elif not self._failures.result(record) and TASK_INDEX in record and ROLLOUT_INDEX in record:
            self.unusable.repeated(line)  # a pair counted already: the same file twice, or runs mixed
        else:
            run.count_result(record)
            if self._on_result is not None:
                self._on_result(record)
        return record

    def finish(self) -> None:
        """Count the failed attempts of pairs that no result has, one a pair."""
        if self._failures is None:
            return
        for record in self._failures.standing():
            failure = failure_of(record)
            assert failure is not None
            self.run.count_failure(failure, record)

    def close(self) -> None:
        if self._failures is not None:
            self._failures.close()


class UnusableLines:
    """The lines a count cannot use (not JSON objects): each counts as a failed row of kind
    bad_input, as a bad input line does in a run; and results of a (task, rollout) pair counted
    already, which count once. Either makes the exit status 1."""

    def __init__(self) -> None:
        self.count = 0
        self._first = ""
        self.repeats = 0
        self._first_repeat = ""

    def repeated(self, line: InputLine) -> None:
        if not self.repeats:
            self._first_repeat = printable(f"{line.source}:{line.number}")
        self.repeats += 1

    def problems(self) -> list[str]:
        found = [str(self)] if self.count else []
        if self.repeats:
            lines = "1 result repeats" if self.repeats == 1 else f"{self.repeats} results repeat"
            found.append(
                f"{lines} a (task, rollout) pair counted already, counted once; the first: {self._first_repeat}"
            )
        return found

    def add(self, line: InputLine, reason: str, run: Run) -> None:
        run.count_failure(AttemptFailure(ErrorKind.BAD_INPUT, reason))
        if not self.count:
            self._first = printable(f"{line.source}:{line.number}: {reason}")
        self.count += 1

    def __str__(self) -> str:
        lines = "1 line is not a result" if self.count == 1 else f"{self.count} lines are not results"
        return f"{lines}, counted as failed (bad_input); the first: {self._first}"
