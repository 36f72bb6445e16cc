"""figures/means.py: the results' running figures."""

from __future__ import annotations

from rollfilter.figures.means import RewardByVersion


def test_the_reward_mean_of_each_policy_version_is_by_the_version_a_rollout_was_sent_under():
    by_version = RewardByVersion("_rf_policy_version")
    for sent, ended, reward in ((1, 2, 1.0), (1, 1, 0.0), (2, 2, 0.5), (3, 3, None)):
        by_version.add({"reward": reward, "_rf_policy_version": {"sent": sent, "ended": ended}})
    by_version.add({"reward": 1.0})  # no stamp
    by_version.add({"reward": 1.0, "mask_sample": True, "_rf_policy_version": {"sent": 2, "ended": 2}})
    by_version.add({"reward": 1.0, "_rf_policy_version": {"sent": True, "ended": 2}})
    assert by_version.means() == {1: 0.5, 2: 0.5, 3: 0.0}
