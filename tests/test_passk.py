"""passk.py: per-task statistics."""

from __future__ import annotations

from typing import Any

import pytest


def test_a_tasks_mean_reward_stays_finite_near_the_float_limit():
    from rollfilter.passk import TaskStats

    records: list[dict[str, Any]] = []
    tasks = TaskStats(2, 1.0, records.append)
    for reward in (1e308, 1e308, 1.0, 0.0):
        tasks.rollout_ended(0 if reward > 1 else 1, reward)
    tasks.finish()
    assert [r["mean_reward"] for r in records] == [1e308, 0.5]
    assert tasks.summary_fields()["mean@2"] == pytest.approx(5e307)


def test_means_of_rewards_at_both_float_limits_stay_finite_and_right():
    from rollfilter.passk import TaskStats

    records: list[dict[str, Any]] = []
    tasks = TaskStats(2, 1.0, records.append)
    for task, reward in ((0, 1.7e308), (0, -1.7e308), (1, 1.7e308), (1, 1.7e308), (2, -1.7e308), (2, -1.7e308)):
        tasks.rollout_ended(task, reward)
    tasks.finish()
    assert [r["mean_reward"] for r in records] == [0.0, 1.7e308, -1.7e308]
    assert tasks.summary_fields()["mean@2"] == pytest.approx(0.0, abs=1e300)  # finite, between the means
    assert tasks.summary_fields()["pass@2"] == pytest.approx(2 / 3)
