"""config.py: a `Config` is checked when it is built, each error naming its field."""

from __future__ import annotations

from typing import Any

import pytest

from rollfilter.cli.fields import in_options
from rollfilter.config import CommandConfig, Config, ConfigError, parse_header
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
