"""groups.py: a task's rollouts gathered until the group ends, then kept or dropped whole."""

from __future__ import annotations

import json
from typing import Any

from rollfilter.engine.groups import ClosedGroup, Fate, GroupStage
from rollfilter.engine.plan import GroupPlan, Job
from rollfilter.errors import ErrorKind
from rollfilter.formats.writers import Release
from rollfilter.outcomes import AttemptFailure


class Sink:
    def __init__(self) -> None:
        self.closed: list[ClosedGroup] = []
        self.releases: list[Release] = []

    def group(self, closed: ClosedGroup, release: Release) -> None:
        self.closed.append(closed)
        self.releases.append(release)


def job(task: int, rollout: int, first: int = 0) -> Job:
    return Job(
        seq=0, source="-", line=task + 1, task_index=task, rollout_index=rollout, row={}, body=b"{}", group=first
    )


def result(task: int, rollout: int, reward: float) -> dict[str, Any]:
    return {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": reward}


class Counted(list[tuple[str, Any]]):
    """A tally that keeps what it was given to count: this run's results, and earlier runs'."""

    mask_unhealthy = False

    def result(self, job: Job, result: dict[str, Any], latency: float | None) -> None:
        self.append(("result", result["_ng_rollout_index"]))

    def earlier(self, result: dict[str, Any]) -> None:
        self.append(("earlier", result["_ng_rollout_index"]))


def stage(
    sink: Sink, *, on_disk: list[Release] | None = None, **options: Any
) -> tuple[GroupStage, Counted, list[bytes], list[str]]:
    """A stage whose held lines are written at once, or, given `on_disk`, whose lines' releases
    wait there until the test runs them (a held file not written yet)."""
    counted = Counted()
    held: list[bytes] = []
    reached: list[str] = []

    def hold(line: bytes, release: Release | None) -> None:
        held.append(line)
        if release is not None:
            release() if on_disk is None else on_disk.append(release)

    groups = GroupStage(sink, lambda: reached.append("target"), counted, hold=hold, **options)  # type: ignore[arg-type]
    return groups, counted, held, reached


def plan(task: int, rollouts: range, **earlier: Any) -> GroupPlan:
    fields = {"earlier": {}, "done": 0, "dropped": 0, "given_up": 0, **earlier}
    return GroupPlan(task, rollouts.start, tuple(rollouts), **fields)


def test_a_group_is_handed_on_whole_once_its_last_rollout_ends_and_only_its_last_slot_waits_for_it():
    sink = Sink()
    groups, counted, held, _ = stage(sink)
    groups.planned(plan(0, range(3)))
    released: list[int] = []
    for rollout in (2, 0):
        groups.result(job(0, rollout), result(0, rollout, 1.0), 0.1, lambda r=rollout: released.append(r))
    assert released == [2, 0]
    assert not sink.closed
    assert not counted
    groups.result(job(0, 1), result(0, 1, 0.0), 0.1, lambda: released.append(1))
    assert released == [2, 0]  # the closing rollout's slot waits for the sink
    (closed,) = sink.closed
    assert closed.fate is Fate.KEPT
    assert [member.result["_ng_rollout_index"] for member in closed.members] == [0, 1, 2]
    assert len(counted) == 3
    sink.releases[0]()
    assert released == [2, 0, 1]
    assert [json.loads(line)["_ng_rollout_index"] for line in held] == [2, 0, 1]  # each as it finished


def test_a_rollouts_slot_comes_back_once_its_line_is_in_the_held_file_not_before():
    # A result back but not yet on disk would be sent again after a kill -9, beside the rollouts
    # in flight: a resumed run would send more than -j again.
    sink, on_disk = Sink(), []
    groups, _, _, _ = stage(sink, on_disk=on_disk)
    groups.planned(plan(0, range(2)))
    released: list[int] = []
    groups.result(job(0, 0), result(0, 0, 1.0), 0.1, lambda: released.append(0))
    assert released == []
    on_disk.pop()()
    assert released == [0]
    groups.result(job(0, 1), result(0, 1, 0.0), 0.1, lambda: released.append(1))
    sink.releases[0]()  # the group written: the closing rollout's slot waits for its held line too
    assert released == [0]
    on_disk.pop()()
    assert released == [0, 1]


def test_uniform_groups_are_dropped_and_marked_in_the_held_file_and_failures_make_them_incomplete():
    sink = Sink()
    groups, counted, held, _ = stage(sink, drop_uniform=True)
    for task in (0, 1):
        groups.planned(plan(task, range(2)))
    for rollout in (0, 1):
        groups.result(job(0, rollout), result(0, rollout, 0.5), 0.1, lambda: None)
    groups.result(job(1, 0), result(1, 0, 1.0), 0.1, lambda: None)
    groups.failure(job(1, 1), AttemptFailure(ErrorKind.TIMEOUT, "no answer"))
    assert [closed.fate for closed in sink.closed] == [Fate.UNIFORM, Fate.INCOMPLETE]
    assert [len(closed.failures) for closed in sink.closed] == [0, 1]
    # One marker line a group: a kill leaves all of it or none.
    markers = [json.loads(line) for line in held if b"group_rollouts" in line]
    assert markers == [
        {"_ng_task_index": 0, "_ng_rollout_index": 0, "dropped_because": "uniform", "group_rollouts": [0, 1]},
        {"_ng_task_index": 1, "_ng_rollout_index": 0, "group_rollouts": [0, 1], "failed_rollouts": [1]},
    ]
    assert len(counted) == 3  # every finished rollout of a closed group: dropped ones are samples too
    assert groups.figures() == {"kept": 0, "dropped_uniform": 1, "dropped_masked": 0, "incomplete": 1, "cancelled": 0}


def test_the_target_stops_the_run_and_a_stop_cancels_open_groups_without_counting_them():
    sink = Sink()
    groups, counted, _, reached = stage(sink, target=2)
    groups.planned(GroupPlan(0, 0, (), {}, 2, 0, 0))  # an earlier run wrote it whole: it counts to the target
    for task in (1, 2, 3):
        groups.planned(plan(task, range(2)))
    groups.result(job(3, 0), result(3, 0, 1.0), 0.1, lambda: None)  # a fast rollout of a straggling group
    for rollout in (0, 1):
        groups.result(job(1, rollout), result(1, rollout, float(rollout)), 0.1, lambda: None)
    assert reached == ["target"]
    groups.result(job(2, 0), result(2, 0, 1.0), 0.1, lambda: None)
    released: list[str] = []
    groups.result(job(2, 1), result(2, 1, 0.0), 0.1, lambda: released.append("2"))  # whole, past the target
    assert released == ["2"]
    assert [closed.task_index for closed in sink.closed] == [1]
    groups.cancel_open()
    assert sorted(closed.task_index for closed in sink.closed if closed.fate is Fate.CANCELLED) == [2, 3]
    assert len(counted) == 2  # the kept group's two rollouts only
    figures = groups.figures()
    assert (figures["kept"], figures["cancelled"]) == (2, 2)
    assert "not the cancelled" in figures["figures_cover"]


def test_a_group_that_an_earlier_run_left_open_closes_with_what_it_held():
    sink = Sink()
    groups, counted, _, _ = stage(sink)
    groups.planned(GroupPlan(5, 4, (5,), {4: result(5, 4, 1.0)}, 0, 0, 0))  # rollouts 4 and 5, 4 held
    groups.result(job(5, 5, first=4), result(5, 5, 0.0), 0.1, lambda: None)
    (closed,) = sink.closed
    assert [member.job is None for member in closed.members] == [True, False]
    assert closed.fate is Fate.KEPT
    assert counted == [("earlier", 4), ("result", 5)]  # the held one counts as an earlier run's
    groups.planned(GroupPlan(6, 0, (), {}, 0, 0, 2))  # every rollout given up: incomplete at once
    assert sink.closed[-1].fate is Fate.INCOMPLETE


def test_numbers_are_compared_exactly_even_above_two_to_the_53():
    sink = Sink()
    groups, _, _, _ = stage(sink, drop_uniform=True)
    values = {0: [2**53 + 1, 2**53], 1: [2**53, 2.0**53], 2: [True, 1.0]}
    for task, pair in values.items():
        groups.planned(plan(task, range(2)))
        for rollout, value in enumerate(pair):
            groups.result(job(task, rollout), result(task, rollout, value), 0.1, lambda: None)
    assert [closed.fate for closed in sink.closed] == [Fate.KEPT, Fate.UNIFORM, Fate.UNIFORM]


def masked_result(task: int, rollout: int, reward: float) -> dict[str, Any]:
    return {**result(task, rollout, reward), "mask_sample": True}


def test_drop_uniform_decides_on_unmasked_members_and_drops_a_group_with_fewer_than_two():
    sink = Sink()
    groups, counted, held, _ = stage(sink, drop_uniform=True)
    for task in (0, 1, 2):
        groups.planned(plan(task, range(3)))
    # Task 0: uniform once its masked member is left out; task 1: one measured member; task 2: kept.
    members = {0: [1.0, 0.0, 1.0], 1: [1.0, 0.0, 0.5], 2: [1.0, 0.0, 0.0]}
    masks = {0: {1}, 1: {0, 2}, 2: {2}}
    for task, rewards in members.items():
        for rollout, value in enumerate(rewards):
            made = masked_result if rollout in masks[task] else result
            groups.result(job(task, rollout), made(task, rollout, value), 0.1, lambda: None)
    assert [closed.fate for closed in sink.closed] == [Fate.UNIFORM, Fate.MASKED, Fate.KEPT]
    markers = {(m["_ng_task_index"], m["dropped_because"]) for m in map(json.loads, held) if "dropped_because" in m}
    assert markers == {(0, "uniform"), (1, "masked")}
    assert len(counted) == 9
    figures = groups.figures()
    assert (figures["dropped_uniform"], figures["dropped_masked"], figures["kept"]) == (1, 1, 1)


def test_without_drop_uniform_a_group_of_masked_members_is_kept():
    sink = Sink()
    groups, _, _, _ = stage(sink)
    groups.planned(plan(0, range(2)))
    for rollout in (0, 1):
        groups.result(job(0, rollout), masked_result(0, rollout, 1.0), 0.1, lambda: None)
    assert [closed.fate for closed in sink.closed] == [Fate.KEPT]


def test_groups_earlier_runs_left_open_are_cancelled_and_handed_on_as_such():
    sink = Sink()
    groups, counted, _, _ = stage(sink)
    groups.cancel_earlier([(7, 0, [result(7, 0, 1.0), result(7, 1, 0.0)]), (8, 4, [result(8, 5, 1.0)])])
    assert [(closed.task_index, closed.first, closed.fate) for closed in sink.closed] == [
        (7, 0, Fate.CANCELLED),
        (8, 4, Fate.CANCELLED),
    ]
    assert [len(closed.members) for closed in sink.closed] == [2, 1]
    assert counted == []  # a cancelled group's rollouts are in no figure
    assert groups.figures()["cancelled"] == 2
