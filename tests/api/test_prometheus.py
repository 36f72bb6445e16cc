"""prometheus.py: a run's figures as Prometheus metrics, and in a caller's own registry."""

from __future__ import annotations

import dataclasses
import threading

import pytest
import trio
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from rollfilter import Config, open_rollouts
from rollfilter.api.in_trio import LiveFigures, RolloutRun, open_rollouts_in_trio
from rollfilter.api.prometheus import OUTCOMES, PrometheusCollector, exposition, families, register
from rollfilter.config import Cost, Groups, Rates, Retries
from rollfilter.demo import DemoAgent, serve
from rollfilter.engine.routing import Router
from rollfilter.errors import ErrorKind
from rollfilter.figures.health import CHECKS
from rollfilter.outcomes import AttemptFailure, Outcome
from rollfilter.run.run import Run
from rollfilter.run.statistics import AgentStatistics, RunStatistics
from tests.conftest import URL
from tests.engine.test_steering import StandIn, collect, rows


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text.decode())
        for sample in family.samples
    }


def registry_of(run: Run) -> CollectorRegistry:
    registry = CollectorRegistry()
    registry.register(PrometheusCollector(LiveFigures(run, None, threading.get_ident())))  # type: ignore[arg-type]
    return registry


def test_the_figures_by_agent_and_outcome_each_outcome_from_zero():
    run = Run(Config(url="http://127.0.0.1:9/run", cost=Cost(prices=(("a", _price()),))))
    metrics = run.metrics
    metrics.add_result({"reward": 1.0, "response": {"usage": {"total_tokens": 7}}}, 0.2, "a")
    metrics.add_result({"reward": 0.0, "response": {"usage": {"total_tokens": 3}}}, 2.0, "a")
    metrics.add_failure(AttemptFailure(ErrorKind.HTTP_STATUS, "429", status=429), "b")
    metrics.add_retry(AttemptFailure(ErrorKind.TIMEOUT, "slow"), "a")
    metrics.add_not_persisted(None)
    assert metrics.spending is not None
    metrics.spending.add("a", {"response": {"usage": {"input_tokens": 1_000_000, "output_tokens": 0}}})
    figures = samples(exposition(registry_of(run)))

    def ended(agent: str, outcome: str) -> float:
        return figures["rollfilter_rollouts_total", (("agent", agent), ("outcome", outcome))]

    assert ended("a", "succeeded") == 2
    assert ended("b", "http_status") == 1
    assert ended("(no name)", "not_persisted") == 1
    assert ended("b", "succeeded") == ended("a", "timeout") == 0  # every outcome of an agent seen
    assert {
        o for (name, labels) in figures if name == "rollfilter_rollouts_total" for k, o in labels if k == "outcome"
    } == set(OUTCOMES)
    assert figures["rollfilter_retries_total", (("agent", "a"),)] == 1
    assert figures["rollfilter_throttled_replies_total", (("agent", "b"),)] == 1
    assert figures["rollfilter_tokens_total", (("agent", "a"),)] == 10
    assert figures["rollfilter_reward_mean", (("agent", "a"),)] == 0.5
    assert figures["rollfilter_rollout_duration_seconds_bucket", (("le", "0.25"),)] == 1
    assert figures["rollfilter_rollout_duration_seconds_bucket", (("le", "2.5"),)] == 2
    assert figures["rollfilter_rollout_duration_seconds_bucket", (("le", "+Inf"),)] == 2
    assert figures["rollfilter_rollout_duration_seconds_count", ()] == 2
    assert figures["rollfilter_rollout_duration_seconds_sum", ()] == pytest.approx(2.2)
    assert figures["rollfilter_cost_usd_total", (("agent", "a"),)] == 1.0
    assert not any(name == "rollfilter_adaptive_window" for name, _ in figures)  # only with an adaptive window


def _price():  # type: ignore[no-untyped-def]
    from rollfilter.cost import Price

    return Price(1.0, 2.0)


def test_describe_names_the_metrics_without_reading_a_figure():
    run = Run(Config(url="http://127.0.0.1:9/run"))
    collector = PrometheusCollector(LiveFigures(run, None, threading.get_ident()))  # type: ignore[arg-type]
    names = {family.name for family in collector.describe()}
    assert {"rollfilter_rollouts", "rollfilter_rollout_duration_seconds", "rollfilter_reward_mean"} <= names
    assert all(not family.samples for family in collector.describe())
    registry = CollectorRegistry()
    registry.register(collector)
    with pytest.raises(ValueError, match="Duplicated timeseries"):  # one run a registry
        registry.register(PrometheusCollector(LiveFigures(run, None, threading.get_ident())))  # type: ignore[arg-type]


def weather_rows() -> list[dict]:
    return [{"responses_create_params": {"input": f"q{i}"}} for i in range(5)]


async def test_a_callers_registry_scraped_in_the_run_and_from_another_thread(monkeypatch: pytest.MonkeyPatch):
    read_in: list[tuple[int, bool]] = []  # each read's thread, and whether the run had ended
    runs: list[RolloutRun] = []

    take = Run.statistics

    def recorded(parts: Run) -> RunStatistics:
        figures = runs[0].figures if runs else None
        read_in.append((threading.get_ident(), figures is not None and figures.ended))
        return take(parts)

    monkeypatch.setattr(Run, "statistics", recorded)
    agent = DemoAgent()
    registry = CollectorRegistry()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve(agent, task_status=task_status))
        config = Config(url=f"http://127.0.0.1:{port}", repeats=2, retries=Retries(count=0))
        async with open_rollouts(weather_rows(), config) as run:
            runs.append(run)
            collector = register(run, registry)
            first = await anext(run)
            assert first is not None
            mid_run = samples(generate_latest(registry))
            from_a_thread = samples(await trio.to_thread.run_sync(generate_latest, registry))
            rest = [outcome async for outcome in run]
        nursery.cancel_scope.cancel()
    assert mid_run["rollfilter_rollouts_total", (("agent", "(no name)"), ("outcome", "succeeded"))] >= 1
    assert from_a_thread["rollfilter_rollouts_started_total", ()] >= 1
    assert len(read_in) >= 3
    # The figures are read in the run's thread while it goes; once it has ended, where they are.
    assert all(thread == threading.get_ident() or ended for thread, ended in read_in)
    assert len(rest) == 9
    assert run.summary is not None
    at_the_end = samples(await trio.to_thread.run_sync(generate_latest, registry))  # the run has ended
    ended = at_the_end["rollfilter_rollouts_total", (("agent", "(no name)"), ("outcome", "succeeded"))]
    assert ended == run.summary["rollfilter"]["succeeded"] == 10
    assert at_the_end["rollfilter_reward_mean", (("agent", "(no name)"),)] == run.summary["reward"]
    registry.unregister(collector)
    assert b"rollfilter_" not in generate_latest(registry)


def test_rollouts_taken_and_not_ended_nor_in_flight_are_counted_cancelled():
    run = Run(Config(url="http://127.0.0.1:9/run"))
    run.metrics.taken = 3  # three taken, one ended, no engine to hold the others in flight: a stop cut them
    run.metrics.add_result({"reward": 1.0}, 0.1, None)
    figures = samples(exposition(registry_of(run)))
    assert figures["rollfilter_rollouts_cancelled_total", ()] == 2
    assert figures["rollfilter_rollouts_started_total", ()] == 3


def test_families_of_a_run_not_connected_yet():
    found = {family.name for family in families(Run(Config(url="http://127.0.0.1:9/run")).statistics())}
    assert "rollfilter_rollouts_in_flight" in found


async def test_requests_waiting_on_a_rate_limit_and_the_seconds_they_waited(autojump_clock):
    run = Run(Config(url="http://127.0.0.1:9/run", endpoints={"a": ("http://127.0.0.1:9/run",)}, rates=Rates(rpm=60)))
    run.router = Router(run.config)  # the agents own their limits: a run's router makes them
    (agent,) = run.router.agents_named("a")
    limits = agent.rate_limits
    assert limits is not None

    def figures() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        return samples(exposition(registry_of(run)))

    await limits.acquire()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(limits.acquire)  # the second of a minute's 60: it waits its turn
        await trio.sleep(0.1)
        assert figures()["rollfilter_rollouts_waiting_on_rate_limits", (("agent", "a"),)] == 1
    ended = figures()
    assert ended["rollfilter_rollouts_waiting_on_rate_limits", (("agent", "a"),)] == 0
    assert ended["rollfilter_rate_limit_wait_seconds_total", (("agent", "a"),)] == limits.waited_s > 0.5


def test_a_row_naming_its_agent_as_the_unnamed_rows_label_gives_no_series_twice():
    run = Run(Config(url="http://127.0.0.1:9/run"))
    run.metrics.add_result({"reward": 1.0, "response": {"usage": {"total_tokens": 2}}}, 0.1, "(no name)")
    run.metrics.add_result({"reward": 0.0, "response": {"usage": {"total_tokens": 3}}}, 0.1, None)
    run.metrics.add_retry(AttemptFailure(ErrorKind.TIMEOUT, "slow"), None)
    text = exposition(registry_of(run)).decode()
    series = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(series) == len(set(series))
    figures = samples(text.encode())
    assert figures["rollfilter_tokens_total", (("agent", "(no name)"),)] == 5
    assert figures["rollfilter_reward_mean", (("agent", "(no name)"),)] == 0.5
    assert figures["rollfilter_retries_total", (("agent", "(no name)"),)] == 1


async def test_a_scrape_after_the_run_ended_reads_the_figures_without_its_loop():
    agent = DemoAgent()
    registry = CollectorRegistry()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve(agent, task_status=task_status))
        async with open_rollouts(weather_rows(), Config(url=f"http://127.0.0.1:{port}")) as run:
            register(run, registry)
            assert len([outcome async for outcome in run]) == 5
        scraped: list[bytes] = []
        scraper = threading.Thread(target=lambda: scraped.append(generate_latest(registry)))
        scraper.start()
        scraper.join(timeout=10)  # the run's loop blocked meanwhile, as by a trainer's own step
        answered_at_once = bool(scraped)
        nursery.cancel_scope.cancel()
    scraper.join(timeout=10)  # (with the loop free again, a scrape that waited for it ends too)
    assert answered_at_once, "the scrape waited for the run's loop"
    assert b'rollfilter_rollouts_total{agent="(no name)",outcome="succeeded"} 5.0' in scraped[0]


async def test_the_pause_the_concurrency_limit_the_version_and_what_staleness_holds(autojump_clock):
    agent = StandIn(lambda row: 1.0)
    config = Config(url=URL, concurrency=64, repeats=2, groups=Groups(max_staleness=0, batch=1), policy_version=5)
    taken: list[Outcome] = []
    async with open_rollouts_in_trio(rows(3), config, transport=agent) as run, trio.open_nursery() as nursery:
        nursery.start_soon(collect, run, taken)
        await trio.sleep(0.5)
        run.pause()
        run.set_concurrency(7)
        registry = CollectorRegistry()
        register(run, registry)
        figures = samples(exposition(registry))
        assert figures["rollfilter_paused", ()] == 1
        assert figures["rollfilter_concurrency_limit", (("agent", "(no name)"),)] == 7
        assert figures["rollfilter_policy_version", ()] == 5
        assert figures["rollfilter_rollouts_waiting_on_policy_version", ()] == 4  # groups 1 and 2, two rollouts each
        assert figures["rollfilter_groups_waiting_on_policy_version", ()] == 2
        run.resume()
        run.set_policy_version(7)
        await trio.sleep(10)
        figures = samples(exposition(registry))
        assert figures["rollfilter_paused", ()] == 0
        assert figures["rollfilter_policy_version", ()] == 7
        assert figures["rollfilter_rollouts_waiting_on_policy_version", ()] == 0
    assert len(taken) == 3


async def test_rollouts_waiting_are_neither_in_flight_nor_cancelled(autojump_clock):
    config = Config(url=URL, concurrency=4, adaptive=True)
    async with open_rollouts_in_trio(rows(12), config, transport=StandIn()) as run, trio.open_nursery() as nursery:
        nursery.start_soon(collect, run, [])
        run.pause()  # before anything is sent: the four rows taken wait
        await trio.sleep(1)
        registry = CollectorRegistry()
        register(run, registry)
        figures = samples(exposition(registry))
        run.resume()
    assert figures["rollfilter_rollouts_started_total", ()] == 4
    assert figures["rollfilter_rollouts_in_flight", (("agent", "(no name)"),)] == 0
    assert figures["rollfilter_rollouts_waiting_on_pause", ()] == 4
    assert figures["rollfilter_rollouts_waiting_on_window", ()] == 0
    assert figures["rollfilter_rollouts_cancelled_total", ()] == 0


def test_a_plain_run_has_no_version_nor_staleness_figures():
    names = {family.name for family in families(Run(Config(url="http://127.0.0.1:9/run")).statistics())}
    assert {"rollfilter_paused", "rollfilter_concurrency_limit"} <= names
    assert not names & {"rollfilter_policy_version", "rollfilter_rollouts_waiting_on_policy_version"}


def test_output_tokens_as_a_histogram():
    run = Run(Config(url="http://127.0.0.1:9/run"))
    for tokens, agent in ((10, "a"), (100, "a"), (5000, "b"), (300_000, None)):
        run.metrics.add_result({"reward": 1.0, "response": {"usage": {"output_tokens": tokens}}}, 0.1, agent)
    run.metrics.add_result({"reward": 1.0}, 0.1)  # no usage: not counted
    figures = samples(exposition(registry_of(run)))

    def under(bound: str) -> float:
        return figures["rollfilter_rollout_output_tokens_bucket", (("le", bound),)]

    assert [under(b) for b in ("16", "64", "256", "4096", "16384", "262144", "+Inf")] == [1, 1, 2, 2, 3, 3, 4]
    assert figures["rollfilter_rollout_output_tokens_count", ()] == 4
    assert figures["rollfilter_rollout_output_tokens_sum", ()] == 305_110


def test_a_scrape_renders_the_snapshot_the_run_gives():
    run = Run(Config(url="http://127.0.0.1:9/run"))
    taken = run.statistics()
    agent = AgentStatistics(seen=True, succeeded=5, in_flight=2, tokens=40.0, reward_mean=0.25)
    shown = dataclasses.replace(taken, started=9, succeeded=5, cancelled=9 - 5, in_flight=2, agents={"a": agent})
    run.statistics = lambda: shown  # type: ignore[method-assign]
    figures = samples(exposition(registry_of(run)))
    assert figures["rollfilter_rollouts_started_total", ()] == 9
    assert figures["rollfilter_rollouts_cancelled_total", ()] == 9 - 5 - 2
    assert figures["rollfilter_rollouts_total", (("agent", "a"), ("outcome", "succeeded"))] == 5
    assert figures["rollfilter_rollouts_in_flight", (("agent", "a"),)] == 2
    assert figures["rollfilter_tokens_total", (("agent", "a"),)] == 40
    assert figures["rollfilter_reward_mean", (("agent", "a"),)] == 0.25


def test_the_unhealthy_rollouts_by_check_each_check_from_zero():
    run = Run(Config(url="http://127.0.0.1:9/run"))
    run.metrics.add_result({"response": {"output": []}}, 0.1, None, checks=["empty_output"])
    run.metrics.add_result({"response": {"output": []}}, 0.1, None, checks=["empty_output", "response_error"])
    figures = samples(exposition(registry_of(run)))
    family = "rollfilter_rollouts_unhealthy_total"
    unhealthy = {labels: value for (name, labels), value in figures.items() if name == family}
    assert unhealthy == {
        (("check", check),): {"empty_output": 2, "response_error": 1}.get(check, 0) for check in CHECKS
    }
