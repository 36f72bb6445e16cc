"""Whole numbers and durations counted in bounded memory: latencies in log-spaced buckets 1%
wide (`LatencyHistogram`), counts such as tokens and tool calls exact under 128 and in such
buckets above (`CountSketch`). Percentiles stay within 1% however many values pass.
"""

from __future__ import annotations

import bisect
import collections
import itertools
import math
from collections.abc import Iterator, Sequence

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
