"""Counters for a run, fed result by result: pure, no I/O. `engine/statistics.py` takes a snapshot
of them, with the rest of a run's figures, and makes the summary from it.

Memory stays flat with the input: means are running sums, and latencies go into
log-spaced buckets (1% wide), so percentiles are within 1% however many rows pass.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rollfilter.cost import Spending
from rollfilter.figures.stats import Estimate, estimate_of_moments
from rollfilter.figures.sums import EXACT_FROM, EXACT_FROM_INT, lost_to_rounding, mean_of, scaled, total_of
from rollfilter.outcomes import OVERLOAD_STATUSES, AttemptFailure
from rollfilter.rows import MASK_SAMPLE, REWARD_COMPONENTS, component_key

_BUCKET_GROWTH = math.log(1.01)
_log = math.log
_MIN_LATENCY = 1e-6


class LatencyHistogram:
    """Log-bucketed latencies: constant memory, percentiles to within 1%."""

    def __init__(self) -> None:
        # A plain dict, not a Counter: counting into a dict subclass is slower, once a result.
        self._counts: dict[int, int] = {}
        self.count = 0
        self.sum = 0.0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        # int() is floor() here: the ratio is at least 1, so its log is not negative.
        bucket = int(_log((seconds if seconds > _MIN_LATENCY else _MIN_LATENCY) / _MIN_LATENCY) / _BUCKET_GROWTH)
        counts = self._counts
        counts[bucket] = counts.get(bucket, 0) + 1
        self.count += 1
        self.sum += seconds
        if seconds > self.max:
            self.max = seconds

    def cumulative(self, bounds: Sequence[float]) -> list[int]:
        """How many latencies are at most each of `bounds` (ascending), as a Prometheus histogram
        counts them; to within a bucket's 1%: a bucket is counted under a bound its middle is under."""
        counts = [0] * len(bounds)
        for bucket, count in self._counts.items():
            middle = _MIN_LATENCY * math.exp((bucket + 0.5) * _BUCKET_GROWTH)
            first = bisect.bisect_left(bounds, middle)
            if first < len(bounds):
                counts[first] += count
        return list(itertools.accumulate(counts))

    def copy(self) -> LatencyHistogram:
        """The latencies so far, apart from those counted from now on."""
        copied = LatencyHistogram()
        copied._counts = self._counts.copy()
        copied.count, copied.sum, copied.max = self.count, self.sum, self.max
        return copied

    def percentile(self, p: float) -> float:
        if not self.count:
            return 0.0
        rank = max(1, math.ceil(p / 100 * self.count))
        seen = 0
        for bucket in sorted(self._counts):
            seen += self._counts[bucket]
            if seen >= rank:
                upper = _MIN_LATENCY * math.exp((bucket + 1) * _BUCKET_GROWTH)
                return min(upper, self.max)
        return self.max


_EXACT_BELOW = 128  # counts under this are kept one by one: tool calls, and short answers' tokens


class CountSketch:
    """Whole numbers (tokens, tool calls) in bounded memory: each value under 128 counted as
    itself, larger ones in 1%-wide log buckets. Percentiles are exact under 128 and within 1%
    above; the mean and the max are exact."""

    __slots__ = ("_buckets", "_exact", "_large_max", "_large_total")

    def __init__(self) -> None:
        self._exact = [0] * _EXACT_BELOW
        self._buckets: collections.Counter[int] = collections.Counter()  # by log bucket, from 128
        # The count, the total and the max are kept for the large values only, and made when
        # asked: a small value, the common one, is one count added on a result's path.
        self._large_total = 0
        self._large_max = 0

    def add(self, value: int) -> None:
        if value < _EXACT_BELOW:
            self._exact[value] += 1
            return
        self._buckets[math.floor(math.log(value / _EXACT_BELOW) / _BUCKET_GROWTH)] += 1
        self._large_total += value
        if value > self._large_max:
            self._large_max = value

    @property
    def count(self) -> int:
        return sum(self._exact) + sum(self._buckets.values())

    @property
    def total(self) -> int:
        return sum(value * count for value, count in enumerate(self._exact) if count) + self._large_total

    @property
    def max(self) -> int:
        if self._large_max:
            return self._large_max
        return next((value for value in range(_EXACT_BELOW - 1, -1, -1) if self._exact[value]), 0)

    def merge(self, other: CountSketch) -> None:
        self._exact = [mine + theirs for mine, theirs in zip(self._exact, other._exact, strict=True)]
        self._buckets.update(other._buckets)
        self._large_total += other._large_total
        self._large_max = max(self._large_max, other._large_max)

    def _counts(self) -> Iterator[tuple[float, float, int]]:
        """Each value or bucket counted, ascending: its least value, its greatest, and its count."""
        for value, count in enumerate(self._exact):
            if count:
                yield value, value, count
        for bucket in sorted(self._buckets):
            low = _EXACT_BELOW * math.exp(bucket * _BUCKET_GROWTH)
            yield low, low * math.exp(_BUCKET_GROWTH), self._buckets[bucket]

    def percentile(self, p: float) -> float:
        """The value `p`% of the counts are at or under (the nearest rank), 0 with none."""
        rank = max(1, math.ceil(p / 100 * self.count))
        seen = 0
        for _, high, count in self._counts():
            seen += count
            if seen >= rank:
                return min(high, self.max)
        return self.max

    def cumulative(self, bounds: Sequence[float]) -> list[int]:
        """How many values are at most each of `bounds` (ascending), a bucket counted by its middle."""
        counts = [0] * len(bounds)
        for low, high, count in self._counts():
            first = bisect.bisect_left(bounds, (low + high) / 2)
            if first < len(bounds):
                counts[first] += count
        return list(itertools.accumulate(counts))

    def buckets(self) -> int:
        """How many counts are kept: what the memory grows with."""
        return len(self._exact) + len(self._buckets)

    def figures(self) -> dict[str, float] | None:
        """p50, p90, max and mean; None when nothing was counted."""
        count = self.count
        if not count:
            return None
        return {
            "p50": math.floor(self.percentile(50)),
            "p90": math.floor(self.percentile(90)),
            "max": self.max,
            "mean": self.total / count,
        }


_MOST_COUNTED = 2**53  # a count at or past this is no count of tokens, and would overflow the figures


def _whole(value: Any) -> int | None:
    """A count from an answer: a whole number from 0 to under 2**53 (an integral float too)."""
    kind = type(value)
    if kind is int:
        return value if 0 <= value < _MOST_COUNTED else None
    if kind is float and 0 <= value < _MOST_COUNTED and value.is_integer():
        return int(value)
    return None


class RolloutCosts:
    """What each rollout took, from its `response`: output and input tokens (`usage`), tool calls
    (`output` items of type function_call), and whether it was cut short (status incomplete)."""

    __slots__ = ("incomplete", "input_tokens", "output_tokens", "rollouts", "tool_calls")

    def __init__(self) -> None:
        self.rollouts = 0
        self.incomplete = 0
        self.output_tokens = CountSketch()
        self.input_tokens = CountSketch()
        self.tool_calls = CountSketch()

    def add(self, response: dict[str, Any], usage: Any) -> None:
        """Count one rollout's `response`, whose `usage` the caller has read already."""
        # On the path of every result: plain ints are taken without a call.
        self.rollouts += 1
        if type(usage) is dict:
            tokens = usage.get("output_tokens")
            if (type(tokens) is int and 0 <= tokens < _MOST_COUNTED) or (tokens := _whole(tokens)) is not None:
                self.output_tokens.add(tokens)
            tokens = usage.get("input_tokens")
            if (type(tokens) is int and 0 <= tokens < _MOST_COUNTED) or (tokens := _whole(tokens)) is not None:
                self.input_tokens.add(tokens)
        output = response.get("output")
        if type(output) is list:
            calls = 0
            for item in output:
                if type(item) is dict and item.get("type") == "function_call":
                    calls += 1
            self.tool_calls.add(calls)
        if response.get("status") == "incomplete" or response.get("incomplete_details"):
            self.incomplete += 1

    def merge(self, other: RolloutCosts) -> None:
        self.rollouts += other.rollouts
        self.incomplete += other.incomplete
        self.output_tokens.merge(other.output_tokens)
        self.input_tokens.merge(other.input_tokens)
        self.tool_calls.merge(other.tool_calls)

    def figures(self) -> dict[str, Any] | None:
        """The summary's `per_rollout`; None when no result held a response."""
        if not self.rollouts:
            return None
        return {
            "output_tokens": self.output_tokens.figures(),
            "input_tokens": self.input_tokens.figures(),
            "tool_calls": self.tool_calls.figures(),
            "incomplete": self.incomplete / self.rollouts,
        }


def as_float(value: Any) -> float | None:
    """A result field as a number for a mean: bool, int or finite float (booleans count 0/1)."""
    kind = type(value)  # exact types: msgspec gives plain bool, int, float
    if kind is float:
        return value if math.isfinite(value) else None
    if kind is int or kind is bool:
        try:
            return float(value)
        except OverflowError:  # an int past float's range: not a usable figure
            return None
    return None


class Means:
    """Running sums of the numeric top-level fields of results, and of `response.usage`.

    Values past `EXACT_FROM` are summed exactly instead (`exact`, `usage_exact`), so
    that means near the float limits stay finite and right (see `rollfilter.figures.sums`).
    """

    __slots__ = (
        *(
            "component_counts",
            "component_exact",
            "component_squares",
            "component_sums",
            "compensations",
            "costs",
            "counts",
            "exact",
            "failed",
        ),
        *("masked", "shifts", "squares", "succeeded", "sums", "usage_counts", "usage_exact", "usage_sums"),
    )

    def __init__(self) -> None:
        self.succeeded = 0
        self.failed = 0
        self.masked = 0  # results with mask_sample: true, in `succeeded` but in no mean
        self.component_sums: dict[str, float] = {}  # reward_components, by name
        self.component_counts: dict[str, int] = {}
        self.component_exact: dict[str, int] = {}  # the entries past EXACT_FROM, summed exactly as the fields'
        # Their squares about 0 (entries are rewards, near 0 and 1): for the error bars, and simply
        # added when two runs' figures are merged.
        self.component_squares: dict[str, float] = {}
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self.exact: dict[str, int] = {}
        self.compensations: dict[str, float] = {}  # what each float sum's rounding lost
        self.shifts: dict[str, float] = {}  # each field's first value, and the squares of the values less it,
        self.squares: dict[str, float] = {}  # for its standard error with a rollout a task (no repeats)
        self.costs = RolloutCosts()
        self.usage_sums: dict[str, float] = {}
        self.usage_counts: dict[str, int] = {}
        self.usage_exact: dict[str, int] = {}

    def add(self, result: dict[str, Any]) -> None:
        # The per-result hot path: as_float() written out inline. A comparison rules out
        # inf and nan (and the rare huge value, summed apart) faster than math.isfinite().
        self.succeeded += 1
        response = result.get("response")
        if type(response) is dict:  # a masked rollout's tokens were spent all the same
            usage = response.get("usage")
            self.costs.add(response, usage)
            if type(usage) is dict:
                _add_usage(usage, self.usage_sums, self.usage_counts, self.usage_exact)
        if result.get(MASK_SAMPLE) is True:
            self.masked += 1
            return
        sums, counts, compensations = self.sums, self.counts, self.compensations
        shifts, squares = self.shifts, self.squares
        for key, value in result.items():
            kind = type(value)
            if kind is float:
                if not -EXACT_FROM < value < EXACT_FROM:
                    if value - value == 0.0:  # finite
                        self._add_huge(key, value)
                    continue
            elif kind is int:
                if not -EXACT_FROM_INT < value < EXACT_FROM_INT:
                    if -_FLOAT_RANGE < value < _FLOAT_RANGE:
                        self._add_huge(key, value)
                    continue
            elif kind is not bool or key == MASK_SAMPLE:  # false on every result the means cover
                continue
            if key.startswith("_ng_"):
                continue
            try:  # a subscript, not a get(): no call for a field seen before
                total = sums[key]
            except KeyError:
                self._first(key, value)
                continue
            # sums.lost_to_rounding, written out: the per-result hot path.
            added = total + value
            if (total if total >= 0.0 else -total) >= (value if value >= 0.0 else -value):
                compensations[key] += (total - added) + value
            else:
                compensations[key] += (value - added) + total
            sums[key] = added
            counts[key] += 1
            deviation = value - shifts[key]
            squares[key] += deviation * deviation
        components = result.get(REWARD_COMPONENTS)
        if type(components) is dict:
            self._add_components(components)

    def _add_components(self, components: dict[str, Any]) -> None:
        sums, counts, squares = self.component_sums, self.component_counts, self.component_squares
        for name, value in components.items():
            number = as_float(value)
            if number is None:
                continue
            counts[name] = counts.get(name, 0) + 1
            if -EXACT_FROM < number < EXACT_FROM:
                sums[name] = sums.get(name, 0.0) + number
                squares[name] = squares.get(name, 0.0) + number * number
            else:  # a figure all the same: summed exactly, its spread past the float range
                sums.setdefault(name, 0.0)
                squares[name] = math.inf
                self.component_exact[name] = self.component_exact.get(name, 0) + scaled(number)

    def _add_huge(self, key: str, value: float) -> None:
        if key.startswith("_ng_"):
            return
        if key not in self.sums:
            self.sums[key], self.counts[key] = 0.0, 0
            self.compensations[key], self.shifts[key], self.squares[key] = 0.0, 0.0, 0.0
        _add_exact(key, value, self.sums, self.counts, self.exact)

    def _first(self, key: str, value: float) -> None:
        self.sums[key] = 0.0 + value
        self.counts[key] = 1
        self.compensations[key] = 0.0
        self.shifts[key] = 0.0 + value
        self.squares[key] = 0.0

    def merge(self, other: Means) -> None:
        self.succeeded += other.succeeded
        self.failed += other.failed
        self.masked += other.masked
        for key, total in other.sums.items():
            if key not in self.sums:
                self.sums[key], self.counts[key] = 0.0, 0
                self.compensations[key], self.shifts[key], self.squares[key] = 0.0, other.shifts[key], 0.0
            shift, count = self.shifts[key], other.counts[key]
            # The other's squares about its own shift, moved to this one's.
            moved = other.shifts[key] - shift
            deviations = total + other.compensations[key] - count * other.shifts[key]
            self.squares[key] += other.squares[key] + 2 * moved * deviations + count * moved * moved
            added = self.sums[key] + total
            self.compensations[key] += other.compensations[key] + lost_to_rounding(self.sums[key], total, added)
            self.sums[key] = added
        for sums, more_sums in (
            (self.usage_sums, other.usage_sums),
            (self.component_sums, other.component_sums),
            (self.component_squares, other.component_squares),
        ):
            for key, value in more_sums.items():
                sums[key] = sums.get(key, 0.0) + value
        for tallies, more in (
            (self.counts, other.counts),
            (self.usage_counts, other.usage_counts),
            (self.exact, other.exact),
            (self.usage_exact, other.usage_exact),
            (self.component_counts, other.component_counts),
            (self.component_exact, other.component_exact),
        ):
            for key, count in more.items():
                tallies[key] = tallies.get(key, 0) + count
        self.costs.merge(other.costs)

    def mean(self, key: str) -> float:
        count = self.counts.get(key)
        if not count:
            return 0.0
        return mean_of(self.sums[key] + self.compensations[key], self.exact.get(key, 0), count)

    def means(self) -> dict[str, Any]:
        """`reward` first (null when no result carried one), then each field's mean in the order first seen."""
        means: dict[str, Any] = {"reward": None}
        for key in self.sums:
            means[key] = self.mean(key)
        return means

    @property
    def measured(self) -> int:
        """The results the means cover: those not masked."""
        return self.succeeded - self.masked

    def components(self) -> dict[str, float]:
        """The mean of each reward_components entry, over the results the means cover."""
        counts, exact = self.component_counts, self.component_exact
        return {name: mean_of(total, exact.get(name, 0), counts[name]) for name, total in self.component_sums.items()}

    def estimates(self) -> dict[str, Estimate]:
        """Each field's mean with its standard error, taking each rollout as a task of its own
        (right for a run without repeats; `passk.TaskStats` clusters by task when it has them).
        Masked results are in none of them."""
        found = {}
        for key, count in self.counts.items():
            mean = self.mean(key)
            if key in self.exact:  # values past the float range's square root: no spread to compute
                found[key] = Estimate(mean, None, None, None, count, count)
            else:
                found[key] = estimate_of_moments(count, mean, self.shifts[key], self.squares[key])
        for name, mean in self.components().items():
            count = self.component_counts[name]
            found[component_key(name)] = estimate_of_moments(count, mean, 0.0, self.component_squares[name])
        return found

    def usage(self) -> dict[str, float]:
        exact, counts = self.usage_exact, self.usage_counts
        return {key: mean_of(total, exact.get(key, 0), counts[key]) for key, total in self.usage_sums.items()}

    def tokens(self) -> float:
        """Tokens used so far: usage's total_tokens, or input plus output tokens; the counts past
        the exact sums' threshold included (inf when their sum is past the float range)."""
        if "total_tokens" in self.usage_sums:
            return self._usage_total("total_tokens")
        return self._usage_total("input_tokens") + self._usage_total("output_tokens")

    def _usage_total(self, key: str) -> float:
        exact = self.usage_exact.get(key, 0)
        total = self.usage_sums.get(key, 0.0)
        return total if not exact else total_of(total, exact)


def _add_usage(
    usage: dict[str, Any], sums: dict[str, float], counts: dict[str, int], exact: dict[str, int], prefix: str = ""
) -> None:
    """Numeric fields of response.usage, and of its objects one level down (input_tokens_details...)."""
    for key, value in usage.items():
        kind = type(value)
        if kind is int and -EXACT_FROM_INT < value < EXACT_FROM_INT:  # the common case, first
            number: float = value
        elif kind is dict:
            if not prefix:
                _add_usage(value, sums, counts, exact, f"{key}.")
            continue
        elif kind is int:
            if -_FLOAT_RANGE < value < _FLOAT_RANGE:
                _add_exact(prefix + key, value, sums, counts, exact)
            continue
        else:
            converted = as_float(value)
            if converted is None:
                continue
            number = converted
            if not -EXACT_FROM < number < EXACT_FROM:
                _add_exact(prefix + key, number, sums, counts, exact)
                continue
        name = prefix + key if prefix else key
        try:  # a subscript, not a get(): no call for a key seen before
            sums[name] += number
        except KeyError:
            sums[name] = 0.0 + number
            counts[name] = 1
        else:
            counts[name] += 1


def _add_exact(key: str, value: float, sums: dict[str, float], counts: dict[str, int], exact: dict[str, int]) -> None:
    """Count a finite value too large for the float sum in the exact one."""
    if key.startswith("_ng_"):
        return
    sums.setdefault(key, 0.0)  # the key keeps its place among the means
    counts[key] = counts.get(key, 0) + 1
    exact[key] = exact.get(key, 0) + scaled(value)


_FLOAT_RANGE = 2**1024 - 2**970  # an int at or past this rounds to an infinite float


UNNAMED_AGENT = "(no name)"  # the key in "agents" for rows routed by -u without an agent name


class Metrics:
    """What happened in a run, fed row by row by the engine."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started_at = clock()
        self.taken = 0  # rollouts taken from the input and started
        self.succeeded = 0
        self.failed = 0
        self.not_persisted = 0  # answers carrying _ng_no_persist: written nowhere, run again by --resume
        self.retries = 0
        self.spending: Spending | None = None  # with prices: what the run spent
        self.failed_by_kind: collections.Counter[str] = collections.Counter()
        self.failed_by_class: collections.Counter[str] = collections.Counter()  # the agents' own classes
        # By the rows' agent names (None: no name), for those who watch a run from outside: these
        # move only when a row fails or an attempt does, never on the path of a success.
        self.failed_by_agent: collections.Counter[tuple[str | None, str]] = collections.Counter()  # and kind
        self.not_persisted_by_agent: collections.Counter[str | None] = collections.Counter()
        self.retries_by_agent: collections.Counter[str | None] = collections.Counter()
        self.throttled_by_agent: collections.Counter[str | None] = collections.Counter()  # 429 and 503 replies
        self.latency = LatencyHistogram()
        self.by_agent: dict[str | None, Means] = {}
        self.earlier_by_agent: dict[str | None, Means] = {}  # earlier runs' results (--resume): figures only

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed + self.not_persisted

    @property
    def masked(self) -> int:
        """This run's results that said `mask_sample: true`."""
        return sum(means.masked for means in self.by_agent.values())

    def _agent(self, agent: str | None) -> Means:
        means = self.by_agent.get(agent)
        if means is None:
            means = self.by_agent[agent] = Means()
        return means

    def add_result(self, result: dict[str, Any], latency: float | None, agent: str | None = None) -> None:
        self.succeeded += 1
        if latency is not None:
            self.latency.add(latency)
        means = self.by_agent.get(agent)
        (means if means is not None else self._agent(agent)).add(result)

    def add_earlier_result(self, result: dict[str, Any], agent: str | None = None) -> None:
        """An earlier run's result: in the means and usage (the summary covers the whole output),
        never in this run's counters or rates."""
        means = self.earlier_by_agent.get(agent)
        if means is None:
            means = self.earlier_by_agent[agent] = Means()
        means.add(result)

    def figures_by_agent(self) -> dict[str | None, Means]:
        if not self.earlier_by_agent:
            return self.by_agent
        combined: dict[str | None, Means] = {}
        for source in (self.by_agent, self.earlier_by_agent):
            for agent, means in source.items():
                combined.setdefault(agent, Means()).merge(means)
        return combined

    def add_failure(self, failure: AttemptFailure, agent: str | None = None) -> None:
        self.failed += 1
        self.failed_by_kind[failure.kind.value] += 1
        self.failed_by_agent[agent, failure.kind.value] += 1
        if failure.status in OVERLOAD_STATUSES:
            self.throttled_by_agent[agent] += 1
        if failure.failure_class is not None:
            self.failed_by_class[failure.failure_class] += 1
        self._agent(agent).failed += 1

    def add_retry(self, failure: AttemptFailure, agent: str | None = None) -> None:
        """An attempt that failed with `failure` and is sent again."""
        self.retries += 1
        self.retries_by_agent[agent] += 1
        if failure.status in OVERLOAD_STATUSES:
            self.throttled_by_agent[agent] += 1

    def add_not_persisted(self, agent: str | None = None) -> None:
        self.not_persisted += 1
        self.not_persisted_by_agent[agent] += 1

    def tokens(self) -> float:
        return sum(means.tokens() for means in self.by_agent.values())

    def tokens_per_s(self) -> float | None:
        """Tokens a second so far; None when the agents' counts make no finite rate."""
        rate = self.tokens() / max(self.elapsed(), 1e-9)
        return rate if math.isfinite(rate) else None

    def rate(self) -> float:
        """Rollouts ended per second so far."""
        return self.ended / max(self.elapsed(), 1e-9)

    def elapsed(self) -> float:
        return self._clock() - self.started_at
