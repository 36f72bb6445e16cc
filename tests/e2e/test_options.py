"""Every numeric option: any value is refused in one line or runs."""

from __future__ import annotations

import json
from typing import Annotated

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import (
    closed_port_url,
    invoke,
    rows_jsonl,
    run,
    simple_rows,
    summary_of,
)


def numeric_options() -> dict[str, type]:
    """Every option whose value is a number, found in the command itself: the annotations of the
    command's parameters (int or float, or either or None), by the option that sets each."""
    import inspect
    import types
    import typing

    import typer.main

    from rollfilter.cli.options import parse, typer_app

    hints = {  # Annotated[...] stripped
        name: typing.get_args(param.annotation)[0] if typing.get_origin(param.annotation) is Annotated else None
        for name, param in inspect.signature(parse).parameters.items()
    }
    found = {}
    for param in typer.main.get_command(typer_app).params:
        hint = hints.get(param.name or "")  # none for typer's own (--install-completion)
        kinds = set(typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)) - {type(None)}
        if len(kinds) == 1 and kinds <= {int, float} and param.opts[0].startswith("-"):
            found[param.opts[-1]] = kinds.pop()
    return found


NUMERIC_OPTIONS = numeric_options()


def test_the_numeric_options_are_found():
    expected = {"--concurrency": int, "--timeout": float, "--limit": int, "--max-cost": float}
    assert expected.items() <= NUMERIC_OPTIONS.items()


EDGE_INTEGERS = st.integers() | st.sampled_from([0, -1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64, 10**30])


EDGE_FLOATS = st.floats().map(repr) | st.sampled_from(["1e400", "-1e400", "1e-400", "1e308", "nan", "inf", "-inf"])


VALUE_OF_KIND = {int: EDGE_INTEGERS.map(str), float: EDGE_FLOATS}


# Options whose text holds numbers of its own form.
NUMBERS_IN_TEXT = {
    "--repeats": EDGE_INTEGERS.map(str) | EDGE_INTEGERS.map(lambda k: f"agent={k}"),
    "--shard": st.tuples(EDGE_INTEGERS, EDGE_INTEGERS).map(lambda pair: f"{pair[0]}/{pair[1]}"),
    "--max-failures": EDGE_INTEGERS.map(str) | EDGE_FLOATS.map(lambda p: f"{p}%"),
    "--retry-on": EDGE_INTEGERS.map(str),
}


OPTION_VALUES = st.one_of(
    *(st.tuples(st.just(option), VALUE_OF_KIND[kind]) for option, kind in NUMERIC_OPTIONS.items()),
    *(st.tuples(st.just(option), values) for option, values in NUMBERS_IN_TEXT.items()),
)


def test_the_numeric_options_are_all_found():
    assert {"--concurrency", "--limit", "--retries", "--timeout", "--pass-threshold"} <= set(NUMERIC_OPTIONS)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option_value=OPTION_VALUES)
def test_any_value_of_a_numeric_option_is_refused_in_one_line_or_runs(
    tmp_path_factory: pytest.TempPathFactory, capfd: pytest.CaptureFixture[str], option_value: tuple[str, str]
):
    from rollfilter.cli.environment import of_process
    from rollfilter.cli.main import run_command

    option, value = option_value
    folder = tmp_path_factory.mktemp("numeric")
    empty = folder / "rows.jsonl"
    empty.write_text("")
    results = folder / "results.jsonl"
    results.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n')
    for mode in (["--dry-run", "-u", closed_port_url(), str(empty)], ["--summarize", str(results)]):
        status = run_command([*mode, "-q", f"{option}={value}"], of_process())
        stderr = capfd.readouterr().err
        assert status in (0, 1, 2), stderr  # 1: it ran, and a line failed (--max-line-bytes 1, say)
        if status == 2:
            [line] = stderr.splitlines()
            assert line.startswith("rollfilter: ")
        assert all(line.startswith("rollfilter: ") for line in stderr.splitlines()), stderr


@pytest.mark.parametrize(
    "args",
    [
        ["-r", "4294967296"],
        ["-r", "agent=4294967296"],
        ["-r", "1" + "0" * 30],
        ["--pass-threshold", "nan"],
        ["--pass-threshold", "inf"],
        ["--pass-threshold", "-inf"],
        ["--pass-threshold", "1e400"],
    ],
)
def test_a_value_that_cannot_be_honoured_is_a_usage_error(args: list[str]):
    proc = run(["-u", closed_port_url(), *args], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 2
    [message] = proc.stderr.decode().splitlines()
    repeats = "-r/--repeats wants K or NAME=K with 1 <= K <= 4294967295"
    start = repeats if args[0] == "-r" else "--pass-threshold must be"
    assert message.startswith(f"rollfilter: {start}")


def test_a_verbose_event_of_a_rollout_not_persisted_says_a_resume_runs_it(agent):
    row = {"responses_create_params": {"input": "q"}, "answer": {"_ng_no_persist": True}}
    proc = run(["-u", agent.run_url, "-a", "agent", "-v", "-q"], input=rows_jsonl([row]))
    assert proc.returncode == 1
    lines = proc.stderr.decode().splitlines()
    assert [line for line in lines if "not persisted" in line] == [
        "rollfilter: <stdin>:1 task 0 rollout 0: not persisted (the agent's _ng_no_persist);"
        " a resumed run runs it again"
    ]


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("1.0", None),  # a whole number, as typer 0.29 read it
        (" 2 ", None),
        ("1_0", None),
        ("2.5", "Input should be a valid integer, unable to parse string as an integer"),
        ("\u0663", "Input should be a valid integer, unable to parse string as an integer"),  # an Arabic-Indic 3
        ("0", "Input should be greater than or equal to 1"),
    ],
)
def test_a_whole_number_option_reads_and_refuses_as_before(value: str, said: str | None):
    proc = run(["--dry-run", "-q", "-u", closed_port_url(), "-j", value], input=rows_jsonl(simple_rows(1)))
    if said is None:
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode == 2
        assert proc.stderr.decode() == (
            "rollfilter: Invalid value for '-j' / '--concurrency' (env var: 'ROLLFILTER_CONCURRENCY'):"
            f" {said} (see 'rollfilter --help')\n"
        )


def test_the_usage_line_says_several_files_are_taken():
    assert "Usage: rollfilter [OPTIONS] [FILE]...\n" in run(["--help"]).stdout.decode()


@pytest.mark.parametrize("layout", ["--gym-layout", "--aggregate"])
def test_the_agents_aggregate_of_rows_that_name_no_agent_fails_the_run_and_says_how(demo_server, tmp_path, layout):
    """-u alone names no agent, so rows without an agent_ref of their own are in no agent's
    aggregate: the run says so and ends with status 1, not 0 with an empty aggregate file."""
    aggregate = tmp_path / ("out_aggregate_metrics.json" if layout == "--gym-layout" else "agg.json")
    args = ["-o", "out.jsonl"] if layout == "--gym-layout" else [str(aggregate)]
    proc = run(["-u", demo_server.url, layout, *args], input=rows_jsonl(simple_rows(2)), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.decode().splitlines()
    assert lines[:2] == [
        "rollfilter: --aggregate: 2 results name no agent (their rows went to a URL, not to an agent by name),"
        " so no agent was asked to aggregate them",
        "rollfilter: --aggregate: to name the rows' agent, give -a NAME beside -u (or -e NAME=URL -a NAME)",
    ]
    assert json.loads(lines[-1])["rollfilter"]["succeeded"] == 2  # the summary, last
    assert json.loads(aggregate.read_text()) == []


def test_the_agents_aggregate_of_rows_that_name_their_agent_is_asked_of_it_with_u_alone(demo_server, tmp_path):
    """NeMo Gym's prepared rows carry agent_ref: -u sends them all to one URL, and each agent
    they name is asked for its aggregate there."""
    rows = [{**row, "agent_ref": {"name": "simple_agent"}} for row in simple_rows(2)]
    proc = run(["-u", demo_server.url, "--aggregate", "agg.json"], input=rows_jsonl(rows), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    [entry] = json.loads((tmp_path / "agg.json").read_text())
    assert entry["agent_ref"]["name"] == "simple_agent"


def test_a_url_given_as_its_port_alone_reaches_this_machine(demo_server):
    port = demo_server.url.removeprefix("http://127.0.0.1:").split("/")[0]
    proc = run(["-u", f":{port}"], input=rows_jsonl(simple_rows(2)))
    assert proc.returncode == 0, proc.stderr
    assert summary_of(proc.stderr)["rollfilter"]["succeeded"] == 2


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--max-staleness", "1"], "--max-staleness needs --batch-groups too: a staleness bound is the two together"),
        (["--batch-groups", "2"], "--batch-groups needs --max-staleness too: a staleness bound is the two together"),
        (
            ["--max-staleness", "1", "--batch-groups", "2"],
            "--max-staleness needs --groups (or --drop-uniform): staleness is bounded group by group",
        ),
        (["--shard", "3/2"], "--shard I/N wants 0 <= I < N"),
        (["--max-cost", "3"], "--max-cost needs --prices: without them nothing is spent"),
        (["-r", "4", "--keep-incomplete"], "--keep-incomplete is about groups: give --groups (or --drop-uniform)"),
    ],
)
def test_a_rule_config_checks_is_said_by_the_options_it_names(args: list[str], said: str):
    proc = run(["-u", closed_port_url(), *args], input=rows_jsonl(simple_rows(1)))
    assert (proc.returncode, proc.stderr.decode()) == (2, f"rollfilter: {said}\n")


def test_a_staleness_bound_without_the_control_to_raise_the_version_is_refused(demo_server):
    # Only the control's version command lets the groups past the first bound go: without it, the
    # run would wait for ever once they were sent.
    staleness = ["--groups", "-r", "2", "--max-staleness", "0", "--batch-groups", "1"]
    result = invoke(["-u", demo_server.url, *staleness], input=rows_jsonl(simple_rows(4)))
    assert (result.returncode, result.stdout) == (2, b"")
    assert result.stderr == (
        b"rollfilter: --max-staleness needs --control SOCKET: the groups past the bound wait for a new policy"
        b" version, which only the control's version command gives\n"
    )
    assert demo_server.stats()["requests"] == 0
