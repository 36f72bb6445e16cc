"""Health: each result judged as received against a stand-in agent that answers each kind (healthy,
each check's, an outage); a known mix gives known counts, whatever --unhealthy does with them,
and an outage stops the run."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollfilter import Config, Health, RecentLimit, Repeats, Retries, rollouts
from rollfilter.figures.health import CHECKS
from tests.conftest import assert_counts_add_up, read_jsonl, rows_jsonl, run, summary_of
from tests.servers.health_agent import OUTAGE_CHECKS, RESPONSES, HealthAgent

# Three healthy rows, one of each check's, two outages.
MIX = [None, None, None, *CHECKS, "outage", "outage"]
MIX_BY_CHECK = {check: 1 + 2 * (check in OUTAGE_CHECKS) for check in CHECKS}


@pytest.fixture
def health_agent() -> Iterator[HealthAgent]:
    server = HealthAgent(name=None)
    try:
        yield server
    finally:
        server.close()


def rows_of(kinds: list[str | None], **extra: Any) -> str:
    rows = []
    for number, kind in enumerate(kinds):
        row: dict[str, Any] = {"id": number, "responses_create_params": {"input": f"q{number}"}, **extra}
        if kind is not None:
            row["health"] = kind
        rows.append(row)
    return rows_jsonl(rows)


def health_of(stderr: bytes) -> dict[str, Any]:
    health: dict[str, Any] = summary_of(stderr)["rollfilter"]["health"]
    return health


def test_a_known_mix_gives_known_counts_and_marks_the_unhealthy_lines_only(health_agent: HealthAgent):
    proc = run(["-u", health_agent.run_url, "-k"], input=rows_of(MIX))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    marks = [json.loads(line).get("_rf_health") for line in lines]
    assert marks == [None, None, None, *([check] for check in CHECKS), OUTAGE_CHECKS, OUTAGE_CHECKS]
    assert all(b"_rf_health" not in line for line in lines[:3])
    assert health_of(proc.stderr) == {"unhealthy": 8, "by_check": MIX_BY_CHECK, "tasks_all_unhealthy": 8}
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["masked"], figures["means_cover"]) == (11, 0, 11)


def test_mask_leaves_the_unhealthy_out_of_every_mean_and_counts_them_masked(health_agent: HealthAgent):
    proc = run(["-u", health_agent.run_url, "--unhealthy", "mask"], input=rows_of(MIX))
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stderr)
    figures = summary["rollfilter"]
    assert (figures["succeeded"], figures["masked"], figures["means_cover"]) == (11, 8, 3)
    assert summary["reward"] == 1.0  # the healthy rows' reward: the unhealthy ones' zeros are left out
    assert figures["health"]["unhealthy"] == 8
    assert len(result_marks(proc.stdout)) == 8


def result_marks(stdout: bytes) -> list[Any]:
    return [json.loads(line)["_rf_health"] for line in stdout.splitlines() if b"_rf_health" in line]


def test_mask_drops_a_group_left_with_one_healthy_member(health_agent: HealthAgent):
    rows = [
        {"id": 0, "responses_create_params": {"input": "a"}, "health": "outage", "health_times": 1},
        {"id": 1, "responses_create_params": {"input": "b"}},
    ]
    args = ["-u", health_agent.run_url, "-r", "2", "--groups", "--drop-uniform", "-j", "1", "--retries", "0"]
    proc = run([*args, "--unhealthy", "mask"], input=rows_jsonl(rows))
    assert proc.returncode == 0, proc.stderr
    groups = summary_of(proc.stderr)["rollfilter"]["groups"]
    assert (groups["dropped_masked"], groups["dropped_uniform"]) == (1, 1)


def test_fail_makes_each_unhealthy_result_a_failed_row_of_its_own_kind(tmp_path: Path, health_agent: HealthAgent):
    errors = tmp_path / "errors.jsonl"
    proc = run(
        ["-u", health_agent.run_url, "--unhealthy", "fail", "--retries", "0", "--errors", str(errors)],
        input=rows_of(MIX),
    )
    assert proc.returncode == 1, proc.stderr
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["failed"], figures["failed_by_kind"]) == (3, 8, {"unhealthy": 8})
    assert figures["health"] == {"unhealthy": 8, "by_check": MIX_BY_CHECK, "tasks_all_unhealthy": 8}
    records = read_jsonl(errors)
    assert {record["_ng_failure_class"] for record in records} == {"unhealthy"}
    assert all(record["error"]["kind"] == "unhealthy" and "_ng_task_index" in record for record in records)
    assert sorted(map(tuple, (record["_rf_health"] for record in records))) == sorted(
        [(check,) for check in CHECKS] + [tuple(OUTAGE_CHECKS)] * 2
    )
    assert b"_rf_health" not in proc.stdout


def test_fail_retries_an_unhealthy_answer_as_a_5xx(health_agent: HealthAgent, quick_backoff: None):
    rows = rows_of(["outage"], health_times=1)
    proc = run(["-u", health_agent.run_url, "--unhealthy", "fail", "--retries", "2"], input=rows)
    assert proc.returncode == 0, proc.stderr
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["retries"], figures["health"]["unhealthy"]) == (1, 1, 0)
    assert len(health_agent.bodies) == 2


def test_resume_sends_an_unhealthy_failure_again(tmp_path: Path, health_agent: HealthAgent):
    data, out, errors = tmp_path / "rows.jsonl", tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    data.write_text(rows_of([None, "outage"], health_times=1))
    args = [
        "-u",
        health_agent.run_url,
        "--unhealthy",
        "fail",
        "--retries",
        "0",
        "-o",
        str(out),
        "--errors",
        str(errors),
    ]
    first = run([*args, str(data)])
    assert first.returncode == 1, first.stderr
    second = run([*args, "--resume", str(data)])
    assert second.returncode == 0, second.stderr
    assert sorted(line["_ng_task_index"] for line in read_jsonl(out)) == [0, 1]
    assert summary_of(second.stderr)["rollfilter"]["succeeded"] == 1


def test_max_unhealthy_stops_an_outage_naming_the_checks_seen_most(health_agent: HealthAgent):
    proc = run(["-u", health_agent.run_url, "-j", "1", "--max-unhealthy", "3"], input=rows_of(["outage"] * 20))
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.decode().splitlines()
    stopped = [line for line in lines if line.startswith("rollfilter: stopped")]
    assert stopped == [
        "rollfilter: stopped after 3 unhealthy rollouts (the limit: 3); the checks failed most:"
        " empty_output (3), no_output_tokens (3), response_error (3)"
    ]
    summary = summary_of(proc.stderr)
    assert_counts_add_up(summary)
    assert (summary["rollfilter"]["succeeded"], summary["rollfilter"]["health"]["unhealthy"]) == (3, 3)


def test_with_groups_a_count_limit_counts_a_group_s_unhealthy_rollouts_when_it_closes(health_agent: HealthAgent):
    """With --groups, results are counted when their group closes, by the limit too: the group
    that brings the count to N or past it stops the run, so -r 4 --max-unhealthy 5 stops after 8."""
    args = ["-u", health_agent.run_url, "-r", "4", "--groups", "-j", "1", "--max-unhealthy", "5"]
    proc = run(args, input=rows_of(["outage"] * 5))
    assert proc.returncode == 1, proc.stderr
    stopped = [line for line in proc.stderr.decode().splitlines() if line.startswith("rollfilter: stopped")]
    assert [line.partition(";")[0] for line in stopped] == [
        "rollfilter: stopped after 8 unhealthy rollouts (the limit: 5)"
    ]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["health"]["unhealthy"], figures["groups"]["kept"]) == (8, 2)


def test_max_unhealthy_as_a_rate_looks_at_the_last_hundred_rollouts(health_agent: HealthAgent):
    kinds: list[str | None] = [None] * 60 + ["empty_output"] * 60
    proc = run(["-u", health_agent.run_url, "-j", "1", "--max-unhealthy", "30%"], input=rows_of(kinds))
    assert proc.returncode == 1, proc.stderr
    assert b"once 26 of the last 86 ended rollouts were unhealthy (the limit: 30%)" in proc.stderr
    assert summary_of(proc.stderr)["rollfilter"]["health"]["unhealthy"] == 26


def test_max_masked_stops_on_mask_sample(health_agent: HealthAgent):
    rows = rows_of([None] * 10, answer={"mask_sample": True})
    proc = run(["-u", health_agent.run_url, "-j", "1", "--max-masked", "2"], input=rows)
    assert proc.returncode == 1, proc.stderr
    assert b"stopped after 2 masked rollouts (the limit: 2)" in proc.stderr
    assert summary_of(proc.stderr)["rollfilter"]["masked"] == 2


@pytest.mark.parametrize("option", ["--max-unhealthy", "--max-masked"])
@pytest.mark.parametrize("value", ["0%", "101%", "0", "x"])
def test_a_limit_of_none_or_over_all_is_refused(option: str, value: str, health_agent: HealthAgent):
    proc = run(["-u", health_agent.run_url, option, value], input=rows_of([None]))
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith(f"rollfilter: {option} wants a count")
    assert health_agent.bodies == []


def test_summarize_judges_files_of_any_run(tmp_path: Path):
    """A file no rollfilter wrote (NeMo Gym's: no _rf_health) is judged as a run judges its results."""
    results = tmp_path / "rollouts.jsonl"
    lines = [
        {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 1.0, "response": RESPONSES[kind]}
        for task, kinds in enumerate([["outage", "outage"], ["truncated", "healthy"]])
        for rollout, kind in enumerate(kinds)
    ]
    lines.append({"_ng_task_index": 2, "_ng_rollout_index": 0, "reward": 1.0, "response": {"output": [{}]}})
    results.write_text(rows_jsonl(lines))
    proc = run(["--summarize", "-r", "2", str(results)])
    assert proc.returncode == 0, proc.stderr
    by_check = {"empty_output": 2, "no_output_tokens": 2, "truncated": 1, "response_error": 2}
    assert health_of(proc.stdout) == {"unhealthy": 3, "by_check": by_check, "tasks_all_unhealthy": 1}
    masked = run(["--summarize", "-r", "2", "--unhealthy", "mask", str(results)])
    assert summary_of(masked.stdout)["rollfilter"]["masked"] == 3


def test_summarize_keeps_the_verdict_of_lines_whose_response_was_cut(tmp_path: Path):
    """`jq 'del(.response)'` keeps a line's _rf_health: the run's verdict stands."""
    results = tmp_path / "rollouts.jsonl"
    lines = [{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 0.0, "_rf_health": ["empty_output"]}]
    lines.append({"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 1.0})
    results.write_text(rows_jsonl(lines))
    proc = run(["--summarize", str(results)])
    assert health_of(proc.stdout) == {"unhealthy": 1, "by_check": {"empty_output": 1}, "tasks_all_unhealthy": 1}


def test_the_python_api_says_each_rollout_s_verdict_and_counts_them(health_agent: HealthAgent):
    rows = [json.loads(line) for line in rows_of(MIX).splitlines()]
    config = Config(url=health_agent.run_url, health=Health(unhealthy="mask", max_unhealthy=RecentLimit(count=100)))
    verdicts = []
    with rollouts(rows, config) as run_:
        for outcome in run_:
            verdicts.append(outcome.health)
            if len(verdicts) == len(rows):  # each is counted before it is handed out
                statistics = run_.statistics()
    assert sorted(verdicts) == sorted([(), (), (), *((check,) for check in CHECKS), *[tuple(OUTAGE_CHECKS)] * 2])
    assert (statistics.unhealthy, dict(statistics.unhealthy_by_check), statistics.masked) == (8, MIX_BY_CHECK, 8)
    assert run_.summary is not None
    assert run_.summary["rollfilter"]["health"]["unhealthy"] == 8


def test_an_answer_that_reports_the_agent_s_own_failure_is_judged_by_that_alone(health_agent: HealthAgent):
    rows = rows_of(["outage"], answer={"_ng_failure_class": "model_down"})
    proc = run(["-u", health_agent.run_url, "--unhealthy", "fail"], input=rows)
    assert proc.returncode == 1, proc.stderr
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["failed_by_kind"], figures["health"]["unhealthy"]) == ({"agent_failure": 1}, 0)


def test_fail_leaves_a_group_with_an_unhealthy_member_incomplete(health_agent: HealthAgent):
    rows = [
        {"id": 0, "responses_create_params": {"input": "a"}, "health": "outage", "health_times": 1},
        {"id": 1, "responses_create_params": {"input": "b"}},
    ]
    args = ["-u", health_agent.run_url, "-r", "2", "--groups", "-j", "1", "--retries", "0", "--unhealthy", "fail"]
    proc = run(args, input=rows_jsonl(rows))
    assert proc.returncode == 1, proc.stderr
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["groups"]["kept"], figures["groups"]["incomplete"]) == (1, 1)
    assert len(proc.stdout.splitlines()) == 2  # the kept group's two rollouts


def test_a_verdict_the_agent_echoes_back_is_replaced_by_the_run_s_own(health_agent: HealthAgent):
    """An agent echoes the row's fields (NeMo Gym's do): a row taken from an earlier run's output
    brings that run's `_rf_health` back with a healthy answer, which is neither marked nor counted."""
    rows = rows_of([None, None, "truncated"], answer={"_rf_health": ["empty_output"]})
    proc = run(["-u", health_agent.run_url, "-k", "--unhealthy", "mask"], input=rows)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line).get("_rf_health") for line in proc.stdout.splitlines()] == [None, None, ["truncated"]]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["health"]["unhealthy"], figures["health"]["by_check"], figures["masked"]) == (
        1,
        {"truncated": 1},
        1,
    )


def test_every_outcome_says_its_verdict_a_failure_of_kind_unhealthy_too(health_agent: HealthAgent):
    rows = [json.loads(line) for line in rows_of([None, "outage", "truncated"]).splitlines()]
    rows.append({"id": 3, "responses_create_params": {"input": "x"}, "answer": {"_ng_failure_class": "model_down"}})
    config = Config(url=health_agent.run_url, health=Health(unhealthy="fail"), retries=Retries(count=0))
    with rollouts(rows, config) as run_:
        verdicts = sorted((outcome.ok, outcome.health) for outcome in run_)
    assert verdicts == sorted([(False, ()), (False, ("truncated",)), (False, tuple(OUTAGE_CHECKS)), (True, ())])


def test_fail_counts_what_each_unhealthy_answer_cost(health_agent: HealthAgent, quick_backoff: None):
    """A truncated answer spent its tokens (a runaway generation, many of them) whether it is kept
    or failed and sent again: every answer's usage is in the cost, as --max-cost must see it."""
    rows = rows_of(["truncated"] * 2)
    price = ["--price", "1000000,1000000"]  # a dollar a token: each answer's 4 in, 2 out cost $6
    kept = run(["-u", health_agent.run_url, *price], input=rows)
    assert summary_of(kept.stderr)["rollfilter"]["cost_usd"] == 12.0
    failed = run(["-u", health_agent.run_url, *price, "--unhealthy", "fail", "--retries", "1"], input=rows)
    figures = summary_of(failed.stderr)["rollfilter"]
    assert (figures["failed"], figures["retries"], figures["cost_usd"]) == (2, 2, 24.0)


def test_the_tasks_all_unhealthy_are_counted_as_tasks_while_the_run_goes(health_agent: HealthAgent):
    rows = [json.loads(line) for line in rows_of(["outage", None]).splitlines()]
    config = Config(url=health_agent.run_url, repeats=Repeats(count=2), concurrency=1)
    seen = []
    with rollouts(rows, config) as run_:
        for outcome in run_:
            statistics = run_.statistics()
            seen.append((outcome.task_index, statistics.unhealthy, statistics.tasks_all_unhealthy))
    # The engine may run ahead of the reader, so the first look may already see both of task 0's rollouts.
    assert [task_index for task_index, _, _ in seen] == [0, 0, 1, 1]
    assert seen[0][1] >= 1
    assert [figures for _, *figures in seen[1:]] == [[2, 1], [2, 1], [2, 1]]


def test_an_unhealthy_failure_s_record_carries_the_policy_version_as_an_agent_failure_s(
    tmp_path: Path, health_agent: HealthAgent
):
    errors = tmp_path / "errors.jsonl"
    rows = rows_of(["outage"]) + rows_jsonl([{"id": 1, "answer": {"_ng_failure_class": "model_down"}}])
    args = ["-u", health_agent.run_url, "--policy-version", "3", "--unhealthy", "fail", "--retries", "0"]
    proc = run([*args, "--errors", str(errors)], input=rows)
    assert proc.returncode == 1, proc.stderr
    versions = {record["_ng_failure_class"]: record.get("_rf_policy_version") for record in read_jsonl(errors)}
    assert versions == {"unhealthy": {"sent": 3, "ended": 3}, "model_down": {"sent": 3, "ended": 3}}
