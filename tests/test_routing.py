"""routing.py: which agent a row goes to."""

from __future__ import annotations

import dataclasses

import httpx

from rollfilter.config import Config, Retries
from rollfilter.outcomes import AttemptFailure
from rollfilter.routing import Router


def test_router_prefers_named_endpoint_then_url():
    config = Config(url="http://d/run", endpoints={"a": ("http://a/run",)})
    router = Router(config)
    route = router.route("a")
    assert not isinstance(route, AttemptFailure)
    assert route.replicas[0].url == httpx.URL("http://a/run")
    route = router.route("other")
    assert not isinstance(route, AttemptFailure)
    assert route.name is None
    assert isinstance(Router(Config(endpoints={"a": ("http://a/run",)})).route(None), AttemptFailure)


def test_each_agent_has_a_retry_budget_of_its_own_at_the_ratio_given():
    config = Config(url="http://d/run", endpoints={"a": ("http://a/run",), "b": ("http://b/run",)})
    router = Router(dataclasses.replace(config, retries=Retries(budget=0.5)))
    budgets = [agent.budget for agent in (router.route("a"), router.route("b"), router.route(None))]
    assert [budget.ratio for budget in budgets] == [0.5, 0.5, 0.5]  # type: ignore[union-attr]
    assert len({id(budget) for budget in budgets}) == 3
    assert all(
        agent.budget is None
        for agent in Router(dataclasses.replace(config, retries=Retries(budget=None))).agents.values()
    )
