"""What a verifier says besides the reward: `mask_sample` and `reward_components`, against the demo agent.

The agent answers rollout r of task t with `reward(t, r)`, masks the rollouts `masked(t, r)` names
(whose reward is 0.5, a value no measured rollout has, so that counting one would show) and
reports `components(t, r)`: every figure below is computed here from those functions.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import DemoServer, read_jsonl, result_lines, rows_jsonl, run, summary_of

K = 4
N = 36


def masked(task: int, rollout: int) -> bool:
    """Three of four masked for tasks 5, 11, ...; one for tasks 4, 10, ...; a scattering elsewhere."""
    if task % 6 == 5:
        return rollout != 0
    if task % 6 == 4:
        return rollout == 1
    return (task + rollout) % 7 == 0


def reward(task: int, rollout: int) -> float:
    if masked(task, rollout):
        return 0.5
    return 1.0 if (task * 31 + rollout * 17) % 11 < task % 12 else 0.0


def components(task: int, rollout: int) -> dict[str, float]:
    if masked(task, rollout):
        return {"accuracy": 0.5, "format": 7.0}
    return {"accuracy": reward(task, rollout), "format": float((task + rollout) % 3 == 0)}


def rows(n: int = N) -> str:
    return rows_jsonl(
        [
            {
                "id": task,
                "responses_create_params": {"input": f"task {task}"},
                "demo": {
                    "rewards": [reward(task, r) for r in range(K)],
                    "fields": [
                        {"reward_components": components(task, r), **({"mask_sample": True} if masked(task, r) else {})}
                        for r in range(K)
                    ],
                },
            }
            for task in range(n)
        ]
    )


def measured(task: int) -> list[int]:
    return [r for r in range(K) if not masked(task, r)]


def pass_at_k(n: int, c: int, k: int) -> float:
    return 1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k)


def fate(task: int, field: Any = reward) -> str:
    values = {field(task, r) for r in measured(task)}
    if len(measured(task)) < 2:
        return "masked"
    return "uniform" if len(values) == 1 else "kept"


def test_masked_rollouts_are_written_counted_and_left_out_of_every_figure(tmp_path: Path, demo_server: DemoServer):
    out, dropped, per_task = tmp_path / "out.jsonl", tmp_path / "dropped.jsonl", tmp_path / "tasks.jsonl"
    prom = tmp_path / "rollfilter.prom"
    args = ["-u", demo_server.url, "-r", str(K), "-j", "16", "--drop-uniform", "--dropped", str(dropped)]
    args += ["-o", str(out), "--per-task", str(per_task), "--prometheus-file", str(prom)]
    proc = run(args, input=rows())
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stderr)
    figures = summary["rollfilter"]
    fates = {task: fate(task) for task in range(N)}
    assert set(fates.values()) == {"kept", "uniform", "masked"}  # the functions give every fate

    # Written as any result: kept groups in the results, the others in --dropped with their fate.
    written = read_jsonl(out)
    assert {line["_ng_task_index"] for line in written} == {t for t in range(N) if fates[t] == "kept"}
    assert all(
        line.get("mask_sample", False) == masked(line["_ng_task_index"], line["_ng_rollout_index"]) for line in written
    )
    stamped = {(line["_ng_task_index"], line["dropped_because"]) for line in read_jsonl(dropped)}
    assert stamped == {(t, fates[t]) for t in range(N) if fates[t] != "kept"}
    assert figures["groups"] == {
        "kept": sum(f == "kept" for f in fates.values()),
        "dropped_uniform": sum(f == "uniform" for f in fates.values()),
        "dropped_masked": sum(f == "masked" for f in fates.values()),
        "incomplete": 0,
        "cancelled": 0,
    }

    # Counted masked; the means are over the others, and say how many they cover.
    pairs = [(t, r) for t in range(N) for r in range(K)]
    unmasked = [(t, r) for t, r in pairs if not masked(t, r)]
    assert figures["succeeded"] == N * K
    assert figures["masked"] == N * K - len(unmasked) > 0
    assert figures["means_cover"] == len(unmasked)
    assert summary["reward"] == pytest.approx(sum(reward(t, r) for t, r in unmasked) / len(unmasked))
    assert summary["accuracy"] == pytest.approx(sum(reward(t, r) >= 1.0 for t, r in unmasked) / len(unmasked))
    assert "mask_sample" not in summary
    for name in ("accuracy", "format"):
        expected = sum(components(t, r)[name] for t, r in unmasked) / len(unmasked)
        assert summary["reward_components"][name] == pytest.approx(expected)

    # mean@K, pass@k and the histogram over each task's measured rollouts.
    means = [sum(reward(t, r) for r in measured(t)) / len(measured(t)) for t in range(N)]
    assert summary[f"mean@{K}"] == pytest.approx(sum(means) / N)
    for k in (1, 2, 4):
        values = [
            pass_at_k(len(measured(t)), sum(reward(t, r) >= 1.0 for r in measured(t)), k)
            for t in range(N)
            if len(measured(t)) >= k
        ]
        assert summary[f"pass@{k}"] == pytest.approx(sum(values) / len(values))
    histogram = [0] * (K + 1)
    for t in range(N):
        histogram[sum(reward(t, r) >= 1.0 for r in measured(t))] += 1
    assert summary["pass_histogram"] == histogram
    records = {record["_ng_task_index"]: record for record in read_jsonl(per_task)}
    assert {t: (r["n"], r["masked"]) for t, r in records.items()} == {
        t: (len(measured(t)), K - len(measured(t))) for t in range(N)
    }

    # Prometheus counts them; their tokens were spent, and count.
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(prom.read_text())
        for sample in family.samples
    }
    assert samples["rollfilter_rollouts_masked_total", (("agent", "(no name)"),)] == figures["masked"]
    everything = [*written, *read_jsonl(dropped)]
    spent = sum(line["response"]["usage"]["total_tokens"] for line in everything)
    assert samples["rollfilter_tokens_total", (("agent", "(no name)"),)] == spent
    assert samples["rollfilter_groups_total", (("fate", "dropped_masked"),)] == figures["groups"]["dropped_masked"]

    # --summarize over what was written (the results and the dropped groups) says the same.
    again = run(["--summarize", "-r", str(K), str(out), str(dropped)])
    assert again.returncode == 0, again.stderr
    recomputed = json.loads(again.stdout)
    for key in ("reward", "accuracy", "reward_components", f"mean@{K}", "pass@1", "pass@4", "pass_histogram"):
        assert recomputed[key] == pytest.approx(summary[key]), key
    assert (recomputed["rollfilter"]["masked"], recomputed["rollfilter"]["means_cover"]) == (
        figures["masked"],
        figures["means_cover"],
    )


def test_group_field_takes_a_dotted_path_into_reward_components(demo_server: DemoServer):
    def format_component(task: int, rollout: int) -> float:
        return components(task, rollout)["format"]

    by_format = {t for t in range(N) if fate(t, format_component) == "kept"}
    by_reward = {t for t in range(N) if fate(t) == "kept"}
    assert by_format != by_reward
    args = ["-u", demo_server.url, "-r", str(K), "--drop-uniform", "--group-field", "reward_components.format"]
    proc = run(args, input=rows())
    assert proc.returncode == 0, proc.stderr
    assert {line["_ng_task_index"] for line in result_lines(proc.stdout)} == by_format


@pytest.mark.parametrize("field", ["reward_components.", ".format", "reward_components..format"])
def test_a_dotted_path_with_an_empty_step_is_a_usage_error(field: str, demo_server: DemoServer):
    proc = run(["-u", demo_server.url, "-r", str(K), "--drop-uniform", "--group-field", field], input=rows(1))
    assert proc.returncode == 2
    assert b"empty step" in proc.stderr
    assert demo_server.stats()["by_id"] == {}


def test_a_resumed_run_counts_the_groups_an_earlier_run_dropped_as_masked(tmp_path: Path, demo_server: DemoServer):
    out, dropped, data = tmp_path / "out.jsonl", tmp_path / "dropped.jsonl", tmp_path / "rows.jsonl"
    data.write_text(rows(12))
    args = ["-u", demo_server.url, "-r", str(K), "--drop-uniform", "--dropped", str(dropped), "-o", str(out), str(data)]
    first = run(args)
    assert first.returncode == 0, first.stderr
    groups = summary_of(first.stderr)["rollfilter"]["groups"]
    assert groups["dropped_masked"] == sum(fate(t) == "masked" for t in range(12)) > 0
    sent = demo_server.stats()["requests"]
    resumed = run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert demo_server.stats()["requests"] == sent  # nothing left to send
    assert summary_of(resumed.stderr)["rollfilter"]["groups"] == groups
