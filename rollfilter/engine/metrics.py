"""A run's counters, fed result by result: pure, no I/O. The figures they hold (means, latencies)
are `rollfilter.figures`'; a run's snapshot reads them with the rest of its parts.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from typing import Any

from rollfilter.cost import Spending
from rollfilter.figures.health import RecentShare
from rollfilter.figures.means import Means, RewardByVersion
from rollfilter.figures.sketches import LatencyHistogram
from rollfilter.outcomes import OVERLOAD_STATUSES, AttemptFailure

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
        # Rollouts that failed a health check (rollfilter.figures.health), results and failures of kind
        # unhealthy alike, and each check failed; earlier runs' are in the figures, not in these.
        self.unhealthy = 0
        self.unhealthy_by_check: collections.Counter[str] = collections.Counter()
        # With a limit on a rate of them, the last ended rollouts (from the first answered one on).
        self.recent_unhealthy: RecentShare | None = None
        self.recent_masked: RecentShare | None = None
        self.by_version: RewardByVersion | None = None  # with a policy version: each version's reward mean

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed + self.not_persisted

    @property
    def masked(self) -> int:
        """This run's results that said `mask_sample: true`, and with `Config.health`'s "mask" the
        unhealthy ones."""
        return sum(means.masked for means in self.by_agent.values())

    def _agent(self, agent: str | None) -> Means:
        means = self.by_agent.get(agent)
        if means is None:
            means = self.by_agent[agent] = Means()
        return means

    def add_result(
        self,
        result: dict[str, Any],
        latency: float | None,
        agent: str | None = None,
        *,
        masked: bool = False,
        checks: list[str] | None = None,
    ) -> None:
        """A result; `masked` leaves it out of the means, `checks` are the health checks it failed."""
        self.succeeded += 1
        if latency is not None:
            self.latency.add(latency)
        means = self.by_agent.get(agent)
        if means is None:
            means = self._agent(agent)
        if masked:
            means.add(result, masked=True)
        else:  # the common call, without a keyword
            means.add(result)
        if checks is not None:
            self.add_unhealthy(checks)
        if self.recent_unhealthy is not None:
            self.recent_unhealthy.add(checks is not None)
        if self.recent_masked is not None:
            self.recent_masked.add(masked or result.get("mask_sample") is True)
        if self.by_version is not None and not masked:
            self.by_version.add(result)

    def add_unhealthy(self, checks: list[str]) -> None:
        self.unhealthy += 1
        self.unhealthy_by_check.update(checks)

    def add_earlier_result(self, result: dict[str, Any], agent: str | None = None, *, masked: bool = False) -> None:
        """An earlier run's result: in the means and usage (the summary covers the whole output),
        never in this run's counters or rates."""
        means = self.earlier_by_agent.get(agent)
        if means is None:
            means = self.earlier_by_agent[agent] = Means()
        means.add(result, masked=masked)
        if self.by_version is not None and not masked:
            self.by_version.add(result)

    def figures_by_agent(self) -> dict[str | None, Means]:
        if not self.earlier_by_agent:
            return self.by_agent
        combined: dict[str | None, Means] = {}
        for source in (self.by_agent, self.earlier_by_agent):
            for agent, means in source.items():
                combined.setdefault(agent, Means()).merge(means)
        return combined

    def add_failure(self, failure: AttemptFailure, agent: str | None = None, checks: list[str] | None = None) -> None:
        """A failed rollout; `checks`: the health checks its answer failed (kind `unhealthy`)."""
        self.failed += 1
        if checks is not None:
            self.add_unhealthy(checks)
        if self.recent_unhealthy is not None and (self.recent_unhealthy or checks is not None):
            self.recent_unhealthy.add(checks is not None)
        if self.recent_masked is not None and self.recent_masked:
            self.recent_masked.add(False)
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
