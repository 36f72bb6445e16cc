"""figures/means.py: the results' running figures."""

from __future__ import annotations

from rollfilter.figures.means import Means, RewardByVersion


def test_the_reward_mean_of_each_policy_version_is_by_the_version_a_rollout_was_sent_under():
    by_version = RewardByVersion("_rf_policy_version")
    for sent, ended, reward in ((1, 2, 1.0), (1, 1, 0.0), (2, 2, 0.5), (3, 3, None)):
        by_version.add({"reward": reward, "_rf_policy_version": {"sent": sent, "ended": ended}})
    by_version.add({"reward": 1.0})  # no stamp
    by_version.add({"reward": 1.0, "mask_sample": True, "_rf_policy_version": {"sent": 2, "ended": 2}})
    by_version.add({"reward": 1.0, "_rf_policy_version": {"sent": True, "ended": 2}})
    assert by_version.means() == {1: 0.5, 2: 0.5, 3: 0.0}


def test_a_field_with_a_value_outside_zero_to_one_is_told_apart_and_no_ng_field_has_a_mean():
    means = Means()
    means.add({"reward": 0.5, "score": 3, "accuracy": True, "_ng_task_index": 7, "_ng_weight": 0.5})
    means.add({"reward": 2.0, "score": 1, "accuracy": False, "_ng_task_index": 8, "_ng_weight": 9.0})
    means.add({"reward": 0.5, "score": 0, "accuracy": True, "_ng_task_index": 9, "_ng_weight": 0.5})
    assert means.within_unit("accuracy")
    assert not means.within_unit("reward")  # 2.0 after a first value inside
    assert not means.within_unit("score")  # 3 as the first value
    assert means.mean("reward") == 1.0
    assert means.mean("score") == 4 / 3
    assert sorted(means.sums) == ["accuracy", "reward", "score"]
