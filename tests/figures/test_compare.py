"""compare.py: two runs paired by task, checked against known truth."""

from __future__ import annotations

import math
import random

import pytest

from rollfilter.figures.compare import compare_runs
from rollfilter.figures.stats import estimate_of, t_two_sided

TASKS = 250
REPETITIONS = 200
SHIFT = 0.04
TASK_SPREAD = 0.25  # how far tasks' difficulties differ: both runs share it
RUN_SPREAD = 0.1  # how far a run's figure on a task strays from the task's difficulty


def two_runs(rng: random.Random, shift: float) -> tuple[list[dict], list[dict]]:
    """A baseline and a run on the same tasks: the run is the baseline plus `shift`, plus noise."""
    baseline, run = [], []
    for task in range(TASKS):
        difficulty = rng.gauss(0.5, TASK_SPREAD)
        baseline.append({"_ng_task_index": task, "reward": rng.gauss(difficulty, RUN_SPREAD)})
        run.append({"_ng_task_index": task, "reward": rng.gauss(difficulty + shift, RUN_SPREAD)})
    return baseline, run


def unpaired_p_value(baseline: list[dict], run: list[dict]) -> float:
    """Welch's test of the two runs' means, as if they had no tasks in common."""
    before = estimate_of(r["reward"] for r in baseline)
    after = estimate_of(r["reward"] for r in run)
    assert before.stderr is not None
    assert after.stderr is not None
    stderr = math.hypot(before.stderr, after.stderr)
    return t_two_sided((after.mean - before.mean) / stderr, 2 * TASKS - 2)


def detections(shift: float, seed: int) -> tuple[int, int]:
    rng = random.Random(seed)
    paired = unpaired = 0
    for _ in range(REPETITIONS):
        baseline, run = two_runs(rng, shift)
        compared = compare_runs(baseline, run)["compare"]["reward"]
        assert compared["tasks"] == TASKS
        paired += compared["p_value"] < 0.05
        unpaired += unpaired_p_value(baseline, run) < 0.05
    return paired, unpaired


def test_a_small_shift_is_detected_paired_and_mostly_missed_unpaired():
    paired, unpaired = detections(SHIFT, seed=44)
    assert paired >= 0.9 * REPETITIONS
    assert unpaired <= 0.6 * REPETITIONS  # the same data, without the pairing: far fewer


def test_with_no_shift_about_one_comparison_in_twenty_is_significant():
    paired, _ = detections(0.0, seed=45)
    assert 0.03 * REPETITIONS <= paired <= 0.07 * REPETITIONS


def test_tasks_in_one_run_only_are_counted_and_left_out():
    baseline = [{"_ng_task_index": t, "_ng_rollout_index": 0, "reward": 0.5} for t in range(4)]
    run = [{"_ng_task_index": t, "_ng_rollout_index": k, "reward": 0.75} for t in range(2, 7) for k in range(2)]
    run.append({"_ng_task_index": 8, "error": {"kind": "timeout", "message": "slow"}})  # a failure: no result
    run.append({"reward": 1.0})  # nothing to pair it by
    compared = compare_runs(baseline, run)
    assert compared["tasks"] == {"paired": 2, "only_in_baseline": 2, "only_in_this_run": 3, "results_without_task": 1}
    reward = compared["compare"]["reward"]
    assert (reward["difference"], reward["improved"], reward["worsened"], reward["tied"]) == (0.25, 2, 0, 0)
    assert reward["p_value"] == 0.0  # every task moved by the same amount
    assert (reward["stderr"], reward["ci95"]) == (0.0, [0.25, 0.25])


@pytest.mark.parametrize(("baseline_task", "task"), [(0, 1), (1, 0)])
def test_runs_with_no_task_in_common_have_no_difference_and_no_test(baseline_task: int, task: int):
    compared = compare_runs(
        [{"_ng_task_index": baseline_task, "reward": 1.0}], [{"_ng_task_index": task, "reward": 0.0}]
    )
    assert compared["tasks"] == {"paired": 0, "only_in_baseline": 1, "only_in_this_run": 1, "results_without_task": 0}
    reward = compared["compare"]["reward"]
    assert (reward["difference"], reward["ci95"], reward["p_value"], reward["test"], reward["tasks"]) == (
        None,
        None,
        None,
        None,
        0,
    )


def test_tasks_are_paired_by_content_without_an_index_and_0_1_rewards_take_the_sign_test():
    rows = [{"responses_create_params": {"input": f"question {i}"}} for i in range(12)]
    baseline = [dict(row, reward=0) for row in rows]
    run = [b'{"responses_create_params":{"input":"question %d"},"reward":%d}' % (i, i < 10) for i in range(12)]
    reward = compare_runs(baseline, run)["compare"]["reward"]
    assert (reward["test"], reward["improved"], reward["tied"], reward["tasks"]) == ("sign", 10, 2, 12)
    assert reward["p_value"] == pytest.approx(2 * 0.5**10, rel=0.05)
    with pytest.raises(ValueError, match="not JSON"):
        compare_runs(["{"], [])
