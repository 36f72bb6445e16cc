"""Two runs compared task by task: is this run better than the baseline, and by how much.

Each run's results are grouped by task: by `_ng_task_index`, or, for a result without one, by its
`responses_create_params` (the row's content, as NeMo Gym's numbering tells one task from
another). Each numeric field's mean is taken in every task, and for the tasks both runs have, the
difference is the mean over those tasks of (this run's task mean - the baseline's): every task
weighs the same, as in mean@K. Its standard error comes from the spread of the per-task
differences, so what the runs share, a task's difficulty, cancels out of it; that is why a paired
comparison sees a small change that two separate error bars hide. The p-value is a paired t-test
of the differences (`stats.PairedDifferences`); when every task's figure is 0 or 1 in both runs
(a rollout a task, a 0/1 reward), the exact sign test, which is McNemar's test there.

A task in one run only cannot be paired: it is counted, and left out. Memory is the two runs'
per-task means (`passk.TaskStats`), not their results.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

import msgspec

from rollfilter.figures.passk import TaskStats
from rollfilter.figures.stats import (
    ERROR_DIGITS,
    Difference,
    PairedDifferences,
    detectable,
    error_bars,
    shown_bound,
    shown_mean,
    significant,
)
from rollfilter.outcomes import failure_of
from rollfilter.rows import TASK_INDEX, is_masked

P_VALUE_DIGITS = 2
_encode = msgspec.json.Encoder().encode


@dataclasses.dataclass(frozen=True, slots=True)
class Comparison:
    """Each mean's `Difference`, over the `paired` tasks both runs have; the tasks of one run
    only, and the results neither run could place in a task (no index, no content), left out."""

    differences: dict[str, Difference]
    paired: int
    only_in_baseline: int
    only_in_run: int
    without_task: int

    def figures(self) -> dict[str, Any]:
        """The summary's `compare`: for each mean, the difference (this run minus the baseline),
        stderr, ci95, p_value, the test it came from, the smallest difference this many tasks
        detect (`detectable`: 80% power at 5%), improved, worsened, tied, and tasks."""
        return {key: _difference_figures(difference) for key, difference in self.differences.items()}

    def tasks(self) -> dict[str, int]:
        """The tasks compared and those left out."""
        return {
            "paired": self.paired,
            "only_in_baseline": self.only_in_baseline,
            "only_in_this_run": self.only_in_run,
            "results_without_task": self.without_task,
        }


def _difference_figures(difference: Difference) -> dict[str, Any]:
    estimate = difference.difference
    stderr, interval = error_bars(estimate)
    known = estimate.tasks > 0
    smallest = detectable(estimate)
    return {
        "difference": _shown_difference(estimate.mean, stderr) if known else None,
        "stderr": stderr,
        "ci95": interval,
        "p_value": significant(difference.p_value, P_VALUE_DIGITS) if math.isfinite(difference.p_value) else None,
        "test": difference.test,
        "detectable": None if smallest is None else significant(smallest, ERROR_DIGITS),
        "improved": difference.improved,
        "worsened": difference.worsened,
        "tied": difference.tied,
        "tasks": estimate.tasks,
    }


def _shown_difference(difference: float, stderr: float | None) -> float:
    """A difference to the place of its standard error's last shown digit, as its interval is."""
    return shown_mean(difference) if stderr is None else shown_bound(difference, stderr)


class RunComparison:
    """The results of a baseline run and of this run, fed one at a time (`add_baseline`, `add`),
    compared by `comparison()`. Failed attempts (error records) are no results and are left out;
    masked results (mask_sample: true) are in no task's mean."""

    def __init__(self) -> None:
        # Only the tasks' field means are used: one "repeat" and any threshold will do.
        self._baseline = TaskStats(1, 1.0)
        self._run = TaskStats(1, 1.0)
        self._without_task = 0

    def add_baseline(self, result: dict[str, Any]) -> None:
        self._add(self._baseline, result)

    def add(self, result: dict[str, Any]) -> None:
        self._add(self._run, result)

    def _add(self, tasks: TaskStats, result: dict[str, Any]) -> None:
        if failure_of(result) is not None:
            return
        task = task_of(result)
        if task is None:
            self._without_task += 1
            return
        tasks.rollout_ended(task, 0.0, result=result, masked=is_masked(result))  # a masked one: in no mean

    def comparison(self) -> Comparison:
        """Each numeric field both runs have (reward first), compared over the tasks they share."""
        baseline, run = self._baseline, self._run
        shared = [key for key in run.fields() if key in baseline.fields()]
        shared.sort(key=lambda key: key != "reward")
        pairs = {key: PairedDifferences() for key in shared}
        paired = only_in_run = 0
        for slot, task in run.tasks_with_results():
            other = baseline.find(task)
            if other is None:
                only_in_run += 1
                continue
            paired += 1
            for key, differences in pairs.items():
                before, after = baseline.task_mean(other, key), run.task_mean(slot, key)
                if before is not None and after is not None:
                    differences.add(before, after)
        in_baseline = sum(1 for _ in baseline.tasks_with_results())
        return Comparison(
            {key: differences.result() for key, differences in pairs.items()},
            paired,
            in_baseline - paired,
            only_in_run,
            self._without_task,
        )


def task_of(result: dict[str, Any]) -> Any:
    """The task a result belongs to: its `_ng_task_index`, else its row's content; None if neither."""
    task = result.get(TASK_INDEX)
    if task is not None:
        return task
    params = result.get("responses_create_params")
    return None if params is None else "content:" + _encode(params).decode()


def compare_runs(baseline: Iterable[Any], results: Iterable[Any]) -> dict[str, Any]:
    """Compare `results` (this run's) with `baseline`'s, task by task: each an iterable of results
    as dicts, or as JSON lines (str or bytes), as the runs wrote them; errors records' lines are
    left out. Returns `{"compare": {mean: {...}}, "tasks": {...}}` as `--summarize --compare`
    gives them (see `Comparison`). ValueError for an item that is not a JSON object."""
    comparison = RunComparison()
    for item in baseline:
        comparison.add_baseline(_result(item))
    for item in results:
        comparison.add(_result(item))
    compared = comparison.comparison()
    return {"compare": compared.figures(), "tasks": compared.tasks()}


def _result(item: Any) -> dict[str, Any]:
    if isinstance(item, (str, bytes)):
        try:
            item = msgspec.json.decode(item)
        except msgspec.DecodeError as exc:
            raise ValueError(f"a result that is not JSON: {exc}") from None
    if not isinstance(item, dict):
        raise ValueError(f"a result is a JSON object, not {type(item).__name__}")
    return item
