"""figures/sketches.py: latencies and counts in bounded memory, their percentiles within 1%."""

from __future__ import annotations

import math
import random

import pytest

from rollfilter.figures.sketches import CountSketch, LatencyHistogram


def test_latency_percentiles_within_one_percent():
    histogram = LatencyHistogram()
    values = [i / 1000 for i in range(1, 1001)]
    random.Random(1).shuffle(values)
    for value in values:
        histogram.add(value)
    for p, exact in ((50, 0.5), (90, 0.9), (99, 0.99)):
        assert abs(histogram.percentile(p) - exact) <= exact * 0.011
    assert histogram.max == 1.0


def test_latencies_counted_under_bounds_as_a_prometheus_histogram_counts_them():
    histogram = LatencyHistogram()
    values = [i / 1000 for i in range(1, 1001)]  # 1 ms to 1 s
    for value in values:
        histogram.add(value)
    bounds = (0.001, 0.1, 0.5, 0.999, 2.0)
    for bound, counted in zip(bounds, histogram.cumulative(bounds), strict=True):
        exact = sum(value <= bound for value in values)
        assert abs(counted - exact) <= max(1, 0.011 * exact)  # a bucket is 1% wide
    assert histogram.cumulative(bounds)[-1] == histogram.count == 1000
    assert histogram.sum == pytest.approx(sum(values))
    assert LatencyHistogram().cumulative(bounds) == [0] * 5


def test_token_percentiles_over_many_rollouts_in_bounded_memory():
    rng = random.Random(2)
    values = [int(rng.lognormvariate(6, 1.5)) for _ in range(200_000)]
    sketch = CountSketch()
    for value in values:
        sketch.add(value)
    ordered = sorted(values)
    for p in (50, 90, 99):
        exact = ordered[math.ceil(p / 100 * len(values)) - 1]
        assert exact <= sketch.percentile(p) <= exact * 1.01 + 1
    assert sketch.buckets() < 128 + 1200  # exact under 128, then 1% buckets up to ~3 million
    assert sketch.figures() == {
        "p50": math.floor(sketch.percentile(50)),
        "p90": math.floor(sketch.percentile(90)),
        "max": max(values),
        "mean": sum(values) / len(values),
    }


def test_a_sketch_makes_its_count_total_and_max_from_small_values_alone_and_merged():
    # A value under 128 is only counted where it falls: the count, the total and the max are made
    # from those counts when asked, and the large values' own are added in.
    small, large = CountSketch(), CountSketch()
    for value in (0, 3, 3, 127):
        small.add(value)
    for value in (5, 1000):
        large.add(value)
    assert (small.count, small.total, small.max) == (4, 133, 127)
    assert (CountSketch().count, CountSketch().max, CountSketch().figures()) == (0, 0, None)
    small.merge(large)
    assert (small.count, small.total, small.max) == (6, 1138, 1000)
    assert small.figures() == {"p50": 3, "p90": 1000, "max": 1000, "mean": 1138 / 6}
