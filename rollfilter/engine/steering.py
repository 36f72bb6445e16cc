"""Steering a run while it runs: pause and drain, the policy version, and bounded staleness.

A long collection for asynchronous RL is steered by its trainer: held still while new weights
are loaded (`pause`, `drain`), told which weights the agents now serve (`set_policy_version`), and
kept from running ahead of the trainer (`StalenessGate`). The rest of what can be changed live
(the concurrency, the rate limits) belongs to the parts that enforce it: `Run` changes them there.

The pause is checked where a request is about to leave (`AgentClient`), after every wait an
attempt makes, so that once `pause()` has returned no new `/run` request starts; what is out goes
on, and its outcome still comes. A plain run pays one attribute read an attempt for this.

Bounded staleness paces, it never discards. With `max_staleness` K and `batch_groups` B, groups
are numbered from 0 in the order they are admitted, and group i is sent only once the policy
version v satisfies i < (v - v0 + K + 1) x B. Groups finish in any order, so the run hands them
out in the order they were admitted (`GroupStage`'s `in_order`): a trainer that takes B groups a
step and then sets the next version has taken at most i groups before group i, so its version is
at most v0 + i // B, while group i was sent under a version of at least v0 + i // B - K. Rows of a
group not yet admitted wait, holding their slot of the concurrency, until the version lets them go.

A group that ends without being handed out to train on (dropped as uniform, or incomplete) is
never taken by the trainer, so it gives its place back: the groups after it move up one, and the
bound above holds for the groups the trainer does take. Were it counted, a trainer waiting for B
groups would wait for ever once more than K x B groups had failed, and so would the run.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import trio

from rollfilter.config import MAX_POLICY_VERSION, Config
from rollfilter.engine.groups import ClosedGroup, group_key, trained_on
from rollfilter.engine.plan import Job
from rollfilter.errors import SteeringError
from rollfilter.rows import POLICY_VERSION


class Steering:
    """A run's pause, its drain, and its policy version.

    `requests_out()` counts the requests at the agents now (the run sets it once its router is
    built); `attempt_ended()` is called by the client after each attempt while the run is
    paused, so that a drain learns when the last one is back.
    """

    def __init__(self, policy_version: int | None = None) -> None:
        self.paused = False
        self.version = policy_version
        self.requests_out: Callable[[], int] = lambda: 0
        self._unpaused = trio.Event()
        self._on_quiet: list[Callable[[bool], None]] = []
        self._on_version: list[Callable[[], None]] = []

    def pause(self) -> None:
        """No new request leaves from now on; those out go on."""
        self.paused = True

    def resume(self) -> None:
        """Requests leave again (those waiting on the pause first); a drain waiting ends, not drained."""
        if self.paused:
            self.paused = False
            unpaused, self._unpaused = self._unpaused, trio.Event()
            unpaused.set()
            waiting, self._on_quiet = self._on_quiet, []
            for callback in waiting:
                callback(False)

    async def wait_unpaused(self) -> None:
        """Return once the run is not paused (at once if it is not)."""
        while self.paused:
            await self._unpaused.wait()

    def when_quiet(self, callback: Callable[[bool], None]) -> None:
        """Call `callback(True)` once no request is out while paused (now, if none is), or
        `callback(False)` if the run is resumed first: what a drain waits for is gone then."""
        if self.requests_out() == 0:
            callback(True)
        else:
            self._on_quiet.append(callback)

    def forget_quiet(self, callback: Callable[[bool], None]) -> None:
        """A waiter that gave up: `callback` is not called."""
        if callback in self._on_quiet:
            self._on_quiet.remove(callback)

    def attempt_ended(self) -> None:
        if self._on_quiet and self.requests_out() == 0:
            waiting, self._on_quiet = self._on_quiet, []
            for callback in waiting:
                callback(True)

    # A drain that runs out of time is an answer (some requests are still out), not an error: it
    # returns False rather than raise as trio.fail_after would.
    async def drain(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109
        """Pause, then wait until no request is out, for at most `timeout` seconds (None: as long
        as it takes). Whether none is out; the run stays paused either way, unless `resume()`
        is called meanwhile, which ends the drain at once, not drained."""
        self.pause()
        ended = trio.Event()
        drained = False

        def on_quiet(quiet: bool) -> None:
            nonlocal drained
            drained = quiet
            ended.set()

        self.when_quiet(on_quiet)
        with trio.move_on_after(math.inf if timeout is None else timeout):
            await ended.wait()
        self.forget_quiet(on_quiet)
        return drained

    def set_version(self, version: int) -> None:
        """The weights the agents serve from now on: a whole number, never lower than the last."""
        if self.version is None:
            raise SteeringError("the run carries no policy version: give the first one when it starts")
        if type(version) is not int:
            raise SteeringError(f"a policy version is a whole number, not {version!r}")
        if abs(version) > MAX_POLICY_VERSION:
            raise SteeringError(f"a policy version is at most {MAX_POLICY_VERSION} (2**53), not {version}")
        if version < self.version:
            raise SteeringError(f"the policy version cannot go back from {self.version} to {version}")
        self.version = version
        for callback in self._on_version:
            callback()

    def on_version(self, callback: Callable[[], None]) -> None:
        """Call `callback` each time the version is set."""
        self._on_version.append(callback)

    def stamp(self, result: dict[str, Any], sent: int | None) -> None:
        """Mark `result` with the version its request was sent under and the one it ended under."""
        result[POLICY_VERSION] = {"sent": sent, "ended": self.version}


class StalenessGate:
    """Admits groups by the policy version (see the module docstring): group i is sent once
    i < (v - v0 + K + 1) x B.

    The engine asks `admits_now(job)` for each job as soon as it has taken it, in the order the
    planner gives them, so that the groups are numbered in that order (a group's jobs come
    together); a job whose group is not admitted waits in `admit(job)`.
    """

    def __init__(
        self, steering: Steering, max_staleness: int, batch_groups: int, *, keep_incomplete: bool = False
    ) -> None:
        assert steering.version is not None, "a staleness bound needs a policy version"
        self._steering = steering
        self._keep_incomplete = keep_incomplete  # incomplete groups are handed out to train on too
        self._first_version = steering.version
        self._max_staleness = max_staleness
        self._batch_groups = batch_groups
        self._last_group: tuple[Any, int] | None = None
        self._groups_seen = 0  # groups numbered so far, admitted or waiting
        self._numbered: set[tuple[Any, int]] = set()  # the groups numbered that have not closed
        self._passed_over = 0  # groups that closed without being handed out to train on
        self._waiting: Counter[int] = Counter()  # rows waiting, by their group's number
        self._moved = trio.Event()
        steering.on_version(self._allowance_raised)

    @classmethod
    def for_config(cls, steering: Steering, config: Config) -> StalenessGate | None:
        """The gate `config` asks for (`Config.groups.max_staleness`, `Config.groups.batch`), or None."""
        groups = config.groups
        if groups is None or groups.max_staleness is None or groups.batch is None:
            return None
        return cls(steering, groups.max_staleness, groups.batch, keep_incomplete=groups.keep_incomplete)

    def groups_allowed(self) -> int:
        """How many groups may be sent under the current version."""
        version = self._steering.version
        assert version is not None
        admitted = (version - self._first_version + self._max_staleness + 1) * self._batch_groups
        return admitted + self._passed_over

    def _number(self, job: Job) -> int:
        key = group_key(job.task_index, job.group)
        if self._last_group is None or key != self._last_group:
            self._last_group = key
            self._numbered.add(key)
            self._groups_seen += 1
        return self._groups_seen - 1

    def group_closed(self, closed: ClosedGroup) -> None:
        """A group has closed: one this gate numbered that is not handed out to train on (see
        `groups.trained_on`) gives its place to the next group (see the module docstring)."""
        key = group_key(closed.task_index, closed.first)
        if key not in self._numbered:  # nothing of it was sent this run (a bad line, a resumed group)
            return
        self._numbered.remove(key)
        if not trained_on(closed.fate, keep_incomplete=self._keep_incomplete):
            self._passed_over += 1
            self._allowance_raised()

    def admits_now(self, job: Job) -> int | None:
        """None if `job`'s group may be sent now, else its group's number (for `admit`)."""
        number = self._number(job)
        return None if number < self.groups_allowed() else number

    async def admit(self, number: int) -> None:
        """Wait until group `number` may be sent."""
        self._waiting[number] += 1
        try:
            while number >= self.groups_allowed():
                await self._moved.wait()
        finally:
            self._waiting[number] -= 1
            if not self._waiting[number]:
                del self._waiting[number]

    @property
    def groups_admitted(self) -> int:
        return min(self._groups_seen, self.groups_allowed())

    @property
    def waiting_on_policy_version(self) -> int:
        return sum(self._waiting.values())

    @property
    def groups_waiting_on_policy_version(self) -> int:
        return len(self._waiting)

    def _allowance_raised(self) -> None:
        moved, self._moved = self._moved, trio.Event()
        moved.set()
