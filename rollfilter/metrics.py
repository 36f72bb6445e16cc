"""Counters for a run and the summary they make: pure, no I/O.

Memory stays flat with the input: means are running sums, and latencies go into
log-spaced buckets (1% wide), so percentiles are within 1% however many rows pass.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable
from typing import Any

from rollfilter.errors import ErrorKind
from rollfilter.outcome import RowFailure
from rollfilter.tasks import TaskStats

_BUCKET_GROWTH = math.log(1.01)
_MIN_LATENCY = 1e-6


class LatencyHistogram:
    """Log-bucketed latencies: constant memory, percentiles to within 1%."""

    def __init__(self) -> None:
        self._counts: collections.Counter[int] = collections.Counter()
        self.count = 0
        self.max = 0.0

    def add(self, seconds: float) -> None:
        self._counts[math.floor(math.log(max(seconds, _MIN_LATENCY) / _MIN_LATENCY) / _BUCKET_GROWTH)] += 1
        self.count += 1
        self.max = max(self.max, seconds)

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


class Metrics:
    """What happened in a run, fed row by row by the dispatcher."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started_at = clock()
        self.taken = 0  # rollouts taken from the input and started
        self.succeeded = 0
        self.failed = 0
        self.skipped = 0
        self.retries = 0
        self.failed_by_kind: collections.Counter[str] = collections.Counter()
        self.latency = LatencyHistogram()
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self.replicas: list[dict[str, Any]] = []

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed

    def add_result(self, result: dict[str, Any], latency: float | None) -> None:
        self.succeeded += 1
        if latency is not None:
            self.latency.add(latency)
        sums, counts = self._sums, self._counts
        for key, value in result.items():
            kind = type(value)  # exact types: msgspec gives plain bool, int, float
            if kind is float:
                if not math.isfinite(value):
                    continue
            elif kind is not int and kind is not bool:
                continue
            if key.startswith("_ng_"):
                continue
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1

    def mean(self, key: str) -> float:
        count = self._counts.get(key)
        return self._sums[key] / count if count else 0.0

    def rate(self) -> float:
        """Rollouts ended per second so far."""
        return self.ended / max(self._clock() - self.started_at, 1e-9)

    def add_failure(self, failure: RowFailure) -> None:
        self.failed += 1
        self.failed_by_kind[failure.kind.value] += 1

    def summary(
        self, *, stopped: str | None = None, tasks: TaskStats | None = None, timings: bool = True
    ) -> dict[str, Any]:
        """The summary object: means of numeric result fields (and mean@K, pass@k over
        tasks), then the run's own figures under "rollfilter"."""
        means: dict[str, Any] = {"reward": 0.0}
        for key in self._sums:
            means[key] = self._sums[key] / self._counts[key]
        figures: dict[str, Any] = {
            "rows_read": self.taken + self.skipped,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "skipped": self.skipped,
            "cancelled": self.taken - self.ended,
            "failed_by_kind": {
                kind.value: self.failed_by_kind[kind.value] for kind in ErrorKind if self.failed_by_kind[kind.value]
            },
            "retries": self.retries,
        }
        if timings:
            figures["elapsed_s"] = round(self._clock() - self.started_at, 3)
            figures["rows_per_s"] = round(self.rate(), 2)
            figures["latency_s"] = {
                "p50": round(self.latency.percentile(50), 4),
                "p90": round(self.latency.percentile(90), 4),
                "p99": round(self.latency.percentile(99), 4),
                "max": round(self.latency.max, 4),
            }
        if tasks is not None:
            means.update(tasks.summary_fields())
            figures.update(tasks.figures())
        if self.replicas:
            figures["replicas"] = self.replicas
        if stopped:
            figures["stopped"] = stopped
        means["rollfilter"] = figures
        return means
