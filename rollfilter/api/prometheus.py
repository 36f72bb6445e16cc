"""A run's figures as Prometheus metrics: a prometheus_client collector that reads them when scraped.

    from prometheus_client import CollectorRegistry
    async with open_rollouts(rows, config) as run:
        rollfilter.api.prometheus.register(run, registry)   # a trainer's own registry
        ...

The collector holds nothing of its own: each scrape reads the run's `Metrics`, its engine and its
router as they are then, so that the path of a row does no work for it. The figures belong to the
thread of the run's trio loop; a scrape from another thread (prometheus_client's
`start_http_server` serves from one) has that thread make them, so it never reads them half
changed. Names follow Prometheus' conventions: the `rollfilter_` prefix, base units, `_total` on
counters; `agent` is the rows' agent name (`(no name)` for rows that name none).

Importing this module imports prometheus_client: the command line imports it only when asked to
export (it costs start-up time).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Iterable
from typing import Protocol, TypeVar

import trio
from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from rollfilter.api.in_trio import RolloutRun, RunFigures
from rollfilter.engine.groups import GroupStage
from rollfilter.engine.metrics import UNNAMED_AGENT, CountSketch, Means, Metrics
from rollfilter.engine.nursery import Engine
from rollfilter.engine.routing import Router
from rollfilter.engine.steering import StalenessGate, Steering
from rollfilter.errors import ErrorKind

# The latency histogram's upper bounds, in seconds: an agent's episode takes from milliseconds
# (a cached answer) to most of an hour.
LATENCY_BOUNDS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    25.0,
    60.0,
    120.0,
    300.0,
    600.0,
    1800.0,
)
# The output-token histogram's upper bounds: a short answer to a long agent episode.
OUTPUT_TOKEN_BOUNDS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)
SUCCEEDED = "succeeded"
NOT_PERSISTED = "not_persisted"
# Each rollout ends with one outcome: it succeeded, was not persisted, or failed with a kind.
OUTCOMES = (SUCCEEDED, NOT_PERSISTED, *(kind.value for kind in ErrorKind if kind is not ErrorKind.NOT_PERSISTED))


class Parts(Protocol):
    """What the figures are read from: a `rollfilter.run.run.Run`."""

    metrics: Metrics
    engine: Engine | None
    router: Router | None
    groups: GroupStage | None
    steering: Steering
    staleness: StalenessGate | None


def _label(agent: str | None) -> str:
    return UNNAMED_AGENT if agent is None else agent


class RunCollector:
    """A prometheus_client collector of one run's figures, read at each scrape (see the module's
    docstring): in the run's own thread, or by its trio loop for a scrape from another thread."""

    def __init__(self, figures: RunFigures) -> None:
        self._figures = figures

    def collect(self) -> list[Metric]:
        figures = self._figures
        if figures.ended or threading.get_ident() == figures.thread:  # ended: nothing changes them now
            return families(figures.run)
        try:
            return trio.from_thread.run_sync(families, figures.run, trio_token=figures.token)
        except trio.RunFinishedError:  # the run has ended: its figures stay as they are
            return families(figures.run)

    def describe(self) -> list[Metric]:
        """The names only (a registry checks them for clashes), read from no figure."""
        described = families(_Nothing(Metrics()))
        for family in described:
            family.samples = []
        return described


@dataclasses.dataclass
class _Nothing:
    metrics: Metrics
    engine: Engine | None = None
    router: Router | None = None
    groups: GroupStage | None = None
    steering: Steering = dataclasses.field(default_factory=Steering)
    staleness: StalenessGate | None = None


def register(run: RolloutRun, registry: CollectorRegistry) -> RunCollector:
    """Add `run`'s figures to `registry` (a trainer's own, say), read at each scrape while the run
    goes and as they ended once it has; call it inside `async with open_rollouts(...) as run`.
    Returns the collector: `registry.unregister(collector)` takes the figures out again.
    ValueError (prometheus_client's) when the registry holds these names already: one run each."""
    if run.figures is None:
        raise ValueError("the run has not started: register it inside its async with block")
    collector = RunCollector(run.figures)
    registry.register(collector)
    return collector


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in Prometheus' text format (version 0.0.4)."""
    return generate_latest(registry)


def families(run: Parts) -> list[Metric]:
    """The run's figures now, as metric families (call it in the run's own thread)."""
    metrics = run.metrics
    in_flight = run.engine.in_flight_by_agent() if run.engine is not None else collections.Counter()
    # Every agent a rollout has ended or is in flight for: each with all its outcomes and its
    # rollouts in flight, at 0 when there are none (a series that vanishes is not a 0).
    seen = {*metrics.by_agent, *(agent for agent, _ in metrics.failed_by_agent), *metrics.not_persisted_by_agent}
    seen |= in_flight.keys()
    zeros = [(agent, 0) for agent in seen]  # a series that vanishes is not a 0
    cancelled = metrics.taken - metrics.ended - sum(in_flight.values())
    found = [
        _outcomes(metrics, seen),
        CounterMetricFamily("rollfilter_rollouts_started_total", "Rollouts taken from the input.", value=metrics.taken),
        CounterMetricFamily(
            "rollfilter_rollouts_cancelled_total", "Rollouts stopped before they ended (a stop).", value=cancelled
        ),
        _by_agent(
            GaugeMetricFamily("rollfilter_rollouts_in_flight", "Rollouts sent and not ended yet.", labels=("agent",)),
            [(agent, in_flight[agent]) for agent in seen],
        ),
        _by_agent(
            _counter("retries", "Attempts sent again after a failure."), [*zeros, *metrics.retries_by_agent.items()]
        ),
        _by_agent(
            _counter("retries_withheld", "Retries the agent's retry budget did not send."),
            run.router.withheld_by_agent() if run.router is not None else (),
        ),
        _by_agent(
            _counter("throttled_replies", "Replies 429 or 503: the agent asked for less."),
            [*zeros, *metrics.throttled_by_agent.items()],
        ),
        _by_agent(
            _counter("rollouts_masked", "Rollouts that succeeded with mask_sample: true, left out of every mean."),
            [*zeros, *((agent, means.masked) for agent, means in metrics.by_agent.items())],
        ),
        _latency(metrics),
        _output_tokens(metrics),
        _by_agent(
            _counter("tokens", "Tokens the agents' answers report using (usage)."),
            [(agent, means.tokens()) for agent, means in metrics.by_agent.items()],
        ),
        _by_agent(
            GaugeMetricFamily(
                "rollfilter_reward_mean",
                "The mean reward so far (earlier runs' results included, as in the summary).",
                labels=("agent",),
            ),
            [
                (label, m.mean("reward"))
                for label, m in _merged(metrics.figures_by_agent()).items()
                if m.counts.get("reward")
            ],
        ),
    ]
    if metrics.windows:
        window = GaugeMetricFamily(
            "rollfilter_adaptive_window", "Requests the adaptive window lets in flight.", labels=("agent",)
        )
        found.append(_by_agent(window, [(name, adaptive.limit) for name, adaptive in metrics.windows.items()]))
    if metrics.limits:  # --rpm, --tpm: what waits on the run's own limits, not on the agent
        held = GaugeMetricFamily(
            "rollfilter_rollouts_held_by_rate_limit", "Requests waiting on the agent's rate limits.", labels=("agent",)
        )
        waited = _counter("rate_limit_wait_seconds", "Seconds requests waited on the agent's rate limits, summed.")
        found.append(_by_agent(held, [(name, limits.waiting) for name, limits in metrics.limits.items()]))
        found.append(_by_agent(waited, [(name, limits.waited_s) for name, limits in metrics.limits.items()]))
    if metrics.spending is not None:
        cost = _counter("cost_usd", "What the agents' answers cost, in US dollars, by the prices given.")
        found.append(_by_agent(cost, metrics.spending.by_agent.items()))
    if run.groups is not None:
        groups = CounterMetricFamily(
            "rollfilter_groups_total", "Groups of a task's rollouts, by fate.", labels=("fate",)
        )
        for fate, count in run.groups.figures().items():
            if type(count) is int:  # not the note on what the figures cover
                groups.add_metric((fate,), count)
        found.append(groups)
    return found + _steered(run)


def _steered(run: Parts) -> list[Metric]:
    """What is in force of what can be steered: the pause, each agent's bound on requests in
    flight, and with a policy version, the version and what the staleness bound holds back."""
    paused = GaugeMetricFamily("rollfilter_paused", "1 while the run is paused: no new request leaves.")
    paused.add_metric((), 1.0 if run.steering.paused else 0.0)
    limit = GaugeMetricFamily(
        "rollfilter_concurrency_limit",
        "Requests the agent may have in flight now: the run's concurrency, or its adaptive window under it.",
        labels=("agent",),
    )
    if run.engine is not None and run.router is not None:
        concurrency = run.engine.concurrency
        limits: dict[str, int] = {}
        for agent in run.router.agents_named(None):
            bound = min(agent.window.limit, concurrency) if agent.window is not None else concurrency
            limits[_label(agent.name)] = max(bound, limits.get(_label(agent.name), 0))  # agents that share a label
        for label, bound in sorted(limits.items()):
            limit.add_metric((label,), bound)
    found: list[Metric] = [paused, limit]
    version = run.steering.version
    if version is not None:
        found.append(GaugeMetricFamily("rollfilter_policy_version", "The policy version now.", value=version))
    if run.staleness is not None:
        held = run.staleness
        found.append(
            GaugeMetricFamily(
                "rollfilter_rows_held_by_staleness",
                "Rollouts waiting for a policy version that admits their group.",
                value=held.rows_held,
            )
        )
        found.append(
            GaugeMetricFamily(
                "rollfilter_groups_held_by_staleness",
                "Groups waiting for a policy version that admits them.",
                value=held.groups_held,
            )
        )
    return found


def _outcomes(metrics: Metrics, seen: Iterable[str | None]) -> CounterMetricFamily:
    """Every outcome of each agent `seen`, those with none at 0 (a rate needs a start)."""
    ended = {(_label(agent), outcome): 0 for agent in seen for outcome in OUTCOMES}
    for agent, means in metrics.by_agent.items():
        ended[_label(agent), SUCCEEDED] += means.succeeded
    for agent, count in metrics.not_persisted_by_agent.items():
        ended[_label(agent), NOT_PERSISTED] += count
    for (agent, kind), count in metrics.failed_by_agent.items():
        ended[_label(agent), kind] += count
    family = CounterMetricFamily(
        "rollfilter_rollouts_total", "Rollouts ended in this run, by agent and outcome.", labels=("agent", "outcome")
    )
    for labels, count in sorted(ended.items()):
        family.add_metric(labels, count)
    return family


def _counter(name: str, documentation: str) -> CounterMetricFamily:
    return CounterMetricFamily(f"rollfilter_{name}_total", documentation, labels=("agent",))


Family = TypeVar("Family", CounterMetricFamily, GaugeMetricFamily)


def _by_agent(family: Family, values: Iterable[tuple[str | None, float]]) -> Family:
    """`family` with one sample an agent's label: the values of agents that share one are summed
    (a row may name its agent as the label of rows that name none), so no series is given twice."""
    totals: dict[str, float] = {}
    for agent, value in values:
        label = _label(agent)
        totals[label] = totals.get(label, 0) + value
    for label, value in sorted(totals.items()):
        family.add_metric((label,), value)
    return family


def _merged(by_agent: dict[str | None, Means]) -> dict[str, Means]:
    """`by_agent`'s figures by label, those of agents that share one merged (as `_by_agent`)."""
    merged: dict[str, Means] = {}
    for agent, means in by_agent.items():
        merged.setdefault(_label(agent), Means()).merge(means)
    return merged


def _latency(metrics: Metrics) -> HistogramMetricFamily:
    latency = metrics.latency
    counts = latency.cumulative(LATENCY_BOUNDS)
    buckets = [(str(bound), float(count)) for bound, count in zip(LATENCY_BOUNDS, counts, strict=True)]
    return HistogramMetricFamily(
        "rollfilter_rollout_duration_seconds",
        "Time from sending a rollout to its answer, retries included (a bucket's bound within 1%).",
        buckets=[*buckets, ("+Inf", latency.count)],
        sum_value=latency.sum,
    )


def _output_tokens(metrics: Metrics) -> HistogramMetricFamily:
    """Output tokens a rollout, as its answer's usage reports them (earlier runs' results included)."""
    sketch = CountSketch()
    for means in metrics.figures_by_agent().values():
        sketch.merge(means.costs.output_tokens)
    counts = sketch.cumulative(OUTPUT_TOKEN_BOUNDS)
    buckets = [(str(bound), float(count)) for bound, count in zip(OUTPUT_TOKEN_BOUNDS, counts, strict=True)]
    return HistogramMetricFamily(
        "rollfilter_rollout_output_tokens",
        "Output tokens a rollout (usage.output_tokens; a bucket's bound within 1% over 128).",
        buckets=[*buckets, ("+Inf", float(sketch.count))],
        sum_value=sketch.total,
    )
