"""config.py: Config and CommandConfig, and the parsers of option text."""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Callable
from typing import Any

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from rollfilter.budget import DEFAULT_RATIO
from rollfilter.cli.fields import in_options
from rollfilter.cli.options import typer_app
from rollfilter.config import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RETRY_STATUSES,
    CommandConfig,
    Config,
    ConfigError,
    FailureLimit,
    Retries,
    Timeouts,
    Tls,
    agent_url,
    parse_endpoints,
    parse_failure_limit,
    parse_header,
    parse_param,
    parse_statuses,
    slurm_shard,
)
from rollfilter.cost import Price
from rollfilter.errors import ExitStatus, UsageError
from tests.conftest import array_task, closed_port_url, run

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
    url = closed_port_url() + "/run"
    engine = Config(url=url, aggregate=True)
    assert CommandConfig(engine, aggregate_file="aggregate.json").engine is engine
    with pytest.raises(UsageError) as refused:
        CommandConfig(Config(url=url), aggregate_file="aggregate.json")
    assert str(refused.value) == (
        "CommandConfig.aggregate_file is written from the agents' /aggregate_metrics,"
        " which only an engine Config with aggregate=True asks for"
    )
    # --aggregate FILE sets both fields, so the command line names the option once.
    assert in_options(str(refused.value)).startswith("--aggregate is written from the agents' /aggregate_metrics,")
    assert in_options(str(refused.value)).count("--aggregate") == 1


def test_a_part_or_its_plain_value_builds_the_same_config():
    assert Config(retries=5) == Config(retries=Retries(count=5))
    assert Config(retries=5).retries == Retries(count=5, budget=DEFAULT_RATIO, statuses=DEFAULT_RETRY_STATUSES)
    assert Config(timeout=30) == Config(timeout=Timeouts(attempt=30))
    assert Config(timeout=None).timeout == Timeouts(attempt=None, connect=DEFAULT_CONNECT_TIMEOUT)
    assert Config(max_failures=10) == Config(max_failures=FailureLimit(count=10))
    assert Config() == Config(retries=Retries(), timeout=Timeouts(), tls=Tls(), max_failures=FailureLimit())
    assert Config(retries=Retries(count=5, budget=None)) != Config(retries=5)
    assert dataclasses.replace(Config(timeout=Timeouts(30, connect=2.5)), retries=0).retries.count == 0


def test_the_parts_are_frozen_values():
    config = Config(retries=Retries(statuses=[503, 429]), tls=Tls(cacert=pathlib.Path("ca.pem")))  # type: ignore[arg-type]
    assert config.retries.statuses == frozenset({429, 503})  # a list from Python, kept as the set it means
    assert config.tls == Tls(cacert="ca.pem", insecure=False)  # a path, kept as the string it means
    assert len({Retries(), Retries(), Timeouts(), Timeouts(), Tls(), Tls()}) == 3  # equal and hashable
    for part, field in ((config.retries, "count"), (config.timeout, "attempt"), (config.tls, "insecure")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(part, field, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.retries = Retries()  # type: ignore[misc]


def test_the_flat_fields_beside_the_parts_are_gone():
    for name in ("retry_budget", "retry_statuses", "connect_timeout", "insecure", "cacert"):
        with pytest.raises(TypeError, match=name):
            Config(**{name: None})


@pytest.mark.parametrize(
    ("build", "field", "option"),
    [
        (lambda: Config(retries=-1), "retries.count", "--retries"),
        (lambda: Config(retries=1.5), "retries.count", "--retries"),
        (lambda: Config(retries="3"), "retries.count", "--retries"),
        (lambda: Config(retries=True), "retries.count", "--retries"),
        (lambda: Retries(budget=-0.1), "retries.budget", "--retry-budget"),
        (lambda: Retries(budget=math.inf), "retries.budget", "--retry-budget"),
        (lambda: Retries(budget=math.nan), "retries.budget", "--retry-budget"),
        (lambda: Retries(budget="0.1"), "retries.budget", "--retry-budget"),
        (lambda: Retries(statuses={999}), "retries.statuses", "--retry-on"),
        (lambda: Retries(statuses={99}), "retries.statuses", "--retry-on"),
        (lambda: Retries(statuses={"429"}), "retries.statuses", "--retry-on"),
        (lambda: Retries(statuses={True}), "retries.statuses", "--retry-on"),
        (lambda: Retries(statuses=503), "retries.statuses", "--retry-on"),
        (lambda: Config(timeout=0), "timeout.attempt", "--timeout"),
        (lambda: Config(timeout=-1.0), "timeout.attempt", "--timeout"),
        (lambda: Config(timeout=math.nan), "timeout.attempt", "--timeout"),
        (lambda: Config(timeout="30"), "timeout.attempt", "--timeout"),
        (lambda: Timeouts(connect=0), "timeout.connect", "--connect-timeout"),
        (lambda: Timeouts(connect=None), "timeout.connect", "--connect-timeout"),
        (lambda: Timeouts(connect="10"), "timeout.connect", "--connect-timeout"),
        (lambda: Tls(cacert=""), "tls.cacert", "--cacert"),
        (lambda: Tls(cacert=5), "tls.cacert", "--cacert"),
        (lambda: Tls(insecure="yes"), "tls.insecure", "--insecure"),
        (lambda: Tls(insecure=1), "tls.insecure", "--insecure"),
        (lambda: Config(max_failures=0), "max_failures.count", "--max-failures"),
        (lambda: Config(max_failures=2.5), "max_failures.count", "--max-failures"),
        (lambda: FailureLimit(fraction=0), "max_failures.fraction", "--max-failures"),
        (lambda: FailureLimit(fraction=1.5), "max_failures.fraction", "--max-failures"),
        (lambda: FailureLimit(fraction="5%"), "max_failures.fraction", "--max-failures"),
        (lambda: FailureLimit(count=5, fraction=0.5), "max_failures", "--max-failures"),
        (lambda: Config(tls=True), "tls", "--cacert/--insecure"),
        (lambda: Config(tls="ca.pem"), "tls", "--cacert/--insecure"),
    ],
)
def test_a_part_that_cannot_be_used_is_refused_by_its_field(build: Callable[[], object], field: str, option: str):
    with pytest.raises(ConfigError) as refused:
        build()
    assert refused.value.field == field
    assert str(refused.value).startswith(f"Config.{field} ")
    assert in_options(str(refused.value)).startswith(f"{option} ")


# For every Config field, values of a type it does not take: each refused by that field's name.
WRONG_TYPES: dict[str, list[Any]] = {
    "url": [5, b"http://h/run"],
    "endpoints": [5, "a=http://h/run", {"a": 5}, {"a": [5]}, {5: "http://h/run"}],
    "agent": [5, ("a",)],
    "concurrency": [True, "3", 2.0, None],
    "limit": [True, "2", 1.5],
    "repeats": [1.5, True, "2"],
    "repeats_by_agent": [5, {"a": "2"}, {"a": 2.0}, {5: 2}, [("a", 2)]],
    "repeat_seeds": ["yes", 1, None],
    "params": [5, ["ab"], [("a",)], [(5, 1)], [("", 1)], [("a..b", 1)], {"temperature": 0.7}],
    "retries": ["3", 1.5, True],
    "timeout": ["30", True],
    "tls": [True, "ca.pem"],
    "max_failures": ["5%", 2.5, True],
    "prices": ["x", 5, [("a", 1.0)], [(5, Price(1, 2))], [("a", Price(1, 2), None)]],
    "max_cost": ["5", True],
    "headers": [5, ["ab"]],
    "shard": [(1,), (0, 2, 4), "0/2", (0, "2"), (0.0, 2), (False, True)],
    "pass_threshold": ["1", None, True],
    "head_server": [3, b"http://h"],
    "proxy": [3, b"http://h"],
    "adaptive": ["yes", 1],
    "aggregate": ["yes", 0],
    "cross_origin_redirects": ["yes", 1],
    "max_reply_bytes": [2.5, True, "1024"],
}


def test_every_config_field_has_wrong_types_to_refuse():
    assert set(WRONG_TYPES) == {field.name for field in dataclasses.fields(Config)}


@pytest.mark.parametrize(
    ("field", "value"), [(field, value) for field, values in WRONG_TYPES.items() for value in values], ids=repr
)
def test_a_field_of_the_wrong_type_is_refused_by_its_name(field: str, value: Any):
    with pytest.raises(ConfigError) as refused:
        Config(**{field: value})
    assert refused.value.field.partition(".")[0] == field  # or its part's field: retries.count
    assert str(refused.value).startswith(f"Config.{refused.value.field} ")
    assert "\n" not in str(refused.value)


ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@given(field=st.sampled_from([field.name for field in dataclasses.fields(Config)]), value=ANY_VALUE)
def test_any_value_of_any_field_is_taken_or_refused_in_one_line(field: str, value: Any):
    message = ""
    try:
        Config(**{field: value})
    except UsageError as refused:  # ConfigError naming the field, or a URL refused as not one
        message = str(refused)
    assert "\n" not in message


def test_values_of_the_types_a_field_takes_are_kept_as_what_they_mean():
    price = Price(0.5, 1.5)
    config = Config(
        url="http://127.0.0.1:1",
        endpoints={
            "a": "http://127.0.0.1:2",
            "b": ["http://127.0.0.1:3", "http://127.0.0.1:4/x"],
            "c": iter(["http://127.0.0.1:7"]),  # read once: checking it must not use it up
        },
        agent="a",
        concurrency=4,
        limit=0,
        repeats=2,
        repeats_by_agent={"a": 3},
        repeat_seeds=True,
        params=[("temperature", 0.7), ["metadata.x", None]],
        prices=[(None, price), ["a", price]],
        max_cost=1,
        shard=[1, 3],
        pass_threshold=0,
        head_server="http://127.0.0.1:5",
        proxy="socks5://127.0.0.1:6",
        adaptive=True,
        aggregate=True,
        cross_origin_redirects=True,
        max_reply_bytes=1,
    )
    assert config.endpoints == {
        "a": ("http://127.0.0.1:2/run",),
        "b": ("http://127.0.0.1:3/run", "http://127.0.0.1:4/x"),
        "c": ("http://127.0.0.1:7/run",),
    }
    assert config.params == (("temperature", 0.7), ("metadata.x", None))
    assert config.prices == ((None, price), ("a", price))
    assert config.shard == (1, 3)
    assert (config.max_cost, config.pass_threshold, config.max_reply_bytes) == (1, 0, 1)


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
        repeats=2,
        repeats_by_agent={"a": 3},
        repeat_seeds=True,
        params=(("temperature", 0.7), ("model", "m")),
        prices=((None, Price(1, 2)),),
        max_cost=3,
        headers=(("X-Token", "t"),),
        shard=(1, 3),
        pass_threshold=0.5,
        head_server="http://127.0.0.1:5",
        proxy="http://127.0.0.1:6",
        aggregate=True,
        cross_origin_redirects=True,
        max_reply_bytes=1024,
        max_failures=FailureLimit(fraction=0.1),
    )


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
        patch.setattr("rollfilter.cli.options.run", keep)
        start = typer_app(["-u", "http://127.0.0.1:1", "/dev/null", *options], standalone_mode=False)
        trio.run(start)
    return built[0].engine


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


@pytest.mark.parametrize("field", ["url", "endpoints", "head_server", "proxy"])
def test_a_url_that_does_not_parse_is_refused_in_one_line(field: str):
    url = "http://us3r:pa55@[::1/run"  # urllib refuses to split it at all
    with pytest.raises(UsageError) as refused:
        Config(**{field: {"a": url} if field == "endpoints" else url})
    assert "not an" in str(refused.value)
    assert "pa55" not in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("host", ["127.0.0.1%00x", "127.0.0.%31", "exa mple", "a\x01b", "a\x00b", "a!b", "a<b"])
@pytest.mark.parametrize("field", ["url", "endpoints", "head_server", "proxy"])
def test_a_host_with_a_character_curl_refuses_is_refused(field: str, host: str):
    url = f"http://us3r:pa55@{host}:8000/run"
    with pytest.raises(UsageError) as refused:
        Config(**{field: {"a": url} if field == "endpoints" else url})
    assert "whose host holds" in str(refused.value)
    assert "8000/run" in str(refused.value)  # which of the URLs it is
    assert "pa55" not in str(refused.value)
    assert "\n" not in str(refused.value)


def test_hosts_curl_takes_are_taken():
    for host in ("a_b.localhost", "xn--9ca.localhost", "é.localhost", "[::1]", "[fe80::1%25eth0]", "127.0.0.1"):
        assert agent_url(f"http://{host}:8000") == f"http://{host}:8000/run"


def test_the_command_line_refuses_a_url_that_does_not_parse_as_bad_usage():
    done = run(["-e", "a=http://[::1/run", "/dev/null"])
    assert done.returncode == ExitStatus.USAGE
    assert done.stderr.decode().startswith("rollfilter: not an http(s) URL: ")
    assert done.stderr.decode().count("\n") == 1
    assert done.stdout == b""


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


def test_a_configs_repr_never_shows_a_header_value():
    config = Config(url=closed_port_url() + "/run", headers=(("Authorization", "Bearer S3CRET"),))
    command = CommandConfig(engine=config)
    assert "S3CRET" not in repr(config)
    assert "S3CRET" not in repr(command)
    assert "S3CRET" not in str(config)
