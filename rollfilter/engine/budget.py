"""The retry budget: retries as a share of an agent's requests, so that an outage is not
multiplied by --retries.

As gRPC's retry throttling (gRFC A6) and Finagle's `RetryBudget` do it: each row's first
request deposits `ratio` of a retry, each retry withdraws a whole one, and a retry is sent
only while the balance holds one. A reserve lets a short run retry at all, and a cap bounds
what a long healthy stretch saves up for the outage after it. Under a total outage an agent
so receives about 1 + `ratio` requests a row (with --retries 3 and no budget: 4); while
failures are rarer than `ratio`, every row keeps all of its retries.
"""

from __future__ import annotations

from rollfilter.defaults import DEFAULT_RATIO

RESERVE = 10.0  # retries any agent may have, whatever its requests: a short run retries too
CAP = 100.0  # the most a budget saves up: what an outage after a healthy stretch can cost


class RetryBudget:
    """One agent's retry budget (trio-only: no locking)."""

    __slots__ = ("_balance", "ratio", "withheld")

    def __init__(self, ratio: float = DEFAULT_RATIO) -> None:
        self.ratio = ratio
        self._balance = RESERVE
        self.withheld = 0  # retries not sent because the balance held none

    def deposit(self) -> None:
        """A row's first request was sent."""
        self._balance = min(CAP, self._balance + self.ratio)

    def withdraw(self) -> bool:
        """Whether a retry may be sent now; it is paid for when it may."""
        if self._balance >= 1.0 - 1e-9:  # ten deposits of 0.1 make a whole retry
            self._balance = max(0.0, self._balance - 1.0)
            return True
        self.withheld += 1
        return False
