"""Error bars for a run's means, and the tests that compare two runs: pure arithmetic, no I/O.

A mean over rollouts is not a mean over independent draws when a task has several rollouts: the
rollouts of one task share its difficulty, so they agree more than rollouts of different tasks do,
and the usual standard error, s / sqrt(n), is too small by the square root of the design effect
(1 + (K - 1) * rho, for K rollouts a task whose rewards correlate by rho within a task). The
standard error here is clustered by task instead, as in "Adding Error Bars to Evals" (Miller,
2024): each task's rollouts enter as one cluster, their sum S_g of n_g values, and

    var(mean) = G / (G - 1) * sum over tasks of (S_g - n_g * mean)**2 / N**2

for G tasks and N rollouts. With one rollout a task it is the usual s**2 / N. The 95% interval
is mean +- t * stderr, t the 97.5% point of Student's t with G - 1 degrees of freedom.

A field whose every value lies in [0, 1] (a 0/1 reward, a pass rate, a score) cannot have a mean
outside it, yet mean +- t * stderr can reach past 0 or 1 when the mean is near either end. Its
interval is Wilson's for a proportion instead (`within_unit`), clustered by task as the standard
error is: with the effective number of draws n = p * (1 - p) / stderr**2 (the rollouts over the
design effect), and t in place of the normal's 1.96. Wilson's interval always lies in [0, 1], and
holds its coverage near the ends where the t interval loses it. Where the tasks show no spread (a
mean of exactly 0 or 1, or every task's mean the same), the interval is Wilson's with a draw a task.

Only sums are kept (`ClusteredMean`), never the values, so memory does not grow with the rollouts.
Student's t is computed here from the regularized incomplete beta function (a continued fraction,
to about 1e-14), so that no statistics package is needed.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable

CONFIDENCE = 0.95
POWER = 0.80  # the chance a difference as large as `detectable` gives p < 0.05, as sample sizes are usually chosen
ERROR_DIGITS = 2  # significant digits a standard error is shown with: its own error is larger than the third
MEAN_DIGITS = 15  # what a figure made from rounded ones holds: the 16th digit is their rounding
_BETA_ITERATIONS = 100_000  # the continued fraction needs about sqrt(a + b) terms
_BETA_EPSILON = 1e-15
_TINY = 1e-300


@dataclasses.dataclass(frozen=True, slots=True)
class Estimate:
    """A mean, its standard error and 95% interval, and the tasks and rollouts it was made from.

    `stderr`, `low` and `high` are None when the spread cannot be seen: fewer than two tasks,
    or values so large that their squares are past the float range."""

    mean: float
    stderr: float | None
    low: float | None
    high: float | None
    tasks: int
    rollouts: int


class ClusteredMean:
    """A mean over rollouts and its standard error clustered by task, fed one task at a time.

    `add(mean, count)` adds a task whose `count` rollouts have mean `mean`; `add_value(v)` a task
    of one rollout. The sums are taken about the first task's mean, so that values far from zero
    with a small spread keep their precision."""

    __slots__ = (
        *("_shift", "_sizes", "_squares", "_sum", "_total", "_total_compensation", "_weighted"),
        *("rollouts", "tasks"),
    )

    def __init__(self) -> None:
        self.tasks = 0
        self.rollouts = 0
        self._shift = 0.0
        self._total = 0.0  # sum of the values, n_g * mean_g, compensated (sums.lost_to_rounding)
        self._total_compensation = 0.0
        self._sum = 0.0  # sum of e_g = n_g * (mean_g - shift): for the spread, which needs no compensation
        self._squares = 0.0  # sum of e_g**2
        self._weighted = 0.0  # sum of n_g * e_g
        self._sizes = 0  # sum of n_g**2

    def add(self, mean: float, count: int) -> None:
        if not self.tasks:
            self._shift = mean
        deviation = count * (mean - self._shift)
        self.tasks += 1
        self.rollouts += count
        self._sum += deviation
        value = count * mean
        total = self._total + value
        # sums.lost_to_rounding, written out: once a task for every mean and field.
        if abs(self._total) >= abs(value):
            self._total_compensation += (self._total - total) + value
        else:
            self._total_compensation += (value - total) + self._total
        self._total = total
        self._squares += deviation * deviation
        self._weighted += count * deviation
        self._sizes += count * count

    def add_value(self, value: float) -> None:
        self.add(value, 1)

    def mean(self) -> float:
        if not self.rollouts:
            return math.nan
        return (self._total + self._total_compensation) / self.rollouts

    def estimate(self) -> Estimate:
        """The mean, its clustered standard error and 95% interval (see the module's docstring)."""
        tasks, rollouts = self.tasks, self.rollouts
        mean = self.mean()
        if tasks < 2 or not math.isfinite(mean):
            return Estimate(mean, None, None, None, tasks, rollouts)
        step = self._sum / rollouts
        spread = self._squares - 2 * step * self._weighted + step * step * self._sizes
        variance = tasks / (tasks - 1) * max(spread, 0.0) / (rollouts * rollouts)
        stderr = math.sqrt(variance)
        if not math.isfinite(stderr):
            return Estimate(mean, None, None, None, tasks, rollouts)
        half = t_quantile(tasks - 1) * stderr
        return Estimate(mean, stderr, mean - half, mean + half, tasks, rollouts)


def within_unit(estimate: Estimate) -> Estimate:
    """`estimate` with Wilson's interval clustered by task (see the module's docstring), for a
    field whose every value lies in [0, 1]; as it is when it has no interval. When every task's
    mean is the same (no spread between tasks to weigh), each task counts as one draw: an interval
    of no width would claim more than a few tasks can show."""
    mean, stderr = estimate.mean, estimate.stderr
    if stderr is None or not 0.0 <= mean <= 1.0:
        return estimate
    spread = mean * (1.0 - mean)
    draws = spread / (stderr * stderr) if spread > 0.0 and stderr > 0.0 else float(estimate.tasks)
    t = t_quantile(estimate.tasks - 1)
    scale = t * t / draws
    center = (mean + scale / 2) / (1 + scale)
    half = t / (1 + scale) * math.sqrt(spread / draws + scale / (4 * draws))
    # Wilson's interval holds the mean; the bounds keep rounding from moving an end past it.
    low, high = max(min(center - half, mean), 0.0), min(max(center + half, mean), 1.0)
    return dataclasses.replace(estimate, low=low, high=high)


def estimate_of_moments(count: int, mean: float, shift: float, squares: float) -> Estimate:
    """The estimate for `count` independent values (a task each) of mean `mean`, given the sum of
    their squared distances from `shift` (a value near them: the first, say)."""
    if count < 2 or not math.isfinite(mean) or not math.isfinite(squares):
        return Estimate(mean, None, None, None, count, count)
    step = mean - shift
    variance = max(squares - count * step * step, 0.0) / (count - 1) / count
    stderr = math.sqrt(variance)
    half = t_quantile(count - 1) * stderr
    return Estimate(mean, stderr, mean - half, mean + half, count, count)


def estimate_of(values: Iterable[float]) -> Estimate:
    """The mean of independent values (a task each), with its standard error and interval."""
    clustered = ClusteredMean()
    for value in values:
        clustered.add_value(value)
    return clustered.estimate()


# Student's t and the binomial, from the regularized incomplete beta function.


def incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularized incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    if x < (a + 1) / (a + b + 2):  # where the continued fraction converges fast
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of I_x(a, b), by the modified Lentz method."""
    c = 1.0
    d = 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    fraction = d
    for m in range(1, _BETA_ITERATIONS):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            fraction *= c * d
        if abs(c * d - 1.0) < _BETA_EPSILON:
            break
    return fraction


def t_two_sided(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: a two-sided p-value."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return incomplete_beta(df / 2, 0.5, df / (df + t * t))


@functools.lru_cache(maxsize=256)
def t_quantile(df: float, confidence: float = CONFIDENCE) -> float:
    """The t that P(|T| >= t) = 1 - `confidence` for Student's t with `df` degrees of freedom (by bisection)."""
    alpha = 1.0 - confidence
    low, high = 0.0, 2.0
    while t_two_sided(high, df) > alpha:
        low, high = high, high * 2
    for _ in range(80):
        middle = (low + high) / 2
        if t_two_sided(middle, df) > alpha:
            low = middle
        else:
            high = middle
    return (low + high) / 2


def detectable(estimate: Estimate) -> float | None:
    """The smallest true difference that a paired comparison of this size finds (p < 0.05, two-sided)
    with 80% power: (t of 0.975 + t of 0.80) * stderr, about 2.8 standard errors. None when the
    standard error is unknown, or 0: every task moved by the same amount (all tied, say) shows no
    spread to plan with, not a design that finds any difference. It scales as 1 / sqrt(tasks):
    four times the tasks halve it."""
    if not estimate.stderr:
        return None
    df = estimate.tasks - 1
    # A one-sided 80% point is the two-sided point of confidence 2 * 0.80 - 1.
    return (t_quantile(df) + t_quantile(df, 2 * POWER - 1)) * estimate.stderr


def sign_test(improved: int, worsened: int) -> float:
    """The exact two-sided sign test: how likely a split at least this uneven is, were improving
    and worsening equally likely (ties left out). With 0/1 outcomes it is McNemar's exact test."""
    trials = improved + worsened
    if not trials:
        return 1.0
    fewer = min(improved, worsened)
    tail = incomplete_beta(trials - fewer, fewer + 1, 0.5)  # P(X <= fewer), X binomial(trials, 1/2)
    return min(1.0, 2.0 * tail)


# A paired comparison of two runs, task by task.


@dataclasses.dataclass(frozen=True, slots=True)
class Difference:
    """One mean compared over the tasks two runs share: this run minus the baseline.

    `test` says how `p_value` was found: "t", a paired t-test of the tasks' differences; "sign",
    the exact sign test (McNemar's), used when every task's figure is 0 or 1 in both runs; None,
    with no task paired: no test, and `p_value` is nan. When every task's figure lies in [0, 1] in
    both runs, the difference cannot leave [-1, 1], and neither does its interval (clipped)."""

    difference: Estimate
    p_value: float
    test: str | None
    improved: int
    worsened: int
    tied: int


class PairedDifferences:
    """The per-task differences of one mean between two runs, fed a task at a time: sums only."""

    __slots__ = ("_binary", "_differences", "_within_unit", "improved", "tied", "worsened")

    def __init__(self) -> None:
        self._differences = ClusteredMean()
        self._binary = True
        self._within_unit = True
        self.improved = self.worsened = self.tied = 0

    def add(self, baseline: float, value: float) -> None:
        """A task's figure in the baseline and in this run (its rollouts' mean in each)."""
        if self._binary and not (baseline in (0.0, 1.0) and value in (0.0, 1.0)):
            self._binary = False
        if self._within_unit and not (0.0 <= baseline <= 1.0 and 0.0 <= value <= 1.0):
            self._within_unit = False
        if value > baseline:
            self.improved += 1
        elif value < baseline:
            self.worsened += 1
        else:
            self.tied += 1
        self._differences.add_value(value - baseline)

    def result(self) -> Difference:
        estimate = self._differences.estimate()
        if self._within_unit and estimate.low is not None and estimate.high is not None:
            estimate = dataclasses.replace(estimate, low=max(estimate.low, -1.0), high=min(estimate.high, 1.0))
        if not estimate.tasks:  # no pair: nothing to test, not a test that found nothing
            return Difference(estimate, math.nan, None, *self._split())
        if self._binary:
            return Difference(estimate, sign_test(self.improved, self.worsened), "sign", *self._split())
        return Difference(estimate, _paired_t(estimate), "t", *self._split())

    def _split(self) -> tuple[int, int, int]:
        return self.improved, self.worsened, self.tied


def _paired_t(estimate: Estimate) -> float:
    if estimate.stderr is None or not math.isfinite(estimate.mean):
        return math.nan
    if estimate.stderr == 0.0:  # every task moved by the same amount
        return 1.0 if estimate.mean == 0.0 else 0.0
    return t_two_sided(estimate.mean / estimate.stderr, estimate.tasks - 1)


# Figures shown with the digits they hold.


def significant(value: float, digits: int) -> float:
    """`value` rounded to `digits` significant digits (inf and nan as they are)."""
    if not math.isfinite(value) or value == 0.0:
        return value
    return float(f"{value:.{digits}g}")


def shown_mean(value: float) -> float:
    """A figure made from rounded ones (an interval's end, a difference) to the 15 digits it holds."""
    return significant(value, MEAN_DIGITS)


def shown_bound(value: float, stderr: float) -> float:
    """An interval's end, to the place of its standard error's last shown digit."""
    if not math.isfinite(value) or stderr <= 0.0 or not math.isfinite(stderr):
        return shown_mean(value)
    places = ERROR_DIGITS - 1 - math.floor(math.log10(stderr))
    return shown_mean(round(value, places))


def error_bars(estimate: Estimate) -> tuple[float | None, list[float] | None]:
    """An estimate's standard error and 95% interval as the summary shows them (None: unknown)."""
    if estimate.stderr is None or estimate.low is None or estimate.high is None:
        return None, None
    stderr = estimate.stderr
    # Wilson's interval at a mean of 0 or 1 has a width with no spread seen: its ends are shown to
    # the place a standard error of about a quarter of that width would be.
    scale = stderr or (estimate.high - estimate.low) / 4
    interval = [shown_bound(estimate.low, scale), shown_bound(estimate.high, scale)]
    return significant(stderr, ERROR_DIGITS), interval
