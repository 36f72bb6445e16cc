"""Where a row goes: the agent its name picks (or -u), and which replica of it.

A replica whose connections fail sits out a growing cool-down, and its rows go to another.
With --adaptive, each agent carries its window (see adaptive.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import httpx

from rollfilter.adaptive import AdaptiveWindow
from rollfilter.budget import RetryBudget
from rollfilter.config import Config
from rollfilter.errors import ErrorKind
from rollfilter.outcomes import AttemptFailure
from rollfilter.redact import shown

if TYPE_CHECKING:
    from rollfilter.headserver import HeadServerAgents

COOLDOWN_BASE = 1.0  # a replica whose connections fail sits out this long, doubling
COOLDOWN_CAP = 60.0


@dataclasses.dataclass(slots=True, eq=False)
class Replica:
    """One URL of an agent, with the counts the least-outstanding choice needs."""

    url: httpx.URL
    outstanding: int = 0
    requests: int = 0
    failures: int = 0
    cool_until: float = 0.0
    cooldown: float = 0.0

    def connection_failed(self, now: float) -> None:
        self.cooldown = min(COOLDOWN_CAP, self.cooldown * 2 or COOLDOWN_BASE)
        self.cool_until = now + self.cooldown

    def connection_worked(self) -> None:
        self.cooldown = 0.0
        self.cool_until = 0.0


@dataclasses.dataclass(slots=True, eq=False)
class Agent:
    """An agent by name (None for -u), its replicas, and with --adaptive its window."""

    name: str | None
    replicas: list[Replica]
    window: AdaptiveWindow | None = None
    budget: RetryBudget | None = None  # None: every failure gets its retries

    def pick(self, now: float, avoid: Replica | None = None) -> Replica:
        """The replica with the fewest requests outstanding among those not cooling down,
        preferring one other than `avoid` (the replica that just failed the row)."""
        if len(self.replicas) == 1:
            return self.replicas[0]
        ready = [r for r in self.replicas if r.cool_until <= now and r is not avoid]
        if not ready:
            ready = [r for r in self.replicas if r.cool_until <= now] or [
                min(self.replicas, key=lambda r: r.cool_until)
            ]
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
    ) -> None:
        def agent(name: str | None, urls: Iterable[str]) -> Agent:
            window = window_for(name) if window_for is not None else None
            ratio = config.retries.budget
            budget = RetryBudget(ratio) if ratio is not None else None
            return Agent(name, [Replica(httpx.URL(url)) for url in urls], window, budget)

        self._default = agent(None, [config.url]) if config.url else None
        named = endpoints if endpoints is not None else config.endpoints
        self.agents = {name: agent(name, urls) for name, urls in named.items()}
        self._head = head

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

    def run_url(self, name: str) -> str | None:
        """The /run URL rows of agent `name` go to (its first replica), or None."""
        agent = self.agents.get(name) or self._default
        return str(agent.replicas[0].url) if agent is not None else None

    def retries_withheld(self) -> int:
        """Retries the agents' budgets did not send, over the run."""
        agents = [*self.agents.values(), *([self._default] if self._default is not None else [])]
        return sum(agent.budget.withheld for agent in agents if agent.budget is not None)

    def replica_counts(self) -> list[dict[str, Any]]:
        """Requests and failures per replica, for agents that have more than one."""
        return [
            {
                "agent": agent.name,
                "url": shown(replica.url),
                "requests": replica.requests,
                "failures": replica.failures,
            }
            for agent in self.agents.values()
            if len(agent.replicas) > 1
            for replica in agent.replicas
        ]
