"""Means that stay finite and exact near the float limits, at the cost of a float sum.

A mean is kept as a plain float sum of the ordinary values, and an exact integer sum of the
few past `EXACT_FROM`: two rewards of 1e308 overflow a float sum to infinity, but not an
integer count of 2**-1074 units (every finite float is a whole number of them). The float
sum of values under `EXACT_FROM` cannot overflow before 2**33 of them, and the mean of both
is rounded once, by Python's correctly rounded integer division.
"""

from __future__ import annotations

import math
import sys

EXACT_FROM = 2.0**990  # values at or past this (in magnitude) go to the exact sum
EXACT_FROM_INT = 2**990  # the same, for comparing ints without converting them
_UNIT_BITS = 1074  # the smallest float is 2**-1074


def scaled(value: float) -> int:
    """`value` (finite; an int too) as a whole number of 2**-1074 units, exactly."""
    if type(value) is int:
        return value << _UNIT_BITS
    numerator, denominator = value.as_integer_ratio()  # the denominator is a power of two
    return numerator << (_UNIT_BITS + 1 - denominator.bit_length())


def mean_of(float_sum: float, exact_sum: int, count: int) -> float:
    """(float_sum + exact_sum) / count, where `exact_sum` is in 2**-1074 units (see `scaled`)."""
    if not exact_sum or not math.isfinite(float_sum):  # the float sum alone: as plain as it gets
        return float_sum / count
    return (scaled(float_sum) + exact_sum) / (count << _UNIT_BITS)


def total_of(float_sum: float, exact_sum: int) -> float:
    """float_sum + exact_sum (in 2**-1074 units): the nearest float, or inf past the float range."""
    if not math.isfinite(float_sum):
        return float_sum
    try:
        return (scaled(float_sum) + exact_sum) / (1 << _UNIT_BITS)
    except OverflowError:
        return math.inf


def lost_to_rounding(first: float, second: float, total: float) -> float:
    """What `total`, the float sum of `first` and `second`, lost to rounding (Neumaier's step).

    Every mean of the summary is a sum compensated this way, divided once: summed in any order,
    the same values give the same mean, to the last digit."""
    if abs(first) >= abs(second):
        return (first - total) + second
    return (second - total) + first


def running_mean(mean: float, value: float, count: int) -> float:
    """The mean of `count` values, from the mean of the first `count` - 1 and the last one.

    Finite for finite values, even at the float limits, where the usual step `(value - mean)`
    overflows (1.7e308 after -1.7e308): the mean of finite values lies between them.
    """
    step = (value - mean) / count
    if step - step == 0.0:  # finite: the common case
        return mean + step
    blended = mean / count * (count - 1) + value / count
    return blended if blended - blended == 0.0 else math.copysign(sys.float_info.max, blended)
