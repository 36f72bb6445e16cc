"""What an agent's answer makes of a rollout: a result stamped with its row's indices and agent
(as NeMo Gym stamps them), the agent's own failure, or a rollout not to be kept."""

from __future__ import annotations

from typing import Any

import msgspec

from rollfilter.engine.plan import Job
from rollfilter.errors import ErrorKind
from rollfilter.outcomes import AttemptFailure, Retry
from rollfilter.rows import AGENT_REF, ATTEMPT_INDEX, ROLLOUT_INDEX, TASK_INDEX

ERROR_REASON_CHARS = 200  # how much of an agent's failure_reason a message quotes


class NotPersisted:
    """The outcome of a rollout whose answer carries `_ng_no_persist`."""


NOT_PERSISTED = NotPersisted()


def judge(
    job: Job, answer: dict[str, Any] | AttemptFailure, attempts: int
) -> dict[str, Any] | AttemptFailure | NotPersisted:
    """What the agent's answer, after `attempts` requests, makes of the rollout: a result stamped
    with the row's indices and agent (as NeMo Gym stamps them), the agent's own failure, or not
    persisted."""
    if isinstance(answer, AttemptFailure):
        if answer.answer is not None:  # an unhealthy answer: its record opens as a result would
            stamp(job, answer.answer)
        return answer
    stamp(job, answer)
    if answer.get("_ng_no_persist"):
        return NOT_PERSISTED
    failure_class = answer.get("_ng_failure_class")
    if failure_class is None:
        return answer
    failure_class = failure_class if isinstance(failure_class, str) else msgspec_text(failure_class)
    reason = answer.get("failure_reason")
    message = f"the agent reported failure class {failure_class!r}" + (
        f": {reason[:ERROR_REASON_CHARS]!r}" if isinstance(reason, str) and reason else ""
    )
    return AttemptFailure(
        ErrorKind.AGENT_FAILURE,
        message,
        attempts=attempts,
        failure_class=failure_class,
        retry=Retry.NEVER if answer.get("_ng_failure_terminal") else Retry.LATER,
        answer=answer,
    )


def stamp(job: Job, result: dict[str, Any]) -> None:
    """Put the row's indices, agent_ref and pass-through keys on its result."""
    result[TASK_INDEX] = job.task_index
    result[ROLLOUT_INDEX] = job.rollout_index
    row = job.row or {}
    if AGENT_REF in row:
        result[AGENT_REF] = row[AGENT_REF]
    if "skills_ref" in row:
        result["skills_ref"] = row["skills_ref"]
    if job.attempt_index is not None:
        result[ATTEMPT_INDEX] = job.attempt_index
    if "_ng_rollout_id" in row:
        result["_ng_rollout_id"] = row["_ng_rollout_id"]


def msgspec_text(value: Any) -> str:
    return msgspec.json.encode(value).decode()
