"""Where a row goes: the agent its name picks (or -u), and which replica of it.

Of an agent's replicas, a rollout goes to the one with the fewest requests outstanding, or, by
task (`TaskPlacement`), every rollout of a task to the same one, for its prefix cache. A
replica whose connections fail sits out a cool-down, and its rows go to another. The cool-down
doubles (to a few seconds) only when a request sent after it began fails too: the requests a
replica had out when it went down fail together, and count once. When the cool-down is over,
the replica is on trial: it takes one request at a time until one gets through, so a replica
still down costs one request, not a flood, and one that is back takes its share at once. With
--adaptive, each agent carries its window (see adaptive.py).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import httpx
import msgspec

from rollfilter.config import MIN_RATE, Config, ConfigError
from rollfilter.engine.adaptive import AdaptiveWindow
from rollfilter.engine.budget import RetryBudget
from rollfilter.engine.metrics import UNNAMED_AGENT
from rollfilter.engine.rate_limits import RateLimits
from rollfilter.errors import ErrorKind, SteeringError
from rollfilter.outcomes import AttemptFailure
from rollfilter.redact import shown

if TYPE_CHECKING:
    from rollfilter.formats.headserver import HeadServerAgents

COOLDOWN_BASE = 1.0  # a replica whose connections fail sits out this long, doubling
# The longest cool-down: a replica that is back again waits at most this long for its trial
# request, and one that stays down costs one request (a connection refused) this often.
COOLDOWN_CAP = 4.0
# A replica takes a new task while it holds at most this many times the mean of the requests
# outstanding (the bound of consistent hashing with bounded loads). 1.25: the busiest replica
# stays within 1.25x the mean, as the fleet benchmark asks, while a task leaves its home replica
# only when that one is a quarter busier than the rest; a tighter bound moves more tasks off
# their replica (and off its prefix cache) for little more balance.
BALANCE = 1.25
POINTS_PER_REPLICA = 100  # places of each replica on the ring: its share of the tasks within a few percent
PLACED_TASKS = 65_536  # tasks whose replica is remembered (a task's rollouts come together, then rarely again)
# An agent that has never answered is judged down once its connections have failed this many times,
# over a span of time (see `Agent.unreachable`): a burst of refusals at the start of a run (a listen
# backlog overflowing) comes at one moment, and a connection that hangs fails only at its timeout.
UNREACHABLE_AFTER_FAILURES = 3
_encode = msgspec.json.Encoder().encode
KEEP: Any = ...  # set_rates' default: the limit stays as it is


def task_key(task_index: Any) -> bytes:
    """What places a task: its index, as NeMo Gym numbers tasks (the same on --resume, in every
    shard, and in every run of the same input)."""
    return _encode(task_index)


def affinity_value(task_index: Any) -> str:
    """The opaque value of --affinity-header for a task: the same in every run, distinct by task."""
    return hashlib.blake2b(b"rollfilter task " + task_key(task_index), digest_size=12).hexdigest()


def _ring_point(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


@dataclasses.dataclass(slots=True, eq=False)
class Replica:
    """One URL of an agent, with the counts the least-outstanding choice needs."""

    url: httpx.URL
    outstanding: int = 0
    requests: int = 0
    failures: int = 0
    cool_until: float = 0.0
    cooldown: float = 0.0  # not 0: its connections failed, and none has worked since
    cool_from: float = 0.0  # when its cool-down began
    refused: bool = False  # a connection to it was refused or dropped this run

    def connection_failed(self, now: float, sent: float | None = None) -> None:
        """A connection to it failed, for a request `sent` then (default: now). A request sent
        before the cool-down began is one of those out when it went down: it counts once."""
        self.refused = True
        if self.cooldown and sent is not None and sent < self.cool_from:
            return
        self.cooldown = min(COOLDOWN_CAP, self.cooldown * 2 or COOLDOWN_BASE)
        self.cool_from = now
        self.cool_until = now + self.cooldown

    def connection_worked(self) -> None:
        self.cooldown = 0.0
        self.cool_until = 0.0

    def takes(self, now: float) -> bool:
        """Whether it takes a request now: not cooling down, and, on trial after a cool-down,
        none out yet."""
        return self.cool_until <= now and not (self.cooldown and self.outstanding)


class TaskPlacement:
    """Every rollout of a task on one replica: consistent hashing with bounded loads (Mirrokni,
    Thorup and Zadimoghaddam, 2018), decided once a task.

    Each replica stands at POINTS_PER_REPLICA places on a ring, by its URL. A task is placed on
    the first replica clockwise from the task's own point that is not cooling down and holds at
    most BALANCE times the mean of the requests outstanding; its later rollouts follow it there,
    over the bound or not (a task's burst of K spilling over would lose the cache it is placed
    for). A replica that cools down moves only its own tasks, and new ones come back once it is
    up. Per replica, `placed` counts the tasks placed on it, and `moved_for_load` and
    `moved_for_failure` those of its own that went elsewhere."""

    def __init__(self, replicas: list[Replica], balance: float = BALANCE) -> None:
        self.replicas = replicas
        self._balance = balance
        points = sorted(
            (_ring_point(b"%s#%d" % (str(replica.url).encode(), number)), index)
            for index, replica in enumerate(replicas)
            for number in range(POINTS_PER_REPLICA)
        )
        self._points = [point for point, _ in points]
        self._owners = [index for _, index in points]
        self._placed: collections.OrderedDict[bytes, int] = collections.OrderedDict()
        self.placed = [0] * len(replicas)
        self.moved_for_load = [0] * len(replicas)
        self.moved_for_failure = [0] * len(replicas)

    def pick(self, key: bytes, now: float, avoid: Replica | None = None) -> Replica:
        """The replica of the task `key`; not `avoid` (the replica that just failed the row) while
        another can take it."""
        at = self._placed.get(key)
        if at is not None:
            replica = self.replicas[at]
            if replica.takes(now) and replica is not avoid:
                self._placed.move_to_end(key)
                return replica
            if replica.cool_until <= now:  # avoided, or its trial request out: this attempt only, the task stays
                return self._place(key, now, avoid, keep=False)
        return self._place(key, now, avoid, keep=True)

    def _place(self, key: bytes, now: float, avoid: Replica | None, *, keep: bool) -> Replica:
        replicas = self.replicas
        up = [replica.takes(now) and replica is not avoid for replica in replicas]
        if not any(up):
            up = [replica.takes(now) for replica in replicas]
        if not any(up):  # all cooling down: the one back first
            return min(replicas, key=lambda replica: replica.cool_until)
        outstanding = sum(replica.outstanding for replica, ready in zip(replicas, up, strict=True) if ready)
        bound = math.ceil(self._balance * (outstanding + 1) / sum(up))
        start = bisect.bisect_left(self._points, _ring_point(key)) % len(self._points)
        home: int | None = None
        chosen: int | None = None
        seen: set[int] = set()
        for step in range(len(self._points)):
            index = self._owners[(start + step) % len(self._points)]
            if index in seen:
                continue
            seen.add(index)
            if home is None:
                home = index
            if up[index] and replicas[index].outstanding + 1 <= bound:
                chosen = index
                break
            if len(seen) == len(replicas):
                break
        if chosen is None:  # every one at the bound: the least busy of those up
            chosen = min((i for i in range(len(replicas)) if up[i]), key=lambda i: replicas[i].outstanding)
        if keep:
            assert home is not None
            self._placed[key] = chosen
            if len(self._placed) > PLACED_TASKS:
                self._placed.popitem(last=False)
            self.placed[chosen] += 1
            if chosen != home:
                moved = self.moved_for_load if up[home] else self.moved_for_failure
                moved[home] += 1
        return replicas[chosen]


@dataclasses.dataclass(slots=True, eq=False)
class Agent:
    """An agent by name (None for -u), its replicas, and with --adaptive its window. With
    `placement`, a task's rollouts go to one replica (see TaskPlacement)."""

    name: str | None
    replicas: list[Replica]
    window: AdaptiveWindow | None = None
    budget: RetryBudget | None = None  # None: every failure gets its retries
    placement: TaskPlacement | None = None
    rate_limits: RateLimits | None = None  # its requests and tokens a minute
    former_rate_limits: RateLimits | None = None  # limits taken off while the run went: their figures stay
    answered: bool = False  # some attempt got past connecting (a reply, or a wait for one) this run
    refused_since: float | None = None  # when a connection to it first failed this run
    refusals: int = 0  # connections to it that failed this run

    def connection_failed(self, replica: Replica, now: float, sent: float) -> None:
        """A connection to `replica` failed, for a request `sent` then."""
        replica.connection_failed(now, sent)
        self.refusals += 1
        if self.refused_since is None:
            self.refused_since = now

    def unreachable(self, now: float, after: float) -> bool:
        """Whether it is judged down: no attempt of the run got past connecting to it, each of its
        replicas refused or dropped a connection, and its connections failed at least
        UNREACHABLE_AFTER_FAILURES times over at least `after` seconds."""
        return (
            not self.answered
            and self.refused_since is not None
            and now - self.refused_since >= after
            and self.refusals >= UNREACHABLE_AFTER_FAILURES
            and all(replica.refused for replica in self.replicas)
        )

    def pick(self, now: float, avoid: Replica | None = None, task: bytes | None = None) -> Replica:
        """The replica for a rollout of the task `task` (its `task_key`): by placement, or the one
        with the fewest requests outstanding among those not cooling down, preferring one other
        than `avoid` (the replica that just failed the row)."""
        if len(self.replicas) == 1:
            return self.replicas[0]
        if self.placement is not None and task is not None:
            return self.placement.pick(task, now, avoid)
        ready = [r for r in self.replicas if r.takes(now) and r is not avoid]
        if not ready:
            ready = [r for r in self.replicas if r.takes(now)] or [min(self.replicas, key=lambda r: r.cool_until)]
        return min(ready, key=lambda r: r.outstanding)


class Router:
    """Chooses the agent for a row: by its agent name (-e, or the head server), else -u.

    The name is the row's `agent_ref.name`, which -a has filled for rows that named none.
    `endpoints` (default: config.endpoints) may hold names from a head server too;
    `head` only makes the message for an unknown name say what the head server knows.
    """

    def __init__(
        self,
        config: Config,
        endpoints: Mapping[str, tuple[str, ...]] | None = None,
        head: HeadServerAgents | None = None,
        *,
        window_for: Callable[[str | None], AdaptiveWindow] | None = None,
        rate_limits_for: Callable[[str | None, float | None, float | None], RateLimits] | None = None,
    ) -> None:
        by_task = config.route_by_task

        def agent(name: str | None, urls: Iterable[str]) -> Agent:
            window = window_for(name) if window_for is not None else None
            ratio = config.retries.budget
            budget = RetryBudget(ratio) if ratio is not None else None
            replicas = [Replica(httpx.URL(url)) for url in urls]
            placement = TaskPlacement(replicas) if by_task and len(replicas) > 1 else None
            rpm, tpm = config.rates.for_agent(name)
            rate_limits = None
            if rpm is not None or tpm is not None:
                rate_limits = rate_limits_for(name, rpm, tpm) if rate_limits_for is not None else RateLimits(rpm, tpm)
            return Agent(name, replicas, window, budget, placement, rate_limits)

        self._default = agent(None, [config.url]) if config.url else None
        named = endpoints if endpoints is not None else config.endpoints
        self.agents = {name: agent(name, urls) for name, urls in named.items()}
        self._head = head
        rates = config.rates
        for field, limited in (("rates.rpm_by_agent", rates.rpm_by_agent), ("rates.tpm_by_agent", rates.tpm_by_agent)):
            unknown = sorted(set(limited) - set(self.agents))
            if unknown:
                raise ConfigError(field, f"names no agent of the run: {', '.join(map(repr, unknown))}")

    def route(self, name: str | None) -> Agent | AttemptFailure:
        """The agent for a row of agent `name` (None: the row names none), or a no_route failure."""
        if name is not None and name in self.agents:
            return self.agents[name]
        if self._default is not None:
            return self._default
        if name is None:
            message = "row has no agent_ref.name, and the run has no default agent or URL for it"
        elif self._head is not None and name in self._head.incomplete:
            message = f"agent {name!r} has no host and port in the head server's config"
        elif self._head is not None:
            message = f"agent {name!r} is not known to the head server (it knows: {self._head.describe_known()})"
        else:
            message = f"no endpoint for agent {name!r}, and the run has no URL for every row"
        return AttemptFailure(ErrorKind.NO_ROUTE, message)

    def agents_named(self, name: str | None) -> list[Agent]:
        """The agent of that name, or with None every agent of the run (the URL's too); LookupError
        for a name the run has no agent of."""
        every = [*self.agents.values(), *([self._default] if self._default is not None else [])]
        if name is None:
            return every
        if name not in self.agents:
            raise LookupError(name)
        return [self.agents[name]]

    def set_ceiling(self, concurrency: int) -> None:
        """Each agent's adaptive window (with `Config.adaptive`) opens to `concurrency` at most."""
        for agent in self.agents_named(None):
            if agent.window is not None:
                agent.window.set_ceiling(concurrency)

    def set_rates(self, name: str | None, *, rpm: float | None = KEEP, tpm: float | None = KEEP) -> None:
        """Change the requests (`rpm`) or tokens (`tpm`) a minute rows of agent `name` may use
        (None: every agent), for the requests waiting too; None removes a limit, and one not given
        (KEEP) stays. A limit taken off leaves its figures (`former_rate_limits`). SteeringError
        for an agent the run does not have, or a rate under its least (see `check_rates`)."""
        check_rates(rpm=rpm, tpm=tpm)
        try:
            targets = self.agents_named(name)
        except LookupError:
            raise SteeringError(f"the run has no agent {name!r}") from None
        for target in targets:
            limits = target.rate_limits
            new_rpm = (limits.rpm if limits is not None else None) if rpm is KEEP else rpm
            new_tpm = (limits.tpm if limits is not None else None) if tpm is KEEP else tpm
            if limits is not None:
                limits.set(new_rpm, new_tpm)  # the requests waiting on them look again
                if new_rpm is None and new_tpm is None:  # a plain path again (its figures stay in the summary)
                    target.rate_limits, target.former_rate_limits = None, limits
            elif new_rpm is not None or new_tpm is not None:
                target.rate_limits, target.former_rate_limits = RateLimits(new_rpm, new_tpm), None

    def requests_out(self) -> int:
        """The requests at the agents now, over every replica."""
        return sum(replica.outstanding for agent in self.agents_named(None) for replica in agent.replicas)

    def run_url(self, name: str) -> str | None:
        """The /run URL rows of agent `name` go to (its first replica), or None."""
        agent = self.agents.get(name) or self._default
        return str(agent.replicas[0].url) if agent is not None else None

    def retries_withheld(self) -> int:
        """Retries the agents' budgets did not send, over the run."""
        return sum(withheld for _, withheld in self.withheld_by_agent())

    def withheld_by_agent(self) -> list[tuple[str | None, int]]:
        """Retries each agent's budget did not send, by agent name (None for -u)."""
        agents = [*self.agents.values(), *([self._default] if self._default is not None else [])]
        return [(agent.name, agent.budget.withheld) for agent in agents if agent.budget is not None]

    def replica_counts(self) -> list[dict[str, Any]]:
        """Requests and failures per replica, for agents that have more than one; placed by task,
        the tasks placed on it and those of its own moved for load or for its failure."""
        counts = []
        for agent in self.agents.values():
            if len(agent.replicas) < 2:
                continue
            placement = agent.placement
            for index, replica in enumerate(agent.replicas):
                figures: dict[str, Any] = {
                    "agent": agent.name,
                    "url": shown(replica.url),
                    "requests": replica.requests,
                    "failures": replica.failures,
                }
                if placement is not None:
                    figures["tasks"] = placement.placed[index]
                    figures["tasks_moved_for_load"] = placement.moved_for_load[index]
                    figures["tasks_moved_for_failure"] = placement.moved_for_failure[index]
                counts.append(figures)
        return counts


def adaptive_windows(
    concurrency: int, on_event: Callable[[str], None] | None
) -> Callable[[str | None], AdaptiveWindow]:
    """How a router makes each agent's adaptive window (its `window_for`): starting at
    `concurrency`, each change of its size said to `on_event` (-v)."""

    def window_for(name: str | None) -> AdaptiveWindow:
        label = name if name is not None else UNNAMED_AGENT

        def changed(old: int, new: int) -> None:
            if on_event is not None:
                on_event(f"agent {label}: window {old} -> {new}")

        return AdaptiveWindow(concurrency, on_change=changed)

    return window_for


def check_rates(*, rpm: float | None = KEEP, tpm: float | None = KEEP) -> None:
    """SteeringError for a rate a run cannot be paced at: not a number, or under its least."""
    for name, rate in (("rpm", rpm), ("tpm", tpm)):
        if (
            rate is not KEEP
            and rate is not None
            and not (type(rate) in (int, float) and math.isfinite(rate) and rate >= MIN_RATE)
        ):
            raise SteeringError(f"{name} is a number of at least {MIN_RATE:g}, not {rate!r}")
