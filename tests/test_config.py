"""config.py: Config and its parts, checked when built, each refusal naming the field's path."""

from __future__ import annotations

import dataclasses
import math
import pathlib
import types
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollfilter.config import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_RETRY_STATUSES,
    Config,
    ConfigError,
    Cost,
    FailureLimit,
    Groups,
    Health,
    Rates,
    RecentLimit,
    Repeats,
    Retries,
    Routing,
    Timeouts,
    Tls,
    Trackers,
    Wire,
    agent_url,
    endpoint_beside,
    verify_url,
)
from rollfilter.cost import Price
from rollfilter.defaults import DEFAULT_RATIO
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
    assert refused.value.field.partition("[")[0] == "headers"  # or where in them: headers[0][1]
    assert str(refused.value).startswith(f"Config.{refused.value.field}: ")
    assert SECRET not in str(refused.value)


def test_a_part_or_its_plain_value_builds_the_same_config():
    assert Config(retries=5) == Config(retries=Retries(count=5))
    assert Config(retries=5).retries == Retries(count=5, budget=DEFAULT_RATIO, statuses=DEFAULT_RETRY_STATUSES)
    assert Config(timeout=30) == Config(timeout=Timeouts(attempt=30))
    assert Config(timeout=None).timeout == Timeouts(attempt=None, connect=DEFAULT_CONNECT_TIMEOUT)
    assert Config(max_failures=10) == Config(max_failures=FailureLimit(count=10))
    assert Config(repeats=4) == Config(repeats=Repeats(count=4))
    assert Config(repeats=None).repeats == Repeats(count=None, by_agent={}, seeds=False)
    assert Config(repeats=4, groups=True) == Config(repeats=4, groups=Groups())
    assert Config(repeats=4, groups=False).groups is None
    assert Config() == Config(retries=Retries(), timeout=Timeouts(), tls=Tls(), max_failures=FailureLimit())
    assert Config() == Config(repeats=Repeats(), groups=None, wire=Wire(), routing=Routing(), rates=Rates())
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
    for name in ("retry_budget", "retry_statuses", "connect_timeout", "insecure", "cacert", *RENAMED):
        with pytest.raises(TypeError, match=name):
            Config(**{name: None})


# The flat fields that became a part's (CHANGELOG.md), by the part's field that holds them now.
RENAMED = {
    "repeats_by_agent": "repeats.by_agent",
    "repeat_seeds": "repeats.seeds",
    "keep_incomplete": "groups.keep_incomplete",
    "drop_uniform": "groups.drop_uniform",
    "group_field": "groups.field",
    "target_groups": "groups.target",
    "max_staleness": "groups.max_staleness",
    "batch_groups": "groups.batch",
    "proxy": "wire.proxy",
    "cross_origin_redirects": "wire.cross_origin_redirects",
    "max_reply_bytes": "wire.max_reply_bytes",
    "route": "routing.policy",
    "affinity_header": "routing.affinity_header",
    "rpm": "rates.rpm",
    "tpm": "rates.tpm",
    "rpm_by_agent": "rates.rpm_by_agent",
    "tpm_by_agent": "rates.tpm_by_agent",
    "prices": "cost.prices",
    "max_cost": "cost.max_usd",
    "pass_threshold": "repeats.pass_threshold",
}
# The parts of a Config, by the field that holds each.
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
    "trackers": Trackers,
}


def test_config_has_at_most_25_fields_and_each_renamed_one_is_a_parts():
    assert len(dataclasses.fields(Config)) <= 25
    held = {f"{name}.{field.name}" for name, part in PARTS.items() for field in dataclasses.fields(part)}
    assert set(RENAMED.values()) <= held


def test_the_checks_within_a_part_are_the_parts_own():
    with pytest.raises(ConfigError, match=r"^Config\.groups\.max_staleness: needs Config\.groups\.batch too"):
        Groups(max_staleness=1)
    with pytest.raises(ConfigError, match=r"^Config\.groups\.batch: needs Config\.groups\.max_staleness too"):
        Groups(batch=2)
    with pytest.raises(ConfigError, match=r"^Config\.groups\.field: 'response' is not a numeric field"):
        Groups(field="response")
    with pytest.raises(ConfigError, match=r"^Config\.cost\.max_usd: needs Config\.cost\.prices"):
        Cost(max_usd=5)
    with pytest.raises(ConfigError, match=r"^Config\.wire\.proxy: not an http/https/socks5 URL"):
        Wire(proxy="ftp://127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"^Config\.routing\.affinity_header: every request carries Host"):
        Routing(affinity_header="Host")


def test_the_checks_across_parts_are_configs():
    with pytest.raises(ConfigError, match=r"^Config\.groups: needs Config\.repeats over 1"):
        Config(groups=True)
    with pytest.raises(ConfigError, match=r"^Config\.groups\.target: expected `int` >= 1"):
        Config(repeats=2, groups=Groups(target=0))
    with pytest.raises(ConfigError, match=r"^Config\.routing\.affinity_header: the headers given set"):
        Config(routing=Routing(affinity_header="X-Session"), headers=(("x-session", "1"),))
    # A staleness bound counts versions from the first: 0 unless given.
    assert Config(repeats=2, groups=Groups(max_staleness=1, batch=2)).policy_version == 0
    assert Config(repeats=2, groups=Groups(max_staleness=1, batch=2), policy_version=7).policy_version == 7
    assert Config(repeats=2, groups=True).policy_version is None


def test_a_parts_figures_are_asked_of_the_part():
    repeats = Repeats(count=2, by_agent={"a": 5})
    assert (repeats.for_agent("a"), repeats.for_agent("b"), repeats.for_agent(None), repeats.largest) == (5, 2, 2, 5)
    assert (Repeats(by_agent={"a": 3}).default, Repeats(by_agent={"a": 3}).for_agent("b"), Repeats().default) == (
        None,
        None,
        1,
    )
    rates = Rates(rpm=60, tpm_by_agent={"a": 1000})
    assert (rates.for_agent(None), rates.for_agent("a"), rates.limited, Rates().limited) == (
        (60, None),
        (60, 1000),
        True,
        False,
    )
    assert Config(repeats=2).route_by_task
    assert not Config(repeats=2, routing=Routing(policy="least-outstanding")).route_by_task
    assert Config(routing=Routing(policy="task")).route_by_task
    assert not Config().route_by_task


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: Config(retries=-1), "retries.count"),
        (lambda: Config(retries=1.5), "retries.count"),
        (lambda: Config(retries="3"), "retries.count"),
        (lambda: Config(retries=True), "retries.count"),
        (lambda: Retries(budget=-0.1), "retries.budget"),
        (lambda: Retries(budget=math.inf), "retries.budget"),
        (lambda: Retries(budget=math.nan), "retries.budget"),
        (lambda: Retries(budget="0.1"), "retries.budget"),
        (lambda: Retries(statuses={999}), "retries.statuses"),
        (lambda: Retries(statuses={99}), "retries.statuses"),
        (lambda: Retries(statuses={"429"}), "retries.statuses"),
        (lambda: Retries(statuses={True}), "retries.statuses"),
        (lambda: Retries(statuses=503), "retries.statuses"),
        (lambda: Config(timeout=0), "timeout.attempt"),
        (lambda: Config(timeout=-1.0), "timeout.attempt"),
        (lambda: Config(timeout=math.nan), "timeout.attempt"),
        (lambda: Config(timeout="30"), "timeout.attempt"),
        (lambda: Timeouts(connect=0), "timeout.connect"),
        (lambda: Timeouts(connect=None), "timeout.connect"),
        (lambda: Timeouts(connect="10"), "timeout.connect"),
        (lambda: Tls(cacert=""), "tls.cacert"),
        (lambda: Tls(cacert=5), "tls.cacert"),
        (lambda: Tls(insecure="yes"), "tls.insecure"),
        (lambda: Tls(insecure=1), "tls.insecure"),
        (lambda: Config(max_failures=0), "max_failures.count"),
        (lambda: Config(max_failures=2.5), "max_failures.count"),
        (lambda: FailureLimit(fraction=0), "max_failures.fraction"),
        (lambda: FailureLimit(fraction=1.5), "max_failures.fraction"),
        (lambda: FailureLimit(fraction="5%"), "max_failures.fraction"),
        (lambda: FailureLimit(count=5, fraction=0.5), "max_failures"),
        (lambda: Config(tls=True), "tls"),
        (lambda: Config(tls="ca.pem"), "tls"),
        (lambda: Config(groups=True, repeats=Repeats(by_agent={"a": 4, "b": 1})), "repeats.by_agent"),
        (lambda: Config(groups=Groups(drop_uniform=True), repeats=Repeats(1, {"a": 4})), "repeats.count"),
        (lambda: Config(groups=True, repeats=1), "groups"),
        (lambda: Config(repeats=2, groups=Groups(target=0)), "groups.target"),
        (lambda: Config(repeats=0), "repeats.count"),
        (lambda: Config(repeats=Repeats(by_agent={"a": 0})), "repeats.by_agent"),
    ],
)
def test_a_part_that_cannot_be_used_is_refused_by_its_field(build: Callable[[], object], field: str):
    with pytest.raises(ConfigError) as refused:
        build()
    assert refused.value.field.partition("[")[0] == field  # or where in it: retries.statuses[0]
    assert str(refused.value).startswith(f"Config.{refused.value.field}: ")


# For every Config field, values of a type it does not take: each refused by that field's name.
WRONG_TYPES: dict[str, list[Any]] = {
    "url": [5, b"http://h/run"],
    "endpoints": [5, "a=http://h/run", {"a": 5}, {"a": [5]}, {5: "http://h/run"}],
    "agent": [5, ("a",)],
    "concurrency": [True, "3", 2.0, None],
    "adaptive": ["yes", 1],
    "limit": [True, "2", 1.5],
    "repeats": [1.5, True, "2"],
    "groups": ["yes", 1, Repeats()],
    "policy_version": [1.5, True, "3"],
    "params": [5, ["ab"], [("a",)], [(5, 1)], [("", 1)], [("a..b", 1)], {"temperature": 0.7}],
    "retries": ["3", 1.5, True],
    "timeout": ["30", True],
    "tls": [True, "ca.pem"],
    "wire": ["http://h", True],
    "routing": ["task", 1],
    "rates": [60, "60", {"rpm": "60"}],
    "cost": [5, ()],
    "max_failures": ["5%", 2.5, True],
    "headers": [5, ["ab"]],
    "shard": [(1,), (0, 2, 4), "0/2", (0, "2"), (0.0, 2), (False, True)],
    "head_server": [3, b"http://h"],
    "aggregate": ["yes", 0],
    "reverify": ["m.jsonl", 5, True],
    "health": ["mask", 1, True],
    "trackers": ["http://127.0.0.1:5000", 5, True],
}
# For every field of the parts a plain value does not stand for, values of a type it does not take.
PART_WRONG_TYPES: dict[str, list[Any]] = {
    "repeats.count": [0, 1.5, True, "2"],
    "repeats.by_agent": [5, {"a": "2"}, {"a": 2.0}, {5: 2}, [("a", 2)]],
    "repeats.seeds": ["yes", 1, None],
    "repeats.pass_threshold": ["1", None, True],
    "groups.keep_incomplete": ["yes", 1],
    "groups.drop_uniform": ["yes", 1],
    "groups.field": [5, None, b"reward"],
    "groups.target": [0, 2.5, True, "3"],
    "groups.max_staleness": [-1, 1.5, True, "1"],
    "groups.batch": [0, 2.5, True, "2"],
    "wire.proxy": [3, b"http://h"],
    "wire.cross_origin_redirects": ["yes", 1],
    "wire.max_reply_bytes": [0, 2.5, True, "1024"],
    "routing.policy": ["random", 1, True],
    "routing.affinity_header": [5, "Session ID", "Host", "content-length"],
    "rates.rpm": [0, -1.0, "60", float("inf"), True],
    "rates.rpm_by_agent": [{"a": 0}, {"a": "60"}, [("a", 60)], {5: 60}],
    "rates.tpm": [0, -5, "x", float("nan")],
    "rates.tpm_by_agent": [{"a": -1}, {"a": None}],
    "cost.prices": ["x", 5, [("a", 1.0)], [(5, Price(1, 2))], [("a", Price(1, 2), None)]],
    "cost.max_usd": ["5", True],
    "health.unhealthy": ["drop", 1, None],
    "health.max_unhealthy": [5, "5%", True],
    "health.max_masked": [0.5, "x"],
    "trackers.mlflow": [5, b"http://h", ""],
    "trackers.experiment": [5, None, ""],
    "trackers.wandb": [5, ""],
    "trackers.run_name": [5, ""],
    "trackers.rollouts": [-1, 1.5, True, "100"],
    "trackers.ids_file": [5, ""],
}


def test_every_config_field_has_wrong_types_to_refuse():
    assert set(WRONG_TYPES) == {field.name for field in dataclasses.fields(Config)}
    new_parts = ("repeats", "groups", "wire", "routing", "rates", "cost", "health", "trackers")
    fields = {f"{name}.{field.name}" for name in new_parts for field in dataclasses.fields(PARTS[name])}
    assert set(PART_WRONG_TYPES) == fields


@pytest.mark.parametrize(
    ("field", "value"), [(field, value) for field, values in WRONG_TYPES.items() for value in values], ids=repr
)
def test_a_field_of_the_wrong_type_is_refused_by_its_name(field: str, value: Any):
    with pytest.raises(ConfigError) as refused:
        Config(**{field: value})
    assert refused.value.field.partition(".")[0].partition("[")[0] == field  # or its part's field: retries.count
    assert str(refused.value).startswith(f"Config.{refused.value.field}: ")
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("path", "value"), [(path, value) for path, values in PART_WRONG_TYPES.items() for value in values], ids=repr
)
def test_a_parts_field_of_the_wrong_type_is_refused_by_its_path(path: str, value: Any):
    with pytest.raises(ConfigError) as refused:
        with_field(path, value)
    assert refused.value.field.partition("[")[0] == path  # or where in it: rates.rpm_by_agent[...]
    assert str(refused.value).startswith(f"Config.{refused.value.field}: ")
    assert "\n" not in str(refused.value)


def with_field(path: str, value: Any) -> Config:
    """A Config with `value` at `path` (a field, or a part's: `groups.target`), its groups of two rollouts."""
    name, _, field = path.partition(".")
    if not field:
        return Config(**{name: value})
    others: dict[str, Any] = {} if name == "repeats" else {"repeats": 2}
    named = {"mlflow": "http://127.0.0.1:5000"} if name == "trackers" and field != "mlflow" else {}
    return Config(**others, **{name: PARTS[name](**{**named, field: value})})


ANY_VALUE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8) | st.binary(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=3), inner),
    max_leaves=6,
)


@given(field=st.sampled_from([*WRONG_TYPES, *PART_WRONG_TYPES]), value=ANY_VALUE)
def test_any_value_of_any_field_is_taken_or_refused_in_one_line(field: str, value: Any):
    message = ""
    try:
        with_field(field, value)
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
        repeats=Repeats(2, by_agent=types.MappingProxyType({"a": 3}), seeds=True, pass_threshold=0),  # any mapping
        groups=Groups(keep_incomplete=True, field="reward_components.accuracy", max_staleness=0, batch=1),
        params=[("temperature", 0.7), ["metadata.x", None]],
        cost=Cost(prices=[(None, price), ["a", price]], max_usd=1),  # type: ignore[arg-type]
        shard=[1, 3],
        head_server="http://127.0.0.1:5",
        wire=Wire(proxy="socks5://127.0.0.1:6", cross_origin_redirects=True, max_reply_bytes=1),
        routing=Routing(policy="task", affinity_header="X-Session-ID"),
        rates=Rates(rpm=60, tpm_by_agent={"a": 1000}),
        adaptive=True,
        aggregate=True,
    )
    assert config.endpoints == {
        "a": ("http://127.0.0.1:2/run",),
        "b": ("http://127.0.0.1:3/run", "http://127.0.0.1:4/x"),
        "c": ("http://127.0.0.1:7/run",),
    }
    assert config.params == (("temperature", 0.7), ("metadata.x", None))
    assert config.cost.prices == ((None, price), ("a", price))
    assert config.shard == (1, 3)
    assert (config.cost.max_usd, config.repeats.pass_threshold, config.wire.max_reply_bytes) == (1, 0, 1)
    assert (config.repeats.by_agent, config.rates.tpm_by_agent, config.policy_version) == ({"a": 3}, {"a": 1000}, 0)


def test_agent_url_appends_run_only_without_a_path():
    assert agent_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/run"
    assert agent_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/run"
    assert agent_url("https://h/agents/x/run") == "https://h/agents/x/run"
    assert agent_url("http://h/prefix") == "http://h/prefix"  # a path without a slash is the endpoint
    for bad in ("127.0.0.1:8000", "ftp://h/", "http://h:99999/"):
        with pytest.raises(UsageError):
            agent_url(bad)


@pytest.mark.parametrize(("given", "run", "verify"), [
    ("http://h/prefix/", "http://h/prefix/run", "http://h/prefix/verify"),
    ("http://h/prefix/?key=v", "http://h/prefix/run?key=v", "http://h/prefix/verify?key=v"),
    ("http://h/?key=v", "http://h/run?key=v", "http://h/verify?key=v"),
    ("http://h/prefix/run", "http://h/prefix/run", "http://h/prefix/verify"),
    ("http://h/prefix", "http://h/prefix", "http://h/prefix"),
    ("http://h/a%2Fb/", "http://h/a%2Fb/run", "http://h/a%2Fb/verify"),  # one segment, as curl sends it
    ("http://h/a%3Fb/?k=v", "http://h/a%3Fb/run?k=v", "http://h/a%3Fb/verify?k=v"),
    ("http://h/%72un", "http://h/%72un", "http://h/%72un"),  # taken as given: not decoded to /run
    ("http://h/p/#part", "http://h/p/run#part", "http://h/p/verify#part"),
])  # fmt: skip
def test_a_path_that_ends_in_a_slash_is_a_base_the_endpoint_is_appended_to(given: str, run: str, verify: str):
    """A URL whose path ends in '/' (a server under a prefix) is a base URL, as the root is: /run or
    /verify is appended to it, the query kept. -u is parsed as an agent's before --reverify is known,
    so an agent's `run` under a base becomes `verify` there."""
    assert agent_url(given) == run
    assert verify_url(given) == verify
    assert verify_url(agent_url(given)) == verify


@pytest.mark.parametrize(("url", "aggregate"), [
    ("http://h/run", "http://h/aggregate_metrics"),
    ("http://h/p/verify?key=v#part", "http://h/p/aggregate_metrics?key=v"),
    ("http://h/p/score", "http://h/p/score/aggregate_metrics"),
    ("http://h/a%3Fb/run", "http://h/a%3Fb/aggregate_metrics"),
])  # fmt: skip
def test_an_endpoint_beside_run_or_verify_is_on_the_path_as_sent_with_the_query(url: str, aggregate: str):
    assert endpoint_beside(url, "/aggregate_metrics") == aggregate


@pytest.mark.parametrize("field", ["max_unhealthy", "max_masked"])
def test_a_recent_limit_that_cannot_be_used_is_refused_by_the_field_it_is_given_as(field: str):
    with pytest.raises(ConfigError, match=rf"^Config\.health\.{field}\.fraction: expected `float` <= 1"):
        Health(**{field: RecentLimit(fraction=2.0)})
    with pytest.raises(ConfigError, match=rf"^Config\.health\.{field}\.count: expected `int` >= 1"):
        Health(**{field: RecentLimit(count=0)})
    with pytest.raises(ConfigError, match=rf"^Config\.health\.{field}: a limit takes a count or a fraction, not"):
        Health(**{field: RecentLimit(count=1, fraction=0.5)})


@pytest.mark.parametrize("field", ["url", "endpoints", "head_server", "wire.proxy"])
def test_a_url_that_does_not_parse_is_refused_in_one_line(field: str):
    url = "http://us3r:pa55@[::1/run"  # urllib refuses to split it at all
    with pytest.raises(UsageError) as refused:
        with_field(field, {"a": url} if field == "endpoints" else url)
    assert "not an" in str(refused.value)
    assert "pa55" not in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("host", ["127.0.0.1%00x", "127.0.0.%31", "exa mple", "a\x01b", "a\x00b", "a!b", "a<b"])
@pytest.mark.parametrize("field", ["url", "endpoints", "head_server", "wire.proxy"])
def test_a_host_with_a_character_curl_refuses_is_refused(field: str, host: str):
    url = f"http://us3r:pa55@{host}:8000/run"
    with pytest.raises(UsageError) as refused:
        with_field(field, {"a": url} if field == "endpoints" else url)
    # httpx refuses a control character itself; what it takes, the check refuses as curl does.
    assert "whose host holds" in str(refused.value) or "non-printable" in str(refused.value)
    assert "8000/run" in str(refused.value)  # which of the URLs it is
    assert "pa55" not in str(refused.value)
    assert "\n" not in str(refused.value)


def test_hosts_curl_takes_are_taken():
    for host in ("a_b.localhost", "xn--9ca.localhost", "[::1]", "[fe80::1%25eth0]", "127.0.0.1"):
        assert agent_url(f"http://{host}:8000") == f"http://{host}:8000/run"
    assert agent_url("http://é.localhost:8000") == "http://xn--9ca.localhost:8000/run"  # as it goes on the wire


def test_a_configs_repr_never_shows_a_header_value():
    config = Config(url="http://127.0.0.1:1/run", headers=(("Authorization", "Bearer S3CRET"),))
    assert "S3CRET" not in repr(config)
    assert "S3CRET" not in str(config)


def test_re_scoring_sends_to_verify_and_goes_one_rollout_at_a_time():
    from rollfilter.config import Reverify

    config = Config(url="http://127.0.0.1:9", endpoints={"a": "http://h:1/run", "b": "http://h:2/v"},
                    reverify=Reverify("m.jsonl"))  # fmt: skip
    assert config.url == "http://127.0.0.1:9/verify"
    assert config.endpoints == {"a": ("http://h:1/verify",), "b": ("http://h:2/v",)}
    assert Config(url="http://127.0.0.1:9").url == "http://127.0.0.1:9/run"
    with pytest.raises(ConfigError, match=r"^Config\.reverify: .*not with Config\.groups"):
        Config(url="http://h", repeats=2, groups=True, reverify=Reverify("m.jsonl"))
    with pytest.raises(ConfigError, match=r"^Config\.reverify\.materialized: "):
        Reverify("")


def test_an_affinity_header_the_headers_set_already_is_refused_without_suggesting_itself():
    with pytest.raises(ConfigError) as refused:
        Config(
            url="http://127.0.0.1:1/run",
            routing=Routing(affinity_header="x-session-id"),
            headers=(("X-Session-ID", "1"),),
        )
    assert refused.value.field == "routing.affinity_header"
    assert "leave it out of them" in str(refused.value)
    assert "such as X-Session-ID" not in str(refused.value)


def test_trackers_name_a_tracker():
    with pytest.raises(ConfigError, match=r"^Config.trackers: names no tracker"):
        Trackers()
    trackers = Trackers(wandb="project", ids_file=pathlib.Path("out.jsonl.trackers.json"))
    assert (trackers.experiment, trackers.rollouts, trackers.ids_file) == ("rollfilter", 100, "out.jsonl.trackers.json")
    assert Config(trackers=trackers).trackers is trackers
