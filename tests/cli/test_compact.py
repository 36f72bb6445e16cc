"""cli/compact.py: the summary for a person at a terminal, rendered from the summary object alone."""

from __future__ import annotations

from typing import Any

from rollfilter.cli.chart import compare_table
from rollfilter.cli.compact import MOST_LINES, compact_summary
from rollfilter.engine.metrics import Metrics
from rollfilter.figures.passk import TaskStats, ks_for
from rollfilter.run.statistics import statistics_of
from rollfilter.run.summary import summary_of


def a_summary(repeats: int, fields: int) -> dict[str, Any]:
    """The summary of a run of 3 tasks of `repeats` rollouts, each result with `fields` numeric fields."""
    metrics, tasks = Metrics(), TaskStats(repeats, 1.0)
    for task in range(3):
        for rollout in range(repeats):
            result: dict[str, Any] = {"reward": float((task + rollout) % 2)}
            result |= {f"field_{i}": float(i + rollout) for i in range(fields)}
            result["response"] = {"usage": {"input_tokens": 120, "output_tokens": 30}}
            tasks.rollout_ended(task, result["reward"], rollout, result)
            metrics.taken += 1
            metrics.add_result(result, 0.1)
    tasks.finish()
    return summary_of(statistics_of(metrics, tasks=tasks))


def test_a_summary_of_everything_is_at_most_25_lines_and_says_where_the_whole_one_is():
    summary = a_summary(1024, fields=9)
    summary["rollfilter"] |= {"masked": 2, "groups": {"kept": 3, "dropped_uniform": 1, "incomplete": 0}}
    summary["rollfilter"] |= {"cost_usd": 1.25, "failed": 4, "failed_by_kind": {"timeout": 3, "bad_response": 1}}
    health = {"unhealthy": 5, "by_check": {"empty_output": 4, "truncated": 1}, "tasks_all_unhealthy": 1}
    summary["rollfilter"]["health"] = health  # where summary_of puts it
    summary["reward_components"] = {"accuracy": 0.25, "style": 1.0}
    summary["masked"] = 2  # a count at the top, no mean: in no row
    lines = compact_summary(summary, whole_at="run-metrics.json")
    assert len(lines) <= MOST_LINES
    assert lines[0] == "3,076 rollouts: 3,072 succeeded, 4 failed (timeout 3, bad_response 1), 2 masked"
    rows = [line.split()[0] for line in lines[2:]]
    passes = [f"pass@{k}" for k in ks_for(1024)]
    assert rows[:8] == ["reward", "mean@1024", *passes[:5], passes[-1]]  # the first k and K
    assert rows[8:12] == ["field_0", "field_1", "field_2", "field_3"]
    assert "  (10 more in the whole summary)" in lines  # 5 pass@k and 5 fields
    assert "reward components: accuracy 0.25, style 1" in lines
    assert "unhealthy: 5 rollouts, 1 tasks with no healthy one (empty_output 4, truncated 1)" in lines
    assert "groups: 3 kept, 1 dropped uniform" in lines
    assert "tokens a rollout: 120 input, 30 output; cost $1.2500" in lines
    assert lines[-1] == "the whole summary (one JSON line): run-metrics.json"


def test_what_the_summary_lacks_is_no_line():
    summary = a_summary(1, fields=0)
    lines = compact_summary(summary, whole_at=None)
    assert lines[0] == "3 rollouts: 3 succeeded, 0 failed"
    assert lines[1].split() == ["mean", "95%", "interval", "tasks", "rollouts"]
    assert lines[2].split()[:2] == ["reward", "0.3333"]
    assert not [line for line in lines if line.startswith(("unhealthy", "groups", "reward components", "cost"))]
    assert lines[-1].startswith("the whole summary: --metrics FILE")
    nothing = summary_of(statistics_of(Metrics()))
    assert compact_summary(nothing, whole_at=None)[:3] == [
        "0 rollouts: 0 succeeded, 0 failed",
        "          mean  95% interval  tasks  rollouts",
        "  reward  -     -             -      -",
    ]


def test_names_an_agent_gave_reach_the_terminal_without_their_control_characters():
    field, component = "\x1b[31mred", "\x1b[2Jclear"
    summary = {"reward": 0.5, field: 1.0, "reward_components": {component: 0.5}, "rollfilter": {"succeeded": 4}}
    summary |= {"ci95": {"reward": [0.1, 0.9], field: [1.0, 1.0]}}
    summary |= {"sample_size": {key: {"tasks": 4, "rollouts": 4} for key in ("reward", field)}}
    shown = "\n".join(compact_summary(summary, whole_at=None))
    assert "\x1b" not in shown
    assert "\\x1b[31mred" in shown
    assert "\\x1b[2Jclear" in shown
    figures = {"difference": 0.0, "stderr": 0.0, "ci95": [0.0, 0.0], "p_value": 1.0, "test": "t"}
    figures |= {"detectable": None, "improved": 0, "worsened": 0, "tied": 4, "tasks": 4}
    assert "\x1b" not in "\n".join(compare_table({field: figures}))
