"""config.py: a `Config` is checked when it is built, each error naming its field."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from rollfilter.cli.fields import in_options
from rollfilter.config import CommandConfig, Config, ConfigError, Retries, Timeouts, parse_header
from rollfilter.errors import UsageError

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
