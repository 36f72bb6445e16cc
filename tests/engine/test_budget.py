"""budget.py: the retry budget's reserve and share."""

from __future__ import annotations

from rollfilter.engine.budget import RetryBudget


def test_the_reserve_then_a_share_of_the_rows_sent():
    budget = RetryBudget(0.1)
    assert [budget.withdraw() for _ in range(11)] == [True] * 10 + [False]  # a reserve of 10 retries
    for _ in range(10):
        budget.deposit()
    assert budget.withdraw()  # ten rows sent paid for one retry
    assert not budget.withdraw()
    assert budget.withheld == 2
    for _ in range(100_000):
        budget.deposit()  # a long healthy stretch saves up no more than the cap: 100 retries
    assert sum(budget.withdraw() for _ in range(300)) == 100


def test_a_share_of_half_pays_a_retry_for_two_rows():
    budget = RetryBudget(0.5)
    for _ in range(10):
        assert budget.withdraw()
    for _ in range(6):
        budget.deposit()
    assert [budget.withdraw() for _ in range(4)] == [True, True, True, False]
