"""cost.py: prices, and what a run spends."""

from __future__ import annotations

import pytest

from rollfilter.cost import Price, PriceError, Spending


def test_cached_input_tokens_have_their_own_price():
    usage = {"input_tokens": 1000, "output_tokens": 10, "input_tokens_details": {"cached_tokens": 400}}
    assert Price(2.0, 8.0, 0.5).of(usage) == pytest.approx((600 * 2.0 + 400 * 0.5 + 10 * 8.0) / 1e6)
    assert Price(2.0, 8.0).of(usage) == pytest.approx((1000 * 2.0 + 10 * 8.0) / 1e6)  # cached priced as input
    assert Price(2.0, 8.0).of({"total_tokens": 5}) is None  # no counts that a price applies to


@pytest.mark.parametrize("value", [10**400, -1, float("inf"), True, "3"])
def test_a_price_is_a_finite_number_a_float_can_hold(value: object):
    with pytest.raises(PriceError) as refused:
        Price(value, 1.0)  # type: ignore[arg-type]
    assert "the input price must be a finite number of USD, 0 or more" in str(refused.value)
    assert len(str(refused.value)) < 120  # a number of hundreds of digits is named by its size
    assert Price(3, 15).input == 3.0


@pytest.mark.parametrize(
    ("price", "usage"),
    [
        (Price(3.0, 15.0), {"input_tokens": 10**340, "output_tokens": 1}),  # past the float range
        (Price(3e12, 15.0), {"input_tokens": 10**305, "output_tokens": 1}),  # a float, but the cost overflows
        (Price(3.0, 15.0), {"input_tokens": 1, "output_tokens": 10**400}),
    ],
)
def test_usage_that_no_cost_can_hold_counts_as_no_usage(price: Price, usage: dict[str, object]):
    assert price.of(usage) is None
    spending = Spending([(None, price)])
    spending.add("agent", {"response": {"usage": usage}})
    spending.add("agent", {"response": {"usage": {"input_tokens": 1_000_000, "output_tokens": 0}}})
    assert spending.figures() == {
        "cost_usd": price.input,
        "cost_usd_by_agent": {"agent": price.input},
        "rollouts_without_usage": 1,
    }


def test_a_total_that_would_overflow_keeps_what_it_held():
    spending = Spending([(None, Price(1e302, 0.0))])
    for _ in range(3):
        spending.add(None, {"response": {"usage": {"input_tokens": 10**12, "output_tokens": 0}}})
    assert spending.total == pytest.approx(1e308)
    assert spending.without_usage == 2
