"""What became of one rollout: a failure record (a success is the agent's own JSON object)."""

from __future__ import annotations

import dataclasses

from rollfilter.errors import ErrorKind


@dataclasses.dataclass(frozen=True, slots=True)
class RowFailure:
    """Why a rollout failed, for the errors record; `attempts` counts requests sent."""

    kind: ErrorKind
    message: str
    status: int | None = None
    attempts: int = 0
    retryable: bool = False

    def with_attempts(self, attempts: int) -> RowFailure:
        return dataclasses.replace(self, attempts=attempts)
