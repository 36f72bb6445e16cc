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


# Every rollout of a task on one replica: consistent hashing with bounded loads.

import collections  # noqa: E402

import pytest  # noqa: E402
import trio  # noqa: E402
import trio.testing  # noqa: E402

from rollfilter.routing import BALANCE, Agent, Replica, TaskPlacement, affinity_value, task_key  # noqa: E402


def replicas(count: int = 4) -> list[Replica]:
    return [Replica(httpx.URL(f"http://127.0.0.1:{9000 + index}/run")) for index in range(count)]


def test_a_task_is_placed_by_its_key_alone_the_same_in_every_run():
    keys = [task_key(task) for task in range(400)]
    first, second = TaskPlacement(replicas()), TaskPlacement(replicas())
    placed = [first.replicas.index(first.pick(key, 0.0)) for key in keys]
    assert placed == [second.replicas.index(second.pick(key, 0.0)) for key in keys]
    shares = collections.Counter(placed)
    assert len(shares) == 4
    assert max(shares.values()) < 1.4 * 100  # each replica a fair share of the ring
    assert task_key("a") != task_key(["a"])
    assert affinity_value(3) == affinity_value(3) != affinity_value(4)


def test_a_replica_over_the_bound_passes_new_tasks_on_but_keeps_its_own_rollouts():
    placement = TaskPlacement(replicas())
    key = task_key(7)
    home = placement.pick(key, 0.0)
    home.outstanding = 10  # the others: none, so the bound is ceil(1.25 x 11 / 4) = 4
    assert placement.pick(key, 0.0) is home  # a placed task follows its replica, over the bound or not
    new = [task for task in range(1000) if task != 7]
    others = {task for task in new if placement.pick(task_key(task), 0.0) is not home}
    homed = {task for task in new if TaskPlacement(replicas()).pick(task_key(task), 0.0).url == home.url}
    assert homed
    assert homed <= others  # every new task homed there went elsewhere
    assert placement.moved_for_load[placement.replicas.index(home)] == len(homed)


def test_a_replica_that_fails_moves_only_its_own_tasks_and_new_ones_come_back():
    placement = TaskPlacement(replicas())
    tasks = range(300)
    before = {task: placement.pick(task_key(task), 0.0) for task in tasks}
    down = before[0]
    down.connection_failed(1.0)  # cools down until 2.0
    during = {task: placement.pick(task_key(task), 1.5) for task in tasks}
    assert all(during[task] is not down for task in tasks)
    assert all(during[task] is before[task] for task in tasks if before[task] is not down)
    assert placement.moved_for_failure[placement.replicas.index(down)] == sum(r is down for r in before.values())
    fresh = range(1000, 1300)
    back = TaskPlacement(replicas())
    homed = {task for task in fresh if back.pick(task_key(task), 0.0).url == down.url}
    assert {task for task in fresh if placement.pick(task_key(task), 3.0) is down} == homed  # it is up again


def test_a_retry_avoids_the_replica_that_failed_it_without_moving_the_task():
    placement = TaskPlacement(replicas())
    key = task_key(1)
    home = placement.pick(key, 0.0)
    assert placement.pick(key, 0.0, avoid=home) is not home
    assert placement.pick(key, 0.0) is home


@pytest.mark.parametrize(("route_by_task", "least_hits"), [(True, 0.85), (False, 0.0)])
async def test_on_the_fleet_model_a_tasks_rollouts_share_one_prefix_cache(
    autojump_clock: trio.testing.MockClock, route_by_task: bool, least_hits: float
):
    """The fleet of the benchmark, modelled: 4 replicas of 8 slots, an LRU cache of 32 prompts, 0.05 s
    a hit and 0.2 s a miss; 200 tasks of 8 rollouts, 64 at once."""
    fleet = replicas()
    agent = Agent("a", fleet, placement=TaskPlacement(fleet) if route_by_task else None)
    slots = {id(replica): trio.CapacityLimiter(8) for replica in fleet}
    caches: dict[int, collections.OrderedDict[int, None]] = {
        id(replica): collections.OrderedDict() for replica in fleet
    }
    hits = 0
    jobs = iter([(task, rollout) for task in range(200) for rollout in range(8)])

    async def worker() -> None:
        nonlocal hits
        for task, _ in jobs:
            replica = agent.pick(trio.current_time(), task=task_key(task))
            replica.outstanding += 1
            replica.requests += 1
            async with slots[id(replica)]:
                cache = caches[id(replica)]
                hit = task in cache
                cache[task] = None
                cache.move_to_end(task)
                if len(cache) > 32:
                    cache.popitem(last=False)
                hits += hit
                await trio.sleep(0.05 if hit else 0.2)
            replica.outstanding -= 1

    async with trio.open_nursery() as nursery:
        for _ in range(64):
            nursery.start_soon(worker)
    rate = hits / 1600
    requests = [replica.requests for replica in fleet]
    if route_by_task:
        assert rate >= least_hits
        assert max(requests) <= BALANCE * (sum(requests) / 4)
    else:
        assert rate < 0.7  # least-outstanding scatters a task's rollouts
