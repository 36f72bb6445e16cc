"""sums.py: sums and means that stay finite near the float limits."""

from __future__ import annotations

import math
import sys
from fractions import Fraction

from hypothesis import given
from hypothesis import strategies as st

from rollfilter.figures.sums import running_mean

SMALLEST_SUBNORMAL = 5e-324
FINITE = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1.7e308, -1.7e308, sys.float_info.max])


@given(st.lists(FINITE, min_size=1, max_size=30))
def test_a_running_mean_is_finite_and_close_to_the_exact_mean(values: list[float]):
    mean = 0.0
    for count, value in enumerate(values, 1):
        mean = running_mean(mean, value, count)
        assert math.isfinite(mean)
    exact = sum(map(Fraction, values)) / len(values)
    relative = Fraction(max(map(abs, values))) * Fraction(len(values), 2**50)
    # Below the normal floats, no float is nearer the mean than the spacing of subnormals allows.
    assert abs(Fraction(mean) - exact) <= relative + Fraction(SMALLEST_SUBNORMAL) * len(values)


def test_a_running_mean_over_values_whose_difference_overflows():
    assert running_mean(1.7e308, -1.7e308, 2) == 0.0
    assert running_mean(-sys.float_info.max, sys.float_info.max, 2) == 0.0
