"""stats.py: error bars clustered by task, Student's t, the sign test, paired differences."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from rollfilter.figures.means import Means
from rollfilter.figures.passk import TaskStats
from rollfilter.figures.stats import (
    ClusteredMean,
    PairedDifferences,
    detectable,
    error_bars,
    estimate_of,
    incomplete_beta,
    sign_test,
    t_quantile,
    t_two_sided,
    within_unit,
)

# Synthetic runs with known truth: a task's difficulty moves all of its rollouts together.
TRUE_MEAN = 0.5
TASK_SPREAD = 0.2  # standard deviation of the tasks' own means
ROLLOUT_SPREAD = 0.1  # of a rollout about its task's mean
TASKS, ROLLOUTS = 100, 4
RUNS = 200


def synthetic_run(rng: random.Random) -> tuple[TaskStats, Means]:
    """One run of TASKS x ROLLOUTS, counted as a run counts it: by task, and in the plain means."""
    tasks, means = TaskStats(ROLLOUTS, 1.0), Means()
    for task in range(TASKS):
        center = rng.gauss(TRUE_MEAN, TASK_SPREAD)
        for _ in range(ROLLOUTS):
            result = {"reward": rng.gauss(center, ROLLOUT_SPREAD)}
            tasks.rollout_ended(task, result["reward"], result=result)
            means.add(result)
    return tasks, means


def test_clustered_errors_match_the_spread_of_means_across_runs_and_cover_the_truth():
    rng = random.Random(44)
    means, clustered, unclustered, covered = [], [], [], 0
    for _ in range(RUNS):
        tasks, plain = synthetic_run(rng)
        estimate = tasks.estimates()["reward"]
        assert (estimate.tasks, estimate.rollouts) == (TASKS, TASKS * ROLLOUTS)
        assert estimate.stderr is not None
        assert estimate.low is not None
        assert estimate.high is not None
        means.append(estimate.mean)
        clustered.append(estimate.stderr)
        unclustered.append(plain.estimates()["reward"].stderr)
        covered += estimate.low <= TRUE_MEAN <= estimate.high
    spread = statistics.stdev(means)
    assert statistics.fmean(clustered) == pytest.approx(spread, rel=0.15)
    assert 0.92 <= covered / RUNS <= 0.98
    # Taking each rollout as independent understates the error by the design effect's root.
    correlation = TASK_SPREAD**2 / (TASK_SPREAD**2 + ROLLOUT_SPREAD**2)
    design_effect = 1 + (ROLLOUTS - 1) * correlation
    assert statistics.fmean(unclustered) == pytest.approx(spread / math.sqrt(design_effect), rel=0.15)
    assert statistics.fmean(unclustered) < spread * 0.7


def test_a_rate_near_zero_has_an_interval_inside_zero_to_one_that_covers_the_truth():
    # Known truth: one task in ten can be solved, half the time; the rest never: a rate of 0.05.
    # Student's t interval reaches below 0 in most runs and covers the truth too rarely there.
    rng = random.Random(9)
    runs, tasks, rollouts, truth = 400, 40, 4, 0.05
    wilson_covered = t_covered = t_below_zero = 0
    for _ in range(runs):
        clustered = ClusteredMean()
        for _ in range(tasks):
            chance = 0.5 if rng.random() < 0.1 else 0.0
            clustered.add(sum(rng.random() < chance for _ in range(rollouts)) / rollouts, rollouts)
        plain, bounded = clustered.estimate(), within_unit(clustered.estimate())
        assert bounded.low is not None
        assert bounded.high is not None
        assert plain.low is not None
        assert plain.high is not None
        assert 0.0 <= bounded.low <= bounded.mean <= bounded.high <= 1.0
        assert (bounded.mean, bounded.stderr) == (plain.mean, plain.stderr)
        wilson_covered += bounded.low <= truth <= bounded.high
        t_covered += plain.low <= truth <= plain.high
        t_below_zero += plain.low < 0.0
    assert 0.93 <= wilson_covered / runs <= 0.98
    assert t_covered / runs < 0.9
    assert t_below_zero > runs / 2


def test_a_rate_of_zero_or_one_has_a_one_sided_interval_and_no_spread_counts_a_draw_a_task():
    none_solved = within_unit(estimate_of([0.0] * 20))
    assert none_solved.low == 0.0
    assert none_solved.high == pytest.approx(t_quantile(19) ** 2 / (20 + t_quantile(19) ** 2))
    all_solved = within_unit(estimate_of([1.0] * 20))
    assert (all_solved.low, all_solved.high) == pytest.approx((1.0 - none_solved.high, 1.0))
    every_task_half = within_unit(estimate_of([0.5] * 20))  # each task 1 of 2: no spread between tasks
    assert every_task_half.low == pytest.approx(1.0 - every_task_half.high)  # Wilson's, a draw a task
    assert 0.25 < every_task_half.low < 0.35
    assert error_bars(none_solved) == (0.0, [0.0, 0.18])  # to the place of its width, not 15 digits
    one_task = estimate_of([0.0])
    assert within_unit(one_task) == one_task  # no spread seen: no interval either way


def test_with_a_rollout_a_task_the_clustered_error_is_the_usual_one():
    values = [0.1, 0.4, 0.35, 0.8, 0.55]
    estimate = estimate_of(values)
    assert estimate.stderr == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)))
    means = Means()
    for value in values:
        means.add({"reward": value})
    assert means.estimates()["reward"].stderr == pytest.approx(estimate.stderr)


def test_merged_means_give_the_errors_of_one_pass():
    rng = random.Random(3)
    values = [rng.gauss(1e6, 3.0) for _ in range(50)]
    whole, first, second = Means(), Means(), Means()
    for index, value in enumerate(values):
        whole.add({"tokens": value})
        (first if index < 20 else second).add({"tokens": value})
    first.merge(second)
    assert first.estimates()["tokens"].stderr == pytest.approx(whole.estimates()["tokens"].stderr, rel=1e-9)
    assert first.mean("tokens") == whole.mean("tokens")


def test_one_task_has_no_error_bar_and_the_bars_are_rounded_to_what_they_hold():
    single = ClusteredMean()
    single.add(0.5, 4)
    assert single.estimate().stderr is None
    assert error_bars(single.estimate()) == (None, None)
    stderr, interval = error_bars(estimate_of([0.61, 0.63, 0.62, 0.64, 0.60]))
    assert stderr == 0.0071
    assert interval == [0.6004, 0.6396]


def test_students_t_against_tabulated_values():
    assert t_quantile(1) == pytest.approx(12.7062, abs=1e-4)
    assert t_quantile(10) == pytest.approx(2.2281, abs=1e-4)
    assert t_quantile(99) == pytest.approx(1.9842, abs=1e-4)
    assert t_quantile(10**7) == pytest.approx(1.95996, abs=1e-5)
    assert t_two_sided(2.0, 5) == pytest.approx(0.101939, abs=1e-6)
    assert t_two_sided(0.0, 3) == 1.0
    assert incomplete_beta(2, 3, 0.4) == pytest.approx(0.5248, abs=1e-12)


def test_the_sign_test_is_the_exact_binomial():
    assert sign_test(10, 0) == pytest.approx(2 * 0.5**10)
    assert sign_test(3, 3) == 1.0
    assert sign_test(0, 0) == 1.0
    exact = 2 * sum(math.comb(20, i) for i in range(6)) / 2**20
    assert sign_test(15, 5) == pytest.approx(exact)


def test_paired_differences_count_the_tasks_and_choose_the_test():
    binary = PairedDifferences()
    for baseline, value in ((0, 1), (0, 1), (1, 1), (1, 0), (0, 0)):
        binary.add(baseline, value)
    result = binary.result()
    assert (result.improved, result.worsened, result.tied, result.test) == (2, 1, 2, "sign")
    assert result.p_value == pytest.approx(sign_test(2, 1))
    graded = PairedDifferences()
    for baseline, value in ((0.5, 0.75), (0.25, 0.5), (0.5, 0.5)):
        graded.add(baseline, value)
    assert graded.result().test == "t"
    unpaired = PairedDifferences().result()  # no task: no test, not one that found nothing
    assert (unpaired.test, unpaired.difference.tasks, math.isnan(unpaired.p_value)) == (None, 0, True)
    assert graded.result().difference.mean == pytest.approx(1 / 6)


def test_a_true_difference_as_large_as_detectable_is_found_four_times_in_five():
    # Known truth: 60 tasks, each moved by the same true difference plus noise of spread 0.2. The
    # difference set to what one such comparison calls detectable is found (p < 0.05) in ~80% of them.
    rng = random.Random(5)
    tasks, spread, runs = 60, 0.2, 400

    def compared(shift: float) -> tuple[float | None, float]:
        pairs = PairedDifferences()
        for _ in range(tasks):
            pairs.add(0.0, rng.gauss(shift, spread))
        result = pairs.result()
        return detectable(result.difference), result.p_value

    smallest = statistics.fmean(d for d, _ in (compared(0.0) for _ in range(50)) if d is not None)
    assert smallest == pytest.approx(2.8 * spread / math.sqrt(tasks), rel=0.1)
    found = sum(compared(smallest)[1] < 0.05 for _ in range(runs))
    assert 0.74 <= found / runs <= 0.86
    assert detectable(estimate_of([0.5])) is None  # one task: no standard error, nothing to say


def test_a_difference_of_figures_within_zero_and_one_has_an_interval_within_minus_one_and_one():
    few = PairedDifferences()
    for baseline, value in ((1, 0), (0, 1), (1, 1)):
        few.add(baseline, value)
    difference = few.result().difference
    assert (difference.low, difference.high) == (-1.0, 1.0)  # the t interval reached -2.48 to 2.48
    graded = PairedDifferences()
    for baseline, value in ((0.0, 2.0), (1.0, -1.0), (0.5, 0.5)):  # outside [0, 1]: no bound to keep
        graded.add(baseline, value)
    assert graded.result().difference.high > 1.0


def test_no_spread_between_the_tasks_detects_nothing_it_can_say():
    tied = PairedDifferences()
    for _ in range(30):
        tied.add(1.0, 1.0)
    assert tied.result().difference.stderr == 0.0
    assert detectable(tied.result().difference) is None  # was 0: "any difference is found"
