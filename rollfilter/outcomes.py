"""What became of one rollout, in one shape for the command line and the Python API.

`Rollout` (the row as sent and the agent's result) and `Failure` (the row, where it came
from, and why) are what the API hands out (with `Config.groups`, in a `Group`); the command
writes the same objects, a result line for a Rollout and an errors-record line
(`Failure.record()`) or a stderr line (`Failure.line()`) for a Failure. `AttemptFailure` is
the engine's account of how a rollout's attempt failed (or why none was made), before it is
tied to its row; the job (`plan.Job.as_failure`, `as_rollout`) ties it.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any, ClassVar

from rollfilter.errors import ErrorKind
from rollfilter.redact import printable
from rollfilter.rows import AGENT_REF, ATTEMPT_INDEX, HEALTH, ROLLOUT_INDEX, TASK_INDEX

TERMINAL_KINDS = frozenset({ErrorKind.BAD_INPUT, ErrorKind.NO_ROUTE})  # no run can fix these
OVERLOAD_STATUSES = frozenset({429, 503})  # the agent asks for less: --adaptive's signal, and a throttled reply
ROLLFILTER_FIELDS = ("source", "line", "attempts", "error", "row", "raw", "agent_fields")  # of an errors record


class Retry(enum.Enum):
    """When sending a failed rollout again can help."""

    NOW = "now"  # in this run, after a pause: a timeout, a connection that failed, a retry status
    LATER = "later"  # not in this run, but a resumed one runs it again
    NEVER = "never"  # no run can fix it: bad input, no route, a failure the agent marks terminal


@dataclasses.dataclass(frozen=True, slots=True)
class AttemptFailure:
    """How a rollout's attempt failed (or why none was made), for the errors record;
    `attempts` counts the requests sent.

    `retry` says whether sending it again can help (the kinds in TERMINAL_KINDS are always
    `Retry.NEVER`), `failure_class` is the agent's own `_ng_failure_class` (None for
    rollfilter's kinds), and `answer` holds the agent's 2xx answer when the agent itself
    reported the failure. `budget_spent`: a retry was due, and the agent's retry budget withheld
    it (the message says so, attempts and all).
    """

    kind: ErrorKind
    message: str
    status: int | None = None
    attempts: int = 0
    retry: Retry = Retry.LATER
    failure_class: str | None = None
    answer: dict[str, Any] | None = None
    budget_spent: bool = False

    def __post_init__(self) -> None:
        if self.kind in TERMINAL_KINDS:
            object.__setattr__(self, "retry", Retry.NEVER)

    def with_attempts(self, attempts: int) -> AttemptFailure:
        return dataclasses.replace(self, attempts=attempts)


@dataclasses.dataclass(frozen=True, slots=True)
class Rollout:
    """A finished rollout: the row as sent, and the agent's result with its indices added."""

    ok: ClassVar[bool] = True
    row: dict[str, Any]
    result: dict[str, Any]
    task_index: Any
    rollout_index: int

    @property
    def health(self) -> tuple[str, ...]:
        """The health checks its result failed (`rollfilter.figures.health`), as its line's
        `_rf_health` holds them; empty when it is healthy. (With `Config.health`'s "fail", an
        unhealthy rollout is a `Failure` of kind `unhealthy` instead.)"""
        checks = self.result.get(HEALTH)
        return tuple(checks) if type(checks) is list else ()


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """A failed rollout, as the errors record holds it. `row` is the row as sent, None when the
    input line was not a JSON object (`raw` then holds its text).

    `failure_class` is the agent's own `_ng_failure_class` (kind `agent_failure`), `terminal`
    says whether running the rollout again can help, and `answer` is the agent's answer when
    it reported the failure itself. Kind `not_persisted` is a rollout whose answer carried
    `_ng_no_persist`: the command writes it nowhere, and a resumed run runs it again.
    """

    ok: ClassVar[bool] = False
    row: dict[str, Any] | None
    task_index: Any
    rollout_index: int
    kind: ErrorKind
    message: str
    status: int | None
    attempts: int
    number: int  # the row's 1-based line number in `source`
    failure_class: str | None = None
    terminal: bool = False
    answer: dict[str, Any] | None = None
    source: str = "<rows>"  # the input it came from: a FILE, <stdin>, or the API's rows
    raw: str | None = None  # the line's text, when it is not a JSON object
    attempt_index: Any = None  # _ng_attempt_index as sent
    budget_spent: bool = False  # a retry withheld by the agent's retry budget: the message counts the attempts

    @property
    def health(self) -> tuple[str, ...]:
        """The health checks its answer failed, for a failure of kind `unhealthy` (with
        `Config.health`'s "fail"), as its record's `_rf_health` holds them; else empty, so that
        every outcome says its verdict as a `Rollout` does."""
        checks = self.answer.get(HEALTH) if self.answer is not None and self.kind is ErrorKind.UNHEALTHY else None
        return tuple(checks) if type(checks) is list else ()

    def record(self) -> dict[str, Any]:
        """One line of the errors record, which is also NeMo Gym's failures sidecar.

        When the agent reported the failure itself, its answer (stamped with the pair's indices
        and agent, as a result is) stands at the top level, as NeMo Gym writes it: readers of the
        sidecar find its `reward` and `response` there. Otherwise the pair's indices, agent and
        failure class open the line. rollfilter's own fields follow: where the row came from,
        the attempts, what went wrong, and the row as sent; of a field the answer holds too,
        rollfilter's stands at the top level and the agent's is kept under `agent_fields`."""
        record: dict[str, Any]
        if self.answer is not None:
            record = dict(self.answer)
            replaced = {key: record[key] for key in ROLLFILTER_FIELDS if key in record}
        else:
            record = {TASK_INDEX: self.task_index, ROLLOUT_INDEX: self.rollout_index}
            if self.row is not None and AGENT_REF in self.row:
                record[AGENT_REF] = self.row[AGENT_REF]
            if self.attempt_index is not None:
                record[ATTEMPT_INDEX] = self.attempt_index
        record["_ng_failure_class"] = self.failure_class if self.failure_class is not None else self.kind.value
        if self.terminal:
            record["_ng_failure_terminal"] = True
        record["source"] = self.source
        record["line"] = self.number
        record["attempts"] = self.attempts
        record["error"] = {"kind": self.kind.value, "status": self.status, "message": self.message}
        if self.row is not None:
            record["row"] = self.row
        else:
            record["raw"] = self.raw
        if self.answer is not None and replaced:
            record["agent_fields"] = replaced  # the agent's own values of the fields above
        return record

    def line(self, *, repeated: bool = False) -> str:
        """The one-line report (where, kind, message), with control characters escaped; `repeated`
        names the rollout. The command prints it on stderr, after its prefix."""
        where = f"{self.source}:{self.number}" + (f" (rollout {self.rollout_index})" if repeated else "")
        tries = f" (after {self.attempts} attempts)" if self.attempts > 1 and not self.budget_spent else ""
        return printable(f"{where}: {self.kind.value}: {self.message}{tries}")


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """A task's rollouts at the end of their group (with `Config.groups`), in rollout order.

    `fate` says what became of it: "kept" (every rollout finished, and with `drop_uniform` their
    `group_field` differs), "uniform" (dropped: the same `group_field` throughout its members that
    are valid measurements), "masked" (dropped: fewer than two of those; `mask_sample`), "incomplete"
    (a rollout failed after its retries: `failures` says how) or "cancelled" (the run stopped
    first, at `target_groups` or when left early). `ok` says whether it is handed out to train
    on: kept, or incomplete with `keep_incomplete` (`RolloutRun.groups()` gives those).
    """

    task_index: Any
    fate: str
    rollouts: tuple[Rollout, ...]
    failures: tuple[Failure, ...] = ()
    ok: bool = False

    @property
    def rewards(self) -> list[Any]:
        """Each rollout's reward, in rollout order."""
        return [rollout.result.get("reward") for rollout in self.rollouts]


Outcome = Rollout | Failure | Group


def failure_of(record: dict[str, Any]) -> AttemptFailure | None:
    """The failure a line of an errors record (or of NeMo Gym's failures sidecar) describes,
    or None for a result line. A line with `_ng_failure_class` is a failure, indices or not."""
    error = record.get("error")
    gym_class = record.get("_ng_failure_class")
    if gym_class is None and not (isinstance(error, dict) and TASK_INDEX in record):
        return None
    error = error if isinstance(error, dict) else {}  # none: NeMo Gym's line, the agent's own class
    try:
        kind = ErrorKind(str(error.get("kind", ErrorKind.AGENT_FAILURE)))
    except ValueError:
        kind = ErrorKind.AGENT_FAILURE
    agent_class = str(gym_class) if kind is ErrorKind.AGENT_FAILURE and gym_class is not None else None
    message = str(error.get("message", f"the agent reported failure class {gym_class!r}"))
    retry = Retry.NEVER if record.get("_ng_failure_terminal") else Retry.LATER
    return AttemptFailure(kind, message, error.get("status"), retry=retry, failure_class=agent_class)
