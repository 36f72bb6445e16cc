"""trackers/flatten.py: a summary as a tracker's metrics."""

from __future__ import annotations

import math

from rollfilter.trackers.flatten import flattened, metric_name


def test_every_number_is_found_by_its_path_whatever_the_blocks():
    summary = {
        "reward": 0.5,
        "mean@4": 0.25,
        "pass@1": 0.5,
        "pass_histogram": [1, 0, 2],
        "stderr": {"reward": 0.1, "pass@4": 0.2},
        "ci95": {"reward": [0.3, 0.7]},
        "per_rollout": {"output_tokens": {"p90": 12, "mean": 10.5}},
        # Another block's figures (a health check's, say) come out the same way, unknown as they are.
        "health": {"unhealthy": 3, "by_check": {"empty_output": 2, "loop": 1}, "tasks_all_unhealthy": 0},
        "rollfilter": {"succeeded": 8, "masked": 1, "stopped": "interrupted", "unsafe": True, "expected": None},
    }
    assert flattened(summary) == {
        "reward": 0.5,
        "mean_at_4": 0.25,
        "pass_at_1": 0.5,
        "pass_histogram/0": 1.0,
        "pass_histogram/1": 0.0,
        "pass_histogram/2": 2.0,
        "stderr/reward": 0.1,
        "stderr/pass_at_4": 0.2,
        "ci95/reward/0": 0.3,
        "ci95/reward/1": 0.7,
        "per_rollout/output_tokens/p90": 12.0,
        "per_rollout/output_tokens/mean": 10.5,
        "health/unhealthy": 3.0,
        "health/by_check/empty_output": 2.0,
        "health/by_check/loop": 1.0,
        "health/tasks_all_unhealthy": 0.0,
        "rollfilter/succeeded": 8.0,
        "rollfilter/masked": 1.0,
        "rollfilter/unsafe": 1.0,
    }


def test_numbers_that_are_no_figure_are_left_out():
    assert flattened({"reward": math.nan, "tokens_per_s": math.inf, "reward_mean": None, "agent": "a"}) == {}


def test_names_keep_only_what_both_trackers_take():
    assert metric_name("by_agent/math:v2/pass@4 (%)") == "by_agent/math_v2/pass_at_4 _pct"
    assert metric_name("usage/cached€") == "usage/cached_"
