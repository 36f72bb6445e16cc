"""earlier.py: what earlier runs left in a resumed run's outputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollfilter.formats.resume import ResumeState
from rollfilter.run.earlier import Earlier, EarlierFiles


class _Left:
    """A resume state whose open groups' rollouts are these (as `leftover_earlier` gives them: a
    task's together, in rollout order)."""

    def __init__(self, results: list[dict[str, Any]]) -> None:
        self.results = results

    def leftover_earlier(self) -> list[dict[str, Any]]:
        return self.results


def result(task: Any, rollout: int, agent: str | None = None) -> dict[str, Any]:
    named = {"agent_ref": {"name": agent}} if agent is not None else {}
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 1.0, **named}


def test_the_rollouts_left_in_open_groups_come_back_by_group_each_its_agents_size():
    left = [result(0, 1), result(0, 5), result(0, 6), result({"k": 1}, 2, "b"), result({"k": 1}, 3, "b")]
    earlier = Earlier(_Left(left))  # type: ignore[arg-type]
    sizes = {None: 4, "b": 2}
    groups = earlier.left_open(sizes.__getitem__)
    assert [(task, first, [r["_ng_rollout_index"] for r in results]) for task, first, results in groups] == [
        (0, 0, [1]),
        (0, 4, [5, 6]),
        ({"k": 1}, 2, [2, 3]),
    ]


def test_a_dry_run_reads_what_resume_skips_and_nothing_else(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n{"_ng_task_index": 0')
    earlier = Earlier.skipped(EarlierFiles(str(out)), max_attempts=3, target_groups=None)
    assert isinstance(earlier.resume, ResumeState)
    assert (earlier.materialized, earlier.results, earlier.held) == (None, None, None)
    assert out.read_text().endswith('{"_ng_task_index": 0')  # its torn last line is left as it is
