"""cli/parsers.py: option texts parsed, and what each refuses said by its option, never the value of a secret."""

from __future__ import annotations

import re
from typing import Any

import pytest

from rollfilter.cli import parsers
from rollfilter.config import ConfigError, FailureLimit, Groups
from rollfilter.cost import Price, PriceError
from rollfilter.errors import ExitStatus, UsageError
from tests.conftest import array_task, run

SECRET = "secret-value"


def test_a_header_is_checked_as_config_checks_it_and_named_by_its_option():
    assert parsers.header(" X-Token :  a b ") == ("X-Token", "a b")
    assert parsers.header("Authorization: Bearer abc") == ("Authorization", "Bearer abc")
    with pytest.raises(UsageError) as refused:
        parsers.header("X-Token " + SECRET)
    assert str(refused.value) == "-H/--header wants 'Name: value' (the value is not shown)"
    # What cannot go on the wire, Config refuses, and the command line says it by the option.
    for spec in ("X-Token " + SECRET, "Bad Name: " + SECRET, "Tôken: " + SECRET, "X-Token: " + SECRET + "\r\nA: 1"):
        proc = run(["-u", "http://127.0.0.1:1", "-H", spec], input=b"")
        assert proc.returncode == ExitStatus.USAGE
        assert proc.stderr.decode().startswith("rollfilter: -H/--header ")
        assert SECRET not in proc.stderr.decode()


def test_shard_auto_is_the_array_tasks_offset_from_the_first():
    slurm_shard = parsers.slurm_shard
    assert [slurm_shard(array_task(task, 0, 4)) for task in range(4)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    assert [slurm_shard(array_task(task, 1, 4)) for task in range(1, 5)] == [(0, 4), (1, 4), (2, 4), (3, 4)]
    stepped = {**array_task(6, 0, 3), "SLURM_ARRAY_TASK_STEP": "3"}  # --array=0-6:3
    assert slurm_shard(stepped) == (2, 3)
    for broken in ({}, array_task(5, 1, 4), {**array_task(4, 0, 3), "SLURM_ARRAY_TASK_STEP": "3"}):
        with pytest.raises(UsageError, match=r"^--shard auto"):
            slurm_shard(broken)


def test_a_shard_is_i_of_n():
    assert parsers.shard("1/3", {}) == (1, 3)
    assert parsers.shard(None, {}) is None
    assert parsers.shard("3/2", {}) == (3, 2)  # Config refuses it (tests/cli/test_command.py)
    with pytest.raises(UsageError) as refused:
        parsers.shard("x", {})
    assert str(refused.value) == "--shard wants I/N, like 0/4, got 'x'"


def test_a_param_takes_json_else_string():
    assert parsers.param("temperature=0.7") == ("temperature", 0.7)
    assert parsers.param("model=my-model") == ("model", "my-model")
    assert parsers.param("tools=[]") == ("tools", [])
    assert parsers.param("x=") == ("x", "")
    assert parsers.param("stop=null") == ("stop", None)
    for bad in ("novalue", "=3", "a..b=1", "+=1", "responses_create_params.=1"):
        with pytest.raises(UsageError, match=r"^-p/--param wants KEY=VALUE"):
            parsers.param(bad)


def test_a_param_in_nemo_gym_s_spelling_means_the_key_inside_responses_create_params():
    for spelling in ("responses_create_params.temperature", "+responses_create_params.temperature", "++temperature"):
        assert parsers.param(f"{spelling}=0.7") == ("temperature", 0.7)
    assert parsers.param("+responses_create_params.metadata.x=1") == ("metadata.x", 1)
    with pytest.raises(UsageError, match=r"^-p sets keys inside responses_create_params: give -p KEY=VALUE"):
        parsers.param('responses_create_params={"temperature": 0.7}')
    with pytest.raises(UsageError, match=r"^-p sets keys inside responses_create_params: give -p KEY=VALUE"):
        parsers.param("+responses_create_params.responses_create_params.temperature=0.7")


def test_a_url_without_a_scheme_is_read_as_curl_reads_it():
    assert parsers.url(":18777") == "http://127.0.0.1:18777/run"
    assert parsers.url("agent-host:8000") == "http://agent-host:8000/run"
    assert parsers.endpoints(["a=:1,h:2/x"]) == {"a": ("http://127.0.0.1:1/run", "http://h:2/x")}
    assert parsers.service_url("--head-server")(":11000") == "http://127.0.0.1:11000"
    with pytest.raises(UsageError) as refused:
        parsers.url("user:s3cret@h:99999")
    assert str(refused.value) == "bad port in URL 'http://h:99999', read from 'h:99999' as curl reads it"
    for typed, quoted in [("//h:x", "//h:x"), ("a b:1", "a b:1"), ("u:s3cret@h:x?token=t", "h:x")]:
        with pytest.raises(UsageError) as refused:
            parsers.url(typed)
        assert str(refused.value).endswith(f", read from {quoted!r} as curl reads it"), typed


def test_endpoints_collect_replicas():
    endpoints = parsers.endpoints(["a=http://h:1", "a=http://h:2,http://h:3", "b=http://h:4/x"])
    assert endpoints == {"a": ("http://h:1/run", "http://h:2/run", "http://h:3/run"), "b": ("http://h:4/x",)}
    with pytest.raises(UsageError, match=r"^-e/--endpoint wants NAME=URL"):
        parsers.endpoints(["nourl"])


def test_a_comma_in_a_replica_s_query_stays_in_it():
    """A query may hold commas (`?tags=a,b`): what follows one there is the query's, unless it
    names a scheme, as the next replica's URL does."""
    assert parsers.endpoints(["a=http://h:1/?tags=x,y"]) == {"a": ("http://h:1/run?tags=x,y",)}
    assert parsers.endpoints(["a=http://h:1/p#x,y,z"]) == {"a": ("http://h:1/p#x,y,z",)}
    both = parsers.endpoints(["a=http://h:1/?k=v,http://h:2/?k=v"])
    assert both == {"a": ("http://h:1/run?k=v", "http://h:2/run?k=v")}
    assert parsers.endpoints(["a=h:1,h:2"]) == {"a": ("http://h:1/run", "http://h:2/run")}


@pytest.mark.parametrize("given", [["a=http://h:1,http://h:1/run"], ["a=http://h:1", "a=http://h:2,http://h:1"]])
def test_a_replica_given_twice_is_refused_by_its_url_without_its_secrets(given: list[str]):
    with pytest.raises(UsageError, match=r"^-e/--endpoint a: http://h:1/run is given twice"):
        parsers.endpoints(given)
    with pytest.raises(UsageError) as refused:
        parsers.endpoints([f"a=http://user:{SECRET}@h:1,http://user:{SECRET}@h:1"])
    assert SECRET not in str(refused.value)


def test_statuses_and_failure_limits():
    assert parsers.statuses("429, 503") == {429, 503}
    assert parsers.statuses("") == frozenset()
    with pytest.raises(UsageError, match=r"^--retry-on wants HTTP statuses"):
        parsers.statuses("abc")
    assert parsers.failure_limit("5") == FailureLimit(count=5)
    assert parsers.failure_limit("2.5%") == FailureLimit(fraction=0.025)
    for bad in ("0", "-1", "101%", "x%", "nan%"):
        with pytest.raises(UsageError, match=r"^--max-failures wants"):
            parsers.failure_limit(bad)
    rate = FailureLimit(fraction=0.1)
    assert not rate.is_reached(failed=5, ended=10)  # too few ended rows to judge a rate
    assert rate.is_reached(failed=3, ended=20)
    assert not rate.is_reached(failed=1, ended=20)


@pytest.mark.parametrize("bad", ["1_000", "+3", "\u0663", "\u00b2", "1_0%", "\u0663\u0660%", "0x10", " 5 %"])
def test_a_count_or_rate_limit_is_ascii_digits_as_every_number_from_outside(bad: str):
    """int() and float() take what no user means as a count (`1_000`, an Arabic-Indic digit, a
    sign): each limit refuses it in one line naming the option."""
    for option, parse in [
        ("--max-failures", parsers.failure_limit),
        ("--max-unhealthy", parsers.recent_limit("--max-unhealthy")),
        ("--max-masked", parsers.recent_limit("--max-masked")),
    ]:
        with pytest.raises(UsageError, match=rf"^{option} wants a count like 10"):
            parse(bad)
    assert parsers.failure_limit(" 7 ") == FailureLimit(count=7)  # space around, as a shell may leave it
    assert parsers.failure_limit("2.5%") == FailureLimit(fraction=0.025)
    assert parsers.failure_limit("100%") == FailureLimit(fraction=1.0)
    assert parsers.failure_limit("1e1%") == FailureLimit(fraction=0.1)  # as --price and --rpm take numbers


def test_numbers_of_seconds_and_usd_are_positive_and_finite():
    timeout = parsers.positive("--timeout", "seconds")
    assert timeout("2.5") == 2.5
    assert timeout(None) is None
    for bad in ("0", "-1", "inf", "nan", "1e400", "x"):
        with pytest.raises(UsageError, match=r"^--timeout must be a positive, finite number of seconds, got "):
            timeout(bad)
    threshold = parsers.finite("--pass-threshold")
    assert threshold("-3") == -3.0
    with pytest.raises(UsageError, match=r"^--pass-threshold must be a finite number"):
        threshold("nan")


def test_repeats_are_a_default_and_counts_by_agent():
    assert parsers.repeats(["2", "a=3", "b=1", "4"]) == (4, {"a": 3, "b": 1})
    assert parsers.repeats([]) == (None, {})
    for bad in ("0", "=2", "a=", "²", "4294967296"):
        with pytest.raises(UsageError, match=r"^-r/--repeats wants K or NAME=K with 1 <= K <= 4294967295"):
            parsers.repeats([bad])


@pytest.mark.parametrize("spec", ["1", "a=1", "=1,2", "1,2,3,4", "1,-2", "x=1,nan", "1,inf", "1_000,2", "\uff11,2"])
def test_a_bad_price_is_refused_by_its_option(spec: str):
    with pytest.raises(UsageError) as refused:
        parsers.parse_price(spec)
    assert str(refused.value) == f"--price wants [AGENT=]IN,OUT[,CACHED] in USD per million tokens, got {spec!r}"


def test_the_last_price_of_an_agent_wins_over_the_file(tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("a: [1, 2, 0.5]\nb: [3, 4]\n_default: [5, 6]\n")
    found = dict(parsers.prices(["a=7,8", "9,10"], str(prices)))
    # --price a=7,8 replaces the file's price of a whole: its cached price too.
    assert found == {"a": Price(7, 8), "b": Price(3, 4), None: Price(9, 10)}


def test_a_prices_file_names_the_agent_whose_price_cannot_be_held():
    with pytest.raises(PriceError) as refused:
        parsers.prices_from_mapping({"alpha": [1, 2], "beta": [10**400, 2]})
    assert str(refused.value) == (
        "the price of 'beta': the input price must be a finite number of USD, 0 or more, got a number of 401 digits"
    )
    with pytest.raises(PriceError, match="the price of 'c': the output price must be a finite number"):
        parsers.prices_from_mapping({"c": {"input": 1, "output": -2}})  # Price's own check, reached


def test_the_command_line_refuses_a_url_that_does_not_parse_as_bad_usage():
    done = run(["-e", "a=http://[::1/run", "/dev/null"])
    assert done.returncode == ExitStatus.USAGE
    assert done.stderr.decode().startswith("rollfilter: not an http(s) URL: ")
    assert done.stderr.decode().count("\n") == 1
    assert done.stdout == b""


def test_gym_layout_names_nemo_gyms_files_after_the_output():
    assert parsers.gym_layout("out/OUT.jsonl") == (
        "out/OUT_materialized_inputs.jsonl",
        "out/OUT_failures.jsonl",
        "out/OUT_aggregate_metrics.json",
        "out/OUT_progress",
    )
    with pytest.raises(UsageError, match=r"^--gym-layout needs -o OUT.jsonl"):
        parsers.gym_layout(None)


def test_a_prometheus_address_is_host_and_port():
    assert parsers.listen_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parsers.listen_address("[::1]:9464") == ("::1", 9464)
    assert parsers.listen_address("localhost:1") == ("localhost", 1)
    for text, problem in (
        ("9464", "give HOST:PORT"),
        (":9464", "give HOST:PORT"),
        ("::1:9464", "an IPv6 address goes in brackets"),
        ("127.0.0.1:65536", "the port must be a number from 1 to 65535"),
        ("127.0.0.1:0", "the port must be a number from 1 to 65535"),
        ("127.0.0.1:९४", "the port must be a number from 1 to 65535"),
        ("127.0.0.1:", "the port must be a number from 1 to 65535"),
    ):
        with pytest.raises(UsageError, match=f"^--prometheus {re.escape(text)}: {problem}"):
            parsers.listen_address(text)
    assert parsers.prometheus(None, None) == {"prometheus": None, "prometheus_file": None}


def test_a_policy_version_is_at_most_2_to_the_53():
    with pytest.raises(UsageError, match=r"--policy-version is a whole number of at most 9007199254740992"):
        parsers.policy_version(2**53 + 1)
    assert parsers.policy_version(-(2**53)) == -(2**53)
    assert parsers.policy_version(None) is None


def groups(grouped: bool = True, **given: object) -> Groups | None:
    """parsers.groups of the options of groups `given`, the rest not given."""
    options: dict[str, Any] = {"keep_incomplete": False, "drop_uniform": False, "field": None, "target": None}
    options |= {"max_staleness": None, "batch": None, "refused": {}}
    return parsers.groups(grouped, **{**options, **given})


def test_the_options_of_groups_make_groups_and_are_refused_without_them():
    assert groups() == Groups()
    assert groups(False, drop_uniform=True, field="accuracy") == Groups(drop_uniform=True, field="accuracy")
    assert groups(target=3, max_staleness=1, batch=2) == Groups(target=3, max_staleness=1, batch=2)
    assert groups(False) is None
    for given, option in (({"keep_incomplete": True}, "--keep-incomplete"), ({"target": 2}, "--target-groups")):
        with pytest.raises(UsageError, match=rf"^{option} is about groups: give --groups \(or --drop-uniform\)$"):
            groups(False, **given)
    with pytest.raises(UsageError, match=r"^--max-staleness needs --groups \(or --drop-uniform\): staleness is"):
        groups(False, max_staleness=1, batch=2)
    with pytest.raises(UsageError, match=r"^--groups cannot go with -k: "):
        groups(refused={"-k": True})
    with pytest.raises(UsageError, match=r"^--group-field is what --drop-uniform compares"):
        groups(field="accuracy")


def test_what_groups_check_they_check_before_groups_are_asked_for():
    # Groups refuses half a staleness bound by its field (the command line says it by option:
    # tests/e2e/test_options.py), before the command line asks for --groups.
    with pytest.raises(ConfigError) as refused:
        groups(False, max_staleness=1)
    assert refused.value.field == "groups.max_staleness"


@pytest.mark.usefixtures("tracker_clients")
def test_trackers_take_their_run_name_from_the_outputs_stem_and_their_defaults():
    trackers = parsers.trackers(
        mlflow="http://127.0.0.1:5000", experiment=None, wandb="proj", run_name=None, rollouts=None, output="d/o.jsonl"
    )
    assert trackers is not None
    assert (trackers.experiment, trackers.run_name, trackers.rollouts) == ("rollfilter", "o", 100)
    none = {"mlflow": None, "experiment": None, "wandb": None, "run_name": None, "rollouts": None, "output": "o"}
    assert parsers.trackers(**none) is None


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"experiment": "e"}, "--experiment goes with --mlflow or --wandb: give one of them"),
        ({"run_name": "r"}, "--run-name goes with --mlflow or --wandb: give one of them"),
        ({"rollouts": 5}, "--track-rollouts goes with --mlflow or --wandb: give one of them"),
        ({"wandb": "p", "experiment": "e"}, "--experiment names an MLflow experiment: give it with --mlflow"),
        ({"wandb": " "}, "--wandb wants a name, not an empty text"),
    ],
)
def test_options_of_trackers_that_cannot_be_used_are_refused(given: dict[str, Any], message: str):
    options = {"mlflow": None, "experiment": None, "wandb": None, "run_name": None, "rollouts": None, "output": None}
    with pytest.raises(UsageError, match=f"^{re.escape(message)}$"):
        parsers.trackers(**{**options, **given})


@pytest.mark.parametrize(("option", "extra"), [("--mlflow", "mlflow"), ("--wandb", "wandb")])
def test_a_tracker_without_its_client_exits_2_with_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, option: str, extra: str
):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    proc = run(["-u", "http://127.0.0.1:9/run", option, "x"])
    assert proc.returncode == ExitStatus.USAGE
    assert proc.stderr.decode().splitlines() == [
        f"rollfilter: {option} needs its client, not installed here: pip install 'rollfilter[{extra}]'"
    ]
