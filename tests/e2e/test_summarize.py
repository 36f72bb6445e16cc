"""--summarize: the live summary recomputed from result files, pass@k and mean@k."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict

import pytest

from tests.conftest import (
    DemoServer,
    result_lines,
    rows_jsonl,
    run,
    summary_of,
)


def direct_pass_at_k(results: list[dict], k: int, threshold: float = 1.0) -> float:
    by_task: dict[int, list[float]] = defaultdict(list)
    for result in results:
        by_task[result["_ng_task_index"]].append(result["reward"])
    values = []
    for rewards in by_task.values():
        n, c = len(rewards), sum(r >= threshold for r in rewards)
        values.append(1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k))
    return sum(values) / len(values)


def test_pass_at_k_and_mean_at_k_match_a_direct_computation(tmp_path, demo_server: DemoServer):
    rng = random.Random(5)
    rows = [
        {"id": i, "responses_create_params": {"input": "x"}, "demo": {"reward_p": rng.choice([0.1, 0.5, 0.9])}}
        for i in range(40)
    ]
    per_task = tmp_path / "tasks.jsonl"
    proc = run(["-u", demo_server.url, "-r", "8", "--per-task", str(per_task)], input=rows_jsonl(rows))
    assert proc.returncode == 0, proc.stderr
    results = result_lines(proc.stdout)
    summary = summary_of(proc.stderr)
    for k in (1, 2, 4, 8):
        assert summary[f"pass@{k}"] == pytest.approx(direct_pass_at_k(results, k))
    assert 0 < summary["pass@1"] < summary["pass@8"] < 1
    by_task: dict[int, list[float]] = defaultdict(list)
    for result in results:
        by_task[result["_ng_task_index"]].append(result["reward"])
    assert summary["mean@8"] == pytest.approx(sum(sum(r) / len(r) for r in by_task.values()) / len(by_task))
    tasks = [json.loads(line) for line in per_task.read_text().splitlines()]
    assert sorted(t["_ng_task_index"] for t in tasks) == list(range(40))
    assert all(t["n"] == 8 and t["failed"] == 0 for t in tasks)
    assert summary["rollfilter"]["tasks"] == 40


def test_tasks_with_failed_rollouts_count_as_incorrect(tmp_path, demo_server: DemoServer):
    rows = [
        {"responses_create_params": {"input": "xx"}},  # reward 1.0 every time
        {"responses_create_params": {"input": "xx"}, "demo": {"fault": "422"}},  # every rollout fails
    ]
    proc = run(["-u", demo_server.url, "-r", "2"], input=rows_jsonl(rows))
    assert proc.returncode == 1
    summary = summary_of(proc.stderr)
    assert summary["pass@1"] == 0.5
    assert summary["rollfilter"]["tasks"] == 2
    assert summary["rollfilter"]["tasks_with_failed_rollouts"] == 1


def test_summarize_counts_nemo_gym_failure_lines_and_lines_it_cannot_use():
    lines = [
        '{"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_failure_class": "timeout"}',  # NeMo Gym's sidecar
        '{"_ng_failure_class": "crash"}',  # no indices to pair it with: a failure all the same
        '{"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 1.0}',
        '{"reward": 1e400}',  # a result whose number no float holds: kept, out of the means
        "[1]",
    ]
    proc = run(["--summarize"], input="".join(line + "\n" for line in lines))
    assert proc.returncode == 1
    [message, unchecked] = proc.stderr.decode().splitlines()
    assert message == (
        "rollfilter: 1 line is not a result, counted as failed (bad_input); the first: <stdin>:5:"
        " not a JSON object (a JSON array)"
    )
    assert unchecked.startswith("rollfilter: --summarize: shards cannot be checked from standard input")
    summary = json.loads(proc.stdout)
    assert summary["reward"] == 1.0
    figures = summary["rollfilter"]
    assert (figures["rows_read"], figures["succeeded"], figures["failed"]) == (5, 2, 3)
    assert figures["failed_by_kind"] == {"agent_failure": 2, "bad_input": 1}
    assert figures["failed_by_class"] == {"crash": 1, "timeout": 1}


def test_summarize_recomputes_the_live_summary(tmp_path, demo_server: DemoServer):
    rows = [{"responses_create_params": {"input": "x" * i}, "demo": {"reward_p": 0.5}} for i in range(30)]
    rows[3]["demo"] = {"fault": "422"}
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    live = run(["-u", demo_server.url, "-r", "4", "-o", str(out), "--errors", str(errors)], input=rows_jsonl(rows))
    assert live.returncode == 1
    again = run(["--summarize", "-r", "4", str(out), str(errors)])
    assert again.returncode == 0, again.stderr
    live_summary, recomputed = summary_of(live.stderr), json.loads(again.stdout)
    figures = ("rows_read", "succeeded", "failed", "failed_by_kind", "tasks", "tasks_with_failed_rollouts")
    for key in ("reward", "accuracy", "mean@4", "pass@1", "pass@2", "pass@4"):
        assert recomputed[key] == pytest.approx(live_summary[key]), key
    for block in ("stderr", "ci95", "sample_size", "per_rollout"):
        assert recomputed[block] == live_summary[block], block
    for key in figures:
        assert recomputed["rollfilter"][key] == live_summary["rollfilter"][key], key
    # The same from a pipe, after cat-ing the pieces in another order.
    piped = run(["--summarize", "-r", "4"], input=errors.read_bytes() + out.read_bytes())
    assert json.loads(piped.stdout)["pass@2"] == pytest.approx(live_summary["pass@2"])


def test_a_pair_given_twice_counts_once_and_is_said(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(rows_jsonl([{"_ng_task_index": i, "_ng_rollout_index": 0, "reward": 1.0} for i in range(3)]))
    proc = run(["--summarize", str(results), str(results)])
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["rollfilter"]["succeeded"] == 3
    assert proc.stderr.decode() == (
        f"rollfilter: 3 results repeat a (task, rollout) pair counted already, counted once; the first: {results}:1\n"
    )


def test_summarize_writes_per_task_lines_and_refuses_what_it_would_not_write(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(
        rows_jsonl(
            [{"_ng_task_index": t, "_ng_rollout_index": k, "reward": float(t == k)} for t in range(2) for k in range(2)]
        )
    )
    per_task = tmp_path / "tasks.jsonl"
    proc = run(["--summarize", "-r", "2", "--per-task", str(per_task), str(results)])
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["pass@1"] for line in per_task.read_text().splitlines()] == [0.5, 0.5]
    for option in (["-o", str(tmp_path / "o.jsonl")], ["--errors", str(tmp_path / "e.jsonl")], ["--append"]):
        refused = run(["--summarize", *option, str(results)])
        assert refused.returncode == 2
        assert refused.stderr.decode().startswith("rollfilter: --summarize writes its summary to standard output")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.jsonl", "tasks.jsonl"]


def test_a_result_with_numbers_past_the_float_range_is_counted(tmp_path):
    # As an agent can answer them, and rollfilter writes them back: exactly.
    huge = "9" * 5000
    results = tmp_path / "results.jsonl"
    results.write_text(
        f'{{"_ng_task_index":0,"_ng_rollout_index":0,"reward":1.0,"response":{{"usage":{{"input_tokens":{huge}}}}}}}\n'
        '{"_ng_task_index":1,"_ng_rollout_index":0,"reward":1e400}\n'
    )
    proc = run(["--summarize", str(results)])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["rollfilter"]["succeeded"] == 2
    assert summary["reward"] == 1.0  # the reward past the float range is no figure of the mean


def test_at_a_terminal_the_summary_is_indented(tmp_path):
    import os
    import pty
    import subprocess

    from tests.conftest import SUBPROCESS_TIMEOUT, clean_env, rollfilter_command

    results = tmp_path / "results.jsonl"
    results.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n')
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run(
            [*rollfilter_command(), "--summarize", str(results)],
            stdout=terminal,
            stderr=subprocess.PIPE,
            timeout=SUBPROCESS_TIMEOUT,
            env=clean_env(TERM="xterm"),
        )
        shown = os.read(controller, 1 << 20).decode().replace("\r\n", "\n")
    finally:
        os.close(terminal)
        os.close(controller)
    assert proc.returncode == 0, proc.stderr
    assert shown.startswith('{\n  "reward": 1.0,\n')
    assert json.loads(shown)["rollfilter"]["succeeded"] == 1
    assert json.loads(run(["--summarize", str(results)]).stdout.decode().strip())["reward"] == 1.0  # one line in a pipe


def test_the_summary_gives_error_bars_clustered_by_task_beside_each_mean(tmp_path):
    rng = random.Random(7)
    results = tmp_path / "results.jsonl"
    lines = []
    for task in range(100):
        p = rng.random()
        for rollout in range(4):
            reward = float(rng.random() < p)
            lines.append({"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward, "ok": reward > 0})
    results.write_text(rows_jsonl(lines))
    summary = json.loads(run(["--summarize", "-r", "4", str(results)]).stdout)
    # Today's keys keep their values; the bars sit beside them, keyed alike.
    assert summary["mean@4"] == summary["reward"] == summary["ok"] == sum(r["reward"] for r in lines) / 400
    means = ("reward", "ok", "mean@4", "pass@1", "pass@2", "pass@4")
    assert list(summary["stderr"]) == list(summary["ci95"]) == list(summary["sample_size"]) == list(means)
    assert summary["sample_size"]["reward"] == {"tasks": 100, "rollouts": 400}
    low, high = summary["ci95"]["reward"]
    assert low < summary["reward"] < high
    assert 0.02 < summary["stderr"]["reward"] < 0.06  # tasks of 4 rollouts spread from 0 to 1
    assert summary["stderr"]["reward"] == summary["stderr"]["mean@4"]
    assert summary["stderr"]["pass@4"] > 0


def paired_runs(tmp_path, *, tasks: int, only_in_baseline: int) -> tuple[str, str]:
    """A baseline, and results that get two rollouts a task right more often, on all but the last
    `only_in_baseline` of its tasks."""
    rng = random.Random(11)
    baseline, results = tmp_path / "baseline.jsonl", tmp_path / "results.jsonl"
    before, after = [], []
    for task in range(tasks):
        p = rng.random()
        for rollout in range(2):
            index = {"_ng_task_index": task, "_ng_rollout_index": rollout}
            before.append({**index, "reward": float(rng.random() < p), "turns": rng.randint(1, 5)})
            if task < tasks - only_in_baseline:
                after.append({**index, "reward": float(rng.random() < min(1.0, p + 0.2)), "turns": 3})
    baseline.write_text(rows_jsonl(before))
    results.write_text(rows_jsonl(after))
    return str(baseline), str(results)


def test_compare_pairs_two_runs_by_task_and_says_what_it_left_out(tmp_path):
    baseline, results = paired_runs(tmp_path, tasks=200, only_in_baseline=3)
    proc = run(["--summarize", "-r", "2", "--compare", baseline, results])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert list(summary)[-2:] == ["compare", "rollfilter"]
    assert list(summary["compare"]) == ["reward", "turns"]
    reward = summary["compare"]["reward"]
    assert set(reward) == {
        *("difference", "stderr", "ci95", "p_value", "test", "detectable"),
        *("improved", "worsened", "tied", "tasks"),
    }
    assert reward["detectable"] == pytest.approx(2.8 * reward["stderr"], rel=0.05)
    assert reward["tasks"] == 197
    assert reward["improved"] + reward["worsened"] + reward["tied"] == 197
    assert reward["test"] == "t"  # two rollouts a task: a task's figure is 0, 0.5 or 1
    assert reward["difference"] > 0
    assert reward["p_value"] < 0.05
    assert reward["ci95"][0] < reward["difference"] < reward["ci95"][1]
    assert summary["rollfilter"]["compared_tasks"] == {
        "paired": 197,
        "only_in_baseline": 3,
        "only_in_this_run": 0,
        "results_without_task": 0,
    }
    assert proc.stderr.decode() == (
        "rollfilter: --compare: 197 tasks compared; left out: 3 in the baseline only, 0 in these results only\n"
    )  # in a pipe: no table


NO_PAIR = dict.fromkeys(("difference", "stderr", "ci95", "p_value", "test", "detectable")) | {"tasks": 0}


def test_compare_with_no_task_in_common_tests_nothing(tmp_path):
    baseline, results = tmp_path / "baseline.jsonl", tmp_path / "results.jsonl"
    baseline.write_text(rows_jsonl([{"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 0.0}]))
    results.write_text(rows_jsonl([{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}]))
    proc = run(["--summarize", "--compare", str(baseline), str(results)])
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert {key: summary["compare"]["reward"][key] for key in NO_PAIR} == NO_PAIR
    assert summary["rollfilter"]["compared_tasks"]["paired"] == 0  # task 0 is under the baseline's 1, not in it


def test_compare_refuses_what_it_cannot_use(tmp_path):
    baseline, results = paired_runs(tmp_path, tasks=5, only_in_baseline=0)
    alone = run(["--compare", baseline, results])
    assert alone.returncode == 2
    assert alone.stderr.decode() == "rollfilter: --compare compares result files: give it with --summarize\n"
    missing = run(["--summarize", "--compare", str(tmp_path / "nothing.jsonl"), results])
    assert missing.returncode == 2
    assert missing.stderr.decode().startswith("rollfilter: cannot read ")
    with open(baseline, "a") as file:
        file.write("not json\n")
    damaged = run(["--summarize", "--compare", baseline, results])
    assert damaged.returncode == 1
    assert f"rollfilter: --compare: 1 line is not a result, left out; the first: {baseline}:11: " in (
        damaged.stderr.decode()
    )
    assert json.loads(damaged.stdout)["compare"]["reward"]["tasks"] == 5


def test_without_repeats_a_task_of_several_rollouts_is_said_to_need_them(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(rows_jsonl([{"_ng_task_index": 0, "_ng_rollout_index": k, "reward": 1.0} for k in range(2)]))
    plain = run(["--summarize", str(results)])
    assert plain.returncode == 0
    assert plain.stderr.decode() == (
        "rollfilter: --summarize: the results hold several rollouts a task: give -r K for error bars clustered"
        " by task (without it, each rollout counts as a task, and the bars are too small)\n"
    )
    assert json.loads(plain.stdout)["sample_size"]["reward"] == {"tasks": 2, "rollouts": 2}
    clustered = run(["--summarize", "-r", "2", str(results)])
    assert clustered.stderr == b""
    assert json.loads(clustered.stdout)["sample_size"]["reward"] == {"tasks": 1, "rollouts": 2}
