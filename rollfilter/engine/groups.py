"""A task's rollouts as one group: gathered until every one has ended, then kept or dropped whole.

GRPO-style training takes a task's K rollouts together, and a group whose rewards are all equal
gives it no gradient. With `Config.groups`, the engine hands each finished rollout here instead
of to its sink: `GroupStage` holds a group's results until its last rollout ends, then decides
its fate (`Fate`): kept (written, adjacent, in rollout order), dropped as uniform (with
`drop_uniform`, every member's `group_field` the same), dropped as masked (with `drop_uniform`,
fewer than two members that are valid measurements: a result with `mask_sample: true` decides
nothing), incomplete (a member failed after its retries, or could not be run), or cancelled (the
run stopped first: `target_groups` reached, a signal). Only the members of groups that closed
count in the run's figures: a cancelled group's fast members are left out, so that cutting
stragglers does not favour fast answers.

With `in_order` (a staleness bound asks for it), closed groups are handed out in the order they
were planned: a group that closed early waits for those before it, so that a trainer counting the
groups it takes cannot run ahead of a slow one by more than the bound.

A group's results are in memory only while it is open, at most one group per rollout in flight.
Each member's slot is given back as soon as its result is kept (in the held file, or without
one in memory), but the one that closes the group, whose
slot comes back once the group is written (or, from the Python API, taken): that keeps what is
written or handed out behind a slow reader bounded, and never waits on a slot a group holds.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from rollfilter.config import Config
from rollfilter.engine.plan import GroupPlan, Job
from rollfilter.engine.tally import Tally
from rollfilter.formats.resume import DROPPED_BECAUSE, FAILED, ROLLOUTS, ResumeState
from rollfilter.formats.writers import Release
from rollfilter.outcomes import AttemptFailure
from rollfilter.rows import ROLLOUT_INDEX, TASK_INDEX, encode_json, field_value, is_masked
from rollfilter.stops import StopCause, StopControl


class Fate(enum.StrEnum):
    """What became of a group."""

    KEPT = "kept"
    UNIFORM = "uniform"  # dropped: every unmasked member's group field the same
    MASKED = "masked"  # dropped: fewer than two members are valid measurements (mask_sample)
    INCOMPLETE = "incomplete"  # a member failed, was not persisted, or could not be run
    CANCELLED = "cancelled"  # the run stopped before every member ended


@dataclasses.dataclass(slots=True)
class Member:
    """A finished rollout of a group: its job (None: one an earlier run finished), result, latency."""

    job: Job | None
    result: dict[str, Any]
    latency: float | None


@dataclasses.dataclass(frozen=True, slots=True)
class ClosedGroup:
    """A group at its end: its fate, and its finished members in rollout order."""

    task_index: Any
    fate: Fate
    members: tuple[Member, ...]
    failures: tuple[tuple[Job, AttemptFailure], ...]
    first: int = 0  # its first rollout index: with the task, the group's key


def trained_on(fate: Fate, *, keep_incomplete: bool) -> bool:
    """Whether a group of this fate is handed out to train on: kept, or incomplete with keep_incomplete."""
    return fate is Fate.KEPT or (fate is Fate.INCOMPLETE and keep_incomplete)


class GroupSink(Protocol):
    """Where closed groups go: `release` (of the member that closed it) runs once it is written."""

    def group(self, closed: ClosedGroup, release: Release) -> None: ...


@dataclasses.dataclass(slots=True, eq=False)
class _Open:
    task_index: Any
    first: int
    size: int
    waiting: set[int]
    members: dict[int, Member]
    failures: list[tuple[Job, AttemptFailure]]
    broken: bool  # a member can never end well: the group is incomplete
    number: int = 0  # in the order groups were planned


def _after_both(release: Release) -> tuple[Release, Release]:
    """Two callables; `release` runs once both have run."""
    left = [2]

    def one() -> None:
        left[0] -= 1
        if not left[0]:
            release()

    return one, one


class GroupStage:
    """Holds groups from the first rollout planned to the last ended (see the module docstring).

    `tally` counts the members of a group once it has closed (one an earlier run finished, as an
    earlier result); `hold(line, release)` keeps a finished member's result line (or the marker of
    a group dropped as uniform or closed incomplete) on disk, for a resumed run, and runs
    `release` (when given) once it is there; `on_close(closed)` hears of each group as it closes,
    before it is handed out; `reached()` is called once `target` groups are kept, earlier runs'
    included: `kept_before`, `dropped_before` and `masked_before` are the groups earlier runs kept,
    dropped as uniform and dropped as masked, as their held file counts them (so a target they met
    is met before anything is sent).

    With `hold`, a member's slot comes back only once its line is on disk (the member that closes
    its group: once the group is written, too). A result that has come back but is not on disk
    yet would be sent again after a kill -9, beside the rollouts in flight: so a resumed run sends
    again at most the rollouts that were in flight, which the concurrency bounds.
    """

    def __init__(
        self,
        sink: GroupSink,
        reached: Callable[[], None],
        tally: Tally,
        *,
        field: str = "reward",
        drop_uniform: bool = False,
        target: int | None = None,
        hold: Callable[[bytes, Release | None], None] | None = None,
        kept_before: int = 0,
        dropped_before: int = 0,
        masked_before: int = 0,
        in_order: bool = False,
        on_close: Callable[[ClosedGroup], None] | None = None,
    ) -> None:
        self._sink = sink
        self._on_close = on_close
        self._reached = reached
        self._tally = tally
        self._field = field
        self._drop_uniform = drop_uniform
        self._target = target
        self._hold = hold
        self._open: dict[tuple[Any, int], _Open] = {}
        self.fates: dict[Fate, int] = dict.fromkeys(Fate, 0)
        self.kept_earlier = kept_before  # groups an earlier run wrote whole
        self.dropped_earlier = dropped_before  # groups an earlier run dropped as uniform
        self.masked_earlier = masked_before  # groups an earlier run dropped as masked
        self.target_reached = False
        self._in_order = in_order
        self._planned = 0  # groups numbered so far
        self._next_out = 0  # with in_order, the number of the next group to hand out
        self._ready: dict[int, tuple[ClosedGroup, Release]] = {}  # closed, waiting for their turn
        self.results_open = 0  # this run's results in groups still open: not counted yet

    @classmethod
    def for_run(
        cls,
        config: Config,
        sink: GroupSink,
        tally: Tally,
        control: StopControl,
        *,
        resume: ResumeState | None = None,
        hold: Callable[[bytes, Release | None], None] | None = None,
        on_close: Callable[[ClosedGroup], None] | None = None,
    ) -> GroupStage:
        """The groups of a run of `config` (`Config.groups`), with those earlier runs kept or
        dropped (`resume`): reaching the target stops the run (`control`); a target earlier runs
        met stops it before anything is sent (`target_reached`)."""
        settings = config.groups
        assert settings is not None, "a run of groups"
        reason = f"stopped once {settings.target} groups were kept (the target)"
        groups = cls(
            sink,
            functools.partial(control.stop, StopCause.TARGET_REACHED, reason),
            tally,
            field=settings.field,
            drop_uniform=settings.drop_uniform,
            target=settings.target,
            hold=hold,
            kept_before=resume.kept_groups if resume is not None else 0,
            dropped_before=resume.dropped_groups if resume is not None else 0,
            masked_before=resume.masked_groups if resume is not None else 0,
            in_order=settings.max_staleness is not None,
            on_close=on_close,
        )
        groups.start()
        return groups

    def start(self) -> None:
        """Before anything is sent: calls `reached()` if earlier runs met the target."""
        self._check_target()

    def planned(self, plan: GroupPlan) -> None:
        """A line's rollouts are planned: open their group (or close it now, when nothing of it is sent)."""
        if not plan.sent and not plan.earlier and not plan.given_up:
            if plan.done and not plan.counted:  # one the held file did not count (kept_before)
                self.kept_earlier += 1
                self._check_target()
            return  # a dropped group's is counted in dropped_before or masked_before
        members = {rollout: Member(None, result, None) for rollout, result in plan.earlier.items()}
        size = len(plan.sent) + len(plan.earlier) + plan.done + plan.dropped + plan.given_up
        group = _Open(plan.task_index, plan.first, size, set(plan.sent), members, [], plan.given_up > 0, self._planned)
        self._planned += 1
        if group.waiting:
            self._open[group_key(plan.task_index, plan.first)] = group
        else:
            self._close(group, None)

    def result(self, job: Job, result: dict[str, Any], latency: float, release: Release) -> None:
        """A member finished with `result`."""
        group = self._open[group_key(job.task_index, job.group)]
        group.members[job.rollout_index] = Member(job, result, latency)
        self.results_open += 1
        if self._hold is not None:
            on_disk, release = _after_both(release)
            self._hold(encode_json(result) + b"\n", on_disk)
        self._ended(job, group, release)

    def failure(self, job: Job, failure: AttemptFailure) -> None:
        """A member failed (after its retries), or was not persisted: its group is incomplete."""
        group = self._open[group_key(job.task_index, job.group)]
        group.broken = True
        group.failures.append((job, failure))
        self._ended(job, group, None)

    def _ended(self, job: Job, group: _Open, release: Release | None) -> None:
        group.waiting.discard(job.rollout_index)
        if group.waiting or self.target_reached:  # past the target, a group is cancelled with the rest
            if release is not None:
                release()
            return
        del self._open[group_key(job.task_index, job.group)]
        self._close(group, release)

    def _close(self, group: _Open, release: Release | None) -> None:
        members = tuple(group.members[rollout] for rollout in sorted(group.members))
        fate = Fate.INCOMPLETE if group.broken else self._decide(members)
        self.fates[fate] += 1
        tally = self._tally
        for member in members:
            if member.job is None:
                tally.earlier(member.result)
            else:
                tally.result(member.job, member.result, member.latency)
                self.results_open -= 1
        if self._hold is not None:
            self._hold_marker(group, fate, members)
        closed = ClosedGroup(group.task_index, fate, members, tuple(group.failures), group.first)
        if self._on_close is not None:
            self._on_close(closed)
        self._hand_out(group.number, closed, release)
        if fate is Fate.KEPT:
            self._check_target()

    def _decide(self, members: tuple[Member, ...]) -> Fate:
        """A whole group's fate: with drop_uniform, decided on its members that are valid measurements."""
        if not self._drop_uniform:
            return Fate.KEPT
        unhealthy = self._tally.mask_unhealthy
        measured = tuple(member for member in members if not is_masked(member.result, unhealthy=unhealthy))
        if len(measured) < 2:
            return Fate.MASKED
        return Fate.UNIFORM if _uniform(measured, self._field) else Fate.KEPT

    def _hold_marker(self, group: _Open, fate: Fate, members: tuple[Member, ...]) -> None:
        """A dropped group's marker (uniform or masked), so that a resumed run sends it no more; an
        incomplete one's, so that a resumed run that runs its failed rollouts again writes it
        again, whole. One line a group: a kill leaves all of it or none."""
        marker: dict[str, Any] = {TASK_INDEX: group.task_index, ROLLOUT_INDEX: group.first}
        if fate in (Fate.UNIFORM, Fate.MASKED):
            rollouts = [member.result[ROLLOUT_INDEX] for member in members]
            marker.update({DROPPED_BECAUSE: fate.value, ROLLOUTS: rollouts})
        elif fate is Fate.INCOMPLETE and group.failures:
            marker[ROLLOUTS] = list(range(group.first, group.first + group.size))
            marker[FAILED] = sorted(job.rollout_index for job, _ in group.failures)
        else:
            return
        assert self._hold is not None
        self._hold(encode_json(marker) + b"\n", None)

    def _hand_out(self, number: int, closed: ClosedGroup, release: Release | None) -> None:
        """To the sink; with `in_order`, once every group planned before it has gone."""
        if not self._in_order:
            self._sink.group(closed, release or _nothing)
            return
        self._ready[number] = (closed, release or _nothing)
        while self._next_out in self._ready:
            self._sink.group(*self._ready.pop(self._next_out))
            self._next_out += 1

    def _check_target(self) -> None:
        if self._target is not None and self.fates[Fate.KEPT] + self.kept_earlier >= self._target:
            self.target_reached = True
            self._reached()

    def cancel_open(self) -> None:
        """The run stopped: the closed groups still waiting for their turn go out, and every group
        still open is cancelled, its members left out of the figures."""
        for number in sorted(self._ready):
            self._sink.group(*self._ready.pop(number))
        for group in self._open.values():
            members = tuple(group.members[rollout] for rollout in sorted(group.members))
            self.fates[Fate.CANCELLED] += 1
            closed = ClosedGroup(group.task_index, Fate.CANCELLED, members, tuple(group.failures), group.first)
            self._sink.group(closed, _nothing)
        self._open.clear()
        self.results_open = 0

    def cancel_earlier(self, groups: Iterable[tuple[Any, int, list[dict[str, Any]]]]) -> None:
        """Groups earlier runs left open, that this run stopped before it read (each its task, its
        first rollout index and its finished rollouts): cancelled, and handed to the sink as such."""
        for task_index, first, results in groups:
            self.fates[Fate.CANCELLED] += 1
            members = tuple(Member(None, result, None) for result in results)
            self._sink.group(ClosedGroup(task_index, Fate.CANCELLED, members, (), first), _nothing)

    def figures(self) -> dict[str, Any]:
        """The summary's `groups`: how many of each fate (kept ones an earlier run wrote included)."""
        figures: dict[str, Any] = {
            "kept": self.fates[Fate.KEPT] + self.kept_earlier,
            "dropped_uniform": self.fates[Fate.UNIFORM] + self.dropped_earlier,
            "dropped_masked": self.fates[Fate.MASKED] + self.masked_earlier,
            "incomplete": self.fates[Fate.INCOMPLETE],
            "cancelled": self.fates[Fate.CANCELLED],
        }
        if self.fates[Fate.CANCELLED]:
            figures["figures_cover"] = "the kept, dropped and incomplete groups: not the cancelled ones"
        return figures


def group_key(task_index: Any, first: int) -> tuple[Any, int]:
    """A group's key, hashable whatever its task index is: the task, and its first rollout index."""
    return (task_index if type(task_index) in (int, str) else encode_json(task_index), first)


def _uniform(members: tuple[Member, ...], field: str) -> bool:
    """Whether every member's `field` (a name, or a dotted path) is the same number (the engine
    refused unmasked results without it).

    Compared as they are: Python compares an int with a float exactly (and True with 1), where
    turning integers to floats would make two above 2**53 the same."""
    values = {field_value(member.result, field) for member in members}
    return len(values) == 1


def _nothing() -> None:
    pass
