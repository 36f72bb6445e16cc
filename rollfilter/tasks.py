"""Per-task figures for repeated rollouts: mean@K and the unbiased pass@k estimator.

A task's state lives only until its last rollout of the run has ended, so memory is
bounded by the tasks in flight, not by the input.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def pass_at_k(n: int, c: int, k: int) -> float:
    """1 - C(n-c, k) / C(n, k): the chance that k of n rollouts, c of them correct, hold a correct one."""
    if k > n:
        raise ValueError(f"k={k} is more than the n={n} rollouts")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(repeats: int) -> list[int]:
    """k = 1, 2, 4, ... up to K, and K itself."""
    ks = [1 << i for i in range(repeats.bit_length()) if 1 << i <= repeats]
    return ks if ks[-1] == repeats else [*ks, repeats]


class _Task:
    __slots__ = ("correct", "ended", "expected", "failed", "reward_sum", "rewarded")

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.ended = 0
        self.failed = 0
        self.correct = 0
        self.rewarded = 0
        self.reward_sum = 0.0


class TaskStats:
    """Aggregates finished tasks into mean@K and pass@k, optionally reporting each task.

    `on_task(record)` receives one dict per finished task (for --per-task).
    """

    def __init__(self, repeats: int, threshold: float, on_task: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.repeats = repeats
        self.threshold = threshold
        self.ks = ks_for(repeats)
        self._on_task = on_task
        self._open: dict[Any, _Task] = {}
        self.tasks = 0
        self.tasks_with_failures = 0
        self._pass_sums = dict.fromkeys(self.ks, 0.0)
        self._pass_counts = dict.fromkeys(self.ks, 0)
        self._mean_sum = 0.0
        self._mean_count = 0

    def rollout_ended(self, task: Any, expected: int, reward: float | None) -> None:
        """Count one rollout of `task` (None: it failed); `expected` rollouts of it run in all."""
        key = task if isinstance(task, (int, str)) else repr(task)
        state = self._open.get(key)
        if state is None:
            state = self._open[key] = _Task(expected)
        state.ended += 1
        if reward is None:
            state.failed += 1
        else:
            state.rewarded += 1
            state.reward_sum += reward
            if reward >= self.threshold:
                state.correct += 1
        if state.ended >= state.expected:
            del self._open[key]
            self._finish(task, state)

    def _finish(self, task: Any, state: _Task) -> None:
        self.tasks += 1
        if state.failed:
            self.tasks_with_failures += 1
        mean = state.reward_sum / state.rewarded if state.rewarded else None
        if mean is not None:
            self._mean_sum += mean
            self._mean_count += 1
        record: dict[str, Any] = {"_ng_task_index": task, "n": state.ended, "failed": state.failed, "mean_reward": mean}
        for k in self.ks:
            if k <= state.ended:
                value = pass_at_k(state.ended, state.correct, k)
                self._pass_sums[k] += value
                self._pass_counts[k] += 1
                record[f"pass@{k}"] = value
        if self._on_task is not None:
            self._on_task(record)

    def flush_open(self) -> None:
        """Finish the tasks whose rollouts did not all end (a recompute over partial files)."""
        for key, state in list(self._open.items()):
            del self._open[key]
            self._finish(key, state)

    @property
    def unfinished(self) -> int:
        return len(self._open)

    def summary_fields(self) -> dict[str, Any]:
        """mean@K, and pass@k for each k; null when no finished task had k rollouts to judge."""
        fields: dict[str, Any] = {
            f"mean@{self.repeats}": self._mean_sum / self._mean_count if self._mean_count else None
        }
        for k in self.ks:
            fields[f"pass@{k}"] = self._pass_sums[k] / self._pass_counts[k] if self._pass_counts[k] else None
        return fields

    def figures(self) -> dict[str, Any]:
        return {
            "tasks": self.tasks,
            "tasks_with_failed_rollouts": self.tasks_with_failures,
            "tasks_unfinished": self.unfinished,
            "pass_threshold": self.threshold,
        }
