"""The retry budget: an outage is not multiplied by --retries, and rare failures keep their retries."""

from __future__ import annotations

import json

import pytest

from rollfilter.budget import CAP, RESERVE, RetryBudget
from tests.conftest import DemoServer, run, summary_of

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


def test_the_reserve_then_a_share_of_the_rows_sent():
    budget = RetryBudget(0.1)
    assert [budget.withdraw() for _ in range(int(RESERVE) + 1)] == [True] * int(RESERVE) + [False]
    for _ in range(10):
        budget.deposit()
    assert budget.withdraw()  # ten rows sent paid for one retry
    assert not budget.withdraw()
    assert budget.withheld == 2
    for _ in range(100_000):
        budget.deposit()  # a long healthy stretch saves up no more than the cap
    assert sum(budget.withdraw() for _ in range(int(CAP) * 2)) == int(CAP)


def test_an_outage_costs_the_agent_about_one_request_a_row(demo_server: DemoServer):
    proc = run(["-u", demo_server.url, "-j", "50", "--retries", "3"], input=rows(ROWS, fault="500"))
    assert proc.returncode == 1
    figures = summary_of(proc.stderr)["rollfilter"]
    requests = demo_server.stats()["requests"]
    assert figures["failed"] == ROWS
    assert requests == ROWS + figures["retries"]  # counted at the agent
    assert requests <= 1.2 * ROWS  # --retries 3 without a budget: 4 a row
    assert 0 < figures["retries_withheld"] <= ROWS  # a row is told no once, and fails then


def test_rare_failures_keep_every_retry(demo_server: DemoServer):
    proc = run(
        ["-u", demo_server.url, "-j", "50", "--retries", "3"], input=rows(ROWS // 20, fault="500", fault_first=2)
    )
    assert proc.returncode == 0, proc.stderr  # 5% of the rows fail twice each, then succeed
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["retries"], figures["retries_withheld"]) == (ROWS, ROWS // 10, 0)
    assert demo_server.stats()["requests"] == ROWS + ROWS // 10


def test_no_budget_retries_every_failure(demo_server: DemoServer):
    proc = run(
        ["-u", demo_server.url, "-j", "50", "--retries", "1", "--retry-budget", "off"], input=rows(40, fault="500")
    )
    assert proc.returncode == 1
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["retries"], figures["retries_withheld"]) == (40, 0)
    assert demo_server.stats()["requests"] == ROWS + 40


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "x"])
def test_a_bad_budget_is_a_usage_error(value: str):
    proc = run(["-u", "http://127.0.0.1:8000/run", "--retry-budget", value])  # refused before sending
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith("rollfilter: --retry-budget wants R")
