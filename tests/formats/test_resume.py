"""resume.py: what earlier runs left behind."""

from __future__ import annotations

import json

from rollfilter.errors import ErrorKind
from rollfilter.formats.resume import ResumeState, drop_torn_tail
from rollfilter.outcomes import TERMINAL_KINDS


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


def _jsonl(path, records) -> None:
    path.write_text("".join(json.dumps(record) + "\n" for record in records))


def _result(task: int, rollout: int, **fields: object) -> dict[str, object]:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 1.0, **fields}


def test_the_held_file_gives_back_open_groups_and_keeps_dropped_ones_from_running(tmp_path):
    out, held = tmp_path / "out.jsonl", tmp_path / "out.jsonl.held"
    _jsonl(out, [_result(0, 0), _result(0, 1)])
    size = out.stat().st_size
    _jsonl(held, [
        _result(0, 0), _result(0, 1),  # written whole
        {"written_through": size},
        _result(1, 0), _result(1, 1),  # dropped
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "dropped_because": "uniform"},
        {"_ng_task_index": 1, "_ng_rollout_index": 1, "dropped_because": "uniform"},
        _result(2, 1, reward=0.25),  # its group still open
    ])  # fmt: skip
    state = ResumeState.from_files(str(out), None, held=str(held))
    assert state.cut_bytes == 0
    assert [state.decide(0, k) for k in (0, 1)] == [ResumeState.DONE] * 2
    assert [state.decide(1, k) for k in (0, 1)] == [ResumeState.DROPPED] * 2
    assert [state.decide(2, k) for k in (0, 1)] == [0, ResumeState.EARLIER]
    assert state.take_earlier(2, 1)["reward"] == 0.25
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in state.dropped_results(str(held))] == [(1, 0), (1, 1)]


def test_results_past_the_held_files_mark_are_cut_only_when_the_held_file_has_them(tmp_path):
    out, held = tmp_path / "out.jsonl", tmp_path / "out.jsonl.held"
    _jsonl(out, [_result(0, 0), _result(0, 1)])
    whole = out.stat().st_size
    with out.open("a") as file:  # the first half of a group a kill cut in two
        file.write(json.dumps(_result(1, 0)) + "\n")
    _jsonl(held, [_result(0, 0), _result(0, 1), {"written_through": whole}, _result(1, 0)])
    state = ResumeState.from_files(str(out), None, held=str(held))
    assert state.cut_bytes == len(json.dumps(_result(1, 0))) + 1
    assert out.stat().st_size == whole
    assert state.decide(1, 0) == ResumeState.EARLIER

    # A line another program wrote past the mark (NeMo Gym's collector finishing the file) stands.
    with out.open("a") as file:
        file.write(json.dumps(_result(1, 0)) + "\n" + json.dumps(_result(7, 0)) + "\n")
    state = ResumeState.from_files(str(out), None, held=str(held))
    assert state.cut_bytes == 0
    assert (state.decide(1, 0), state.decide(7, 0)) == (ResumeState.DONE, ResumeState.DONE)


def _pairs(path) -> list[tuple[object, object, object]]:
    records = map(json.loads, path.read_text().splitlines())
    return [(r["_ng_task_index"], r["_ng_rollout_index"], r.get("dropped_because")) for r in records]


def test_the_dropped_file_is_made_again_from_the_held_file_each_uniform_rollout_once(tmp_path):
    """As two writers killed between them leave it: a uniform group's lines twice, another's not at
    all, and an open group's lines as cancelled, which the resumed run writes again when it closes it."""
    out, held, dropped = tmp_path / "out.jsonl", tmp_path / "out.jsonl.held", tmp_path / "dropped.jsonl"
    _jsonl(out, [])
    marker = {"_ng_rollout_index": 0, "dropped_because": "uniform", "group_rollouts": [0, 1]}
    uniform = [{"_ng_task_index": t, **marker} for t in (1, 2)]
    _jsonl(held, [_result(1, 1), _result(1, 0), uniform[0], _result(2, 0), _result(2, 1), uniform[1], _result(3, 0)])
    stamped = [{**_result(1, k), "dropped_because": "uniform"} for k in (0, 1)]
    foreign = {**_result(99, 0), "dropped_because": "uniform"}  # another run's (--append): it stands
    _jsonl(dropped, [foreign, *stamped, *stamped, {**_result(3, 0), "dropped_because": "cancelled"}])
    state = ResumeState.from_files(str(out), None, held=str(held))
    assert state.dropped_groups == 2
    state.rebuild_dropped(str(dropped), str(held))
    assert _pairs(dropped) == [
        (99, 0, "uniform"),
        (1, 0, "uniform"),
        (1, 1, "uniform"),
        (2, 0, "uniform"),
        (2, 1, "uniform"),
    ]
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in state.leftover_earlier()] == [(3, 0)]
    assert list(state.leftover_earlier()) == []  # given once


def test_a_group_written_incomplete_is_cut_off_to_be_written_whole_when_its_failed_rollout_runs_again(tmp_path):
    out, held, errors = tmp_path / "out.jsonl", tmp_path / "out.jsonl.held", tmp_path / "errors.jsonl"
    _jsonl(out, [_result(0, 0), _result(0, 1)])
    kept_end = out.stat().st_size
    with out.open("a") as file:  # task 1 written without its rollout 1, then task 2 whole
        file.write("".join(json.dumps(_result(t, k)) + "\n" for t, k in ((1, 0), (2, 0), (2, 1))))
    incomplete = {"_ng_task_index": 1, "_ng_rollout_index": 0, "group_rollouts": [0, 1], "failed_rollouts": [1]}
    _jsonl(held, [
        _result(0, 0), _result(0, 1), {"written_through": kept_end, "kept": [0, 0]},
        _result(1, 0), incomplete, {"written_through": kept_end + 100},
        _result(2, 0), _result(2, 1), {"written_through": out.stat().st_size, "kept": [2, 0]},
    ])  # fmt: skip
    failure = {"_ng_task_index": 1, "_ng_rollout_index": 1, "error": {"kind": "http_status"}}
    _jsonl(errors, [failure])
    state = ResumeState.from_files(str(out), str(errors), held=str(held))
    assert (state.reopened, out.stat().st_size, state.kept_groups) == (1, kept_end, 1)
    assert [state.decide(1, k) for k in (0, 1)] == [ResumeState.EARLIER, 1]  # taken back, and run again
    assert [state.decide(2, k) for k in (0, 1)] == [ResumeState.EARLIER] * 2  # written again after it
    assert state.counted_kept(0, 0)
    assert not state.counted_kept(2, 0)
    assert json.loads(held.read_bytes().splitlines()[-1]) == {"written_through": kept_end}  # before the cut

    # Its failed rollout out of attempts: the group stands as written, and nothing is cut.
    _jsonl(out, [_result(0, 0), _result(0, 1), _result(1, 0), _result(2, 0), _result(2, 1)])
    _jsonl(held, [_result(0, 0), _result(0, 1), _result(1, 0), incomplete, _result(2, 0), _result(2, 1),
                  {"written_through": out.stat().st_size}])  # fmt: skip
    _jsonl(errors, [failure] * 3)
    state = ResumeState.from_files(str(out), str(errors), held=str(held))
    assert (state.reopened, state.cut_bytes) == (0, 0)
    assert [state.decide(1, k) for k in (0, 1)] == [ResumeState.DONE, ResumeState.GIVE_UP]


def test_a_result_with_fields_named_like_a_markers_is_still_a_result(tmp_path):
    out, held = tmp_path / "out.jsonl", tmp_path / "out.jsonl.held"
    _jsonl(out, [])
    _jsonl(held, [_result(0, 0, failed=True, failed_rollouts=2, group_rollouts=[0], kept=[0, 0])])
    state = ResumeState.from_files(str(out), None, held=str(held))
    assert state.decide(0, 0) == ResumeState.EARLIER
