"""The threads that talk to the trackers, off the run's path: one a tracker, so that one that
hangs costs the others nothing.

A run hands its points to `TrackerLog.point`, which never waits: each queue is bounded, and a point
that finds one full is dropped there (the next one carries the same counts, a few seconds on). Each
tracker's client is made (imported) by `make`, which a run calls before it sends, or else in its
thread, where its tracker run is started; one that fails, at the start or later, is said once
and left alone, and the run goes on. `end` gives the threads the final figures and waits
a bounded time for them: a tracker that hangs costs the run that time, no more.
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
    """The trackers `openers` make (each imports its client, in its thread), fed from a run.

    `start` starts a thread for each tracker, which starts its run with `params` (continuing the
    one `ids` names for it) and hands the ids of those started so far to `on_ids`; one thread
    each, so that a tracker that hangs costs the others nothing. `names` name the trackers whose
    client could not even be made, by their keys. `point` queues live metrics, `end` the final
    figures. What went wrong is kept for `warnings`, to be said by the run's own thread."""

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
        self._queues: dict[str, queue.Queue[_Point | Final]] = {key: queue.Queue(QUEUED_POINTS) for key in openers}
        self._threads = [
            threading.Thread(target=self._serve, args=(key,), name=f"rollfilter-tracker-{key}", daemon=True)
            for key in openers
        ]
        self._said: list[str] = []
        self._lock = threading.Lock()  # for the warnings
        self._ids_lock = threading.Lock()
        self._started: list[str] = []  # the trackers whose run started, in that order
        self.dropped = 0
        self._made: dict[str, Tracker] | None = None  # the clients, once made

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def point(self, metrics: Mapping[str, float], step: int, versions: Mapping[int, float] | None = None) -> bool:
        """Queue live metrics at `step`, with policy versions' reward means (`versions`), for each
        tracker; dropped for one whose thread is behind. Whether every tracker's queue took it."""
        queued = True
        for waiting in self._queues.values():
            try:
                waiting.put_nowait(_Point(metrics, step, versions or {}))
            except queue.Full:
                queued = False
        if not queued:
            self.dropped += 1
        return queued

    def end(self, final: Final, *, wait_s: float) -> None:
        """Give each thread `final` and wait for them to log it, `wait_s` seconds at most in all; a
        tracker still busy then is said to have been left."""
        deadline = time.monotonic() + wait_s
        for waiting in self._queues.values():
            with contextlib.suppress(queue.Full):  # the thread is stuck: the join below says so
                waiting.put(final, timeout=max(0.0, deadline - time.monotonic()))
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in self._threads):
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
        Each thread makes its own otherwise. A client that cannot be made is said, and left out."""
        if self._made is not None:
            return
        self._made = {}
        for key in self._openers:
            tracker = self._make(key)
            if tracker is not None:
                self._made[key] = tracker

    def _make(self, key: str) -> Tracker | None:
        try:
            return self._openers[key]()
        except Exception as exc:  # a tracker never costs a result
            self._failed(self._names.get(key, key), "start its run", exc)
            return None

    def _serve(self, key: str) -> None:
        tracker = self._made.get(key) if self._made is not None else self._make(key)
        waiting = self._queues[key]
        if tracker is not None and not self._start(key, tracker):
            tracker = None
        while True:
            item = waiting.get()
            if tracker is not None:
                try:
                    if isinstance(item, Final):
                        tracker.end(item)
                    else:
                        tracker.log(item.metrics, item.step)
                        if item.versions:
                            tracker.log_versions(item.versions)
                except Exception as exc:
                    self._failed(tracker.name, "log", exc)
                    tracker = None
            if isinstance(item, Final):
                return

    def _start(self, key: str, tracker: Tracker) -> bool:
        """Start (or continue) `tracker`'s run, and keep the ids of those started so far."""
        try:
            run_id = tracker.start(self._params, self._ids.get(key))
        except Exception as exc:  # a tracker never costs a result
            self._failed(tracker.name, "start its run", exc)
            return False
        with self._ids_lock:  # one thread at a time keeps the ids, each with all those started
            self._ids[key] = run_id
            self._started.append(key)
            try:
                self._on_ids({started: self._ids[started] for started in self._started})
            except OSError as exc:
                self._failed("trackers", "keep their run ids", exc)
        return True
