"""engine/metrics.py: the counters, and the means and error bars the summary makes of them."""

from __future__ import annotations

import fractions
import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollfilter.engine.metrics import Metrics
from rollfilter.errors import ErrorKind
from rollfilter.figures.passk import TaskStats
from rollfilter.outcomes import AttemptFailure
from rollfilter.run.statistics import statistics_of
from rollfilter.run.summary import summary_of


def summary_alone(metrics: Metrics, *, tasks: TaskStats | None = None) -> dict[str, Any]:
    """The summary of `metrics` alone (and `tasks`, finished), as a run that has no other part makes it."""
    if tasks is not None:
        tasks.finish()
    return summary_of(statistics_of(metrics, tasks=tasks))


FINITE = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e308, -1e308, 1.7976931348623157e308])


def exact_mean(values: list[float]) -> float:
    return float(sum(map(fractions.Fraction, values)) / len(values))


def test_failures_retries_and_throttled_replies_are_counted_by_agent():
    metrics = Metrics()
    throttled = AttemptFailure(ErrorKind.HTTP_STATUS, "429", status=429)
    metrics.add_retry(throttled, "a")
    metrics.add_retry(AttemptFailure(ErrorKind.TIMEOUT, "slow"), "a")
    metrics.add_failure(AttemptFailure(ErrorKind.HTTP_STATUS, "503", status=503), "b")
    metrics.add_failure(AttemptFailure(ErrorKind.CONNECT, "refused"), None)
    metrics.add_not_persisted("a")
    assert metrics.retries == 2
    assert metrics.retries_by_agent == {"a": 2}
    assert metrics.throttled_by_agent == {"a": 1, "b": 1}
    assert metrics.failed_by_agent == {("b", "http_status"): 1, (None, "connect"): 1}
    assert metrics.failed_by_kind == {"http_status": 1, "connect": 1}
    assert metrics.not_persisted == 1
    assert metrics.not_persisted_by_agent == {"a": 1}


def test_metrics_means_skip_non_numbers_and_count_booleans():
    metrics = Metrics()
    metrics.add_result({"reward": 1.0, "accuracy": True, "note": "x", "score": float("nan")}, 0.1)
    metrics.add_result({"reward": 0, "accuracy": False, "score": 3}, 0.2)
    metrics.add_result({"accuracy": True}, 0.3)
    metrics.add_failure(AttemptFailure(ErrorKind.TIMEOUT, "slow"))
    summary = summary_alone(metrics)
    assert summary["reward"] == 0.5
    assert summary["accuracy"] == 2 / 3
    assert summary["score"] == 3.0
    assert "note" not in summary
    assert summary["rollfilter"]["failed_by_kind"] == {"timeout": 1}
    assert list(summary)[-1] == "rollfilter"
    assert summary_alone(Metrics())["reward"] is None  # no result: no mean, rather than a mean of 0


def test_means_count_numbers_only_and_usage_one_level_down():
    from rollfilter.figures.means import Means

    means = Means()
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "note": "n"}
    odd = {"huge": 10**400, "nan": float("nan"), "_ng_task_index": 3, "text": "x"}
    means.add({"reward": 1.0, "ok": True, **odd, "response": {"usage": usage}})
    means.add({"reward": 0, "ok": False, "response": {"usage": {"input_tokens": 20}}})
    assert means.means() == {"reward": 0.5, "ok": 0.5}
    assert means.usage() == {"input_tokens": 15.0, "input_tokens_details.cached_tokens": 4.0}
    assert means.tokens() == 30.0


@settings(max_examples=300, deadline=None)
@given(values=st.lists(FINITE, min_size=1, max_size=12))
def test_means_stay_finite_and_exact_near_the_float_limits(values: list[float]):
    from rollfilter.figures.means import Means
    from rollfilter.figures.sums import EXACT_FROM

    means = Means()
    for value in values:
        means.add({"reward": value, "reward_components": {"c": value}, "response": {"usage": {"total_tokens": value}}})
    small = [abs(v) for v in values if abs(v) < EXACT_FROM]
    # Values past EXACT_FROM are summed exactly; the float sum of the others is off by at most
    # a few units in the last place of the largest of them.
    bound = len(values) * 2**-52 * max(small, default=0.0)
    figures = (means.mean("reward"), means.means()["reward"], means.usage()["total_tokens"], means.components()["c"])
    for mean in figures:
        assert math.isfinite(mean)
        assert abs(mean - exact_mean(values)) <= bound or mean == exact_mean(values)


def test_the_mean_of_rewards_and_usage_near_the_float_limits():
    from rollfilter.figures.means import Means

    means = Means()
    for _ in range(2):  # the float sum of these two is infinite
        means.add({"reward": 1e308, "tokens": 10**308, "response": {"usage": {"input_tokens": 10**308}}})
    assert means.means() == {"reward": 1e308, "tokens": 1e308}
    assert means.usage() == {"input_tokens": 1e308}


def test_a_reward_component_of_any_finite_size_has_its_mean_as_the_reward_has():
    metrics = Metrics()
    metrics.add_result({"reward": 1e300, "reward_components": {"c": 1e300, "d": 0.5}}, 0.1)
    metrics.add_result({"reward": 1e300, "reward_components": {"c": 1e300, "d": 1.5}}, 0.1)
    metrics.add_earlier_result({"reward": 1e300, "reward_components": {"c": 1e300}})  # merged with this run's
    summary = summary_alone(metrics)
    assert summary["reward"] == 1e300
    assert summary["reward_components"] == {"c": 1e300, "d": 1.0}
    assert summary["stderr"]["reward_components"] == {"c": None, "d": 0.5}  # a spread past the float range: unknown
    assert summary["sample_size"]["reward_components"]["c"] == {"tasks": 3, "rollouts": 3}


def test_reward_components_that_is_a_number_is_a_field_like_any_other():
    metrics = Metrics()
    metrics.add_result({"reward": 1.0, "reward_components": 2}, 0.1)
    summary = summary_alone(metrics)
    assert summary["reward_components"] == 2.0
    assert summary["sample_size"]["reward_components"] == {"tasks": 1, "rollouts": 1}


def test_a_token_rate_past_the_float_range_is_null_not_infinite():
    ticks = iter([0.0, *[1e-12] * 10])
    metrics = Metrics(clock=lambda: next(ticks))
    for _ in range(30):  # each under the exact sums' threshold, their float sum past what a rate can hold
        metrics.add_result({"reward": 1.0, "response": {"usage": {"total_tokens": 9e297}}}, 0.1)
    figures = summary_alone(metrics)["rollfilter"]
    assert figures["tokens_per_s"] is None
    assert figures["rows_per_s"] == pytest.approx(3e10)


def test_token_counts_past_the_exact_sums_threshold_count_in_the_token_rate():
    metrics = Metrics()
    for _ in range(4):
        metrics.add_result(
            {"reward": 1.0, "response": {"usage": {"input_tokens": 10**300, "output_tokens": 10**300}}}, 0.1
        )
    assert metrics.tokens() == pytest.approx(8e300)
    assert summary_alone(metrics)["rollfilter"]["tokens_per_s"] > 8e300


def test_a_masked_result_is_counted_and_its_tokens_spent_but_it_is_in_no_mean():
    metrics = Metrics()
    usage = {"response": {"usage": {"total_tokens": 10}}}
    metrics.add_result({"reward": 1.0, "reward_components": {"a": 1.0, "b": True, "c": "x"}, **usage}, 0.1)
    metrics.add_result({"reward": 0.0, "mask_sample": True, "reward_components": {"a": 9.0}, **usage}, 0.1)
    metrics.add_result({"reward": 0.5, "mask_sample": False, "reward_components": {"a": 0.0}, **usage}, 0.1)
    metrics.add_earlier_result({"reward": 0.0, "mask_sample": True, **usage})
    summary = summary_alone(metrics)
    assert summary["reward"] == 0.75
    assert "mask_sample" not in summary
    assert summary["reward_components"] == {"a": 0.5, "b": 1.0}
    assert (summary["rollfilter"]["succeeded"], summary["rollfilter"]["masked"]) == (3, 1)  # this run's
    assert summary["rollfilter"]["means_cover"] == 2  # the earlier run's masked result covered by none
    assert metrics.tokens() == 30
    assert summary["usage"] == {"total_tokens": 10.0}


def test_a_masked_result_is_in_per_rollout_but_in_no_error_bar():
    metrics = Metrics()
    for reward, tokens, masked in ((1.0, 3, False), (0.0, 5, False), (0.0, 100, True)):
        response = {"usage": {"output_tokens": tokens}}
        metrics.add_result({"reward": reward, "mask_sample": masked, "response": response}, 0.1)
    summary = summary_alone(metrics)
    assert summary["per_rollout"]["output_tokens"]["max"] == 100  # its tokens were spent
    assert summary["sample_size"] == {"reward": {"tasks": 2, "rollouts": 2}}
    assert summary["stderr"] == {"reward": 0.5}


def test_what_each_rollout_took_by_agent():
    metrics = Metrics()
    call = {"type": "function_call", "name": "f", "arguments": "{}"}
    message = {"type": "message", "content": []}
    answers = [
        (
            "a",
            {"status": "completed", "output": [call, call, message], "usage": {"input_tokens": 9, "output_tokens": 3}},
        ),
        ("a", {"status": "incomplete", "output": [message], "usage": {"input_tokens": 11, "output_tokens": 40}}),
        ("b", {"output": [call], "incomplete_details": {"reason": "max_output_tokens"}, "usage": {"output_tokens": 7}}),
        ("b", {"output": [], "incomplete_details": None}),
    ]
    for agent, response in answers:
        metrics.add_result({"reward": 1.0, "response": response}, 0.1, agent)
    metrics.add_result({"reward": 1.0}, 0.1, "b")  # no response: no figure of a rollout's cost
    summary = summary_alone(metrics)
    assert summary["per_rollout"] == {
        "output_tokens": {"p50": 7, "p90": 40, "max": 40, "mean": 50 / 3},
        "input_tokens": {"p50": 9, "p90": 11, "max": 11, "mean": 10.0},
        "tool_calls": {"p50": 0, "p90": 2, "max": 2, "mean": 0.75},
        "incomplete": 0.5,
    }
    assert summary["agents"]["a"]["per_rollout"]["tool_calls"] == {"p50": 0, "p90": 2, "max": 2, "mean": 1.0}
    assert summary["agents"]["b"]["per_rollout"]["input_tokens"] is None
    assert summary["agents"]["b"]["per_rollout"]["incomplete"] == 0.5


def test_the_summary_gives_each_mean_its_error_bars_by_agent_too():
    metrics = Metrics()
    for reward, agent in ((1.0, "a"), (0.0, "a"), (1.0, "a"), (0.5, "b")):
        metrics.add_result({"reward": reward, "score": 2 * reward, "note": "x"}, 0.1, agent)
    summary = summary_alone(metrics)
    assert summary["stderr"] == {"reward": 0.24, "score": 0.48}
    assert summary["sample_size"]["reward"] == {"tasks": 4, "rollouts": 4}
    assert summary["agents"]["a"]["stderr"] == {"reward": 0.33, "score": 0.67}
    # Rewards all in [0, 1]: Wilson's interval, inside it; scores up to 2: Student's t, as they are.
    assert summary["agents"]["a"]["ci95"] == {"reward": [0.04, 0.99], "score": [-1.54, 4.2]}
    assert summary["agents"]["b"]["stderr"] == {"reward": None, "score": None}  # one rollout: no spread to see
    assert summary["agents"]["b"]["sample_size"]["reward"] == {"tasks": 1, "rollouts": 1}


def test_no_mean_no_error_blocks():
    metrics = Metrics()
    metrics.add_failure(AttemptFailure(ErrorKind.TIMEOUT, "slow"))
    assert {"stderr", "ci95", "sample_size", "per_rollout"}.isdisjoint(summary_alone(metrics))


def test_token_counts_past_any_real_count_are_left_out_of_the_distributions():
    metrics = Metrics()
    for tokens in (10**400, 2**53, -1, 7.5, 12.0, True):
        metrics.add_result({"reward": 1.0, "response": {"usage": {"output_tokens": tokens}}}, 0.1)
    figures = summary_alone(metrics)["per_rollout"]["output_tokens"]
    assert figures == {"p50": 12, "p90": 12, "max": 12, "mean": 12.0}


def test_with_repeats_every_mean_of_zero_one_rewards_has_an_interval_inside_zero_to_one():
    tasks, metrics = TaskStats(4, 1.0), Metrics()
    for task in range(10):
        for rollout in range(4):
            result = {"reward": float(task == 0 and rollout == 0), "tokens": 100}
            tasks.rollout_ended(task, result["reward"], result=result)
            metrics.add_result(result, 0.1)
    summary = summary_alone(metrics, tasks=tasks)
    for key in ("reward", "mean@4", "pass@1", "pass@4"):
        low, high = summary["ci95"][key]
        assert 0.0 <= low <= summary[key] <= high <= 1.0, key
    assert summary["ci95"]["tokens"] == [100.0, 100.0]
