"""cli/command.py: a command-line run's config, and the command line that builds it from its options."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import trio

from rollfilter import rollouts
from rollfilter.cli import options
from rollfilter.cli.command import CommandConfig
from rollfilter.cli.options import typer_app
from rollfilter.config import (
    Config,
    ConfigError,
    Cost,
    FailureLimit,
    Groups,
    Health,
    Rates,
    Repeats,
    Retries,
    Reverify,
    Routing,
    Timeouts,
    Tls,
    Trackers,
    Wire,
)
from rollfilter.cost import Price
from rollfilter.demo import DemoOptions
from rollfilter.errors import ExitStatus, UsageError
from tests.conftest import closed_port_url, rows_jsonl, run, simple_rows
from tests.conftest import run as run_command


def test_a_command_config_never_changes_the_engine_config_it_is_given():
    url = "http://127.0.0.1:1/run"  # nothing is sent
    config = Config(url=url, aggregate=True)
    assert CommandConfig(config, aggregate_file="aggregate.json").config is config
    with pytest.raises(UsageError) as refused:
        CommandConfig(Config(url=url), aggregate_file="aggregate.json")
    assert str(refused.value) == "--aggregate FILE is written from the agents' /aggregate_metrics, which it asks for"


def test_config_refuses_resume_without_output():
    with pytest.raises(UsageError, match=r"^--resume needs -o FILE"):
        CommandConfig(Config(url="http://h/run"), resume=True)


def test_the_command_line_builds_a_config_from_every_option_that_sets_a_field():
    config = typer_run_config(
        "-e", "a=http://127.0.0.1:2", "-a", "a", "-j", "4", "--adaptive", "-n", "5", "-r", "2", "-r", "a=3",
        "--repeat-seeds", "-p", "temperature=0.7", "-p", "model=m", "--price", "1,2", "--max-cost", "3",
        "-H", "X-Token: t", "--shard", "1/3", "--pass-threshold", "0.5", "--head-server", "http://127.0.0.1:5",
        "--proxy", "http://127.0.0.1:6", "--aggregate", "aggregate.json", "--cross-origin-redirects",
        "--max-reply-bytes", "1024", "--max-failures", "10%",
    )  # fmt: skip
    assert config == Config(
        url="http://127.0.0.1:1/run",
        endpoints={"a": ("http://127.0.0.1:2/run",)},
        agent="a",
        concurrency=4,
        adaptive=True,
        limit=5,
        repeats=Repeats(count=2, by_agent={"a": 3}, seeds=True, pass_threshold=0.5),
        params=(("temperature", 0.7), ("model", "m")),
        cost=Cost(prices=((None, Price(1, 2)),), max_usd=3),
        headers=(("X-Token", "t"),),
        shard=(1, 3),
        head_server="http://127.0.0.1:5",
        wire=Wire(proxy="http://127.0.0.1:6", cross_origin_redirects=True, max_reply_bytes=1024),
        aggregate=True,
        max_failures=FailureLimit(fraction=0.1),
    )


def test_the_command_line_builds_the_groups_routing_and_rates_from_their_options():
    config = typer_run_config(
        "-r", "2", "--drop-uniform", "--group-field", "accuracy", "--keep-incomplete", "--target-groups", "5",
        "--max-staleness", "1", "--batch-groups", "4", "--policy-version", "3", "--route", "least-outstanding",
        "--affinity-header", "X-Session-ID", "--rpm", "60", "--rpm", "a=30", "--tpm", "a=1000",
        "-e", "a=http://127.0.0.1:2", "--control", "run.sock",
    )  # fmt: skip
    assert config.groups == Groups(True, True, "accuracy", target=5, max_staleness=1, batch=4)
    assert config.policy_version == 3
    assert config.routing == Routing(policy="least-outstanding", affinity_header="X-Session-ID")
    assert config.rates == Rates(rpm=60, rpm_by_agent={"a": 30}, tpm_by_agent={"a": 1000})
    assert typer_run_config("-r", "2", "--groups").groups == Groups()
    assert typer_run_config("-r", "2").groups is None


def test_the_command_line_builds_the_parts_from_its_options():
    config = typer_run_config(
        "--retries", "5", "--retry-budget", "off", "--retry-on", "429", "--timeout", "30", "--connect-timeout", "2",
        "--cacert", "ca.pem", "--insecure",
    )  # fmt: skip
    assert config.retries == Retries(count=5, budget=None, statuses=frozenset({429}))
    assert config.timeout == Timeouts(attempt=30, connect=2)
    assert config.tls == Tls(cacert="ca.pem", insecure=True)  # as curl, --insecure with a CA file: no check
    assert typer_run_config() == Config(url="http://127.0.0.1:1/run")


def typer_run_config(*options: str) -> Config:
    """The engine's Config the command line builds from `options` (nothing is run, no file read)."""
    built: list[CommandConfig] = []

    async def keep(config: CommandConfig, **_: object) -> ExitStatus:
        built.append(config)
        return ExitStatus.OK

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("rollfilter.cli.collect.collect", keep)
        start = typer_app(["-u", "http://127.0.0.1:1", "/dev/null", *options], standalone_mode=False)
        trio.run(start, None)
    return built[0].config


def test_a_command_configs_repr_never_shows_a_header_value():
    command = CommandConfig(config=Config(url="http://127.0.0.1:1/run", headers=(("Authorization", "Bearer S3CRET"),)))
    assert "S3CRET" not in repr(command)


def test_a_bad_setting_is_its_field_in_python_and_its_option_on_the_command_line(demo_server):
    with pytest.raises(UsageError) as caught:
        list(rollouts(simple_rows(1), Config(url=demo_server.url, cost=Cost(max_usd=5.0))))
    assert str(caught.value) == "Config.cost.max_usd: needs Config.cost.prices: without them nothing is spent"
    proc = run_command(["-u", demo_server.url, "--max-cost", "5"], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 2
    assert proc.stderr.decode() == "rollfilter: --max-cost needs --prices: without them nothing is spent\n"
    assert demo_server.stats()["requests"] == 0


def test_config_errors_name_the_field_and_the_command_line_names_the_option():
    with pytest.raises(ConfigError, match=r"^Config\.concurrency: expected `int` >= 1$") as caught:
        Config(url="http://h/run", concurrency=0)
    assert caught.value.field == "concurrency"
    proc = run(["-u", closed_port_url(), "-j", "1", "--shard", "3/2"])
    assert proc.stderr.decode() == "rollfilter: --shard I/N wants 0 <= I < N\n"


URL = "http://127.0.0.1:1/run"  # nothing is sent: the command line is only parsed
STALENESS = ["--max-staleness", "1", "--batch-groups", "2"]
# For each field, a use of the option that sets it (with what that option needs beside it):
# parsing it must change that field.
USE_OF_FIELD: dict[str, list[str]] = {
    "url": ["-u", "http://127.0.0.1:2/run"],
    "reverify": ["--reverify", "m.jsonl"],
    "reverify.materialized": ["--reverify", "m.jsonl"],
    "reverify.judge_failed_only": ["--reverify", "m.jsonl", "--judge-failed-only"],
    "reverify.force": ["--reverify", "m.jsonl", "--force"],
    "endpoints": ["-e", "a=http://127.0.0.1:3/run"],
    "agent": ["-a", "a"],
    "concurrency": ["-j", "3"],
    "limit": ["-n", "5"],
    "repeats.count": ["-r", "2"],
    "repeats.by_agent": ["-r", "a=2"],
    "repeats.seeds": ["--repeat-seeds", "-r", "2"],
    "params": ["-p", "temperature=0.5"],
    "retries.count": ["--retries", "7"],
    "retries.budget": ["--retry-budget", "0.5"],
    "retries.statuses": ["--retry-on", "500"],
    "timeout.attempt": ["--timeout", "9"],
    "timeout.connect": ["--connect-timeout", "9"],
    "tls.cacert": ["--cacert", "ca.pem"],
    "tls.insecure": ["--insecure"],
    "max_failures.count": ["--max-failures", "3"],
    "max_failures.fraction": ["--max-failures", "10%"],
    "health.unhealthy": ["--unhealthy", "mask"],
    "health.max_unhealthy": ["--max-unhealthy", "30%"],
    "health.max_masked": ["--max-masked", "5"],
    "cost.prices": ["--prices", "prices.json"],
    "cost.max_usd": ["--max-cost", "5", "--prices", "prices.json"],
    "headers": ["-H", "X-Test: 1"],
    "shard": ["--shard", "1/2"],
    "repeats.pass_threshold": ["--pass-threshold", "0.5"],
    "head_server": ["--head-server", "http://127.0.0.1:4"],
    "wire.proxy": ["--proxy", "http://127.0.0.1:5"],
    "adaptive": ["--adaptive"],
    "aggregate": ["--aggregate", "aggregate.json", "-a", "a"],
    "wire.cross_origin_redirects": ["--cross-origin-redirects"],
    "wire.max_reply_bytes": ["--max-reply-bytes", "1000"],
    "output": ["-o", "out.jsonl"],
    "errors_file": ["--errors", "errors.jsonl"],
    "metrics_file": ["--metrics", "metrics.json"],
    "per_task_file": ["--per-task", "tasks.jsonl", "-r", "2"],
    "aggregate_file": ["--aggregate", "aggregate.json", "-a", "a"],
    "materialized_file": ["--materialized", "materialized.jsonl", "-o", "out.jsonl"],
    "progress_file": ["--progress-file", "progress"],
    "resume": ["--resume", "-o", "out.jsonl"],
    "max_attempts": ["--max-attempts", "5"],
    "groups": ["--groups", "-r", "2"],
    "groups.keep_incomplete": ["--keep-incomplete", "--groups", "-r", "2"],
    "groups.drop_uniform": ["--drop-uniform", "-r", "2"],
    "groups.field": ["--group-field", "accuracy", "--drop-uniform", "-r", "2"],
    "groups.target": ["--target-groups", "3", "--groups", "-r", "2"],
    "dropped_file": ["--dropped", "dropped.jsonl", "--groups", "-r", "2"],
    "routing.policy": ["--route", "task"],
    "routing.affinity_header": ["--affinity-header", "X-Session-ID"],
    "rates.rpm": ["--rpm", "600"],
    "rates.rpm_by_agent": ["--rpm", "a=600", "-e", "a=http://127.0.0.1:3/run"],
    "rates.tpm": ["--tpm", "60000"],
    "rates.tpm_by_agent": ["--tpm", "a=60000", "-e", "a=http://127.0.0.1:3/run"],
    "policy_version": ["--policy-version", "3"],
    "groups.max_staleness": [*STALENESS, "--groups", "-r", "2", "--control", "run.sock"],
    "groups.batch": [*STALENESS, "--groups", "-r", "2", "--control", "run.sock"],
    "control_socket": ["--control", "run.sock"],
    "quiet": ["-q"],
    "progress": ["--no-progress"],
    "verbose": ["-v"],
    "dry_run": ["--dry-run"],
    "trackers.mlflow": ["--mlflow", "http://127.0.0.1:5000"],
    "trackers.experiment": ["--mlflow", "http://127.0.0.1:5000", "--experiment", "e"],
    "trackers.wandb": ["--wandb", "p"],
    "trackers.run_name": ["--wandb", "p", "--run-name", "r"],
    "trackers.rollouts": ["--wandb", "p", "--track-rollouts", "5"],
    "trackers.ids_file": ["--wandb", "p", "-o", "out.jsonl"],
}


# Config's parts, by the field that holds each.
PARTS: dict[str, type] = {
    "repeats": Repeats,
    "groups": Groups,
    "retries": Retries,
    "timeout": Timeouts,
    "tls": Tls,
    "wire": Wire,
    "routing": Routing,
    "rates": Rates,
    "cost": Cost,
    "max_failures": FailureLimit,
    "health": Health,
    "reverify": Reverify,
    "trackers": Trackers,
}


def leaf_fields() -> set[str]:
    """Config's fields that are no part, and its parts' fields (`retries.budget`), by their paths."""
    fields = {field.name for field in dataclasses.fields(Config) if field.name not in PARTS}
    return fields | {f"{name}.{field.name}" for name, part in PARTS.items() for field in dataclasses.fields(part)}


def parsed(args: list[str], monkeypatch: pytest.MonkeyPatch) -> CommandConfig:
    """The CommandConfig the command line `args` gives its run."""
    given: list[CommandConfig] = []
    monkeypatch.setattr("rollfilter.cli.collect.collect", lambda config, **_: given.append(config))
    start = options.typer_app(args=["-u", URL, *args, "rows.jsonl"], prog_name="rollfilter", standalone_mode=False)
    start(None)
    return given[0]


def field_value(command: CommandConfig, name: str) -> Any:
    """The value of field `name` (`retries.budget`: of a Config part; None: of a part not there)
    that `command` holds."""
    config_fields = {field.name for field in dataclasses.fields(command.config)}
    value: Any = command.config if name.split(".")[0] in config_fields else command
    for part in name.split("."):
        value = getattr(value, part) if value is not None else None
    return value


def test_demo_gives_the_run_the_demo_agents_default_options(monkeypatch: pytest.MonkeyPatch):
    given: list[CommandConfig] = []
    monkeypatch.setattr("rollfilter.cli.collect.collect", lambda config, **_: given.append(config))
    for args in (["--demo"], ["-u", URL]):
        options.typer_app(args=[*args, "rows.jsonl"], prog_name="rollfilter", standalone_mode=False)(None)
    assert [command.demo for command in given] == [DemoOptions(), None]
    assert [command.handle_signals for command in given] == [True, True]  # the command handles its signals


@pytest.mark.usefixtures("tracker_clients")
def test_every_field_is_set_by_its_option(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """Each field of Config (and of its parts) and each file of CommandConfig is set by the option
    that USE_OF_FIELD gives for it: parsing that option changes the field."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prices.json").write_text('{"a": [1, 2]}')
    assert leaf_fields() <= set(USE_OF_FIELD)
    before = parsed([], monkeypatch)
    unset = []
    for name, use in USE_OF_FIELD.items():
        if field_value(parsed(use, monkeypatch), name) == field_value(before, name):
            unset.append(f"{name}: {' '.join(use)}")
    assert unset == []
