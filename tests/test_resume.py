"""resume.py: what earlier runs left behind."""

from __future__ import annotations

import json

from rollfilter.errors import ErrorKind
from rollfilter.outcomes import TERMINAL_KINDS
from rollfilter.resume import ResumeState, drop_torn_tail


def test_resume_index_and_torn_tail(tmp_path):
    path = tmp_path / "out.jsonl"
    lines = [json.dumps({"_ng_task_index": t, "_ng_rollout_index": k}) for t in (0, 5, 9) for k in (0, 1)]
    path.write_text("\n".join(lines) + "\n" + '{"_ng_task_index": 7, "_ng_rol')
    assert drop_torn_tail(str(path)) == len('{"_ng_task_index": 7, "_ng_rol')
    state = ResumeState.from_files(str(path), None)
    assert state.done_pairs == 6
    assert state.decide(5, 1) == ResumeState.DONE
    assert state.decide(7, 0) == 0  # the torn line's pair runs again
    assert state.decide(9, 2) == 0
    state.add_done("odd-index", 0)
    assert state.decide("odd-index", 0) == ResumeState.DONE
    assert state.decide("odd-index", 1) == 0


def test_a_failure_of_a_terminal_kind_is_not_run_again_though_its_record_has_no_flag(tmp_path):
    kinds: list[object] = [*ErrorKind, ["bad_input"], {"kind": "bad_input"}, None, 5]
    failures = tmp_path / "failures.jsonl"
    failures.write_text(
        "".join(json.dumps({"_ng_task_index": task, "_ng_rollout_index": 0, "error": {"kind": kind}}) + "\n"
                for task, kind in enumerate(kinds))
    )  # fmt: skip
    state = ResumeState.from_files(str(tmp_path / "missing.jsonl"), str(failures))
    decided = {task: state.decide(task, 0) for task in range(len(kinds))}
    assert decided == {
        task: ResumeState.GIVE_UP if isinstance(kind, ErrorKind) and kind in TERMINAL_KINDS else 1
        for task, kind in enumerate(kinds)
    }
