"""config.py: Config and CommandConfig, and the parsers of option text."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from rollfilter.cli.fields import in_options
from rollfilter.config import (
    CommandConfig,
    Config,
    ConfigError,
    FailureLimit,
    Retries,
    Timeouts,
    agent_url,
    parse_endpoints,
    parse_failure_limit,
    parse_header,
    parse_param,
    parse_statuses,
    slurm_shard,
)
from rollfilter.errors import UsageError
from tests.conftest import array_task

SECRET = "secret-value"


def test_headers_that_can_go_on_the_wire_are_kept_as_pairs():
    config = Config(headers=[["X-Token", "a b"], ("Accept", ""), ("x!#$%&'*+-.^_`|~9", "é")])
    assert config.headers == (("X-Token", "a b"), ("Accept", ""), ("x!#$%&'*+-.^_`|~9", "é"))


@pytest.mark.parametrize(
    "headers",
    [
        [("X-Token", SECRET + "\r\nInjected: 1")],
        [("X-Token", SECRET + "\n")],
        [("X-Token", SECRET + "\0")],
        [("Bad Name", SECRET)],
        [("", SECRET)],
        [("X:Token", SECRET)],
        [("Tôken", SECRET)],
        [("X-Token\n", SECRET)],
        [("X-Token",)],
        [("X-Token", SECRET, SECRET)],
        [("X-Token", 5)],
        [5],
        5,
        ["ab"],
        "X-Token: " + SECRET,
    ],
)
def test_config_refuses_headers_that_cannot_go_on_the_wire_and_never_shows_the_value(headers: Any):
    with pytest.raises(ConfigError) as refused:
        Config(headers=headers)
    assert refused.value.field == "headers"
    assert str(refused.value).startswith("Config.headers ")
    assert SECRET not in str(refused.value)


def test_the_command_line_checks_a_header_as_config_does_and_names_the_option():
    assert parse_header(" X-Token :  a b ") == ("X-Token", "a b")
    for spec in ("X-Token " + SECRET, "Bad Name: " + SECRET, "Tôken: " + SECRET, "X-Token: " + SECRET + "\r\nA: 1"):
        with pytest.raises(ConfigError) as refused:
            parse_header(spec)
        assert in_options(str(refused.value)).startswith("-H/--header ")
        assert SECRET not in str(refused.value)


def test_a_command_config_never_changes_the_engine_config_it_is_given():
    engine = Config(url="http://127.0.0.1:1/run", aggregate=True)
    assert CommandConfig(engine, aggregate_file="aggregate.json").engine is engine
    with pytest.raises(UsageError, match=r"^CommandConfig\.aggregate_file needs Config\.aggregate"):
        CommandConfig(Config(url="http://127.0.0.1:1/run"), aggregate_file="aggregate.json")


def test_the_retry_fields_make_one_checked_part_that_follows_replace():
    config = Config(retries=5, retry_budget=None, retry_statuses=[503, 429])  # type: ignore[arg-type]
    assert config.retry_policy == Retries(count=5, budget=None, statuses=frozenset({429, 503}))
    assert config.retry_statuses == frozenset({429, 503})  # a list from Python, kept as the set it means
    assert Config().retry_policy == Retries()
    assert dataclasses.replace(config, retries=0).retry_policy.count == 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("retries", -1),
        ("retries", 1.5),
        ("retries", "3"),
        ("retries", True),
        ("retry_budget", -0.1),
        ("retry_budget", math.inf),
        ("retry_budget", math.nan),
        ("retry_budget", "0.1"),
        ("retry_statuses", {999}),
        ("retry_statuses", {99}),
        ("retry_statuses", {"429"}),
        ("retry_statuses", {True}),
        ("retry_statuses", 503),
    ],
)
def test_a_retry_field_that_cannot_be_used_is_refused_by_its_name(field: str, value: Any):
    with pytest.raises(ConfigError) as refused:
        Config(**{field: value})
    assert refused.value.field == field
    assert str(refused.value).startswith(f"Config.{field} ")
    option = {"retries": "--retries", "retry_budget": "--retry-budget", "retry_statuses": "--retry-on"}[field]
    assert in_options(str(refused.value)).startswith(option + " ")


def test_the_timeout_fields_make_one_checked_part_that_follows_replace():
    config = Config(timeout=30, connect_timeout=2.5)
    assert config.timeouts == Timeouts(attempt=30, connect=2.5)
    assert Config().timeouts == Timeouts()
    assert dataclasses.replace(config, timeout=None).timeouts == Timeouts(attempt=None, connect=2.5)


@pytest.mark.parametrize(
    ("field", "value", "option"),
    [
        ("timeout", 0, "--timeout"),
        ("timeout", -1.0, "--timeout"),
        ("timeout", math.nan, "--timeout"),
        ("timeout", "30", "--timeout"),
        ("connect_timeout", 0, "--connect-timeout"),
        ("connect_timeout", None, "--connect-timeout"),
        ("connect_timeout", "10", "--connect-timeout"),
    ],
)
def test_a_timeout_that_cannot_be_used_is_refused_by_its_name(field: str, value: Any, option: str):
    with pytest.raises(ConfigError) as refused:
        Config(**{field: value})
    assert refused.value.field == field
    assert in_options(str(refused.value)) == f"{option} must be a positive number of seconds"


def test_shard_auto_is_the_array_tasks_offset_from_the_first():
    assert [slurm_shard(array_task(task, 0, 4)) for task in range(4)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert [slurm_shard(array_task(task, 1, 4)) for task in range(1, 5)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    stepped = {**array_task(6, 0, 3), "SLURM_ARRAY_TASK_STEP": "3"}  # --array=0-6:3
    assert slurm_shard(stepped) == (2, 3)
    for broken in ({}, array_task(5, 1, 4), {**array_task(4, 0, 3), "SLURM_ARRAY_TASK_STEP": "3"}):
        with pytest.raises(UsageError, match=r"^Config\.shard auto"):
            slurm_shard(broken)


def test_parse_param_takes_json_else_string():
    assert parse_param("temperature=0.7") == ("temperature", 0.7)
    assert parse_param("model=my-model") == ("model", "my-model")
    assert parse_param("tools=[]") == ("tools", [])
    assert parse_param("x=") == ("x", "")
    assert parse_param("stop=null") == ("stop", None)
    for bad in ("novalue", "=3", "a..b=1"):
        with pytest.raises(UsageError):
            parse_param(bad)


def test_agent_url_appends_run_only_without_a_path():
    assert agent_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/run"
    assert agent_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/run"
    assert agent_url("https://h/agents/x/run") == "https://h/agents/x/run"
    for bad in ("127.0.0.1:8000", "ftp://h/", "http://h:99999/"):
        with pytest.raises(UsageError):
            agent_url(bad)


def test_endpoints_collect_replicas():
    endpoints = parse_endpoints(["a=http://h:1", "a=http://h:2,http://h:3", "b=http://h:4/x"])
    assert endpoints == {"a": ("http://h:1/run", "http://h:2/run", "http://h:3/run"), "b": ("http://h:4/x",)}
    with pytest.raises(UsageError):
        parse_endpoints(["nourl"])


def test_header_parsing_never_echoes_the_value():
    assert parse_header("Authorization: Bearer abc") == ("Authorization", "Bearer abc")
    for bad in ("Bad Name: secret-value", "X-Token: secret-value\r\nInjected: 1"):
        with pytest.raises(UsageError) as info:
            parse_header(bad)
        assert "secret-value" not in str(info.value)


def test_statuses_and_failure_limits():
    assert parse_statuses("429, 503") == {429, 503}
    assert parse_statuses("") == frozenset()
    with pytest.raises(UsageError):
        parse_statuses("abc")
    assert parse_failure_limit("5") == FailureLimit(count=5)
    assert parse_failure_limit("2.5%") == FailureLimit(fraction=0.025)
    for bad in ("0", "-1", "101%", "x%", "nan%"):
        with pytest.raises(UsageError):
            parse_failure_limit(bad)
    rate = FailureLimit(fraction=0.1)
    assert not rate.is_reached(failed=5, ended=10)  # too few ended rows to judge a rate
    assert rate.is_reached(failed=3, ended=20)
    assert not rate.is_reached(failed=1, ended=20)


def test_config_refuses_resume_without_output():
    with pytest.raises(UsageError, match=r"^CommandConfig\.resume needs CommandConfig\.output"):
        CommandConfig(Config(url="http://h/run"), resume=True)
