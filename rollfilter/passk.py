"""Per-task figures for repeated rollouts: mean@K and the unbiased pass@k estimator.

Named for what it computes: a row's "task" here is NeMo Gym's task (its rows share a task index),
not a trio task.
"""

from __future__ import annotations

import collections
import itertools
import math
from array import array
from collections.abc import Callable
from typing import Any

from rollfilter.sums import running_mean


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


# A task's counts, one array each (4 bytes a count, 8 for the mean): planned rollouts, ended,
# failed, correct (reward at or over the threshold), rewarded, the rollouts of its first line (its
# group's size), and the mean of the rewards.
_COUNTS = ("planned", "ended", "failed", "correct", "rewarded", "size")
_DENSE_GAP = 1 << 16  # a numbered task at most this far past the last one extends the arrays


class TaskStats:
    """mean@K and pass@k over tasks, grouped by NeMo Gym's `_ng_task_index`, as its reward
    profiler groups them: a line seen twice is one task, and its rollouts are counted together.

    A later line may add rollouts to any task, so each task's counts are kept until `finish()`
    (about 32 bytes a task, in flat arrays for tasks numbered 0, 1, 2, ...). `finish()` computes
    the figures and gives `on_task(record)` one dict a task, in task order (for --per-task).

    The pass histogram counts groups, as `--drop-uniform` judges them: a line's rollouts (a task's
    rollout index over its first line's count tells which). A task met on one line, the common
    case, is one group; the later groups of a task met again are counted apart, in a dict.
    """

    def __init__(self, repeats: int, threshold: float, on_task: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.repeats = repeats
        self.threshold = threshold
        self.ks = ks_for(repeats)
        self._on_task = on_task
        self._counts = {name: array("I") for name in _COUNTS}
        self._reward_means = array("d")
        self._numbered = 0  # tasks 0 .. _numbered-1 have the slot of their own index
        self._others: dict[Any, int] = {}  # any other task -> its slot, after the numbered ones
        self._other_keys: list[Any] = []
        # slot -> group past the first -> [ended, correct, failed]
        self._later_groups: dict[int, dict[int, list[int]]] = {}
        self._finished: dict[str, Any] | None = None

    def _slot(self, task: Any) -> int:
        if type(task) is int and 0 <= task < self._numbered:
            return task
        if type(task) is int and not self._others and self._numbered <= task <= self._numbered + _DENSE_GAP:
            self._grow(task + 1 - self._numbered)
            self._numbered = task + 1
            return task
        key = _key(task)
        slot = self._others.get(key)
        if slot is None:
            slot = self._others[key] = len(self._reward_means)
            self._other_keys.append(task)
            self._grow(1)
        return slot

    def _grow(self, count: int) -> None:
        for values in self._counts.values():
            values.frombytes(bytes(values.itemsize * count))
        self._reward_means.frombytes(bytes(self._reward_means.itemsize * count))

    def planned(self, task: Any, count: int) -> None:
        """`count` more rollouts of `task` belong to the run (a task with fewer ended is unfinished):
        a line's, its group."""
        slot = self._slot(task)
        self._counts["planned"][slot] += count
        if not self._counts["size"][slot]:
            self._counts["size"][slot] = count

    def rollout_ended(self, task: Any, reward: float | None, rollout: Any = None) -> None:
        """Count one rollout of `task`, its rollout index `rollout` (None: it failed, and counts as
        not correct)."""
        slot = self._slot(task)
        counts = self._counts
        counts["ended"][slot] += 1
        correct = reward is not None and reward >= self.threshold
        if type(rollout) is int and rollout >= (size := counts["size"][slot] or self.repeats):
            group = self._later_groups.setdefault(slot, {}).setdefault(rollout // size, [0, 0, 0])
            group[0] += 1
            group[1] += correct
            group[2] += reward is None
        if reward is None:
            counts["failed"][slot] += 1
            return
        rewarded = counts["rewarded"][slot] = counts["rewarded"][slot] + 1
        self._reward_means[slot] = running_mean(self._reward_means[slot], reward, rewarded)
        if correct:
            counts["correct"][slot] += 1

    def _add_groups(self, histogram: collections.Counter[tuple[int, int]], slot: int) -> None:
        """Count the task's groups whose rollouts all ended well, each by its size and its correct
        rollouts. A group with a failed rollout is left out: --drop-uniform calls it incomplete,
        never uniform, and the histogram's ends are the groups it drops."""
        counts = self._counts
        planned, size = counts["planned"][slot], counts["size"][slot] or self.repeats
        later = self._later_groups.get(slot, {})
        first = [counts["ended"][slot], counts["correct"][slot], counts["failed"][slot]]
        for group in later.values():
            first = [first_count - count for first_count, count in zip(first, group, strict=True)]
        for ended, correct, failed in (first, *later.values()):
            if ended and not failed and (not planned or ended >= min(size, planned)):  # every rollout of it ended
                histogram[ended, correct] += 1

    def finish(self) -> None:
        """Compute the figures over every task, and report each task; later calls do nothing."""
        if self._finished is not None:
            return
        counts = self._counts
        tasks = with_failures = unfinished = 0
        mean_of_means = 0.0
        means = 0
        pass_means = dict.fromkeys(self.ks, 0.0)
        pass_counts = dict.fromkeys(self.ks, 0)
        groups: collections.Counter[tuple[int, int]] = collections.Counter()  # finished ones, by size and correct
        slots = itertools.chain(range(self._numbered), (self._others[_key(task)] for task in self._other_keys))
        names = itertools.chain(range(self._numbered), self._other_keys)
        for slot, task in zip(slots, names, strict=True):
            ended, planned = counts["ended"][slot], counts["planned"][slot]
            if not ended and not planned:
                continue
            tasks += 1
            failed, rewarded = counts["failed"][slot], counts["rewarded"][slot]
            with_failures += failed > 0
            unfinished += ended < planned
            self._add_groups(groups, slot)
            mean = self._reward_means[slot] if rewarded else None
            if mean is not None:
                means += 1
                mean_of_means = running_mean(mean_of_means, mean, means)
            record: dict[str, Any] = {"_ng_task_index": task, "n": ended, "failed": failed, "mean_reward": mean}
            for k in self.ks:
                if k <= ended:
                    value = pass_at_k(ended, counts["correct"][slot], k)
                    pass_counts[k] += 1
                    pass_means[k] = running_mean(pass_means[k], value, pass_counts[k])
                    record[f"pass@{k}"] = value
            if self._on_task is not None and ended:
                self._on_task(record)
        fields: dict[str, Any] = {f"mean@{self.repeats}": mean_of_means if means else None}
        for k in self.ks:
            fields[f"pass@{k}"] = pass_means[k] if pass_counts[k] else None
        fields["pass_histogram"] = _histogram(groups)
        self._finished = {
            "fields": fields,
            "figures": {
                "tasks": tasks,
                "tasks_with_failed_rollouts": with_failures,
                "tasks_unfinished": unfinished,
                "pass_threshold": self.threshold,
            },
        }

    def summary_fields(self) -> dict[str, Any]:
        """mean@K, pass@k for each k (null when no task had k rollouts to judge), and
        `pass_histogram`: of the groups (a line's rollouts) whose rollouts all ended well, how many had
        0, 1, ..., K rollouts at or over the threshold (K: the largest of those groups, -r's K
        once a group of K has ended)."""
        self.finish()
        assert self._finished is not None
        return dict(self._finished["fields"])

    def figures(self) -> dict[str, Any]:
        self.finish()
        assert self._finished is not None
        return dict(self._finished["figures"])


def _histogram(groups: collections.Counter[tuple[int, int]]) -> list[int]:
    """Groups by their correct rollouts, 0 to the largest group's size; a smaller group (of an
    agent given fewer repeats) that is all correct is at its size, not at the end."""
    histogram = [0] * (max((size for size, _ in groups), default=-1) + 1)
    for (_, correct), count in groups.items():
        histogram[correct] += count
    return histogram


def _key(task: Any) -> Any:
    return task if isinstance(task, (int, str)) else repr(task)
