"""--max-failures: a count or a rate, stopping the run where the summary says."""

from __future__ import annotations

import pytest

from rollfilter import rollouts
from rollfilter.config import Config, FailureLimit
from tests.conftest import (
    DemoServer,
    read_jsonl,
    rows_jsonl,
    run,
    simple_rows,
    stderr_at_a_terminal,
    summary_of,
    task_indices,
)


@pytest.mark.parametrize("limit", [1, 4])
def test_max_failures_stops_after_exactly_n_failures(tmp_path, demo_server: DemoServer, limit: int):
    rows = simple_rows(30)
    for row in rows[1::2]:  # every odd row fails, and 422 is not retried
        row["demo"] = {"fault": "422"}
    errors = tmp_path / "errors.jsonl"
    args = ["-u", demo_server.url, "-j", "1", "--max-failures", str(limit), "--errors", str(errors)]
    proc = run(args, input=rows_jsonl(rows))
    assert proc.returncode == 1
    assert [r["_ng_task_index"] for r in read_jsonl(errors)] == [2 * k + 1 for k in range(limit)]
    assert task_indices(proc.stdout) == [2 * k for k in range(limit)]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["failed"], figures["succeeded"]) == (limit, limit)
    assert demo_server.stats()["requests"] == 2 * limit


def test_max_failures_stops_early(start_demo):
    server = start_demo("--fail-rate", "1.0")
    proc = run(
        ["-u", server.url, "-j", "4", "--retries", "0", "--max-failures", "5"], input=rows_jsonl(simple_rows(2000))
    )
    assert proc.returncode == 1
    assert "(the limit: 5)" in proc.stderr.decode()
    figures = summary_of(proc.stderr)["rollfilter"]
    assert 5 <= figures["failed"] < 20
    assert server.stats()["requests"] < 20


def test_max_failures_as_a_rate(start_demo):
    server = start_demo("--fail-rate", "0.5", "--seed", "3")
    proc = run(
        ["-u", server.url, "-j", "4", "--retries", "0", "--max-failures", "10%"], input=rows_jsonl(simple_rows(2000))
    )
    assert proc.returncode == 1
    assert "(the limit: 10%)" in proc.stderr.decode()
    assert server.stats()["requests"] < 200


@pytest.mark.parametrize("limit", ["5", "100%"])
def test_max_failures_says_the_counts_the_summary_gives(start_demo, limit: str):
    server = start_demo("--fail-rate", "1.0")
    proc = run(
        ["-u", server.url, "-j", "16", "--retries", "0", "--max-failures", limit], input=rows_jsonl(simple_rows(500))
    )
    assert proc.returncode == 1
    # Not a terminal: why the run stopped is said in the summary alone, which stays parseable.
    assert not [line for line in proc.stderr.decode().splitlines() if line.startswith("rollfilter: stopped")]
    figures = summary_of(proc.stderr)["rollfilter"]
    # Rows in flight when the limit is reached may still fail before the stop lands.
    ended = f" of {figures['succeeded'] + figures['failed']} ended" if limit.endswith("%") else ""
    assert figures["stopped"] == f"stopped after {figures['failed']} failed rows{ended} (the limit: {limit})"


def test_the_stopped_reason_reads_the_same_from_python_and_the_command_line(start_demo):
    url = start_demo("--fail-rate", "1.0").url
    rows = simple_rows(30)
    config = Config(url=url, retries=0, concurrency=1, max_failures=FailureLimit(count=2))
    with rollouts(rows, config) as outcomes:
        assert len(list(outcomes)) == 2
    assert outcomes.summary is not None
    assert outcomes.summary["rollfilter"]["stopped"] == "stopped after 2 failed rows (the limit: 2)"
    proc = run(["-u", url, "--retries", "0", "-j", "1", "--max-failures", "2"], input=rows_jsonl(rows))
    assert proc.returncode == 1
    assert summary_of(proc.stderr)["rollfilter"]["stopped"] == "stopped after 2 failed rows (the limit: 2)"


def test_why_the_run_stopped_is_a_line_of_its_own_only_at_a_terminal(start_demo):
    url = start_demo("--fail-rate", "1.0").url
    args = ["-u", url, "--retries", "0", "-j", "1", "--max-failures", "2", "--no-progress"]
    code, shown = stderr_at_a_terminal(args, input=rows_jsonl(simple_rows(30)))
    assert code == 1
    assert "rollfilter: stopped after 2 failed rows (the limit: 2)\n" in shown
