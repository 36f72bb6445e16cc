"""The summary: one JSON object rendered from a run's snapshot (`RunStatistics`), and nothing else.

The means of every numeric result field (and mean@K and pass@k over tasks), their error bars,
token usage, what each rollout took, a split by agent when several served the run, then the
run's own figures under "rollfilter".
"""

from __future__ import annotations

from typing import Any

from rollfilter.errors import ErrorKind
from rollfilter.figures.means import Means
from rollfilter.figures.stats import Estimate, error_bars, within_unit
from rollfilter.rows import REWARD_COMPONENTS, component_key
from rollfilter.run.statistics import RunStatistics, label, merged


def summary_of(statistics: RunStatistics) -> dict[str, Any]:
    """The summary object of a run's snapshot: means of numeric result fields (and mean@K, pass@k
    over tasks), token usage, a split by agent when several served the run, each agent's
    key_metrics once aggregated, the comparison with a baseline, then the run's own figures under
    "rollfilter"."""
    by_agent = statistics.results_by_agent
    tasks = statistics.tasks
    overall = merged(by_agent)
    summary = overall.means()
    if tasks is not None:
        summary.update(tasks.fields)
    if overall.component_sums:
        summary[REWARD_COMPONENTS] = overall.components()
    summary |= error_blocks(summary, overall.estimates() if tasks is None else dict(tasks.estimates), overall)
    summary["usage"] = overall.usage()
    costs = overall.costs.figures()
    if costs is not None:
        summary["per_rollout"] = costs
    if len(by_agent) > 1:
        summary["agents"] = {
            label(name): _agent_figures(means, means.estimates() if tasks is None else dict(tasks.by_agent[name]))
            for name, means in sorted(by_agent.items(), key=lambda item: item[0] or "")
        }
    if statistics.key_metrics is not None:
        summary["key_metrics"] = dict(statistics.key_metrics)
    if statistics.comparison is not None:
        summary["compare"] = statistics.comparison.figures()
    summary["rollfilter"] = _run_figures(statistics, overall.measured)
    return summary


def _run_figures(statistics: RunStatistics, means_cover: int) -> dict[str, Any]:
    """The summary's "rollfilter": the run's own figures."""
    s = statistics
    figures: dict[str, Any] = {} if s.expected is None else {"expected": s.expected}
    figures["rows_read"] = s.rows_read
    # A run that sends nothing has nothing succeed: it counts the rows it would send.
    figures |= {"succeeded": s.succeeded} if s.would_send is None else {"succeeded": 0, "would_send": s.would_send}
    figures |= {
        "failed": s.failed,
        "masked": s.masked,  # of the succeeded: in no mean, mean@K or pass@k
        "means_cover": means_cover,  # the results the means are over (earlier runs' included)
        "not_persisted": s.not_persisted,
        "skipped": s.skipped,
        "not_retried": s.not_retried,
        "cancelled": s.cancelled,
    }
    if s.expected is not None or s.groups is not None:  # with groups, null when the input cannot be counted
        figures["not_started"] = s.not_started
    figures |= {
        "failed_by_kind": {
            kind.value: s.failed_by_kind[kind.value] for kind in ErrorKind if s.failed_by_kind.get(kind.value)
        },
        "retries": s.retries,
        "retries_withheld": s.retries_withheld,
    }
    if s.failed_by_class:
        figures["failed_by_class"] = dict(sorted(s.failed_by_class.items()))
    figures["health"] = {
        "unhealthy": s.unhealthy,
        "by_check": dict(s.unhealthy_by_check),
        "tasks_all_unhealthy": s.tasks_all_unhealthy,
    }
    if s.spending is not None:
        figures.update(s.spending)
    if s.timed:
        figures |= _timings(s)
    if s.tasks is not None:
        figures.update(s.tasks.counts)
    if s.replicas:
        figures["replicas"] = [dict(replica) for replica in s.replicas]
    if s.windows:
        figures["windows"] = {name: dict(window) for name, window in s.windows.items()}
    if s.limits:
        figures["limits"] = {name: dict(limits) for name, limits in s.limits.items()}
    return figures | _said(s)


def _timings(statistics: RunStatistics) -> dict[str, Any]:
    """How long the run took, and how fast it went."""
    s, latency = statistics, statistics.latency
    return {
        "elapsed_s": round(s.elapsed_s, 3),
        "rows_per_s": round(s.rows_per_s, 2),
        "tokens_per_s": None if s.tokens_per_s is None else round(s.tokens_per_s, 2),
        "latency_s": {
            "p50": round(latency.percentile(50), 4),
            "p90": round(latency.percentile(90), 4),
            "p99": round(latency.percentile(99), 4),
            "max": round(latency.max, 4),
        },
    }


def _said(statistics: RunStatistics) -> dict[str, Any]:
    """What the run says of itself at the end of its figures: why it stopped, its groups, whether
    it re-scored unsafely, what re-scoring passed over, the shards read, the tasks compared."""
    s = statistics
    said: dict[str, Any] = {"stopped": s.stopped} if s.stopped else {}
    if s.groups is not None:
        said["groups"] = dict(s.groups)
    if s.unsafe:
        said["unsafe"] = True
    if s.not_judge_failed is not None:
        said["not_judge_failed"] = s.not_judge_failed
    if s.shards is not None:
        said["shards"] = dict(s.shards)
    if s.comparison is not None:
        said["compared_tasks"] = s.comparison.tasks()
    return said


def error_blocks(figures: dict[str, Any], estimates: dict[str, Estimate], means: Means) -> dict[str, Any]:
    """The summary's error bars beside its means, a block each, keyed as the means are:
    `stderr`, `ci95` ([low, high]) and `sample_size` ({"tasks", "rollouts"}); a mean whose
    spread cannot be seen (one task) has null bars, and a summary with no mean no blocks.
    A mean whose values (as `means` counted them) all lie in [0, 1] has Wilson's interval."""
    stderr: dict[str, Any] = {}
    ci95: dict[str, Any] = {}
    sample_size: dict[str, Any] = {}
    for key, value in figures.items():
        estimate = estimates.get(key)
        if value is None or estimate is None:
            continue
        stderr[key], ci95[key] = error_bars(_bounded(key, estimate, means))
        sample_size[key] = {"tasks": estimate.tasks, "rollouts": estimate.rollouts}
    components = figures.get(REWARD_COMPONENTS)
    # Each entry's bars nested as its mean is (stderr.reward_components.NAME); a line's
    # reward_components that is a number is a numeric field like any other, its bars above.
    if isinstance(components, dict) and components:
        for block in (stderr, ci95, sample_size):
            block[REWARD_COMPONENTS] = {}
        for name in components:
            estimate = estimates.get(component_key(name))
            if estimate is not None:
                bars = error_bars(_bounded(component_key(name), estimate, means))
                stderr[REWARD_COMPONENTS][name], ci95[REWARD_COMPONENTS][name] = bars
                sample_size[REWARD_COMPONENTS][name] = {"tasks": estimate.tasks, "rollouts": estimate.rollouts}
    if not sample_size:  # no mean: no blocks, as an agent whose rollouts all failed has none
        return {}
    return {"stderr": stderr, "ci95": ci95, "sample_size": sample_size}


def _bounded(key: str, estimate: Estimate, means: Means) -> Estimate:
    """`estimate` with Wilson's interval where the figure lies in [0, 1]: pass@k always, mean@K
    where the rewards do, a field where each of its values did."""
    if key.startswith("pass@") or means.within_unit("reward" if key.startswith("mean@") else key):
        return within_unit(estimate)
    return estimate


def _agent_figures(means: Means, estimates: dict[str, Estimate]) -> dict[str, Any]:
    """An agent's part of the summary's `agents`: its counts, means, error bars, usage and costs."""
    figures: dict[str, Any] = {"succeeded": means.succeeded, "failed": means.failed, "masked": means.masked}
    figures |= means.means()
    if means.component_sums:
        figures[REWARD_COMPONENTS] = means.components()
    figures |= error_blocks(figures, estimates, means)
    figures["usage"] = means.usage()
    costs = means.costs.figures()
    if costs is not None:
        figures["per_rollout"] = costs
    return figures
