"""The summary's counts add up however a run ends: each ending below is checked by one shared
assertion (conftest's `assert_counts_add_up`, the identities docs/faults.md states), and by what
the run wrote. A new way of ending a run is a function here and one line in ENDINGS."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollfilter import Config, rollouts
from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    assert_counts_add_up,
    closed_port_url,
    read_jsonl,
    rows_jsonl,
    run,
    start,
    summary_of,
    wait_for,
)


@dataclasses.dataclass(frozen=True)
class Ended:
    """How a run ended: its summary, and what it wrote where that can be read back (None: not kept)."""

    summary: dict[str, Any]
    results: int | None = None  # result lines written
    errors: int | None = None  # errors records written


def mixed_rows(count: int, *, slow_from: int | None = None) -> list[dict[str, Any]]:
    """`count` rows, some failing (422) and some not persisted; from `slow_from` on, rows the agent
    answers only after the test has ended (a stop cancels them)."""
    rows: list[dict[str, Any]] = []
    for number in range(count):
        demo: dict[str, Any] = {}
        if number % 5 == 1:
            demo["fault"] = "422"
        elif number % 7 == 2:
            demo["fields"] = [{"_ng_no_persist": True}]
        if slow_from is not None and number >= slow_from:
            demo["latency"] = 600
        rows.append({"id": number, "responses_create_params": {"input": f"q{number}"}, "demo": demo})
    return rows


def outputs(tmp_path: Path) -> tuple[Path, Path, list[str]]:
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    return out, errors, ["-o", str(out), "--errors", str(errors)]


def ran_to_the_end(tmp_path: Path, demo_server: DemoServer) -> Ended:
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(mixed_rows(30)))
    out, errors, files = outputs(tmp_path)
    proc = run(["-u", demo_server.url, "-r", "2", *files, str(data)])
    assert proc.returncode == 1, proc.stderr  # some rows failed
    summary = summary_of(proc.stderr)
    assert "stopped" not in summary["rollfilter"]
    return Ended(summary, len(read_jsonl(out)), len(read_jsonl(errors)))


def resumed_to_the_end(tmp_path: Path, demo_server: DemoServer) -> Ended:
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(mixed_rows(30)))
    out, errors, files = outputs(tmp_path)
    first = run(["-u", demo_server.url, "-j", "1", "--max-failures", "3", *files, str(data)])
    assert first.returncode == 1, first.stderr
    written, recorded = len(read_jsonl(out)), len(read_jsonl(errors))
    proc = run(["-u", demo_server.url, *files, "--resume", "--max-attempts", "1", str(data)])
    assert proc.returncode == 1, proc.stderr  # rows failed anew
    summary = summary_of(proc.stderr)
    figures = summary["rollfilter"]
    assert (figures["skipped"], figures["not_retried"]) == (written, recorded)  # the first run's, given up
    return Ended(summary, len(read_jsonl(out)) - written, len(read_jsonl(errors)) - recorded)


def stopped_by(signum: int, status: int) -> Callable[[Path, DemoServer], Ended]:
    def stopped_by_a_signal(tmp_path: Path, demo_server: DemoServer) -> Ended:
        data, materialized = tmp_path / "rows.jsonl", tmp_path / "materialized.jsonl"
        data.write_text(rows_jsonl(mixed_rows(60, slow_from=8)))
        out, errors, files = outputs(tmp_path)
        proc = start(["-u", demo_server.url, "-j", "4", "--materialized", str(materialized), *files, str(data)])
        try:
            wait_for(lambda: demo_server.stats()["requests"] >= 12)  # 8 answered, 4 that never will be
            proc.send_signal(signum)
            _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
        finally:
            proc.kill()
            proc.wait(timeout=SUBPROCESS_TIMEOUT)
        assert proc.returncode == status, stderr
        summary = summary_of(stderr)
        figures = summary["rollfilter"]
        assert (figures["expected"], figures["cancelled"]) == (60, 4)  # the first pass planned every pair
        assert figures["not_started"] > 0
        return Ended(summary, len(read_jsonl(out)), len(read_jsonl(errors)))

    stopped_by_a_signal.__name__ = f"stopped_by_{signal.Signals(signum).name}"
    return stopped_by_a_signal


def stopped_at_the_failure_limit(tmp_path: Path, demo_server: DemoServer) -> Ended:
    data, materialized = tmp_path / "rows.jsonl", tmp_path / "materialized.jsonl"
    data.write_text(rows_jsonl(mixed_rows(60)))
    out, errors, files = outputs(tmp_path)
    limited = ["-j", "4", "--max-failures", "3", "--materialized", str(materialized)]
    proc = run(["-u", demo_server.url, *limited, *files, str(data)])
    assert proc.returncode == 1, proc.stderr
    summary = summary_of(proc.stderr)
    assert summary["rollfilter"]["stopped"].endswith("(the limit: 3)")
    assert summary["rollfilter"]["not_started"] > 0
    return Ended(summary, len(read_jsonl(out)), len(read_jsonl(errors)))


def stopped_for_unhealthy_rollouts(tmp_path: Path, demo_server: DemoServer) -> Ended:
    """An outage from row 20 on: each answer is empty and failed, a failed row with --unhealthy fail."""
    rows = mixed_rows(60)
    outage = {"response": {"output": [], "usage": {"output_tokens": 0}, "status": "failed"}}
    for row in rows[20:]:
        row["demo"] = {"fields": [outage]}
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(rows))
    out, errors, files = outputs(tmp_path)
    limited = ["-j", "4", "-r", "2", "--unhealthy", "fail", "--retries", "0", "--max-unhealthy", "5"]
    proc = run(["-u", demo_server.url, *limited, *files, str(data)])
    assert proc.returncode == 1, proc.stderr
    figures = summary_of(proc.stderr)["rollfilter"]
    assert figures["stopped"].startswith("stopped after "), figures
    assert figures["failed_by_kind"]["unhealthy"] >= 5
    assert figures["rows_read"] < 120
    return Ended(summary_of(proc.stderr), len(read_jsonl(out)), len(read_jsonl(errors)))


def stopped_at_the_target(tmp_path: Path, demo_server: DemoServer) -> Ended:
    data = tmp_path / "rows.jsonl"
    rows = [{**row, "demo": {"rewards": [1, 0]}} for row in mixed_rows(60)]
    data.write_text(rows_jsonl(rows))
    out, errors, files = outputs(tmp_path)
    proc = run(["-u", demo_server.url, "-j", "4", "-r", "2", "--groups", "--target-groups", "3", *files, str(data)])
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stderr)
    figures = summary["rollfilter"]
    assert (figures["groups"]["kept"], figures["expected"]) == (3, 120)  # counted again after the stop
    assert figures["not_started"] > 0
    return Ended(summary, len(read_jsonl(out)), len(read_jsonl(errors)))


def stopped_for_an_agent_that_never_answered(tmp_path: Path, demo_server: DemoServer) -> Ended:
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(mixed_rows(3000)))
    out, errors, files = outputs(tmp_path)
    proc = run(["-u", closed_port_url(), "--connect-timeout", "0.2", *files, str(data)])
    assert proc.returncode == 3, proc.stderr
    summary = summary_of(proc.stderr)
    figures = summary["rollfilter"]
    assert (figures["expected"], figures["failed"]) == (3000, 1)
    assert figures["cancelled"] < figures["rows_read"] < 3000  # the rows never read are not cancelled
    return Ended(summary, len(read_jsonl(out)), len(read_jsonl(errors)))


def stopped_by_a_closed_stdout(tmp_path: Path, demo_server: DemoServer) -> Ended:
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(mixed_rows(40, slow_from=6)))
    errors = tmp_path / "errors.jsonl"
    proc = start(["-u", demo_server.url, "-j", "4", "--errors", str(errors), str(data)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline()
        proc.stdout.close()  # the reader goes away while rows are in flight
        _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 141, stderr
    summary = summary_of(stderr)
    assert summary["rollfilter"]["stopped"] == "broken pipe"
    return Ended(summary, errors=len(read_jsonl(errors)))


def left_early_by_the_caller(tmp_path: Path, demo_server: DemoServer) -> Ended:
    taken = 0
    with rollouts(mixed_rows(40, slow_from=10), Config(url=demo_server.url, concurrency=4)) as outcomes:
        for _ in outcomes:
            taken += 1
            if taken == 5:
                break
    summary = outcomes.summary
    assert summary is not None
    assert summary["rollfilter"]["stopped"] == "stopped early by the caller"
    return Ended(summary)


ENDINGS = [
    ran_to_the_end,
    resumed_to_the_end,
    stopped_by(signal.SIGINT, 130),
    stopped_by(signal.SIGTERM, 143),
    stopped_at_the_failure_limit,
    stopped_for_unhealthy_rollouts,
    stopped_at_the_target,
    stopped_for_an_agent_that_never_answered,
    stopped_by_a_closed_stdout,
    left_early_by_the_caller,
]


@pytest.mark.parametrize("ending", ENDINGS, ids=[ending.__name__ for ending in ENDINGS])
def test_the_summary_s_counts_add_up_however_the_run_ends(
    ending: Callable[[Path, DemoServer], Ended], tmp_path: Path, demo_server: DemoServer
):
    ended = ending(tmp_path, demo_server)
    assert_counts_add_up(ended.summary)
    figures = ended.summary["rollfilter"]
    if ended.results is not None and "groups" not in figures:  # groups write only what they keep
        assert ended.results == figures["succeeded"], json.dumps(figures)
    if ended.errors is not None:
        assert ended.errors == figures["failed"], json.dumps(figures)


def test_failures_a_resume_gives_up_on_count_in_their_tasks_as_when_they_failed(
    tmp_path: Path, demo_server: DemoServer
):
    """A resume that sends nothing again (--max-attempts 1) keeps the first run's failed rollouts
    in their tasks: the same task figures (pass@k, the means, the pass histogram) as the first
    run's, not tasks left unfinished."""
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(mixed_rows(12)))
    _, _, files = outputs(tmp_path)
    first = run(["-u", demo_server.url, "-r", "2", *files, str(data)])
    assert first.returncode == 1, first.stderr  # rows failed
    resumed = run(["-u", demo_server.url, "-r", "2", *files, "--resume", "--max-attempts", "1", str(data)])
    before, after = summary_of(first.stderr), summary_of(resumed.stderr)
    assert after["rollfilter"]["not_retried"] > 0
    assert {key: after[key] for key in before if key != "rollfilter"} == {
        key: value for key, value in before.items() if key != "rollfilter"
    }
