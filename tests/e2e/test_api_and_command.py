"""The same rows and `Config` through the command and through `rollouts()`: one `Run`, one summary.

Each case runs the rows once through the command (in this process, `conftest.invoke`) and once
through the Python API, and compares the two summaries field by field, timings aside, and the
warnings the run gave. The agent is the demo agent, whose rewards the rows choose, and the runs
send one row at a time, so that a stop at a target ends both at the same row.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import trio

from rollfilter import Config, Groups, Repeats, Reverify, RollfilterError, ServiceError, open_rollouts, rollouts
from rollfilter.api.in_trio import FinalReport
from tests.conftest import DemoServer, closed_port_url, invoke, read_jsonl, rows_jsonl, serving, summary_of
from tests.e2e.test_groups import K, group_rows
from tests.e2e.test_reverify import files as reverify_files
from tests.servers.resources_server import ResourcesServer

# What depends on the clock, not on the rows.
TIMINGS = ("elapsed_s", "rows_per_s", "tokens_per_s", "latency_s")


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    options: tuple[str, ...]
    config: dict[str, Any]
    rows: int = 12
    warned: tuple[str, ...] = ()  # the problems the run's warnings say


CASES = [
    Case("repeats", ("-r", "3"), {"repeats": 3}),
    Case(
        "repeats by agent, one naming no row",
        ("-r", "2", "-r", "nobody=3"),
        {"repeats": Repeats(2, by_agent={"nobody": 3})},
        warned=("no row named agent 'nobody'",),
    ),
    Case("groups", ("-r", str(K), "--groups"), {"repeats": K, "groups": True}),
    Case(
        "groups to a target",
        ("-r", str(K), "--groups", "--target-groups", "3"),
        {"repeats": K, "groups": Groups(target=3)},
    ),
    Case(
        "a target the first group meets, most rows never read",
        ("-r", str(K), "--groups", "--target-groups", "1"),
        {"repeats": K, "groups": Groups(target=1)},
        rows=24,
    ),
    Case(
        "uniform groups dropped",
        ("-r", str(K), "--drop-uniform", "--target-groups", "4"),
        {"repeats": K, "groups": Groups(drop_uniform=True, target=4)},
    ),
]


def _without_timings(summary: dict[str, Any]) -> dict[str, Any]:
    figures = {key: value for key, value in summary["rollfilter"].items() if key not in TIMINGS}
    return {**summary, "rollfilter": figures}


def _command_warnings(stderr: bytes) -> list[str]:
    """The command's message lines, the summary left out, without the command's prefix."""
    lines = stderr.decode().splitlines()[:-1]
    return [line.removeprefix("rollfilter: ") for line in lines if line.startswith("rollfilter: ")]


def _through_the_command(case: Case, rows: Path, url: str) -> tuple[dict[str, Any], list[str]]:
    proc = invoke(["-u", url, "-j", "1", *case.options, str(rows)])
    assert proc.returncode == 0, proc.stderr
    return _without_timings(summary_of(proc.stderr)), _command_warnings(proc.stderr)


def _through_the_api(case: Case, rows: list[dict[str, Any]], url: str, loop: str) -> tuple[dict[str, Any], list[str]]:
    """The run through `rollouts()` from this thread, or `open_rollouts` under asyncio or trio."""
    config = Config(url=url, concurrency=1, **case.config)
    results: FinalReport
    if loop == "thread":
        results = rollouts(rows, config)
        for _ in results:
            pass
    else:

        async def collect() -> FinalReport:
            async with open_rollouts(rows, config) as run:
                async for _ in run:
                    pass
            return run

        results = asyncio.run(collect()) if loop == "asyncio" else trio.run(collect)
    assert results.summary is not None
    return _without_timings(results.summary), results.warnings


@pytest.mark.parametrize("loop", ["thread", "asyncio", "trio"])
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_command_and_the_api_summarize_the_same_run_alike(
    case: Case, loop: str, tmp_path: Path, demo_server: DemoServer
):
    rows = group_rows(case.rows, latency=lambda task, rollout: 0.0)
    path = tmp_path / "rows.jsonl"
    path.write_text(rows_jsonl(rows))
    command_summary, command_warnings = _through_the_command(case, path, demo_server.url)
    api_summary, api_warnings = _through_the_api(case, rows, demo_server.url, loop)
    differences = {
        key: (command_summary["rollfilter"].get(key), api_summary["rollfilter"].get(key))
        for key in command_summary["rollfilter"].keys() | api_summary["rollfilter"].keys()
        if command_summary["rollfilter"].get(key) != api_summary["rollfilter"].get(key)
    }
    assert differences == {}, json.dumps(differences)
    assert command_summary == api_summary
    # And what they say is so: every pair of the rows expected, those never read not started.
    figures = api_summary["rollfilter"]
    assert figures["expected"] == case.rows * Config(**case.config).repeats.default
    if "stopped" in figures or case.config.get("groups"):
        assert figures["not_started"] == figures["expected"] - figures["rows_read"]
        assert figures["not_started"] > 0 if "stopped" in figures else figures["not_started"] == 0
    # The same warnings, each naming what the caller gave: the option, or the Config field.
    assert [line.partition(": ")[2] for line in command_warnings] == list(case.warned)
    assert [line.partition(": ")[0] for line in command_warnings] == ["-r nobody=K"] * len(case.warned)
    assert [line.partition(": ")[2] for line in api_warnings] == list(case.warned)


STOPS_BEFORE_SENDING = ["head server unreachable", "reverify_mode HTTP 500", "no reverify_mode", "materialized folder"]


@pytest.mark.parametrize("stop", STOPS_BEFORE_SENDING)
def test_a_run_stopped_before_it_sends_raises_what_the_command_says(tmp_path: Path, stop: str):
    """The Python API raises the error whose line the command says, and the command's status is
    its exit status; the command's summary follows the line when a service stopped it (exit 3)."""
    materialized, rollout_lines = reverify_files(tmp_path)
    with serving(ResourcesServer(mode_status=500 if stop == "reverify_mode HTTP 500" else 404)) as server:
        if stop == "head server unreachable":
            head = closed_port_url()
            options, config = ["--head-server", head], Config(head_server=head)
        else:
            path = str(tmp_path if stop == "materialized folder" else materialized)
            options, config = ["--reverify", path, "-u", server.url], Config(url=server.url, reverify=Reverify(path))
        proc = invoke([*options, str(rollout_lines)])
        with pytest.raises(RollfilterError) as raised:
            for _ in rollouts(read_jsonl(rollout_lines), config):
                pass
        assert server.bodies == []
    line, *after = proc.stderr.decode().splitlines()
    assert line == f"rollfilter: {raised.value}"
    assert proc.returncode == raised.value.exit_status
    if isinstance(raised.value, ServiceError):
        assert [json.loads(summary)["rollfilter"]["stopped"] for summary in after] == [str(raised.value)]
    else:
        assert after == []
