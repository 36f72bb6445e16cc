"""passk.py: per-task statistics."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import invoke
from tests.engine.test_metrics import summary_alone


def test_a_tasks_mean_reward_stays_finite_near_the_float_limit():
    from rollfilter.figures.passk import TaskStats

    records: list[dict[str, Any]] = []
    tasks = TaskStats(2, 1.0, records.append)
    for reward in (1e308, 1e308, 1.0, 0.0):
        tasks.rollout_ended(0 if reward > 1 else 1, reward)
    tasks.finish()
    assert [r["mean_reward"] for r in records] == [1e308, 0.5]
    assert tasks.summary_fields()["mean@2"] == pytest.approx(5e307)


def test_means_of_rewards_at_both_float_limits_stay_finite_and_right():
    from rollfilter.figures.passk import TaskStats

    records: list[dict[str, Any]] = []
    tasks = TaskStats(2, 1.0, records.append)
    for task, reward in ((0, 1.7e308), (0, -1.7e308), (1, 1.7e308), (1, 1.7e308), (2, -1.7e308), (2, -1.7e308)):
        tasks.rollout_ended(task, reward)
    tasks.finish()
    assert [r["mean_reward"] for r in records] == [0.0, 1.7e308, -1.7e308]
    assert tasks.summary_fields()["mean@2"] == pytest.approx(0.0, abs=1e300)  # finite, between the means
    assert tasks.summary_fields()["pass@2"] == pytest.approx(2 / 3)


def test_the_pass_histogram_counts_finished_tasks_by_their_correct_rollouts():
    from rollfilter.figures.passk import TaskStats

    tasks = TaskStats(3, 0.5)
    rewards = {0: [1.0, 1.0, 1.0], 1: [0.0, 0.7, None], 2: [0.0, 0.0, 0.0], 3: [0.5, 0.0, 0.2]}
    for task, values in rewards.items():
        tasks.planned(task, 3)
        for rollout, value in enumerate(values):
            tasks.rollout_ended(task, value, rollout)
    tasks.planned(4, 3)  # unfinished: one of three ended
    tasks.rollout_ended(4, 1.0, 0)
    tasks.planned(5, 3)  # a task met again: two groups, three correct and two
    tasks.planned(5, 3)
    for rollout, value in reversed(list(enumerate((1.0, 1.0, 1.0, 1.0, 0.0, 1.0)))):
        tasks.rollout_ended(5, value, rollout)
    tasks.planned(6, 3)  # met again, its second line unfinished: its first group counts
    tasks.planned(6, 3)
    for rollout, value in enumerate((0.0, 0.0, 0.0, 1.0)):
        tasks.rollout_ended(6, value, rollout)
    tasks.planned(7, 3)  # a failed rollout: incomplete, so in no bin, not even the uniform ones
    for rollout, value in enumerate((0.0, None, 0.0)):
        tasks.rollout_ended(7, value, rollout)
    tasks.planned(8, 3)  # met again, a rollout of its second group failed: its first group counts
    tasks.planned(8, 3)
    for rollout, value in enumerate((1.0, 1.0, 1.0, 1.0, None, 1.0)):
        tasks.rollout_ended(8, value, rollout)
    # K + 1 bins whatever the input: its ends are the groups --drop-uniform drops (binary rewards).
    assert tasks.summary_fields()["pass_histogram"] == [2, 1, 1, 3]
    assert tasks.figures()["tasks_unfinished"] == 2


def test_the_pass_histogram_has_k_plus_1_bins_whichever_groups_ended():
    from rollfilter.figures.passk import TaskStats

    assert TaskStats(4, 1.0).summary_fields()["pass_histogram"] == [0] * 5  # no group ended
    tasks = TaskStats(4, 1.0)
    for task in range(3):  # one rollout masked in each: groups of three measured
        tasks.planned(task, 4)
        for rollout in range(4):
            tasks.rollout_ended(task, 1.0, rollout, {"reward": 1.0}, masked=rollout == 0)
    assert tasks.summary_fields()["pass_histogram"] == [0, 0, 0, 3, 0]


def test_a_k_too_large_for_a_line_ends_the_histogram_at_the_most_correct_rollouts_seen():
    from rollfilter.figures.passk import HISTOGRAM_MAX_K, TaskStats

    assert TaskStats(HISTOGRAM_MAX_K, 1.0).summary_fields()["pass_histogram"] == [0] * (HISTOGRAM_MAX_K + 1)
    tasks = TaskStats(2**32 - 1, 1.0)  # -r's largest: no list of K+1 bins is made
    tasks.rollout_ended(0, 1.0, 0, {"reward": 1.0})
    assert tasks.summary_fields()["pass_histogram"] == [0, 1]  # unplanned: a group of its one rollout


def test_results_counted_without_a_plan_reach_the_groups_their_rollout_indices_say():
    from rollfilter.figures.passk import TaskStats

    tasks = TaskStats(8, 1.0)
    for rollout in range(4):  # four rollouts of eight: unfinished, and in no bin
        tasks.reached(0, rollout, 8)
        tasks.rollout_ended(0, 1.0, rollout)
    for rollout in (0, 1, 2, 3, 4, 5, 6, 7, 9):  # a second group of eight, begun
        tasks.reached(1, rollout, 8)
        tasks.rollout_ended(1, 1.0, rollout)
    for rollout in range(8):
        tasks.reached(2, rollout, 8)
        tasks.rollout_ended(2, 0.0, rollout)
    assert tasks.figures()["tasks_unfinished"] == 2
    assert tasks.summary_fields()["pass_histogram"] == [1, 0, 0, 0, 0, 0, 0, 0, 1]


def test_masked_rollouts_are_in_no_task_figure_but_end_the_task():
    from rollfilter.figures.passk import TaskStats

    records: list[dict] = []
    tasks = TaskStats(4, 1.0, records.append)
    for task, ended in {0: [(1.0, False), (0.0, True), (0.0, True), (0.0, False)], 1: [(0.0, True)] * 4}.items():
        tasks.planned(task, 4)
        for rollout, (reward, masked) in enumerate(ended):
            tasks.rollout_ended(task, reward, rollout, {"reward": reward}, masked=masked)
    fields = tasks.summary_fields()
    assert [(r["n"], r["masked"], r["mean_reward"]) for r in records] == [(2, 2, 0.5), (0, 4, None)]
    assert fields["mean@4"] == 0.5
    assert (fields["pass@1"], fields["pass@2"], fields["pass@4"]) == (0.5, 1.0, None)
    # Task 0 is a group of its 2 measured rollouts, 1 correct; task 1 measured none: in no bucket.
    # The bins are K+1 all the same: a count of correct rollouts among a task's K.
    assert fields["pass_histogram"] == [0, 1, 0, 0, 0]
    assert tasks.figures()["tasks_unfinished"] == 0
    estimates = tasks.estimates()  # the error bars are over the measured rollouts alone
    assert (estimates["reward"].tasks, estimates["reward"].rollouts) == (1, 2)
    assert (estimates["mean@4"].rollouts, estimates["pass@1"].rollouts, estimates["pass@2"].rollouts) == (2, 2, 2)


def test_each_agents_error_is_clustered_over_its_own_tasks():
    from rollfilter.engine.metrics import Metrics
    from rollfilter.figures.passk import TaskStats

    tasks, metrics = TaskStats(2, 1.0), Metrics()
    rewards = {0: ("a", [1.0, 1.0]), 1: ("a", [0.0, 0.0]), 2: ("a", [1.0, 0.0]), 3: ("b", [0.5, 0.5])}
    for task, (agent, values) in rewards.items():
        for value in values:
            tasks.rollout_ended(task, value, result={"reward": value}, agent=agent)
            metrics.add_result({"reward": value}, 0.1, agent)
    a = tasks.estimates("a", by_agent=True)["reward"]
    assert (a.mean, a.tasks, a.rollouts) == (0.5, 3, 6)
    assert a.stderr == pytest.approx(0.5 / 3**0.5)  # the spread of the tasks' means 1, 0 and 0.5
    assert tasks.estimates("b", by_agent=True)["reward"].stderr is None  # one task
    summary = summary_alone(metrics, tasks=tasks)
    assert summary["agents"]["a"]["sample_size"] == {"reward": {"tasks": 3, "rollouts": 6}}
    assert summary["sample_size"]["reward"] == {"tasks": 4, "rollouts": 8}
    assert summary["agents"]["a"]["stderr"] == {"reward": 0.29}


def test_each_reward_component_gets_error_bars_clustered_by_task():
    from rollfilter.engine.metrics import Metrics
    from rollfilter.figures.passk import TaskStats

    tasks, metrics = TaskStats(2, 1.0), Metrics()
    accuracy = {0: [1.0, 1.0], 1: [0.0, 0.0], 2: [1.0, 0.0]}  # task means 1, 0 and 0.5
    for task, values in accuracy.items():
        for value in values:
            result = {"reward": 1.0, "reward_components": {"accuracy": value, "style": True}}
            tasks.rollout_ended(task, 1.0, result=result)
            metrics.add_result(result, 0.1)
    summary = summary_alone(metrics, tasks=tasks)
    assert summary["reward_components"] == {"accuracy": 0.5, "style": 1.0}
    assert summary["sample_size"]["reward_components"]["accuracy"] == {"tasks": 3, "rollouts": 6}
    assert summary["stderr"]["reward_components"]["accuracy"] == 0.29  # 0.5 / sqrt(3): over tasks
    assert summary["stderr"]["reward_components"]["style"] == 0.0
    # Without repeats, each rollout is its own task: the same values, an error over six.
    plain = Metrics()
    for values in accuracy.values():
        for value in values:
            plain.add_result({"reward": 1.0, "reward_components": {"accuracy": value}}, 0.1)
    alone = summary_alone(plain)
    assert alone["sample_size"]["reward_components"]["accuracy"] == {"tasks": 6, "rollouts": 6}
    assert alone["stderr"]["reward_components"]["accuracy"] == 0.22  # sqrt(0.3 / 6)
    low, high = alone["ci95"]["reward_components"]["accuracy"]
    assert low < 0.5 < high


def test_means_are_compensated_sums_whatever_the_order():
    from rollfilter.figures.means import Means
    from rollfilter.figures.stats import ClusteredMean

    means, clustered = Means(), ClusteredMean()
    for value in (1e16, 1.0, -1e16):  # a plain float sum loses the 1.0
        means.add({"reward": value})
        clustered.add_value(value)
    assert means.mean("reward") == clustered.mean() == 1 / 3


@pytest.mark.parametrize("rollout", [1 << 40, 1 << 70])
def test_a_rollout_index_past_32_bits_leaves_its_task_unfinished(tmp_path, rollout: int):
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps({"reward": 1.0, "_ng_task_index": 0, "_ng_rollout_index": rollout}) + "\n")
    summarized = invoke(["--summarize", "-r", "2", str(path)])
    assert summarized.returncode == 0, summarized.stderr
    assert json.loads(summarized.stdout)["rollfilter"]["tasks_unfinished"] == 1
