"""--groups, --drop-uniform, --target-groups: whole groups in the stream, against the demo agent.

The agent's reward for rollout r of task t is `reward(t, r)` below (each row carries its rewards,
which the agent gives by rollout index), so which groups are kept and which dropped is computed
here from the function, never copied from a run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    read_jsonl,
    result_lines,
    rows_jsonl,
    run,
    start,
    summary_of,
    wait_for,
)

K = 4


def reward(task: int, rollout: int) -> float:
    """1 for some rollouts of a task: none for tasks 0, 12, 24, ...; every one for 11, 23, ..."""
    return 1.0 if (task * 31 + rollout * 17) % 11 < task % 12 else 0.0


def group_rows(
    n: int,
    rewards: Callable[[int, int], float | None] = reward,
    latency: Callable[[int, int], float] = lambda task, rollout: 0.01 * ((task + 3 * rollout) % 4),
    **demo: Any,
) -> list[dict[str, Any]]:
    """n rows whose rollouts the agent answers with `rewards(task, rollout)` after `latency(task, rollout)` s."""
    return [
        {
            "id": task,
            "responses_create_params": {"input": f"task {task}"},
            "demo": {
                "rewards": [rewards(task, rollout) for rollout in range(K)],
                "latencies": [latency(task, rollout) for rollout in range(K)],
                **demo,
            },
        }
        for task in range(n)
    ]


def uniform(task: int, rewards: Callable[[int, int], float | None] = reward) -> bool:
    return len({rewards(task, rollout) for rollout in range(K)}) == 1


def groups_in(lines: list[dict[str, Any]]) -> list[tuple[int, list[int]]]:
    """The output's runs of one task, in order: (task, its rollout indices as written)."""
    runs: list[tuple[int, list[int]]] = []
    for line in lines:
        task = line["_ng_task_index"]
        if not runs or runs[-1][0] != task:
            runs.append((task, []))
        runs[-1][1].append(line["_ng_rollout_index"])
    return runs


def test_groups_are_written_whole_adjacent_and_in_rollout_order(demo_server: DemoServer):
    # Rollouts of a task finish out of order (latency falls with the rollout index), and tasks interleave.
    rows = group_rows(30, latency=lambda task, rollout: 0.01 * (K - rollout) + 0.005 * (task % 3))
    proc = run(["-u", demo_server.url, "-r", str(K), "--groups", "-j", "16"], input=rows_jsonl(rows))
    assert proc.returncode == 0, proc.stderr
    written = groups_in(result_lines(proc.stdout))
    assert sorted(task for task, _ in written) == list(range(30))  # each task once
    assert all(rollouts == list(range(K)) for _, rollouts in written)
    unordered = run(["-u", demo_server.url, "-r", str(K), "-j", "16"], input=rows_jsonl(rows))
    assert any(rollouts != list(range(K)) for _, rollouts in groups_in(result_lines(unordered.stdout)))
    summary = summary_of(proc.stderr)
    assert summary["rollfilter"]["groups"] == {
        "kept": 30,
        "dropped_uniform": 0,
        "dropped_masked": 0,
        "incomplete": 0,
        "cancelled": 0,
    }


def test_drop_uniform_keeps_exactly_the_groups_whose_rewards_differ(tmp_path: Path, demo_server: DemoServer):
    n = 48
    dropped = tmp_path / "dropped.jsonl"
    args = ["-u", demo_server.url, "-r", str(K), "--drop-uniform", "-j", "32", "--dropped", str(dropped)]
    proc = run(args, input=rows_jsonl(group_rows(n)))
    assert proc.returncode == 0, proc.stderr
    kept = {task for task in range(n) if not uniform(task)}
    assert 0 < len(kept) < n  # the function gives both
    lines = result_lines(proc.stdout)
    assert {task for task, _ in groups_in(lines)} == kept
    assert all(line["reward"] == reward(line["_ng_task_index"], line["_ng_rollout_index"]) for line in lines)
    stamped = read_jsonl(dropped)
    assert {line["_ng_task_index"] for line in stamped} == set(range(n)) - kept
    assert {line["dropped_because"] for line in stamped} == {"uniform"}
    assert len(stamped) == K * (n - len(kept))
    summary = summary_of(proc.stderr)
    figures = summary["rollfilter"]
    assert figures["groups"] == {
        "kept": len(kept),
        "dropped_uniform": n - len(kept),
        "dropped_masked": 0,
        "incomplete": 0,
        "cancelled": 0,
    }
    # Dropped groups are real samples: every rollout is in the figures.
    assert figures["succeeded"] == n * K
    expected_mean = sum(reward(task, rollout) for task in range(n) for rollout in range(K)) / (n * K)
    assert summary["reward"] == pytest.approx(expected_mean)
    histogram = [0] * (K + 1)
    for task in range(n):
        histogram[sum(reward(task, rollout) >= 1.0 for rollout in range(K))] += 1
    assert summary["pass_histogram"] == histogram


def test_group_field_compares_the_field_it_names(demo_server: DemoServer):
    # Rewards that differ while accuracy (reward >= 1) does not: kept by reward, dropped by accuracy.
    def rewards(task: int, rollout: int) -> float:
        return [0.2, 0.5, 1.0][task % 3] if task % 2 else 0.1 * rollout

    n = 12
    by_accuracy = {task for task in range(n) if len({rewards(task, r) >= 1.0 for r in range(K)}) > 1}
    by_reward = {task for task in range(n) if not uniform(task, rewards)}
    assert by_accuracy != by_reward
    rows = rows_jsonl(group_rows(n, rewards))
    for field, kept in (("accuracy", by_accuracy), ("reward", by_reward)):
        proc = run(["-u", demo_server.url, "-r", str(K), "--drop-uniform", "--group-field", field], input=rows)
        assert proc.returncode == 0, proc.stderr
        assert {task for task, _ in groups_in(result_lines(proc.stdout))} == kept, field


def test_a_result_without_the_group_field_makes_its_group_incomplete(tmp_path: Path, demo_server: DemoServer):
    def rewards(task: int, rollout: int) -> float | None:
        return None if (task, rollout) == (1, 2) else float(rollout % 2)

    errors = tmp_path / "errors.jsonl"
    args = ["-u", demo_server.url, "-r", str(K), "--drop-uniform", "--errors", str(errors)]
    proc = run(args, input=rows_jsonl(group_rows(3, rewards)))
    assert proc.returncode == 1, proc.stderr
    assert b"Traceback" not in proc.stderr
    assert {task for task, _ in groups_in(result_lines(proc.stdout))} == {0, 2}
    (record,) = read_jsonl(errors)
    assert (record["_ng_task_index"], record["_ng_rollout_index"]) == (1, 2)
    assert record["error"]["kind"] == "group_field"
    assert "'reward'" in record["error"]["message"]
    assert summary_of(proc.stderr)["rollfilter"]["groups"]["incomplete"] == 1


def test_a_failed_rollout_keeps_its_group_out_and_a_resume_runs_only_it(tmp_path: Path, demo_server: DemoServer):
    rows = group_rows(4)
    rows[2]["demo"]["faults"] = [None, "422", None, None]  # rollout 1 of task 2 fails on its first attempt
    out, errors, dropped = tmp_path / "out.jsonl", tmp_path / "errors.jsonl", tmp_path / "dropped.jsonl"
    (tmp_path / "rows.jsonl").write_text(rows_jsonl(rows))
    args = ["-u", demo_server.url, "-r", str(K), "--groups", str(tmp_path / "rows.jsonl"), "-o", str(out)]
    args += ["--errors", str(errors), "--dropped", str(dropped)]
    first = run(args)
    assert first.returncode == 1, first.stderr
    assert {task for task, _ in groups_in(read_jsonl(out))} == {0, 1, 3}
    assert [(line["_ng_task_index"], line["dropped_because"]) for line in read_jsonl(dropped)] == [
        (2, "incomplete")
    ] * 3
    (failure,) = read_jsonl(errors)
    assert (failure["_ng_rollout_index"], failure["error"]["kind"]) == (1, "http_status")
    assert summary_of(first.stderr)["rollfilter"]["groups"] == {
        "kept": 3,
        "dropped_uniform": 0,
        "dropped_masked": 0,
        "incomplete": 1,
        "cancelled": 0,
    }
    sent_before = demo_server.stats()["by_id"]["2"]

    resumed = run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert demo_server.stats()["by_id"]["2"] == sent_before + 1  # only the rollout that failed
    written = groups_in(read_jsonl(out))
    assert sorted(task for task, _ in written) == [0, 1, 2, 3]
    assert all(rollouts == list(range(K)) for _, rollouts in written)
    figures = summary_of(resumed.stderr)["rollfilter"]
    assert figures["groups"]["kept"] == 4  # the earlier run's three, and the one it made whole
    assert read_jsonl(dropped) == []  # a rollout is in -o or in --dropped, never both


def test_keep_incomplete_writes_the_finished_rollouts(demo_server: DemoServer):
    rows = group_rows(3)
    rows[0]["demo"]["faults"] = ["422", None, None, None]
    proc = run(["-u", demo_server.url, "-r", str(K), "--groups", "--keep-incomplete"], input=rows_jsonl(rows))
    assert proc.returncode == 1, proc.stderr
    assert sorted(groups_in(result_lines(proc.stdout))) == [(0, [1, 2, 3]), (1, [0, 1, 2, 3]), (2, [0, 1, 2, 3])]


def test_target_groups_writes_the_fast_groups_and_cuts_the_stragglers(tmp_path: Path, demo_server: DemoServer):
    n, target, slow = 40, 5, {0, 1, 2}
    # Tasks 0-2 have one rollout that takes far longer than every other task's whole group.
    rows = group_rows(n, latency=lambda task, rollout: 30.0 if task in slow and rollout == 3 else 0.01)
    (tmp_path / "rows.jsonl").write_text(rows_jsonl(rows))
    dropped = tmp_path / "dropped.jsonl"
    args = ["-u", demo_server.url, "-r", str(K), "--groups", "--target-groups", str(target), "-j", "16"]
    proc = run([*args, "--dropped", str(dropped), "--errors", str(tmp_path / "errors"), str(tmp_path / "rows.jsonl")])
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(b"\n") == 1  # with --errors, in a pipe: the summary alone, the target's notice in it
    written = groups_in(result_lines(proc.stdout))
    assert len(written) == target
    assert not slow & {task for task, _ in written}
    figures = summary_of(proc.stderr)["rollfilter"]
    assert figures["groups"]["kept"] == target
    assert figures["groups"]["cancelled"] >= len(slow)
    assert "cancelled" in figures["groups"]["figures_cover"]
    assert figures["succeeded"] == target * K  # only closed groups count: not the stragglers' fast rollouts
    requested = demo_server.stats()["requests"]
    assert requested <= figures["rows_read"] < n * K  # rows past the target are never sent
    assert figures["not_started"] == n * K - figures["rows_read"]
    assert "the target" in figures["stopped"]
    cancelled = {line["_ng_task_index"] for line in read_jsonl(dropped) if line["dropped_because"] == "cancelled"}
    assert slow <= cancelled


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--groups", "-k"], "--groups cannot go with -k:"),
        (["--groups", "--ordered"], "--groups cannot go with --ordered:"),
        (["--drop-uniform", "--ordered"], "--drop-uniform cannot go with --ordered:"),
    ],
)
def test_an_option_groups_cannot_go_with_is_named_as_typed(demo_server: DemoServer, args: list[str], said: str):
    proc = run(["-u", demo_server.url, "-r", "4", *args], input=rows_jsonl(group_rows(1)))
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith(f"rollfilter: {said}")


def test_group_options_that_cannot_work_exit_2_in_one_line(demo_server: DemoServer):
    url = ["-u", demo_server.url]
    refused = {
        ("--groups",): "--groups needs -r over 1",
        ("-r", "a=4", "-r", "b=1", "--drop-uniform"): "-r b=K is 1, which makes groups of one",
        ("-r", "1", "-r", "a=4", "--groups"): "-r is 1, which makes groups of one",
        ("-r", "4", "--groups", "--target-groups", "0"): "--target-groups",
        ("-r", "4", "--target-groups", "3"): "give --groups",
        ("-r", "4", "--keep-incomplete"): "give --groups",
        ("-r", "4", "--dropped", "d.jsonl"): "give --groups",
        ("-r", "4", "--groups", "--group-field", "accuracy"): "give --drop-uniform",
        ("-r", "4", "--drop-uniform", "--group-field", "response"): "not a numeric field",
        ("-r", "4", "--drop-uniform", "--group-field", " "): "--group-field",
        ("-r", "4", "--groups", "-k"): "input order",
        ("-r", "4", "--groups", "--dry-run"): "sends nothing",
    }
    for args, said in refused.items():
        proc = run([*url, *args], input=rows_jsonl(group_rows(1)))
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.decode().strip().splitlines()
        assert len(lines) == 1, (args, lines)
        assert said in lines[0], (args, lines)
    assert demo_server.stats()["requests"] == 0


def test_summarize_gives_the_pass_histogram(tmp_path: Path, demo_server: DemoServer):
    n = 24
    out = tmp_path / "out.jsonl"
    proc = run(["-u", demo_server.url, "-r", str(K), "-o", str(out)], input=rows_jsonl(group_rows(n)))
    assert proc.returncode == 0, proc.stderr
    summarized = run(["--summarize", "-r", str(K), str(out)])
    histogram = [0] * (K + 1)
    for task in range(n):
        histogram[sum(reward(task, rollout) >= 1.0 for rollout in range(K))] += 1
    assert json.loads(summarized.stdout)["pass_histogram"] == histogram
    assert b"pass_histogram):" not in summarized.stderr  # the chart is for a terminal only


def test_the_pass_histogram_keeps_k_plus_1_bins_when_rollouts_are_masked(tmp_path: Path, demo_server: DemoServer):
    row = {"responses_create_params": {"input": "hi"}, "demo": {"fields": [{"mask_sample": True}, {}, {}, {}]}}
    out = tmp_path / "out.jsonl"
    proc = run(["-u", demo_server.url, "-r", str(K), "-o", str(out)], input=rows_jsonl([row, row]))
    assert summary_of(proc.stderr)["pass_histogram"] == [0, 0, 0, 2, 0]  # three correct of each task's K
    summarized = run(["--summarize", "-r", str(K), str(out)])
    assert json.loads(summarized.stdout)["pass_histogram"] == [0, 0, 0, 2, 0]


def test_summarize_counts_a_task_with_fewer_rollouts_than_k_unfinished(tmp_path: Path, demo_server: DemoServer):
    out = tmp_path / "out.jsonl"
    proc = run(["-u", demo_server.url, "-r", str(K), "-o", str(out)], input=rows_jsonl(group_rows(3)))
    assert proc.returncode == 0, proc.stderr
    as_run = json.loads(run(["--summarize", "-r", str(K), str(out)]).stdout)
    assert as_run["rollfilter"]["tasks_unfinished"] == 0
    summary = json.loads(run(["--summarize", "-r", str(2 * K), str(out)]).stdout)
    assert (summary["rollfilter"]["tasks"], summary["rollfilter"]["tasks_unfinished"]) == (3, 3)
    assert summary["pass_histogram"] == [0] * (2 * K + 1)  # no group of 2K ended


def test_a_resumed_run_finishes_a_killed_one_with_every_group_whole_and_once(tmp_path: Path):
    n, jobs = 60, 12
    demo = DemoServer()
    try:
        rows = group_rows(n, latency=lambda task, rollout: 0.005 + 0.01 * ((task * 5 + rollout * 3) % 7))
        (tmp_path / "rows.jsonl").write_text(rows_jsonl(rows))
        out = tmp_path / "out.jsonl"
        args = ["-u", demo.url, "-r", str(K), "--groups", "-j", str(jobs), str(tmp_path / "rows.jsonl")]
        args += ["-o", str(out), "-q"]
        process = start(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_for(lambda: out.exists() and out.stat().st_size > 0 and len(out.read_bytes().splitlines()) >= 8 * K)
        finally:
            process.send_signal(signal.SIGKILL)
            process.wait(timeout=SUBPROCESS_TIMEOUT)
        sent_first = demo.stats()["requests"]
        assert sent_first < n * K  # killed mid-run
        resumed = run([*args, "--resume"])
        assert resumed.returncode == 0, resumed.stderr
        written = groups_in(read_jsonl(out))
        assert sorted(task for task, _ in written) == list(range(n))  # each group once
        assert all(rollouts == list(range(K)) for _, rollouts in written)  # whole, in order
        repeated = demo.stats()["requests"] - n * K
        assert 0 <= repeated <= jobs  # at most what was in flight when it was killed
        assert (tmp_path / "out.jsonl.held").exists()
    finally:
        demo.kill()


def test_a_group_a_kill_cut_in_two_is_written_again_whole(tmp_path: Path, demo_server: DemoServer):
    """The torn case, made by hand: the results hold part of a group past the last point the held
    file vouches for (as a kill -9 in the middle of a write leaves it)."""
    rows = group_rows(3)
    (tmp_path / "rows.jsonl").write_text(rows_jsonl(rows))
    out = tmp_path / "out.jsonl"
    args = ["-u", demo_server.url, "-r", str(K), "--groups", str(tmp_path / "rows.jsonl"), "-o", str(out), "-j", "1"]
    proc = run(args)
    assert proc.returncode == 0, proc.stderr
    lines = out.read_bytes().splitlines(keepends=True)
    held = Path(str(out) + ".held")
    vouched = len(b"".join(lines[: 2 * K]))  # two whole groups, then two lines of the third
    held_lines = [line for line in held.read_bytes().splitlines(keepends=True) if b"written_through" not in line]
    held.write_bytes(b"".join(held_lines) + json.dumps({"written_through": vouched}).encode() + b"\n")
    out.write_bytes(b"".join(lines[: 2 * K + 2]))
    sent = demo_server.stats()["requests"]

    resumed = run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert demo_server.stats()["requests"] == sent  # the held file had every rollout
    assert b"cut" in resumed.stderr
    written = groups_in(read_jsonl(out))
    assert written == [(task, list(range(K))) for task in range(3)]


def test_the_held_file_of_an_earlier_fresh_run_is_not_taken_back(tmp_path: Path, demo_server: DemoServer):
    out = tmp_path / "out.jsonl"
    held = Path(str(out) + ".held")
    held.write_text(json.dumps({"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 99}) + "\n")
    proc = run(["-u", demo_server.url, "-r", str(K), "--groups", "-o", str(out)], input=rows_jsonl(group_rows(1)))
    assert proc.returncode == 0, proc.stderr
    assert b"99" not in held.read_bytes()
    assert all(line["reward"] != 99 for line in read_jsonl(out))


def test_the_chart_is_drawn_at_a_terminal(tmp_path: Path, demo_server: DemoServer):
    import pty

    metrics = tmp_path / "metrics.json"
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run(
            [*run_command(), "-u", demo_server.url, "-r", str(K), "--no-progress", "--metrics", str(metrics)],
            input=rows_jsonl(group_rows(12)).encode(),
            stdout=subprocess.PIPE,
            stderr=terminal,
            timeout=SUBPROCESS_TIMEOUT,
            env={**os.environ, "TERM": "xterm"},
        )
        os.close(terminal)
        terminal = -1
        shown = _read_all(controller)
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    assert proc.returncode == 0
    assert "pass_histogram):" in shown
    # The chart, then the summary for a person, which says where the whole one is.
    assert shown.endswith(f"the whole summary (one JSON line): {metrics}\n")
    histogram = json.loads(metrics.read_text())["pass_histogram"]
    for correct, tasks in enumerate(histogram):
        assert f"  {correct} {tasks:>{len(str(max(histogram)))}}" in shown


def run_command() -> list[str]:
    from tests.conftest import rollfilter_command

    return rollfilter_command()


def _read_all(fd: int) -> str:
    data = b""
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the terminal's other end closed
            break
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace").replace("\r\n", "\n")


def test_a_resume_keeps_the_groups_and_their_size(tmp_path: Path, demo_server: DemoServer):
    (tmp_path / "rows.jsonl").write_text(rows_jsonl(group_rows(2)))
    out = tmp_path / "out.jsonl"
    first = ["-u", demo_server.url, str(tmp_path / "rows.jsonl"), "-o", str(out)]
    assert run([*first, "-r", str(K), "--drop-uniform"]).returncode == 0
    for changed, named in (
        (["-r", str(K)], "--drop-uniform: on then, off now"),
        (["-r", str(K + 1), "--drop-uniform"], "a group keeps its size"),
        (["-r", str(K), "--drop-uniform", "--group-field", "accuracy"], "--group-field: reward then, accuracy now"),
    ):
        proc = run([*first, *changed, "--resume"])
        assert proc.returncode == 2, changed
        assert named in proc.stderr.decode(), changed


def pairs(lines: list[dict[str, Any]]) -> list[tuple[int, int]]:
    return [(line["_ng_task_index"], line["_ng_rollout_index"]) for line in lines]


@pytest.mark.parametrize("rewards", [[1, 1, 0, 1], [1, 1, 1, 1]], ids=["kept", "uniform"])
def test_a_group_written_incomplete_is_judged_and_written_whole_when_a_resume_completes_it(
    tmp_path: Path, demo_server: DemoServer, rewards: list[int]
):
    """Task 0's rollout 2 fails; --keep-incomplete writes the other three. The resume that runs it
    again judges the four together, and writes them (or drops them) together, once."""
    faults = [None, None, "422", None]
    rows = [
        {"id": 0, "responses_create_params": {"input": "a"}, "demo": {"rewards": rewards, "faults": faults}},
        {"id": 1, "responses_create_params": {"input": "b"}, "demo": {"rewards": [1, 0, 1, 0]}},
    ]
    (tmp_path / "rows.jsonl").write_text(rows_jsonl(rows))
    out, dropped = tmp_path / "out.jsonl", tmp_path / "dropped.jsonl"
    args = ["-u", demo_server.url, "-r", str(K), "--drop-uniform", "--keep-incomplete", str(tmp_path / "rows.jsonl")]
    args += ["-o", str(out), "--errors", str(tmp_path / "errors.jsonl"), "--dropped", str(dropped)]
    first = run(args)
    assert first.returncode == 1, first.stderr
    assert sorted(groups_in(read_jsonl(out))) == [(0, [0, 1, 3]), (1, [0, 1, 2, 3])]
    sent = demo_server.stats()["requests"]

    resumed = run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert demo_server.stats()["requests"] == sent + 1  # only the rollout that failed
    kept = rewards != [1, 1, 1, 1]
    assert sorted(groups_in(read_jsonl(out))) == [(0, list(range(K))), (1, list(range(K)))][0 if kept else 1 :]
    assert sorted(pairs(read_jsonl(dropped))) == ([] if kept else [(0, k) for k in range(K)])
    groups = summary_of(resumed.stderr)["rollfilter"]["groups"]
    assert groups == {
        "kept": 1 + kept,
        "dropped_uniform": int(not kept),
        "dropped_masked": 0,
        "incomplete": 0,
        "cancelled": 0,
    }
    assert b"written incomplete" in resumed.stderr

    again = run([*args, "--resume"])  # nothing left to run: the files and the counts stand
    assert again.returncode == 0, again.stderr
    assert demo_server.stats()["requests"] == sent + 1
    assert summary_of(again.stderr)["rollfilter"]["groups"] == groups
    assert sorted(pairs(read_jsonl(out)) + pairs(read_jsonl(dropped))) == [(t, k) for t in (0, 1) for k in range(K)]


def test_a_resume_whose_target_was_met_sends_nothing_and_repeats_no_dropped_line(
    tmp_path: Path, demo_server: DemoServer
):
    n, target, slow = 24, 5, {0, 1, 2}
    rows = group_rows(n, latency=lambda task, rollout: 30.0 if task in slow and rollout == 3 else 0.01)
    (tmp_path / "rows.jsonl").write_text(rows_jsonl(rows))
    out, dropped = tmp_path / "out.jsonl", tmp_path / "dropped.jsonl"
    args = ["-u", demo_server.url, "-r", str(K), "--groups", "--target-groups", str(target), "-j", "16"]
    args += ["-o", str(out), "--dropped", str(dropped), str(tmp_path / "rows.jsonl")]
    first = run(args)
    assert first.returncode == 0, first.stderr
    cancelled = sorted(pairs(read_jsonl(dropped)))
    assert {task for task, _ in cancelled} >= slow
    sent = demo_server.stats()["requests"]
    for _ in range(2):
        resumed = run([*args, "--resume"])
        assert resumed.returncode == 0, resumed.stderr
        assert demo_server.stats()["requests"] == sent  # a met target sends nothing
        assert sorted(pairs(read_jsonl(dropped))) == cancelled  # each once, as the first run left them
        assert len(groups_in(read_jsonl(out))) == target
        assert not set(pairs(read_jsonl(out))) & set(cancelled)
        figures = summary_of(resumed.stderr)["rollfilter"]
        assert figures["groups"]["kept"] == target
        assert figures["groups"]["cancelled"] == len({task for task, _ in cancelled})  # as --dropped says
        finished = len(read_jsonl(out)) + len(cancelled)
        assert (figures["skipped"], figures["not_started"]) == (finished, n * K - finished)


def test_a_resume_whose_target_was_met_with_groups_written_incomplete_keeps_the_file(
    tmp_path: Path, demo_server: DemoServer
):
    """Tasks 0, 2 and 4 lose a rollout (written incomplete) before 5 groups are kept. The target is
    met: a resume sends nothing, and the kept groups stay in -o rather than go to --dropped."""
    rows = group_rows(12, rewards=lambda task, rollout: float(rollout % 2), latency=lambda task, rollout: 0.0)
    for task in (0, 2, 4):
        rows[task]["demo"]["faults"] = [None, "500", None, None]
    (tmp_path / "rows.jsonl").write_text(rows_jsonl(rows))
    out, dropped = tmp_path / "out.jsonl", tmp_path / "dropped.jsonl"
    args = ["-u", demo_server.url, "-r", str(K), "-j", "1", "--retries", "0", "--groups", "--keep-incomplete"]
    args += ["--target-groups", "5", "-o", str(out), "--dropped", str(dropped), str(tmp_path / "rows.jsonl")]
    first = run(args)
    assert summary_of(first.stderr)["rollfilter"]["groups"]["kept"] == 5, first.stderr
    written, sent = out.read_bytes(), demo_server.stats()["requests"]
    resumed = run([*args, "--resume"])
    assert demo_server.stats()["requests"] == sent, resumed.stderr  # a met target sends nothing
    assert out.read_bytes() == written
    assert not set(pairs(read_jsonl(out))) & set(pairs(read_jsonl(dropped)))
    assert summary_of(resumed.stderr)["rollfilter"]["groups"]["kept"] == 5


def test_after_kills_and_a_resume_the_dropped_file_holds_each_uniform_rollout_once(tmp_path: Path):
    n, jobs, kills = 120, 16, 4
    demo = DemoServer()
    try:
        rows = group_rows(n, latency=lambda task, rollout: 0.005 + 0.0075 * ((task * 5 + rollout * 3) % 4))
        (tmp_path / "rows.jsonl").write_text(rows_jsonl(rows))
        out, dropped = tmp_path / "out.jsonl", tmp_path / "dropped.jsonl"
        held = Path(str(out) + ".held")
        args = ["-u", demo.url, "-r", str(K), "--drop-uniform", "-j", str(jobs), str(tmp_path / "rows.jsonl")]
        args += ["-o", str(out), "--dropped", str(dropped)]
        for kill in range(kills):
            before = len(held.read_bytes().splitlines()) if held.exists() else 0
            resume = ["--resume"] if kill else []
            process = start([*args, *resume], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_for(lambda before=before: held.exists() and len(held.read_bytes().splitlines()) >= before + 40)
            finally:
                process.send_signal(signal.SIGKILL)
                process.wait(timeout=SUBPROCESS_TIMEOUT)
        assert demo.stats()["requests"] < n * K  # every run was killed before the end
        resumed = run([*args, "--resume"])
        assert resumed.returncode == 0, resumed.stderr
    finally:
        demo.kill()
    uniform_tasks = {task for task in range(n) if uniform(task)}
    stamped = read_jsonl(dropped)
    assert sorted(pairs(stamped)) == [(task, k) for task in sorted(uniform_tasks) for k in range(K)]  # each once
    assert {line["dropped_because"] for line in stamped} == {"uniform"}
    written = groups_in(read_jsonl(out))
    assert sorted(task for task, _ in written) == sorted(set(range(n)) - uniform_tasks)
    assert all(rollouts == list(range(K)) for _, rollouts in written)
    groups = summary_of(resumed.stderr)["rollfilter"]["groups"]
    assert groups["dropped_uniform"] == len(uniform_tasks)
    assert groups["kept"] == n - len(uniform_tasks)


def test_a_kill_between_the_held_file_and_the_dropped_file_neither_loses_nor_doubles_a_group(
    tmp_path: Path, demo_server: DemoServer
):
    """The two orders a kill -9 can catch the two writers in, made by hand from a whole run: one
    uniform group's lines never reached --dropped (its marker did), another's reached it and its
    marker did not (the resumed run judges that group again)."""
    n = 24
    (tmp_path / "rows.jsonl").write_text(rows_jsonl(group_rows(n)))
    out, dropped = tmp_path / "out.jsonl", tmp_path / "dropped.jsonl"
    held = Path(str(out) + ".held")
    args = ["-u", demo_server.url, "-r", str(K), "--drop-uniform", str(tmp_path / "rows.jsonl")]
    args += ["-o", str(out), "--dropped", str(dropped)]
    assert run(args).returncode == 0
    uniform_tasks = sorted(task for task in range(n) if uniform(task))
    assert len(uniform_tasks) >= 2
    lost, doubled = uniform_tasks[:2]
    dropped.write_text(
        "".join(json.dumps(line) + "\n" for line in read_jsonl(dropped) if line["_ng_task_index"] != lost)
    )
    held.write_bytes(
        b"".join(
            line
            for line in held.read_bytes().splitlines(keepends=True)
            if not (b"dropped_because" in line and json.loads(line)["_ng_task_index"] == doubled)
        )
    )
    resumed = run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(pairs(read_jsonl(dropped))) == [(task, k) for task in uniform_tasks for k in range(K)]
    assert summary_of(resumed.stderr)["rollfilter"]["groups"]["dropped_uniform"] == len(uniform_tasks)


def test_the_pass_histogram_has_k_plus_1_bins_and_its_ends_are_the_uniform_groups(demo_server: DemoServer):
    same = {"responses_create_params": {"input": "a"}, "demo": {"rewards": [1, 1, 1, 1]}}
    other = {"responses_create_params": {"input": "b"}, "demo": {"rewards": [1, 0, 1, 0]}}
    proc = run(["-u", demo_server.url, "-r", str(K), "--drop-uniform"], input=rows_jsonl([same, same, other]))
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stderr)
    assert summary["pass_histogram"] == [0, 0, 1, 0, 2]  # the identical lines' task: two groups of four
    histogram, groups = summary["pass_histogram"], summary["rollfilter"]["groups"]
    assert histogram[0] + histogram[K] == groups["dropped_uniform"] == 2
    failing = {"responses_create_params": {"input": "c"}, "demo": {"rewards": [0] * K, "faults": [None, "422"]}}
    proc = run(["-u", demo_server.url, "-r", str(K), "--drop-uniform"], input=rows_jsonl([same, failing]))
    summary = summary_of(proc.stderr)
    histogram, groups = summary["pass_histogram"], summary["rollfilter"]["groups"]
    assert (groups["incomplete"], groups["dropped_uniform"]) == (1, 1)
    assert histogram == [0, 0, 0, 0, 1]  # the incomplete group is in no bin: not at an end, as if uniform
