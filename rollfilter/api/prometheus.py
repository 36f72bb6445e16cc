"""A run's figures as Prometheus metrics: a prometheus_client collector that reads them when scraped.

    from prometheus_client import CollectorRegistry
    async with open_rollouts(rows, config) as run:
        rollfilter.api.prometheus.register(run, registry)   # a trainer's own registry
        ...

The collector holds nothing of its own: each scrape renders a snapshot of the run's figures
(`Run.statistics()`), taken then, so that the path of a row does no work for it. The figures belong
to the thread of the run's trio loop; a scrape from another thread (prometheus_client's
`start_http_server` serves from one) has that thread take the snapshot, so it never reads them half
changed. Names follow Prometheus' conventions: the `rollfilter_` prefix, base units, `_total` on
counters; `agent` is the rows' agent name (`(no name)` for rows that name none).

Importing this module imports prometheus_client: the command line imports it only when asked to
export (it costs start-up time).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeVar

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from rollfilter.api.in_trio import LiveFigures, RolloutRun
from rollfilter.errors import ErrorKind
from rollfilter.figures.health import CHECKS
from rollfilter.figures.sketches import CountSketch, LatencyHistogram
from rollfilter.run.statistics import AgentStatistics, RunStatistics

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


class PrometheusCollector:
    """A prometheus_client collector of one run's figures: a snapshot taken at each scrape (in the
    run's own thread, or by its trio loop for a scrape from another thread: see `LiveFigures`)."""

    def __init__(self, figures: LiveFigures) -> None:
        self._figures = figures

    def collect(self) -> list[Metric]:
        return families(self._figures.statistics())

    def describe(self) -> list[Metric]:
        """The names only (a registry checks them for clashes), read from no figure."""
        described = families(RunStatistics.empty())
        for family in described:
            family.samples = []
        return described


def register(run: RolloutRun, registry: CollectorRegistry) -> PrometheusCollector:
    """Add `run`'s figures to `registry` (a trainer's own, say), read at each scrape while the run
    goes and as they ended once it has; call it inside `async with open_rollouts(...) as run`.
    Returns the collector: `registry.unregister(collector)` takes the figures out again.
    ValueError (prometheus_client's) when the registry holds these names already: one run each."""
    if run.figures is None:
        raise ValueError("the run has not started: register it inside its async with block")
    collector = PrometheusCollector(run.figures)
    registry.register(collector)
    return collector


def exposition(registry: CollectorRegistry) -> bytes:
    """The registry's metrics in Prometheus' text format (version 0.0.4)."""
    return generate_latest(registry)


def families(statistics: RunStatistics) -> list[Metric]:
    """A run's snapshot as metric families (in any thread: nothing changes it)."""
    agents = statistics.agents
    # Every agent a rollout has ended or is in flight for: each with all its outcomes and its
    # rollouts in flight, at 0 when there are none (a series that vanishes is not a 0).
    seen = {label: figures for label, figures in agents.items() if figures.seen}
    # Those out, waiting to be sent or held in an open group may yet end: not cancelled yet.
    cancelled = statistics.cancelled - statistics.in_flight - statistics.waiting - statistics.in_open_groups
    found = [
        _outcomes(seen),
        CounterMetricFamily(
            "rollfilter_rollouts_started_total", "Rollouts taken from the input.", value=statistics.started
        ),
        CounterMetricFamily(
            "rollfilter_rollouts_cancelled_total", "Rollouts stopped before they ended (a stop).", value=cancelled
        ),
        _by_agent(
            GaugeMetricFamily("rollfilter_rollouts_in_flight", "Rollouts sent and not ended yet.", labels=("agent",)),
            {label: figures.in_flight for label, figures in seen.items()},
        ),
        _by_agent(
            _counter("retries", "Attempts sent again after a failure."),
            {label: a.retries for label, a in agents.items() if a.seen or a.retries},
        ),
        _by_agent(
            _counter("retries_withheld", "Retries the agent's retry budget did not send."),
            {label: a.retries_withheld for label, a in agents.items() if a.retries_withheld is not None},
        ),
        _by_agent(
            _counter("throttled_replies", "Replies 429 or 503: the agent asked for less."),
            {label: a.throttled for label, a in agents.items() if a.seen or a.throttled},
        ),
        _by_agent(
            _counter("rollouts_masked", "Rollouts that succeeded with mask_sample: true, left out of every mean."),
            {label: figures.masked for label, figures in seen.items()},
        ),
        _latency(statistics.latency),
        _output_tokens(statistics.output_tokens()),
        _by_agent(
            _counter("tokens", "Tokens the agents' answers report using (usage)."),
            {label: a.tokens for label, a in agents.items() if a.tokens is not None},
        ),
        _by_agent(
            GaugeMetricFamily(
                "rollfilter_reward_mean",
                "The mean reward so far (earlier runs' results included, as in the summary).",
                labels=("agent",),
            ),
            {label: a.reward_mean for label, a in agents.items() if a.reward_mean is not None},
        ),
    ]
    unhealthy = CounterMetricFamily(
        "rollfilter_rollouts_unhealthy",
        "Rollouts whose result failed a health check (docs/health.md), by check: one may fail several.",
        labels=("check",),
    )
    for check in CHECKS:
        unhealthy.add_metric((check,), statistics.unhealthy_by_check.get(check, 0))
    found.append(unhealthy)
    found += _windows(statistics)
    limited = {label: a for label, a in agents.items() if a.waiting_on_rate_limits is not None}
    if limited:  # --rpm, --tpm: what waits on the run's own limits, not on the agent
        waiting = _gauge("rollouts_waiting_on_rate_limits", "Requests waiting on the agent's rate limits.")
        waited = _counter("rate_limit_wait_seconds", "Seconds requests waited on the agent's rate limits, summed.")
        found.append(_by_agent(waiting, {label: a.waiting_on_rate_limits or 0 for label, a in limited.items()}))
        found.append(_by_agent(waited, {label: a.rate_limit_wait_s or 0.0 for label, a in limited.items()}))
    if statistics.cost_usd is not None:
        cost = _counter("cost_usd", "What the agents' answers cost, in US dollars, by the prices given.")
        found.append(_by_agent(cost, {label: a.cost_usd for label, a in agents.items() if a.cost_usd is not None}))
    if statistics.groups is not None:
        groups = CounterMetricFamily(
            "rollfilter_groups_total", "Groups of a task's rollouts, by fate.", labels=("fate",)
        )
        for fate, count in statistics.groups.items():
            if type(count) is int:  # not the note on what the figures cover
                groups.add_metric((fate,), count)
        found.append(groups)
    return found + _steered(statistics)


def _windows(statistics: RunStatistics) -> list[Metric]:
    """With adaptive windows: each agent's, and the rollouts waiting for room in them."""
    windows = {label: a.window for label, a in statistics.agents.items() if a.window is not None}
    if not windows:
        return []
    window = GaugeMetricFamily(
        "rollfilter_adaptive_window", "Requests the adaptive window lets in flight.", labels=("agent",)
    )
    waiting = GaugeMetricFamily(
        "rollfilter_rollouts_waiting_on_window",
        "Rollouts taken and not sent: waiting for room in their agent's adaptive window.",
        value=statistics.waiting_on_window,
    )
    return [_by_agent(window, windows), waiting]


def _steered(statistics: RunStatistics) -> list[Metric]:
    """What is in force of what can be steered: the pause, each agent's bound on requests in
    flight, and with a policy version, the version and what the staleness bound holds back."""
    steering = statistics.steering
    paused = GaugeMetricFamily("rollfilter_paused", "1 while the run is paused: no new request leaves.")
    paused.add_metric((), 1.0 if steering.paused else 0.0)
    in_flight_allowed = GaugeMetricFamily(
        "rollfilter_concurrency_limit",
        "Requests the agent may have in flight now: the run's concurrency, or its adaptive window under it.",
        labels=("agent",),
    )
    for label, figures in statistics.agents.items():
        if figures.concurrency_limit is not None:
            in_flight_allowed.add_metric((label,), figures.concurrency_limit)
    waiting = GaugeMetricFamily("rollfilter_rollouts_waiting_on_pause", "Rollouts taken, not sent: the run is paused.")
    waiting.add_metric((), statistics.waiting_on_pause)
    found: list[Metric] = [paused, waiting, in_flight_allowed]
    version = steering.policy_version
    if version is not None:
        found.append(GaugeMetricFamily("rollfilter_policy_version", "The policy version now.", value=version))
    if statistics.staleness_bound:
        found.append(
            GaugeMetricFamily(
                "rollfilter_rollouts_waiting_on_policy_version",
                "Rollouts waiting for a policy version that admits their group.",
                value=steering.waiting_on_policy_version,
            )
        )
        found.append(
            GaugeMetricFamily(
                "rollfilter_groups_waiting_on_policy_version",
                "Groups waiting for a policy version that admits them.",
                value=steering.groups_waiting_on_policy_version,
            )
        )
    return found


def _outcomes(seen: Mapping[str, AgentStatistics]) -> CounterMetricFamily:
    """Every outcome of each agent `seen`, those with none at 0 (a rate needs a start)."""
    family = CounterMetricFamily(
        "rollfilter_rollouts_total", "Rollouts ended in this run, by agent and outcome.", labels=("agent", "outcome")
    )
    ended: dict[tuple[str, str], int] = {}
    for label, figures in seen.items():
        for outcome in OUTCOMES:
            ended[label, outcome] = figures.failed_by_kind.get(outcome, 0)
        ended[label, SUCCEEDED] += figures.succeeded
        ended[label, NOT_PERSISTED] += figures.not_persisted
    for labels, count in sorted(ended.items()):
        family.add_metric(labels, count)
    return family


def _counter(name: str, documentation: str) -> CounterMetricFamily:
    return CounterMetricFamily(f"rollfilter_{name}_total", documentation, labels=("agent",))


def _gauge(name: str, documentation: str) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"rollfilter_{name}", documentation, labels=("agent",))


Family = TypeVar("Family", CounterMetricFamily, GaugeMetricFamily)


def _by_agent(family: Family, values: Mapping[str, float]) -> Family:
    """`family` with one sample an agent's label (the snapshot has added up the agents that share one)."""
    for label, value in sorted(values.items()):
        family.add_metric((label,), value)
    return family


def _latency(latency: LatencyHistogram) -> HistogramMetricFamily:
    return _histogram(
        "rollfilter_rollout_duration_seconds",
        "Time from sending a rollout to its answer, retries included (a bucket's bound within 1%).",
        LATENCY_BOUNDS,
        latency.cumulative(LATENCY_BOUNDS),
        count=latency.count,
        total=latency.sum,
    )


def _output_tokens(sketch: CountSketch) -> HistogramMetricFamily:
    """Output tokens a rollout, as its answer's usage reports them (earlier runs' results included)."""
    return _histogram(
        "rollfilter_rollout_output_tokens",
        "Output tokens a rollout (usage.output_tokens; a bucket's bound within 1% over 128).",
        OUTPUT_TOKEN_BOUNDS,
        sketch.cumulative(OUTPUT_TOKEN_BOUNDS),
        count=sketch.count,
        total=sketch.total,
    )


def _histogram(
    name: str, documentation: str, bounds: Sequence[float], counts: Sequence[int], *, count: int, total: float
) -> HistogramMetricFamily:
    """A histogram from cumulative `counts` at `bounds`, all `count` values under +Inf."""
    buckets = [(str(bound), float(number)) for bound, number in zip(bounds, counts, strict=True)]
    return HistogramMetricFamily(name, documentation, buckets=[*buckets, ("+Inf", float(count))], sum_value=total)
