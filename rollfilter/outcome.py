"""What became of one rollout: a failure record (a success is the agent's own JSON object)."""

from __future__ import annotations

import dataclasses
from typing import Any

from rollfilter.errors import ErrorKind

TERMINAL_KINDS = frozenset({ErrorKind.BAD_INPUT, ErrorKind.NO_ROUTE})  # retrying cannot fix these


@dataclasses.dataclass(frozen=True, slots=True)
class RowFailure:
    """Why a rollout failed, for the errors record; `attempts` counts requests sent.

    `failure_class` is the agent's own `_ng_failure_class` (None for rollfilter's kinds),
    `terminal` marks a failure that running the rollout again cannot fix, and `answer`
    holds the agent's 2xx answer when the agent itself reported the failure.
    """

    kind: ErrorKind
    message: str
    status: int | None = None
    attempts: int = 0
    retryable: bool = False
    failure_class: str | None = None
    terminal: bool = False
    answer: dict[str, Any] | None = None

    def with_attempts(self, attempts: int) -> RowFailure:
        return dataclasses.replace(self, attempts=attempts)

    @property
    def gym_class(self) -> str:
        """The `_ng_failure_class` NeMo Gym's tools read: the agent's own, or rollfilter's kind."""
        return self.failure_class if self.failure_class is not None else self.kind.value

    @property
    def is_terminal(self) -> bool:
        return self.terminal or self.kind in TERMINAL_KINDS
