"""The thread that talks to the trackers, off the run's path.

A run hands its points to `TrackerLog.point`, which never waits: the queue is bounded, and a point
that finds it full is dropped (the next one carries the same counts, a few seconds on). Each
tracker's client is made (imported) by `make`, which a run calls before it sends, or else in the
thread, where each tracker run is started; one that fails, at the start or later, is said once
and left alone, and the run goes on. `end` gives the thread the final figures and waits
a bounded time for it: a tracker that hangs costs the run that time, no more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from rollfilter.redact import printable

# Each policy version's reward mean, at step = the version.
VERSION_METRIC = "policy/reward_mean"
# Live points waiting for the thread: a few, since each carries the whole of the counts so far.
QUEUED_POINTS = 8


class Tracker(Protocol):
    """One tracker's run: started (or continued, given its id), fed points, ended."""

    name: str  # as a person reads it: "MLflow"

    def start(self, params: Mapping[str, str], run_id: str | None) -> str:
        """Start a tracker run with `params`, or continue run `run_id`; its id."""
        ...

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_versions(self, means: Mapping[int, float]) -> None:
        """Each policy version's reward mean, at step = the version."""
        ...

    def end(self, final: Final) -> None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Final:
    """What a tracker run gets at the end: every figure of the summary (`metrics`, at `step`), the
    summary itself (`summary`, JSON), the sampled result lines (`rollouts`, JSON lines), and how
    the run ended (`status`: FINISHED, KILLED or FAILED), and each policy version's reward mean
    (`versions`)."""

    metrics: Mapping[str, float]
    step: int
    summary: bytes
    rollouts: tuple[bytes, ...]
    status: str
    versions: Mapping[int, float] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class _Point:
    metrics: Mapping[str, float]
    step: int
    versions: Mapping[int, float]


class TrackerLog:
    """The trackers `openers` make (each imports its client, in the thread), fed from a run.

    `start` starts the thread, which starts each tracker's run with `params` (continuing the one
    `ids` names for it) and hands the ids to `on_ids`; `names` name the trackers whose client
    could not even be made, by their keys. `point` queues live metrics, `end` the
    final figures. What went wrong is kept for `warnings`, to be said by the run's own thread."""

    def __init__(
        self,
        openers: Mapping[str, Callable[[], Tracker]],
        params: Mapping[str, str],
        ids: Mapping[str, str],
        on_ids: Callable[[dict[str, str]], None],
        *,
        hidden: tuple[str, ...] = (),
        names: Mapping[str, str] | None = None,
    ) -> None:
        self._openers, self._params, self._ids, self._on_ids = openers, params, dict(ids), on_ids
        self._hidden = hidden  # text never said in a warning (a URL's credentials), longest first
        self._names = names or {}  # a tracker's name by its key, for one that failed before it was made
        self._queue: queue.Queue[_Point | Final] = queue.Queue(QUEUED_POINTS)
        self._thread = threading.Thread(target=self._serve, name="rollfilter-trackers", daemon=True)
        self._said: list[str] = []
        self._lock = threading.Lock()
        self.dropped = 0
        self._made: dict[str, Tracker] | None = None  # the clients, once made

    def start(self) -> None:
        self._thread.start()

    def point(self, metrics: Mapping[str, float], step: int, versions: Mapping[int, float] | None = None) -> bool:
        """Queue live metrics at `step`, with policy versions' reward means (`versions`); dropped
        when the thread is behind. Whether it was queued."""
        try:
            self._queue.put_nowait(_Point(metrics, step, versions or {}))
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def end(self, final: Final, *, wait_s: float) -> None:
        """Give the thread `final` and wait for it to log it, `wait_s` seconds at most; a tracker
        still busy then is said to have been left."""
        deadline = time.monotonic() + wait_s  # for the two waits together
        with contextlib.suppress(queue.Full):  # the thread is stuck: the join below says so
            self._queue.put(final, timeout=wait_s)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._warn(f"trackers: not done logging after {wait_s:g} s; left as they are")

    def warnings(self) -> list[str]:
        """What went wrong since last asked, each said once."""
        with self._lock:
            said, self._said = self._said, []
        return said

    def _warn(self, text: str) -> None:
        with self._lock:
            self._said.append(text)

    def _failed(self, name: str, doing: str, exc: BaseException) -> None:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        for secret in self._hidden:  # before the cut, which could leave a secret's start
            detail = detail.replace(secret, "...")
        detail = detail[:300]
        text = f"{type(exc).__name__}: {printable(detail)}" if detail else type(exc).__name__
        self._warn(f"{name}: cannot {doing} ({text}); the run goes on without it")

    def make(self) -> None:
        """Make each tracker's client (importing it), once: blocking, so that a caller may do it
        before its run is busy (a thread contending with the run for the interpreter costs both).
        `start` does it in the thread otherwise. A client that cannot be made is said, and left out."""
        if self._made is not None:
            return
        self._made = {}
        for key, opener in self._openers.items():
            try:
                self._made[key] = opener()
            except Exception as exc:  # a tracker never costs a result
                self._failed(self._names.get(key, key), "start its run", exc)

    def _serve(self) -> None:
        self.make()
        assert self._made is not None
        trackers: dict[str, Tracker] = {}
        for key, tracker in self._made.items():
            try:
                self._ids[key] = tracker.start(self._params, self._ids.get(key))
                trackers[key] = tracker
            except Exception as exc:  # a tracker never costs a result
                self._failed(tracker.name, "start its run", exc)
        if trackers:
            try:
                self._on_ids({key: self._ids[key] for key in trackers})
            except OSError as exc:
                self._failed("trackers", "keep their run ids", exc)
        while True:
            item = self._queue.get()
            for key, tracker in list(trackers.items()):
                try:
                    if isinstance(item, Final):
                        tracker.end(item)
                    else:
                        tracker.log(item.metrics, item.step)
                        if item.versions:
                            tracker.log_versions(item.versions)
                except Exception as exc:
                    self._failed(tracker.name, "log", exc)
                    del trackers[key]
            if isinstance(item, Final):
                return
