"""outputs.py: where a run's outcomes go: results put back in input order, whole groups written."""

from __future__ import annotations

from rollfilter.run.outputs import GroupOutputs, LineSink, Reorderer


def test_reorderer_emits_in_sequence():
    out: list[int] = []
    reorderer = Reorderer()
    for seq in (2, 0, 3, 1, 5):
        reorderer.emit(seq, lambda s=seq: out.append(s))
    assert out == [0, 1, 2, 3]  # 5 is held behind the 4 that never came
    reorderer.flush()
    assert out == [0, 1, 2, 3, 5]


def test_a_kept_group_reaches_the_results_after_the_held_file_and_the_held_file_hears_how_far():
    import json

    from rollfilter.engine.groups import ClosedGroup, Fate, Member

    events: list[str] = []

    class Writer:
        def __init__(self, name: str) -> None:
            self.name = name
            self.lines: list[bytes] = []

        def write(self, line: bytes, release=None) -> None:  # written at once
            events.append(f"{self.name} write")
            self.lines.append(line)
            if release is not None:
                release()

        def flush_now(self) -> None:
            events.append(f"{self.name} flush")

    results, held, dropped = Writer("results"), Writer("held"), Writer("dropped")
    sink = LineSink(
        results,
        Writer("errors"),
        records=True,
        ordered=False,
        repeats=2,
        stderr_line=str.encode,
        groups=GroupOutputs(dropped=dropped, held=held, results_size=lambda: 123),
    )
    members = tuple(Member(None, {"_ng_task_index": 0, "_ng_rollout_index": k, "reward": k}, None) for k in (0, 1))
    released: list[str] = []
    sink.group(ClosedGroup(0, Fate.KEPT, members, ()), lambda: released.append("kept"))
    assert events == ["held flush", "results write", "held write"]
    assert [json.loads(line)["_ng_rollout_index"] for line in results.lines[0].splitlines()] == [0, 1]
    assert json.loads(held.lines[-1]) == {"written_through": 123, "kept": [0, 0]}  # the group, for a target
    sink.group(ClosedGroup(1, Fate.UNIFORM, members, ()), lambda: released.append("dropped"))
    assert {json.loads(line)["dropped_because"] for line in dropped.lines[0].splitlines()} == {"uniform"}
    assert released == ["kept", "dropped"]
