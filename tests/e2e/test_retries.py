"""Retries: which failures are sent again, Retry-After, and the retry budget."""

from __future__ import annotations

import json
import re

import pytest

from rollfilter.engine.routing import UNREACHABLE_AFTER_FAILURES
from tests.conftest import (
    DemoServer,
    assert_counts_add_up,
    closed_port_url,
    read_jsonl,
    rows_jsonl,
    run,
    simple_rows,
    summary_of,
)

ROWS = 200


def rows(faulty: int, **fault: object) -> str:
    """ROWS rows, the last `faulty` of them with `fault`: their retries come once the rows before
    have paid into the budget, whatever order the answers come back in."""
    return "".join(
        json.dumps(
            {"id": i, "responses_create_params": {"input": "xx"}, **({"demo": fault} if i >= ROWS - faulty else {})}
        )
        + "\n"
        for i in range(ROWS)
    )


@pytest.mark.usefixtures("quick_backoff")
def test_an_outage_costs_the_agent_about_one_request_a_row(demo_server: DemoServer):
    proc = run(["-u", demo_server.url, "-j", "50", "--retries", "3"], input=rows(ROWS, fault="500"))
    assert proc.returncode == 1
    figures = summary_of(proc.stderr)["rollfilter"]
    requests = demo_server.stats()["requests"]
    assert figures["failed"] == ROWS
    assert requests == ROWS + figures["retries"]  # counted at the agent
    assert requests <= 1.2 * ROWS  # --retries 3 without a budget: 4 a row
    assert 0 < figures["retries_withheld"] <= ROWS  # a row is told no once, and fails then


@pytest.mark.usefixtures("quick_backoff")
def test_rare_failures_keep_every_retry(demo_server: DemoServer):
    proc = run(
        ["-u", demo_server.url, "-j", "50", "--retries", "3"], input=rows(ROWS // 20, fault="500", fault_first=2)
    )
    assert proc.returncode == 0, proc.stderr  # 5% of the rows fail twice each, then succeed
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["retries"], figures["retries_withheld"]) == (ROWS, ROWS // 10, 0)
    assert demo_server.stats()["requests"] == ROWS + ROWS // 10


@pytest.mark.usefixtures("quick_backoff")
def test_no_budget_retries_every_failure(demo_server: DemoServer):
    proc = run(
        ["-u", demo_server.url, "-j", "50", "--retries", "1", "--retry-budget", "off"], input=rows(40, fault="500")
    )
    assert proc.returncode == 1
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["retries"], figures["retries_withheld"]) == (40, 0)
    assert demo_server.stats()["requests"] == ROWS + 40


@pytest.mark.usefixtures("quick_backoff")
def test_a_budget_of_none_beyond_the_reserve_retries_ten_rows_of_each_agent(demo_server: DemoServer):
    # Two agents on one failing server: each has its own reserve of 10, and --retry-budget 0 adds none.
    data = "".join(
        json.dumps(
            {"id": i, "responses_create_params": {"input": "x"}, "agent_ref": {"name": name}, "demo": {"fault": "500"}}
        )
        + "\n"
        for i, name in enumerate(["a", "b"] * 20)
    )
    args = ["-e", f"a={demo_server.url}", "-e", f"b={demo_server.url}", "-j", "4", "--retries", "3"]
    proc = run([*args, "--retry-budget", "0"], input=data)
    assert proc.returncode == 1
    figures = summary_of(proc.stderr)["rollfilter"]
    assert figures["retries"] == 20  # 10 for each agent
    assert demo_server.stats()["requests"] == 40 + 20


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "x"])
def test_a_bad_budget_is_a_usage_error(value: str):
    proc = run(["-u", closed_port_url() + "/run", "--retry-budget", value])  # refused before sending
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith("rollfilter: --retry-budget wants R")


def test_retry_after_is_honoured(demo_server: DemoServer):
    row = {"id": 1, "responses_create_params": {"input": "x"}, "demo": {"fault": "429", "fault_first": 1}}
    proc = run(["-u", demo_server.url, "-v"], input=rows_jsonl([row]))
    assert proc.returncode == 0, proc.stderr
    assert demo_server.stats()["by_id"] == {"1": 2}
    # The wait the run chose (-v says it): the demo agent's Retry-After of 1 s, where backoff
    # alone starts under 0.5 s.
    waits = re.findall(rb"retry in ([0-9.]+) s after http_status: HTTP 429", proc.stderr)
    assert len(waits) == 1, proc.stderr
    assert float(waits[0]) >= 1.0
    assert summary_of(proc.stderr)["rollfilter"]["retries"] == 1


@pytest.mark.usefixtures("quick_backoff")
def test_status_not_in_retry_set_is_not_retried(demo_server: DemoServer):
    row = {"id": 1, "responses_create_params": {"input": "x"}, "demo": {"fault": "422"}}
    proc = run(["-u", demo_server.url], input=rows_jsonl([row]))
    assert proc.returncode == 1
    assert demo_server.stats()["by_id"] == {"1": 1}
    message = proc.stderr.decode().splitlines()[0]
    assert message.startswith("rollfilter: <stdin>:1: http_status: HTTP 422")
    proc = run(["-u", demo_server.url, "--retry-on", "422", "--retries", "1"], input=rows_jsonl([{**row, "id": 2}]))
    assert demo_server.stats()["by_id"]["2"] == 2


@pytest.mark.usefixtures("quick_backoff")
def test_an_agent_that_never_answered_stops_the_run_once_refused_for_the_connect_timeout(
    tmp_path, demo_server: DemoServer
):
    """An agent refusing every connection since the start: its row is sent again, beyond its
    retries, until the agent has refused for the connect timeout, a few times; then that row's
    failure stops the run as a service failure (exit 3), the rest are counted not started, and
    --resume finishes the run once an agent answers."""
    errors, output, rows = tmp_path / "errors.jsonl", tmp_path / "out.jsonl", tmp_path / "rows.jsonl"
    rows.write_text(rows_jsonl(simple_rows(50)))
    url = closed_port_url()
    args = ["-u", url, "-j", "1", "--retries", "1", "--connect-timeout", "0.2"]
    proc = run([*args, "--errors", str(errors), "-o", str(output), str(rows)])
    assert proc.returncode == 3
    [record] = read_jsonl(errors)
    assert record["error"]["kind"] == "connect"
    assert record["attempts"] >= UNREACHABLE_AFTER_FAILURES
    *lines, _ = proc.stderr.decode().splitlines()
    assert lines == [
        f"rollfilter: stopped: the agent at {url}/run refused or dropped every connection since the run began:"
        f" {record['error']['message']}"
    ]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["failed"], figures["expected"]) == (1, 50)
    assert_counts_add_up(summary_of(proc.stderr))  # the rows never read are not_started; one read may wait unsent
    assert figures["stopped"] == lines[0].removeprefix("rollfilter: ")
    resumed = run(["-u", demo_server.url, "--errors", str(errors), "-o", str(output), "--resume", str(rows)])
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(line["_ng_task_index"] for line in read_jsonl(output)) == list(range(50))
