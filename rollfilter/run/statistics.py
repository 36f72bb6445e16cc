"""A run's figures at one moment: a frozen snapshot, taken in one place and rendered by every view.

`Metrics` counts as results come; the engine, the router and its agents (their adaptive windows,
rate limits and retry budgets), the planner, the groups, the steering and the tasks' figures each
know a part of where a run is. `statistics_of` reads all of them once and derives, here only,
what is worked out from several counts (the rows read, those cancelled, those not started, those
finished earlier runs' included) and what several views show (each agent's window and rates).
What it returns changes no more, and holds everything a view shows: the summary (`summary_of`),
the Prometheus exposition, the progress display and lines, the progress file, the status block
and the control socket's status render it, and read nothing else, in any thread, as trio's
`CapacityLimiter.statistics()` is rendered by whoever asked for it.

A snapshot is cheap enough to take several times a second: it copies counters and the results'
running sums (a few numbers a field and an agent), never anything that grows with the rows. The
tasks' figures (`TaskFigures`), which are computed over every task, are in it once the tasks are
finished (`TaskStats.finish`, at the run's end, or when a summary is asked for before it).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import types
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rollfilter.engine.client import Waiting
from rollfilter.engine.groups import GroupStage
from rollfilter.engine.metrics import UNNAMED_AGENT, Metrics
from rollfilter.engine.nursery import Engine, InFlight
from rollfilter.engine.rate_limits import RateLimits
from rollfilter.engine.routing import Agent, Router
from rollfilter.engine.steering import StalenessGate, Steering
from rollfilter.figures.health import CHECKS
from rollfilter.figures.means import Means
from rollfilter.figures.passk import TaskStats
from rollfilter.figures.sketches import CountSketch, LatencyHistogram
from rollfilter.figures.stats import Estimate
from rollfilter.figures.sums import mean_of

if TYPE_CHECKING:  # loaded by the runs that compare (--summarize --compare)
    from rollfilter.figures.compare import Comparison

_NONE: Mapping[str, Any] = types.MappingProxyType({})
_NO_VERSIONS: Mapping[int, float] = types.MappingProxyType({})


@dataclasses.dataclass(frozen=True, slots=True)
class SteeringStatistics:
    """What is in force in a run now, as `run.statistics()` gives it (a frozen snapshot).

    `concurrency` is the run's bound on requests out (with adaptive windows, their ceiling), and
    `windows` each agent's adaptive window. `rates` holds each limited agent's requests and
    tokens a minute (by agent name, "(no name)" for the rows of the run's URL). `groups_admitted` and the
    two counts waiting on the policy version are 0 without a staleness bound.
    """

    paused: bool
    requests_out: int
    concurrency: int
    windows: Mapping[str, int]
    rates: Mapping[str, Mapping[str, float | None]]
    policy_version: int | None
    groups_admitted: int = 0
    groups_waiting_on_policy_version: int = 0
    waiting_on_policy_version: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The snapshot as JSON-ready data (the control socket's `status`)."""
        data = dataclasses.asdict(self)
        data["windows"] = dict(self.windows)
        data["rates"] = {agent: dict(rates) for agent, rates in self.rates.items()}
        return data


@dataclasses.dataclass(frozen=True, slots=True)
class TaskFigures:
    """The tasks' figures, as `TaskStats.finish` computed them: mean@K, pass@k and the pass
    histogram (`fields`), the tasks counted (`counts`), and the means' error bars clustered by
    task, for the run (`estimates`) and, with several agents, for each (`by_agent`)."""

    fields: Mapping[str, Any]
    counts: Mapping[str, Any]
    estimates: Mapping[str, Estimate]
    by_agent: Mapping[str | None, Mapping[str, Estimate]]

    @classmethod
    def of(cls, tasks: TaskStats, agents: Iterable[str | None]) -> TaskFigures:
        """`tasks`' figures, finished first if they are not; by agent for each of `agents`."""
        by_agent = {agent: tasks.estimates(agent, by_agent=True) for agent in agents}
        return cls(tasks.summary_fields(), tasks.figures(), tasks.estimates(), by_agent)


@dataclasses.dataclass(frozen=True, slots=True)
class RunStatus:
    """A run in progress, as a status block shows it: its counts, and the oldest rollouts taken
    and not ended (`RunStatistics.status()` makes it from a run's snapshot). `in_flight` counts
    the rollouts sent and not ended; those taken and not sent are counted by what they wait on
    (the `waiting_on_` figures)."""

    ended: int
    failed: int
    in_flight: int
    rows_per_s: float
    elapsed_s: float
    oldest: tuple[InFlight, ...]
    # Rows waiting on an agent's rate limit (Config.rpm, Config.tpm), or under them for a place
    # among the requests out.
    waiting_on_rate_limits: int = 0
    paused: bool = False  # no new request leaves (the run's pause)
    waiting_on_pause: int = 0  # rows taken and not sent because the run is paused
    waiting_on_window: int = 0  # rows waiting for room in their agent's adaptive window
    waiting_on_policy_version: int = 0  # rows whose group the staleness bound does not admit yet
    in_open_groups: int = 0  # with groups: ended, and counted once their group closes


@dataclasses.dataclass(frozen=True, slots=True)
class AgentStatistics:
    """One agent's figures, by its label (the rows' agent name, "(no name)" for rows that name
    none); agents that share a label are added up. A figure that is None has nothing to say for
    that agent (no result of it yet, no window, no rate limit, no retry budget, no prices)."""

    seen: bool = False  # a rollout of it has ended in this run, or is taken and not ended
    succeeded: int = 0
    not_persisted: int = 0
    failed_by_kind: Mapping[str, int] = dataclasses.field(default_factory=dict)
    retries: int = 0
    throttled: int = 0  # replies 429 and 503, of rows that failed or were sent again
    masked: int = 0
    in_flight: int = 0  # sent and not ended
    tokens: float | None = None  # usage reported by this run's results
    reward_mean: float | None = None  # earlier runs' results included, as in the summary
    retries_withheld: int | None = None
    window: int | None = None  # its adaptive window
    concurrency_limit: int | None = None  # the requests it may have out: the run's bound, or its window under it
    waiting_on_rate_limits: int | None = None  # requests waiting on its rate limits now
    rate_limit_wait_s: float | None = None
    cost_usd: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class RunStatistics:
    """A run's figures at one moment, as `Run.statistics()` takes them (see the module docstring).

    The rollouts: `started` (taken from the input), of which `succeeded`, `failed` and
    `not_persisted` have `ended` and the rest are `cancelled` (while the run goes, those not ended
    yet, `in_flight`, `waiting` and `in_open_groups` among them; once it is over, those a stop cut).
    `in_flight` are sent and not ended (a retry's wait included); `in_open_groups` have come back
    and wait in a group still open, counted once it closes; `waiting` are taken and not sent: on the pause, a
    rate limit or a place among the requests out under one, an adaptive window, or the staleness
    bound (`waiting_on_` counts some of them by what they wait on). `skipped` and `not_retried` are
    pairs an earlier run finished or gave up (--resume). `rows_read` is the started, the skipped and
    the not retried, `expected` every pair of the input when it is known, and `not_started` the
    pairs of it never read (None while it is not known). So, however the run ended, rows_read =
    succeeded + failed + not_persisted + skipped + not_retried + cancelled, and expected = rows_read
    + not_started.
    `finished` is what the progress file counts: the ended, the given up, and what earlier runs
    finished. `steering` is what is in force (the pause, the concurrency, the version, and the
    rows the staleness bound holds back). With a policy version, `reward_by_version` is the reward
    mean of each version's results (earlier runs' included), by the version they were sent under.

    What the run says of itself, beside its counts: why it `stopped` (None: it was not), the
    tasks' figures once finished (`tasks`), whether it re-scored where that is not known to be
    safe (`unsafe`), with a client that sends nothing the rows it `would_send`, the rollouts
    re-scoring passed over as not judged failed (`not_judge_failed`), each agent's `key_metrics`
    once aggregated; and for a run counted from result files, which has no timings (`timed` is
    false), the `shards` they cover and their `comparison` with a baseline.
    """

    connected: bool  # the run has its engine: it sends, or has sent
    elapsed_s: float
    started: int
    succeeded: int
    failed: int
    not_persisted: int
    masked: int  # this run's results that said mask_sample: true (or unhealthy ones, masked)
    skipped: int
    not_retried: int
    cancelled: int
    expected: int | None
    rows_read: int
    not_started: int | None
    in_flight: int
    waiting: int
    waiting_on_pause: int
    waiting_on_window: int
    finished: int
    retries: int
    retries_withheld: int
    failed_by_kind: Mapping[str, int]
    failed_by_class: Mapping[str, int]
    rows_per_s: float
    tokens_per_s: float | None  # None when the agents' counts make no finite rate
    reward_mean: float  # over every result so far, earlier runs' included; 0 with none
    waiting_on_rate_limits: int  # rows waiting on a rate limit now (not for a place among those out)
    window: int | None  # the agents' adaptive windows together
    spending: Mapping[str, Any] | None  # with prices: the summary's cost figures
    cost_usd: float | None
    latency: LatencyHistogram  # a copy: nothing changes it
    results_by_agent: Mapping[str | None, Means]  # the means' sums by agent name (copies)
    agents: Mapping[str, AgentStatistics]
    replicas: tuple[Mapping[str, Any], ...]
    windows: Mapping[str, Mapping[str, int]]  # each adaptive window's final, least and greatest size
    limits: Mapping[str, Mapping[str, Any]]  # each agent's rate limits and what waited on them
    groups: Mapping[str, Any] | None
    staleness_bound: bool  # a staleness bound holds groups back (see `steering`)
    steering: SteeringStatistics
    oldest: tuple[InFlight, ...]  # the rollouts in flight longest, oldest first
    in_open_groups: int = 0
    stopped: str | None = None
    tasks: TaskFigures | None = None
    unsafe: bool = False
    would_send: int | None = None
    not_judge_failed: int | None = None
    key_metrics: Mapping[str, Any] | None = None
    shards: Mapping[str, Any] | None = None
    comparison: Comparison | None = None
    timed: bool = True
    # The rollouts that failed a health check (rollfilter.figures.health), this run's: each check's
    # count, and the tasks all of whose rollouts were unhealthy (earlier runs' included, as the
    # tasks' figures; without repeats a task is its one rollout).
    unhealthy: int = 0
    unhealthy_by_check: Mapping[str, int] = dataclasses.field(default_factory=dict)
    tasks_all_unhealthy: int = 0
    reward_by_version: Mapping[int, float] = dataclasses.field(
        default_factory=lambda: _NO_VERSIONS
    )  # with a policy version: each version's reward mean

    @classmethod
    def empty(cls) -> RunStatistics:
        """The figures of a run that has done nothing: zero, with nothing in force."""
        return statistics_of(Metrics())

    @property
    def ended(self) -> int:
        return self.succeeded + self.failed + self.not_persisted

    def output_tokens(self) -> CountSketch:
        """A rollout's output tokens, as the answers' usage reports them (earlier runs' included)."""
        sketch = CountSketch()
        for means in self.results_by_agent.values():
            sketch.merge(means.costs.output_tokens)
        return sketch

    def status(self) -> RunStatus:
        """The status the API's `status()` gives and `kill -USR1` prints."""
        return RunStatus(
            self.ended,
            self.failed,
            self.in_flight,
            self.rows_per_s,
            self.elapsed_s,
            self.oldest,
            self.waiting_on_rate_limits,
            self.steering.paused,
            waiting_on_pause=self.waiting_on_pause,
            waiting_on_window=self.waiting_on_window,
            waiting_on_policy_version=self.steering.waiting_on_policy_version,
            in_open_groups=self.in_open_groups,
        )


def statistics_of(
    metrics: Metrics,
    *,
    engine: Engine | None = None,
    router: Router | None = None,
    groups: GroupStage | None = None,
    steering: Steering | None = None,
    staleness: StalenessGate | None = None,
    concurrency: int = 0,
    tasks: TaskStats | None = None,
    expected: int | None = None,
    skipped_unread: int = 0,
    finished_earlier: int = 0,
    stopped: str | None = None,
    unsafe: bool = False,
    would_send: int | None = None,
    key_metrics: Mapping[str, Any] | None = None,
    shards: Mapping[str, Any] | None = None,
    comparison: Comparison | None = None,
    timed: bool = True,
) -> RunStatistics:
    """The figures of a run's parts now (see the module docstring). `concurrency` is the run's
    bound before it has an engine; `skipped_unread` counts pairs an earlier run finished that no
    row was read for (a group target met before the start), and `finished_earlier` the pairs earlier
    runs finished, for `finished`; `tasks` are in the snapshot once they are finished. The rest is
    what the run says of itself (see `RunStatistics`)."""
    planner = engine.planner if engine is not None else None
    skipped = skipped_unread + (planner.skipped if planner is not None else 0)
    not_retried = planner.given_up if planner is not None else 0
    rows_read = metrics.taken + skipped + not_retried
    agents = router.agents_named(None) if router is not None else []
    in_flight, waiting = _taken(engine)
    by_agent = metrics.figures_by_agent()
    fresh = by_agent is not metrics.by_agent  # merged anew with earlier runs' figures: nobody else's
    results = {agent: means if fresh else _copy(means) for agent, means in by_agent.items()}
    spending = metrics.spending
    windows, limits, rates = _limits(agents)
    concurrency = engine.concurrency if engine is not None else concurrency
    in_force = _in_force(steering, staleness, concurrency, windows, rates)
    by_agent_too = results if len(results) > 1 else ()
    task_figures = TaskFigures.of(tasks, by_agent_too) if tasks is not None and tasks.finished else None
    return RunStatistics(
        connected=engine is not None,
        elapsed_s=metrics.elapsed(),
        started=metrics.taken,
        succeeded=metrics.succeeded,
        failed=metrics.failed,
        not_persisted=metrics.not_persisted,
        masked=metrics.masked,
        skipped=skipped,
        not_retried=not_retried,
        cancelled=metrics.taken - metrics.ended,
        expected=expected,
        rows_read=rows_read,
        not_started=max(0, expected - rows_read) if expected is not None else None,
        in_flight=sum(in_flight.values()),
        waiting=sum(waiting.values()) + in_force.waiting_on_policy_version,
        waiting_on_pause=waiting[Waiting.PAUSE],
        waiting_on_window=waiting[Waiting.WINDOW],
        finished=finished_earlier + not_retried + metrics.ended,
        retries=metrics.retries,
        retries_withheld=router.retries_withheld() if router is not None else 0,
        failed_by_kind=dict(metrics.failed_by_kind),
        failed_by_class=dict(metrics.failed_by_class),
        rows_per_s=metrics.rate(),
        tokens_per_s=metrics.tokens_per_s(),
        reward_mean=_mean_over(results.values(), "reward"),
        waiting_on_rate_limits=sum(limits.waiting for limits in limits.values()),
        window=sum(window.size for window in windows.values()) if windows else None,
        spending=spending.figures() if spending is not None else None,
        cost_usd=spending.total if spending is not None else None,
        latency=metrics.latency.copy(),
        results_by_agent=types.MappingProxyType(results),
        agents=_agents(metrics, results, in_flight, router, engine),
        replicas=tuple(router.replica_counts()) if router is not None else (),
        windows={name: dataclasses.asdict(window.stats()) for name, window in sorted(windows.items())},
        limits={name: limits.figures() for name, limits in sorted(limits.items())},
        groups=groups.figures() if groups is not None else None,
        in_open_groups=groups.results_open if groups is not None else 0,
        staleness_bound=staleness is not None,
        steering=in_force,
        oldest=engine.oldest_in_flight() if engine is not None else (),
        not_judge_failed=planner.passed_over if planner is not None else None,
        tasks=task_figures,
        stopped=stopped,
        unsafe=unsafe,
        would_send=would_send,
        key_metrics=key_metrics,
        shards=shards,
        comparison=comparison,
        timed=timed,
        **_health(metrics, tasks),
        reward_by_version=metrics.by_version.means() if metrics.by_version is not None else _NO_VERSIONS,
    )


def _health(metrics: Metrics, tasks: TaskStats | None) -> dict[str, Any]:
    """The health figures, each check's in the order of CHECKS."""
    by_check = metrics.unhealthy_by_check
    return {
        "unhealthy": metrics.unhealthy,
        "unhealthy_by_check": {check: by_check[check] for check in CHECKS if check in by_check},
        "tasks_all_unhealthy": tasks.all_unhealthy if tasks is not None else metrics.unhealthy,
    }


def _limits(agents: list[Agent]) -> tuple[dict[str, Any], dict[str, RateLimits], dict[str, dict[str, float | None]]]:
    """The agents' adaptive windows and rate limits, by label (of agents that share one, the
    last): each limits' figures, those taken off while the run went included, and the rates in
    force now."""
    windows = {label(agent.name): agent.window for agent in agents if agent.window is not None}
    limits: dict[str, RateLimits] = {}
    rates: dict[str, dict[str, float | None]] = {}
    for agent in agents:
        current, shown = agent.rate_limits, agent.rate_limits or agent.former_rate_limits
        if current is not None:
            rates[label(agent.name)] = {"rpm": current.rpm, "tpm": current.tpm}
        if shown is not None:
            limits[label(agent.name)] = shown
    return windows, limits, rates


def _in_force(
    steering: Steering | None,
    staleness: StalenessGate | None,
    concurrency: int,
    windows: Mapping[str, Any],
    rates: Mapping[str, Mapping[str, float | None]],
) -> SteeringStatistics:
    """What is in force now: paused, the concurrency, the windows and rates, the version, and
    with a staleness bound the groups admitted and those waiting on the policy version."""
    return SteeringStatistics(
        paused=steering.paused if steering is not None else False,
        requests_out=steering.requests_out() if steering is not None else 0,
        concurrency=concurrency,
        windows={name: window.size for name, window in windows.items()},
        rates=rates,
        policy_version=steering.version if steering is not None else None,
        groups_admitted=staleness.groups_admitted if staleness is not None else 0,
        groups_waiting_on_policy_version=staleness.groups_waiting_on_policy_version if staleness is not None else 0,
        waiting_on_policy_version=staleness.waiting_on_policy_version if staleness is not None else 0,
    )


def _taken(engine: Engine | None) -> tuple[collections.Counter[str | None], collections.Counter[Waiting]]:
    """The rollouts the engine has taken and not ended: those in flight by agent name (an agent
    whose rows all wait is there, at 0), and those waiting to be sent by what they wait on."""
    in_flight: collections.Counter[str | None] = collections.Counter()
    waiting: collections.Counter[Waiting] = collections.Counter()
    for (agent, on), count in (engine.taken_by_agent() if engine is not None else {}).items():
        in_flight[agent] += count if on is None else 0
        if on is not None:
            waiting[on] += count
    return in_flight, waiting


def label(agent: str | None) -> str:
    return UNNAMED_AGENT if agent is None else agent


def _copy(means: Means) -> Means:
    copied = Means()
    copied.merge(means)
    return copied


def _mean_over(figures: Iterable[Means], key: str) -> float:
    """The mean of `key` over `figures` together, as merging them gives it, without merging the rest."""
    total, exact, count = [], 0, 0
    for means in figures:
        if means.counts.get(key):
            total.append(means.sums[key] + means.compensations[key])
            exact += means.exact.get(key, 0)
            count += means.counts[key]
    return mean_of(math.fsum(total), exact, count) if count else 0.0


def merged(figures: Mapping[str | None, Means] | list[Means]) -> Means:
    """`figures` together: the one as it is, several merged into a new one."""
    every = list(figures.values()) if isinstance(figures, Mapping) else figures
    if len(every) == 1:
        return every[0]
    total = Means()
    for means in every:
        total.merge(means)
    return total


def _agents(
    metrics: Metrics,
    results: Mapping[str | None, Means],
    in_flight: collections.Counter[str | None],
    router: Router | None,
    engine: Engine | None,
) -> Mapping[str, AgentStatistics]:
    """Each agent's figures by label, those of agents that share one added up."""
    tally: dict[str, dict[str, Any]] = collections.defaultdict(dict)

    def add(agent: str | None, field: str, value: Any) -> None:
        figures = tally[label(agent)]
        figures[field] = figures.get(field, 0) + value

    seen = {*metrics.by_agent, *(agent for agent, _ in metrics.failed_by_agent), *metrics.not_persisted_by_agent}
    for agent in seen | in_flight.keys():
        tally[label(agent)]["seen"] = True
        add(agent, "in_flight", in_flight[agent])
    for agent, means in metrics.by_agent.items():
        add(agent, "succeeded", means.succeeded)
        add(agent, "masked", means.masked)
        add(agent, "tokens", means.tokens())
    for agent, count in metrics.not_persisted_by_agent.items():
        add(agent, "not_persisted", count)
    for (agent, kind), count in metrics.failed_by_agent.items():
        kinds = tally[label(agent)].setdefault("failed_by_kind", {})
        kinds[kind] = kinds.get(kind, 0) + count
    for agent, count in metrics.retries_by_agent.items():
        add(agent, "retries", count)
    for agent, count in metrics.throttled_by_agent.items():
        add(agent, "throttled", count)
    by_label: dict[str, list[Means]] = collections.defaultdict(list)
    for agent, means in results.items():
        by_label[label(agent)].append(means)
    for name, labelled in by_label.items():
        means = merged(labelled)  # merged only where agents share a label
        if means.counts.get("reward"):
            tally[name]["reward_mean"] = means.mean("reward")
    if metrics.spending is not None:
        for agent, cost in metrics.spending.by_agent.items():
            add(agent, "cost_usd", cost)
    if router is not None:
        for agent, withheld in router.withheld_by_agent():
            add(agent, "retries_withheld", withheld)
        _add_agents(add, tally, router.agents_named(None), engine.concurrency if engine is not None else None)
    return types.MappingProxyType(
        {label: AgentStatistics(**figures) for label, figures in sorted(tally.items())}  # sorted: as each view shows
    )


def _add_agents(add: Any, tally: dict[str, dict[str, Any]], agents: list[Agent], concurrency: int | None) -> None:
    """What the router's agents own: their windows, their rate limits, and once the run sends, the
    bound on each one's requests out (agents that share a label: the greatest)."""
    for agent in agents:
        if agent.window is not None:
            add(agent.name, "window", agent.window.size)
        limits = agent.rate_limits or agent.former_rate_limits
        if limits is not None:
            add(agent.name, "waiting_on_rate_limits", limits.waiting)
            add(agent.name, "rate_limit_wait_s", limits.waited_s)
        if concurrency is not None:
            bound = min(agent.window.size, concurrency) if agent.window is not None else concurrency
            figures = tally[label(agent.name)]
            figures["concurrency_limit"] = max(bound, figures.get("concurrency_limit", 0))
