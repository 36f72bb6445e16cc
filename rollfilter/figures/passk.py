"""Per-task figures for repeated rollouts: mean@K and the unbiased pass@k estimator.

Named for what it computes: a row's "task" here is NeMo Gym's task (its rows share a task index),
not a trio task.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from array import array
from collections.abc import Callable, Iterator
from typing import Any

from rollfilter.figures.stats import ClusteredMean, Estimate
from rollfilter.figures.sums import running_mean
from rollfilter.rows import MASK_SAMPLE, REWARD_COMPONENTS, component_key


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
# failed, masked (ended, but no valid measurement), correct (reward at or over the threshold),
# rewarded, the rollouts of its first line (its group's size), unhealthy (failed a health check,
# `rollfilter.figures.health`), and the mean of the rewards.
_COUNTS = ("planned", "ended", "failed", "masked", "correct", "rewarded", "size", "unhealthy")
# A histogram of K+1 bins is a line of the summary: past this K (a run of thousands of rollouts a
# task, or -r given as a bound no task reaches), it ends at the most correct rollouts a group had.
HISTOGRAM_MAX_K = 1024
_MOST_PLANNED = (1 << 32) - 1  # what a count's array ("I") holds
_DENSE_GAP = 1 << 16  # a numbered task at most this far past the last one extends the arrays


class TaskStats:
    """mean@K and pass@k over tasks, grouped by NeMo Gym's `_ng_task_index`, as its reward
    profiler groups them: a line seen twice is one task, and its rollouts are counted together.

    A later line may add rollouts to any task, so each task's counts are kept until `finish()`
    (about 40 bytes a task and 12 more for each numeric result field, in flat arrays for tasks
    numbered 0, 1, 2, ...). `finish()` computes
    the figures and gives `on_task(record)` one dict a task, in task order (for --per-task).

    The pass histogram counts groups, as `--drop-uniform` judges them: a line's rollouts (a task's
    rollout index over its first line's count tells which). A task met on one line, the common
    case, is one group; the later groups of a task met again are counted apart, in a dict.
    """

    def __init__(
        self,
        repeats: int,
        threshold: float,
        on_task: Callable[[dict[str, Any]], None] | None = None,
        *,
        clusters_only: bool = False,
    ) -> None:
        self.repeats = repeats
        # Only the tasks for the error bars: no mean@K, pass@k or histogram (no K was given).
        self.clusters_only = clusters_only
        self.threshold = threshold
        self.ks = ks_for(repeats)
        self._on_task = on_task
        self._counts = {name: array("I") for name in _COUNTS}
        self._reward_means = array("d")
        # Each numeric result field's sum in each task, and its rollouts, for error bars clustered
        # by task; and the agent of each task's last rollout (an index into _agent_names). A sum
        # past the float range makes that field's error unknown, not its mean (`metrics.Means`).
        self._field_sums: dict[str, array[float]] = {}
        self._field_counts: dict[str, array[int]] = {}
        self._agents = array("I")
        self._agent_ids: dict[str | None, int] = {None: 0}
        self._agent_names: list[str | None] = [None]
        self._estimates: dict[str, Estimate] = {}
        self._agent_estimates: dict[str | None, dict[str, Estimate]] | None = None
        self._numbered = 0  # tasks 0 .. _numbered-1 have the slot of their own index
        self._others: dict[Any, int] = {}  # any other task -> its slot, after the numbered ones
        self._other_keys: list[Any] = []
        # slot -> group past the first -> [ended, correct, failed, masked]
        self._later_groups: dict[int, dict[int, list[int]]] = {}
        self._finished: dict[str, Any] | None = None
        self.all_unhealthy = 0  # tasks all of whose rollouts ended so far were unhealthy

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
        grown: list[array[Any]] = [*self._counts.values(), self._reward_means, self._agents]
        for values in (*grown, *self._field_sums.values(), *self._field_counts.values()):
            values.frombytes(bytes(values.itemsize * count))

    def planned(self, task: Any, count: int) -> None:
        """`count` more rollouts of `task` belong to the run (a task with fewer ended is unfinished):
        a line's, its group."""
        slot = self._slot(task)
        self._counts["planned"][slot] += count
        if not self._counts["size"][slot]:
            self._counts["size"][slot] = count

    def reached(self, task: Any, rollout: Any, size: int) -> None:
        """Where no plan says how many rollouts `task` has (results counted from files): it has at
        least the groups of `size` its rollout index `rollout` reaches (a task with fewer ended is
        unfinished). Call it before the rollout's `rollout_ended`."""
        slot = self._slot(task)
        counts = self._counts
        if not counts["size"][slot]:
            counts["size"][slot] = size
        size = counts["size"][slot]
        groups = rollout // size + 1 if type(rollout) is int and rollout >= 0 else 1
        # A rollout index past any plan still makes the task unfinished, within what the array holds.
        counts["planned"][slot] = min(max(counts["planned"][slot], groups * size), _MOST_PLANNED)

    def rollout_ended(
        self,
        task: Any,
        reward: float | None,
        rollout: Any = None,
        result: dict[str, Any] | None = None,
        agent: str | None = None,
        *,
        masked: bool = False,
        unhealthy: bool = False,
    ) -> None:
        """Count one rollout of `task`, its rollout index `rollout` (None: it failed, and counts as
        not correct); `result`'s numeric top-level fields go into the task's sums (the rollouts that
        count), by `agent`. A `masked` one has ended, but is in none of the task's figures: n, the
        sums and the error bars leave it out. An `unhealthy` one failed a health check."""
        slot = self._slot(task)
        counts = self._counts
        ended = counts["ended"][slot]
        counts["ended"][slot] = ended + 1
        if unhealthy:
            counts["unhealthy"][slot] += 1
            self.all_unhealthy += not ended  # its first rollout: all of it unhealthy, so far
        elif ended and counts["unhealthy"][slot] == ended:  # a healthy one in a task all unhealthy till now
            self.all_unhealthy -= 1
        correct = not masked and reward is not None and reward >= self.threshold
        if type(rollout) is int and rollout >= (size := counts["size"][slot] or self.repeats):
            group = self._later_groups.setdefault(slot, {}).setdefault(rollout // size, [0, 0, 0, 0])
            group[0] += 1
            group[1] += correct
            group[2] += reward is None and not masked
            group[3] += masked
        if masked:
            counts["masked"][slot] += 1
            return
        if reward is None:
            counts["failed"][slot] += 1
            return
        if result is not None:
            self._add_fields(slot, result, agent)
        rewarded = counts["rewarded"][slot] = counts["rewarded"][slot] + 1
        self._reward_means[slot] = running_mean(self._reward_means[slot], reward, rewarded)
        if correct:
            counts["correct"][slot] += 1

    def _add_fields(self, slot: int, result: dict[str, Any], agent: str | None) -> None:
        agent_id = self._agent_ids.get(agent)
        if agent_id is None:
            agent_id = self._agent_ids[agent] = len(self._agent_names)
            self._agent_names.append(agent)
        self._agents[slot] = agent_id
        for key, value in result.items():
            kind = type(value)  # _number(), written out for the common float
            if kind is float:
                if value - value != 0.0:  # inf or nan
                    continue
                number = value
            elif kind is bool:
                if key == MASK_SAMPLE:  # false on every rollout the sums cover
                    continue
                number = 1.0 if value else 0.0
            elif kind is int and not key.startswith("_ng_"):
                number = _number(value)
                if number is None:
                    continue
            else:
                continue
            if key.startswith("_ng_"):
                continue
            self._add_field(slot, key, number)
        components = result.get(REWARD_COMPONENTS)
        if type(components) is dict:
            for name, value in components.items():
                number = _number(value)
                if number is not None:
                    self._add_field(slot, component_key(name), number)

    def _add_field(self, slot: int, key: str, number: float) -> None:
        sums = self._field_sums.get(key)
        if sums is None:
            size = len(self._reward_means)
            sums = self._field_sums[key] = array("d", bytes(8 * size))
            self._field_counts[key] = array("I", bytes(4 * size))
        sums[slot] += number
        self._field_counts[key][slot] += 1

    def _add_groups(self, histogram: collections.Counter[tuple[int, int]], slot: int) -> None:
        """Count the task's groups whose rollouts all ended well, each by its size and its correct
        rollouts. A group with a failed rollout is left out: --drop-uniform calls it incomplete,
        never uniform, and the histogram's ends are the groups it drops. Masked rollouts are no
        trial: a group is as large as its others (and in no bucket with none)."""
        counts = self._counts
        planned, size = counts["planned"][slot], counts["size"][slot] or self.repeats
        later = self._later_groups.get(slot, {})
        first = [counts["ended"][slot], counts["correct"][slot], counts["failed"][slot], counts["masked"][slot]]
        for group in later.values():
            first = [first_count - count for first_count, count in zip(first, group, strict=True)]
        for ended, correct, failed, masked in (first, *later.values()):
            if ended > masked and not failed and (not planned or ended >= min(size, planned)):  # every one ended
                histogram[ended - masked, correct] += 1

    @property
    def finished(self) -> bool:
        """Whether the figures are computed (`finish`): no rollout counted after that is in them."""
        return self._finished is not None

    def finish(self) -> None:
        """Compute the figures over every task, and report each task; later calls do nothing."""
        if self._finished is not None:
            return
        counts = self._counts
        tasks = with_failures = unfinished = 0
        mean_of_means = 0.0  # a fallback for task means so large that their spread is past the float range
        # mean@K and pass@k weigh each task the same; the rollouts behind them are counted apart.
        task_means = ClusteredMean()
        passes = {k: ClusteredMean() for k in self.ks}
        rollouts = dict.fromkeys(["mean", *self.ks], 0)
        groups: collections.Counter[tuple[int, int]] = collections.Counter()  # finished ones, by size and correct
        for slot, task in self._slots():
            ended, planned = counts["ended"][slot], counts["planned"][slot]
            if not ended and not planned:
                continue
            tasks += 1
            failed, rewarded, masked = counts["failed"][slot], counts["rewarded"][slot], counts["masked"][slot]
            with_failures += failed > 0
            unfinished += ended < planned
            measured = ended - masked  # the n of pass@k: masked rollouts are no trial either way
            self._add_groups(groups, slot)
            mean = self._reward_means[slot] if rewarded else None
            if mean is not None:
                task_means.add_value(mean)
                rollouts["mean"] += rewarded
                mean_of_means = running_mean(mean_of_means, mean, task_means.tasks)
            record: dict[str, Any] = {"_ng_task_index": task, "n": measured, "failed": failed}
            record |= {"masked": masked, "mean_reward": mean}
            for k in self.ks:
                if k <= measured:
                    value = pass_at_k(measured, counts["correct"][slot], k)
                    passes[k].add_value(value)
                    rollouts[k] += measured
                    record[f"pass@{k}"] = value
            if self._on_task is not None and ended:
                self._on_task(record)
        estimates = {f"mean@{self.repeats}": _over_tasks(task_means, rollouts["mean"], mean_of_means)}
        estimates |= {f"pass@{k}": _over_tasks(passes[k], rollouts[k], 0.0) for k in self.ks}
        fields: dict[str, Any] = {key: None if e is None else e.mean for key, e in estimates.items()}
        fields["pass_histogram"] = _histogram(groups, self.repeats)
        self._estimates = self._field_estimates(by_agent=False)[None]
        self._estimates |= {key: e for key, e in estimates.items() if e is not None}
        self._finished = {
            "fields": fields,
            "figures": {
                "tasks": tasks,
                "tasks_with_failed_rollouts": with_failures,
                "tasks_unfinished": unfinished,
                "pass_threshold": self.threshold,
            },
        }

    def _slots(self) -> Iterator[tuple[int, Any]]:
        """Each task's slot and its name, in task order."""
        yield from zip(range(self._numbered), range(self._numbered), strict=True)
        for task in self._other_keys:
            yield self._others[_key(task)], task

    def _field_estimates(self, by_agent: bool) -> dict[str | None, dict[str, Estimate]]:
        """Each field's mean over rollouts with its error clustered by task: for the run (under
        None), or with `by_agent` for each agent by name (a task is its last rollout's agent's)."""
        found: dict[str | None, dict[str, Estimate]] = {name: {} for name in self._agent_names}
        for key, sums in self._field_sums.items():
            counts = self._field_counts[key]
            agents = [ClusteredMean() for _ in self._agent_names] if by_agent else [ClusteredMean()]
            for slot, _ in self._slots():
                count = counts[slot]
                if count:
                    agents[self._agents[slot] if by_agent else 0].add(sums[slot] / count, count)
            for name, clustered in zip(self._agent_names, agents, strict=False):
                if clustered.tasks:
                    found[name][key] = clustered.estimate()
        return found

    def estimates(self, agent: str | None = None, *, by_agent: bool = False) -> dict[str, Estimate]:
        """The run's means with their errors clustered by task (each field's, mean@K's and
        pass@k's); with `by_agent`, each field's over the tasks of `agent` alone."""
        self.finish()
        if not by_agent:
            return dict(self._estimates)
        if self._agent_estimates is None:  # made once asked for: most runs have one agent
            self._agent_estimates = self._field_estimates(by_agent=True)
        return dict(self._agent_estimates.get(agent, {}))

    def find(self, task: Any) -> int | None:
        """`task`'s slot, None for a task never met (nothing is added); a numbered task under the
        highest met has a slot of its own all the same, met or not."""
        if type(task) is int and 0 <= task < self._numbered:
            counts = self._counts
            return task if counts["ended"][task] or counts["planned"][task] else None
        return self._others.get(_key(task))

    def fields(self) -> list[str]:
        """The numeric result fields the tasks have means of, in the order first met."""
        return list(self._field_sums)

    def task_mean(self, slot: int, key: str) -> float | None:
        """The mean of field `key` over the rollouts of the task in `slot`; None when it has none."""
        counts = self._field_counts.get(key)
        return None if counts is None or not counts[slot] else self._field_sums[key][slot] / counts[slot]

    def tasks_with_results(self) -> Iterator[tuple[int, Any]]:
        """The slot and name of each task at least one rollout of which succeeded, in task order."""
        rewarded = self._counts["rewarded"]
        return ((slot, task) for slot, task in self._slots() if rewarded[slot])

    def summary_fields(self) -> dict[str, Any]:
        """mean@K, pass@k for each k (null when no task had k rollouts to judge), and
        `pass_histogram`: of the groups (a line's rollouts) whose rollouts all ended well, how many had
        0, 1, ..., K rollouts at or over the threshold: K+1 bins, whichever groups ended."""
        self.finish()
        assert self._finished is not None
        return {} if self.clusters_only else dict(self._finished["fields"])

    def figures(self) -> dict[str, Any]:
        """The tasks counted (and the pass threshold, unless `clusters_only`)."""
        self.finish()
        assert self._finished is not None
        figures = dict(self._finished["figures"])
        if self.clusters_only:
            del figures["pass_threshold"]
        return figures


def _over_tasks(clustered: ClusteredMean, rollouts: int, fallback: float) -> Estimate | None:
    """A mean over tasks (None with no task), with the rollouts behind it; `fallback` is the
    mean when the tasks' values are too far apart for a finite sum of their differences."""
    if not clustered.tasks:
        return None
    estimate = dataclasses.replace(clustered.estimate(), rollouts=rollouts)
    return estimate if math.isfinite(estimate.mean) else dataclasses.replace(estimate, mean=fallback)


def _number(value: Any) -> float | None:
    """A result field as a number for a task's mean: bool, int or finite float (as `metrics.as_float`)."""
    kind = type(value)
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is bool or (kind is int and -_FLOAT_RANGE < value < _FLOAT_RANGE):
        return float(value)
    return None


_FLOAT_RANGE = 2**1023


def _histogram(groups: collections.Counter[tuple[int, int]], repeats: int) -> list[int]:
    """Groups by their correct rollouts, 0 to K (`repeats`), whatever the groups' sizes: a group
    with masked rollouts, or of an agent given fewer repeats, that is all correct is at its count
    of correct rollouts, not at the end (a group of results without rollout indices may reach further)."""
    bins = max([repeats if repeats <= HISTOGRAM_MAX_K else 0, *(correct for _, correct in groups)]) + 1
    histogram = [0] * bins
    for (_, correct), count in groups.items():
        histogram[correct] += count
    return histogram


def _key(task: Any) -> Any:
    return task if isinstance(task, (int, str)) else repr(task)
