"""A summary as a tracker's metrics: every number in it, by its path (`stderr/reward`,
`per_rollout/output_tokens/p90`), whatever blocks it holds."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# The marks trackers refuse or read as paths in a metric's name: MLflow takes letters, digits,
# and _ - . space / only; `pass@k` is `pass_at_k` in both trackers, as NeMo Gym's exporters name it.
_RENAMED = {"@": "_at_", ":": "_", "%": "_pct", "(": "", ")": ""}


def metric_name(path: str) -> str:
    """`path` as a name both trackers take: `pass@4` as `pass_at_4`, `mean@4` as `mean_at_4`, any
    other mark MLflow refuses as `_`."""
    for mark, replacement in _RENAMED.items():
        path = path.replace(mark, replacement)
    return "".join(c if c.isalnum() or c in "_-./ " else "_" for c in path)


def flattened(figures: Mapping[str, Any]) -> dict[str, float]:
    """Every finite number in `figures`, a summary, by its path: `reward`, `pass_at_4`,
    `rollfilter/succeeded`, `stderr/reward`, `per_rollout/output_tokens/p90` (a list's items by
    their place, `pass_histogram/0`), whatever blocks it holds. Booleans are 0 or 1; text, None
    and non-finite numbers are left out."""
    found: dict[str, float] = {}
    _flatten(figures, "", found)
    return found


def _flatten(value: Any, path: str, found: dict[str, float]) -> None:
    if isinstance(value, bool):
        found[metric_name(path)] = float(value)
    elif isinstance(value, int | float):
        if math.isfinite(value):
            found[metric_name(path)] = float(value)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _flatten(item, f"{path}/{key}" if path else str(key), found)
    elif isinstance(value, list | tuple):
        for place, item in enumerate(value):
            _flatten(item, f"{path}/{place}", found)
