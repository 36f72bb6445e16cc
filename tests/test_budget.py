"""budget.py: the retry budget's reserve and share."""

from __future__ import annotations

from rollfilter.budget import CAP, RESERVE, RetryBudget


def test_the_reserve_then_a_share_of_the_rows_sent():
    budget = RetryBudget(0.1)
    assert [budget.withdraw() for _ in range(int(RESERVE) + 1)] == [True] * int(RESERVE) + [False]
    for _ in range(10):
        budget.deposit()
    assert budget.withdraw()  # ten rows sent paid for one retry
    assert not budget.withdraw()
    assert budget.withheld == 2
    for _ in range(100_000):
        budget.deposit()  # a long healthy stretch saves up no more than the cap
    assert sum(budget.withdraw() for _ in range(int(CAP) * 2)) == int(CAP)
