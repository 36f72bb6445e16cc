"""rollfilter: collect agent rollouts as a streaming Unix filter (JSONL in, results out).

From Python: `rollouts(rows, Config(...))` (any thread) or `open_rollouts(rows, config)`
(trio); see `rollfilter.api.rollouts`. Names are imported on first use, so the CLI starts fast.
"""

from __future__ import annotations

from rollfilter._version import __version__

# Not typing's own: the package root imports nothing it does not need, so that the command's entry
# point (rollfilter.cli.startup, below this package) sets its signal handling within a millisecond.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from rollfilter.api.in_trio import RolloutRun
    from rollfilter.api.rollouts import Rollouts, open_rollouts, rollouts
    from rollfilter.config import (
        Config,
        Cost,
        Groups,
        Health,
        Rates,
        RecentLimit,
        Repeats,
        Retries,
        Reverify,
        Routing,
        Timeouts,
        Tls,
        Trackers,
        Wire,
    )
    from rollfilter.errors import ErrorKind, RollfilterError, ServiceError, SteeringError, UsageError
    from rollfilter.figures.compare import compare_runs
    from rollfilter.outcomes import Failure, Group, Rollout
    from rollfilter.run.statistics import SteeringStatistics

_EXPORTS = {
    "Config": "rollfilter.config",
    "Cost": "rollfilter.config",
    "Groups": "rollfilter.config",
    "Health": "rollfilter.config",
    "RecentLimit": "rollfilter.config",
    "Rates": "rollfilter.config",
    "Repeats": "rollfilter.config",
    "Retries": "rollfilter.config",
    "Reverify": "rollfilter.config",
    "Routing": "rollfilter.config",
    "Timeouts": "rollfilter.config",
    "Tls": "rollfilter.config",
    "Trackers": "rollfilter.config",
    "Wire": "rollfilter.config",
    "ErrorKind": "rollfilter.errors",
    "RollfilterError": "rollfilter.errors",
    "UsageError": "rollfilter.errors",
    "ServiceError": "rollfilter.errors",
    "Failure": "rollfilter.outcomes",
    "Group": "rollfilter.outcomes",
    "Rollout": "rollfilter.outcomes",
    "RolloutRun": "rollfilter.api.in_trio",
    "Rollouts": "rollfilter.api.rollouts",
    "open_rollouts": "rollfilter.api.rollouts",
    "rollouts": "rollfilter.api.rollouts",
    "SteeringError": "rollfilter.errors",
    "SteeringStatistics": "rollfilter.run.statistics",
    "compare_runs": "rollfilter.figures.compare",
}
__all__ = [
    "Config",
    "Cost",
    "ErrorKind",
    "Failure",
    "Group",
    "Groups",
    "Health",
    "Rates",
    "RecentLimit",
    "Repeats",
    "Retries",
    "Reverify",
    "RollfilterError",
    "Rollout",
    "RolloutRun",
    "Rollouts",
    "Routing",
    "ServiceError",
    "SteeringError",
    "SteeringStatistics",
    "Timeouts",
    "Tls",
    "Trackers",
    "UsageError",
    "Wire",
    "__version__",
    "compare_runs",
    "open_rollouts",
    "rollouts",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollfilter' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})  # the names imported on first use too
