"""cost.py: prices and their parsing."""

from __future__ import annotations

import pytest

from rollfilter.cost import Price, PriceError, parse_price


def test_cached_input_tokens_have_their_own_price():
    usage = {"input_tokens": 1000, "output_tokens": 10, "input_tokens_details": {"cached_tokens": 400}}
    assert Price(2.0, 8.0, 0.5).of(usage) == pytest.approx((600 * 2.0 + 400 * 0.5 + 10 * 8.0) / 1e6)
    assert Price(2.0, 8.0).of(usage) == pytest.approx((1000 * 2.0 + 10 * 8.0) / 1e6)  # cached priced as input
    assert Price(2.0, 8.0).of({"total_tokens": 5}) is None  # no counts that a price applies to


@pytest.mark.parametrize("spec", ["1", "a=1", "=1,2", "1,2,3,4", "1,-2", "x=1,nan", "1,inf", "1_000,2", "\uff11,2"])
def test_a_bad_price_is_refused(spec: str):
    with pytest.raises(PriceError):
        parse_price(spec)
