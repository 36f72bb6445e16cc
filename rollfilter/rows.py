"""What a row is: an input line parsed as a JSON object, its NeMo Gym keys, and the changes a
run makes to it (the -p overrides, the --repeat-seeds seed)."""

from __future__ import annotations

import decimal
import json
import math
import re
from collections.abc import Iterable
from typing import Any

import msgspec

TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"
ATTEMPT_INDEX = "_ng_attempt_index"
ROLLOUT_ID = "_ng_rollout_id"
# NeMo Gym uses the id as a path segment and a file name, and its agents refuse any other:
# letters, digits, dots, dashes and underscores, not starting with a dot or a dash.
_ROLLOUT_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
AGENT_REF = "agent_ref"
MASK_SAMPLE = "mask_sample"  # true: the rollout ran, but is no valid measurement (left out of the figures)
HEALTH = "_rf_health"  # the health checks a result failed (rollfilter.figures.health); absent when healthy
POLICY_VERSION = "_rf_policy_version"  # the policy version when a result's /run was sent, and when it ended
REWARD_COMPONENTS = "reward_components"  # named objectives beside the reward (a multi-reward verifier)


def component_key(name: str) -> str:
    """The key a reward_components entry's figures go by beside the fields': reward_components.NAME."""
    return f"{REWARD_COMPONENTS}.{name}"


_decode = msgspec.json.Decoder().decode


# Writes a number decode_exact kept as a Decimal back as the number it was.
encode_json = msgspec.json.Encoder(decimal_format="number").encode


def is_masked(result: dict[str, Any], *, unhealthy: bool = False) -> bool:
    """Whether a result says it is no valid measurement (`mask_sample: true`): written as any
    result, but left out of every mean, pass@k and group decision. With `unhealthy` (a run that
    masks unhealthy rollouts), a result marked unhealthy (`_rf_health`) is masked too."""
    return result.get(MASK_SAMPLE) is True or (unhealthy and HEALTH in result)


def field_value(result: dict[str, Any], path: str) -> Any:
    """A result's field by name, or by a dotted path into its objects (`reward_components.accuracy`);
    a top-level key that holds the dots itself comes first. None when there is no such field."""
    if path in result or "." not in path:
        return result.get(path)
    value: Any = result
    for part in path.split("."):
        if type(value) is not dict:
            return None
        value = value.get(part)
    return value


def parse_row(data: bytes, *, exact: bool = False) -> dict[str, Any] | str:
    """The row as a dict, or a short reason why the line is not a JSON object. With `exact`, a
    number past what msgspec holds is kept (`decode_exact`) instead of refused."""
    try:
        value = _decode(data)
    except msgspec.ValidationError as exc:  # numbers like 1e400 (a DecodeError too: caught first)
        if not exact:
            return f"invalid JSON: {exc}"
        try:
            value = decode_exact(data)
        except (ValueError, RecursionError):
            return f"invalid JSON: {exc}"
    except msgspec.DecodeError as exc:
        return _describe_decode_error(data, exc)
    except RecursionError:
        return "invalid JSON: nested too deeply"
    if not isinstance(value, dict):
        return f"not a JSON object (a JSON {_json_type(value)})"
    return value


def decode_exact(data: bytes) -> Any:
    """JSON that msgspec refuses for a number it cannot hold (past the float range, or an integer
    of more digits than Python converts): each such number kept whole, as a Decimal, which
    `encode_json` writes back as it was; the others as msgspec gives them. An agent's number
    never fails the answer it came with. ValueError (or RecursionError) for what is not JSON."""
    return json.loads(data, parse_int=_whole, parse_float=_real, parse_constant=_not_json)


def _whole(text: str) -> int | decimal.Decimal:
    try:
        return int(text)
    except ValueError:  # more digits than int() converts
        return decimal.Decimal(text)


def _real(text: str) -> float | decimal.Decimal:
    number = float(text)
    return number if math.isfinite(number) else decimal.Decimal(text)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


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
        reached = 0  # how many of the parents lead to an object
        for part in parents:
            if not isinstance(target, dict):
                break
            target = target.setdefault(part, {})
            reached += 1
        if not isinstance(target, dict):
            where = ".".join(["responses_create_params", *parents[:reached]])
            return f"cannot set the param {key}: {where} is not an object"
        target[leaf] = value
    return None


def agent_name(row: dict[str, Any]) -> str | None:
    """The row's `agent_ref.name`, if it is a string."""
    ref = row.get(AGENT_REF)
    name = ref.get("name") if isinstance(ref, dict) else None
    return name if isinstance(name, str) else None


def rollout_id_problem(row: dict[str, Any]) -> str | None:
    """Why the row's `_ng_rollout_id` would be refused by the agent; None when it has none, or a good one."""
    given = row.get(ROLLOUT_ID)
    if given is None or (type(given) is str and _ROLLOUT_ID_PATTERN.fullmatch(given)):
        return None
    shown = json.dumps(given)[:80]
    return (
        f"{ROLLOUT_ID} {shown} is not a rollout id: give a string of letters, digits, dots, dashes"
        " and underscores that starts with a letter or a digit"
    )


def check_seedable(row: dict[str, Any]) -> str | None:
    """Why a rollout's seed cannot be put into this row (Config.repeats.seeds), or None."""
    params = row.get("responses_create_params", {})
    metadata = params.get("metadata", {}) if isinstance(params, dict) else None
    if not isinstance(metadata, dict):
        return "cannot seed its rollouts: responses_create_params.metadata is not an object"
    extra = metadata.get("extra_body", "{}")
    try:
        if isinstance(extra, str) and isinstance(json.loads(extra), dict):
            return None
    except ValueError:
        pass
    return "cannot seed its rollouts: responses_create_params.metadata.extra_body is not a JSON object in a string"


def add_seed(row: dict[str, Any], rollout: int) -> None:
    """Merge "seed": rollout into metadata.extra_body, as NeMo Gym's num_repeats_add_seed does
    (a JSON string written by Python's json.dumps), copying what it changes."""
    params = row["responses_create_params"] = dict(row.get("responses_create_params", {}))
    metadata = params["metadata"] = dict(params.get("metadata", {}))
    extra = json.loads(metadata.get("extra_body", "{}"))
    extra["seed"] = rollout
    metadata["extra_body"] = json.dumps(extra)
