"""routing.py: which agent a row goes to."""

from __future__ import annotations

import dataclasses

import httpx

from rollfilter.config import Config, Retries
from rollfilter.engine.routing import Router
from rollfilter.outcomes import AttemptFailure


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

from rollfilter.engine.routing import BALANCE, Agent, Replica, TaskPlacement, affinity_value, task_key  # noqa: E402


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
    unloaded = TaskPlacement(replicas())  # where each task goes with nothing outstanding: its home
    homed = {task for task in new if unloaded.pick(task_key(task), 0.0).url == home.url}
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


# A replica that blips: failures together count once; back, it is tried with one request.

from rollfilter.engine.routing import COOLDOWN_BASE, COOLDOWN_CAP  # noqa: E402


def test_failures_of_the_requests_out_when_a_replica_went_down_count_once():
    replica = replicas(1)[0]
    replica.connection_failed(1.0, sent=0.5)
    for now in (1.01, 1.02, 1.3):  # eight more of those sent before it went down
        replica.connection_failed(now, sent=0.9)
    assert (replica.cooldown, replica.cool_until) == (COOLDOWN_BASE, 1.0 + COOLDOWN_BASE)
    replica.connection_failed(2.1, sent=2.0)  # its trial, sent after the cool-down began: it doubles
    assert (replica.cooldown, replica.cool_until) == (2 * COOLDOWN_BASE, 2.1 + 2 * COOLDOWN_BASE)


def test_the_cool_down_of_a_replica_that_stays_down_stays_within_a_few_seconds():
    replica = replicas(1)[0]
    for attempt in range(20):
        now = float(attempt * 10)
        replica.connection_failed(now, sent=now)
    assert replica.cooldown == COOLDOWN_CAP <= 5.0


@pytest.mark.parametrize("by_task", [False, True])
def test_a_replica_past_its_cool_down_takes_one_trial_request_at_a_time(by_task: bool):
    fleet = replicas(3)
    agent = Agent("a", fleet, placement=TaskPlacement(fleet) if by_task else None)
    down = fleet[1]
    down.connection_failed(1.0)
    now = 1.0 + COOLDOWN_BASE

    def sent(task: int) -> Replica:
        replica = agent.pick(now, task=task_key(task) if by_task else None)
        replica.outstanding += 1
        return replica

    picked = [sent(task) for task in range(60)]
    assert picked.count(down) == 1  # its trial; the others go elsewhere while it is out
    down.outstanding -= 1
    down.connection_worked()  # the trial got through: it takes its share again
    assert [sent(task) for task in range(60, 120)].count(down) >= 15


DOWN_FROM, BACK_AT = 1.0, 2.4  # the blip of the model below, in seconds


def replica_down(replica: Replica, fleet: list[Replica], now: float) -> bool:
    return replica is fleet[1] and DOWN_FROM <= now < BACK_AT


@pytest.mark.parametrize("by_task", [False, True])
async def test_a_replica_that_blips_is_back_within_a_few_seconds_and_tried_not_flooded(
    autojump_clock: trio.testing.MockClock, by_task: bool
):
    """Three replicas, 32 rollouts at once of 0.1 s each, replica 1 down from 1.0 s to 2.4 s (its
    connections refused, those out dropped), as the client (client.py) uses the router."""
    fleet = replicas(3)
    agent = Agent("a", fleet, placement=TaskPlacement(fleet) if by_task else None)
    sent_to_down: list[float] = []  # when each request to replica 1 went out
    failed_at: list[float] = []  # when each of its failures was seen
    jobs = iter(range(3200))

    async def worker() -> None:
        for task in jobs:
            avoid = None
            while True:
                now = trio.current_time()
                replica = agent.pick(now, avoid=avoid, task=task_key(task // 4) if by_task else None)
                replica.outstanding += 1
                if replica is fleet[1]:
                    sent_to_down.append(now)
                if replica_down(replica, fleet, now):
                    await trio.sleep(0.001)  # refused
                    failed = True
                else:
                    await trio.sleep(0.1)
                    failed = replica_down(replica, fleet, trio.current_time())  # dropped as it went down
                replica.outstanding -= 1
                if not failed:
                    replica.connection_worked()
                    break
                if replica is fleet[1]:
                    failed_at.append(trio.current_time())
                replica.connection_failed(trio.current_time(), sent=now)
                avoid = replica

    async with trio.open_nursery() as nursery:
        for _ in range(32):
            nursery.start_soon(worker)
    # Requests sent up to the moment its first failure was seen could not have known of it (how
    # many depends on the order trio runs the workers in): those after are the router's choice.
    during = [at for at in sent_to_down if min(failed_at) < at < BACK_AT]
    assert len(during) <= 3, during  # a trial request or two, not a flood
    first_back = min(at for at in sent_to_down if at >= BACK_AT)
    assert first_back < BACK_AT + COOLDOWN_CAP  # tried again, and so back, within a few seconds
    end = trio.current_time()
    later = [at for at in sent_to_down if at >= first_back + 1.0]
    assert len(later) >= 0.25 * 32 / 0.1 * (end - first_back - 1.0)  # its share (a third) again


def test_an_agent_is_judged_down_only_once_every_replica_refused():
    """One replica refusing for long enough is a replica down, not the agent: the other may only be slow."""
    from rollfilter.engine.routing import UNREACHABLE_AFTER_FAILURES, Agent, Replica

    down, slow = Replica(httpx.URL("http://127.0.0.1:1/run")), Replica(httpx.URL("http://127.0.0.1:2/run"))
    agent = Agent("a", [down, slow])
    for second in range(UNREACHABLE_AFTER_FAILURES):
        agent.connection_failed(down, float(second), float(second))
    later = UNREACHABLE_AFTER_FAILURES + 20.0
    assert not agent.unreachable(later, after=10.0)
    agent.connection_failed(slow, later, later)
    assert agent.unreachable(later, after=10.0)
