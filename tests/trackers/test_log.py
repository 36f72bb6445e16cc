"""trackers/log.py: the trackers' thread, off the run's path; a tracker never costs a result."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from rollfilter.trackers.log import QUEUED_POINTS, Final, TrackerLog

FINAL = Final(metrics={"reward": 0.5}, step=4, summary=b"{}", rollouts=(b"{}\n",), status="FINISHED")


class Recording:
    """A tracker that keeps what it is given; `hold` makes each log wait until it is set."""

    name = "Recording"

    def __init__(self, *, fail_at: str = "", hold: threading.Event | None = None) -> None:
        self.fail_at, self.hold = fail_at, hold
        self.started_with: tuple[Mapping[str, str], str | None] | None = None
        self.points: list[tuple[dict[str, float], int]] = []
        self.ended: Final | None = None
        self.versions: dict[int, float] = {}
        self.logging = threading.Event()

    def start(self, params: Mapping[str, str], run_id: str | None) -> str:
        if self.fail_at == "start":
            raise ConnectionError("http://user:secret@tracker:5000 refused the connection")
        self.started_with = (params, run_id)
        return run_id or "new-id"

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self.logging.set()
        if self.hold is not None:
            self.hold.wait()
        if self.fail_at == "log":
            raise RuntimeError("the server went away\nwith a second line")
        self.points.append((dict(metrics), step))

    def log_versions(self, means: Mapping[int, float]) -> None:
        self.versions.update(means)

    def end(self, final: Final) -> None:
        self.ended = final


def test_each_tracker_is_started_fed_and_ended_and_the_ids_are_kept():
    first, second = Recording(), Recording()
    kept: list[dict[str, str]] = []
    log = TrackerLog({"a": lambda: first, "b": lambda: second}, {"repeats": "4"}, {"b": "old-id"}, kept.append)
    log.start()
    log.point({"live/finished": 1.0}, 1, {3: 0.5})
    log.end(FINAL, wait_s=30)
    assert first.started_with == ({"repeats": "4"}, None)
    assert second.started_with == ({"repeats": "4"}, "old-id")  # continued
    assert kept[-1] == {"a": "new-id", "b": "old-id"}  # each tracker's thread keeps those started
    assert first.points == second.points == [({"live/finished": 1.0}, 1)]
    assert first.versions == second.versions == {3: 0.5}
    assert first.ended is second.ended is FINAL
    assert log.warnings() == []


def test_a_tracker_that_cannot_start_is_said_once_without_its_credentials_and_the_others_go_on():
    working = Recording()
    log = TrackerLog(
        {"a": lambda: Recording(fail_at="start"), "b": lambda: working},
        {},
        {},
        lambda ids: None,
        hidden=("http://user:secret@tracker:5000",),
    )
    log.start()
    log.end(FINAL, wait_s=30)
    assert log.warnings() == [
        "Recording: cannot start its run (ConnectionError: ... refused the connection); the run goes on without it"
    ]
    assert working.ended is FINAL
    assert log.warnings() == []  # each said once


def test_a_client_that_is_missing_or_breaks_when_made_is_named_by_its_key():
    def broken() -> Recording:
        raise ImportError("No module named 'mlflow'")

    log = TrackerLog({"mlflow": broken}, {}, {}, lambda ids: None, names={"mlflow": "MLflow"})
    log.start()
    log.end(FINAL, wait_s=30)
    assert log.warnings() == [
        "MLflow: cannot start its run (ImportError: No module named 'mlflow'); the run goes on without it"
    ]


def test_a_tracker_that_fails_while_logging_is_left_alone_after_one_warning():
    failing = Recording(fail_at="log")
    log = TrackerLog({"a": lambda: failing}, {}, {}, lambda ids: None)
    log.start()
    log.point({"x": 1.0}, 1)
    log.point({"x": 2.0}, 2)
    log.end(FINAL, wait_s=30)
    assert log.warnings() == ["Recording: cannot log (RuntimeError: the server went away); the run goes on without it"]
    assert failing.ended is None


def test_points_are_dropped_rather_than_wait_for_a_slow_tracker():
    hold = threading.Event()
    slow = Recording(hold=hold)
    log = TrackerLog({"a": lambda: slow}, {}, {}, lambda ids: None)
    log.start()
    log.point({"x": 0.0}, 0)
    assert slow.logging.wait(30)  # the thread is busy with the first point from here on
    for step in range(1, QUEUED_POINTS + 6):
        log.point({"x": float(step)}, step)  # never waits
    assert log.dropped == 5
    hold.set()
    log.end(FINAL, wait_s=30)
    assert [step for _, step in slow.points] == list(range(QUEUED_POINTS + 1))
    assert slow.ended is FINAL


def test_the_end_waits_for_a_stuck_tracker_a_bounded_time_and_says_so():
    hold = threading.Event()
    stuck = Recording(hold=hold)
    log = TrackerLog({"a": lambda: stuck}, {}, {}, lambda ids: None)
    log.start()
    log.point({"x": 0.0}, 0)
    assert stuck.logging.wait(30)
    log.end(FINAL, wait_s=0.01)
    assert log.warnings() == ["trackers: not done logging after 0.01 s; left as they are"]
    hold.set()


def test_a_secret_the_warning_is_cut_through_is_hidden_whole():
    class Quoting(Recording):
        def start(self, params: Mapping[str, str], run_id: str | None) -> str:
            raise ConnectionError("x" * 288 + "/?token=t0k3nt0k3n/api/2.0/mlflow")  # cut at 300 in the token

    log = TrackerLog({"a": Quoting}, {}, {}, lambda ids: None, hidden=("token=t0k3nt0k3n", "t0k3nt0k3n"))
    log.start()
    log.end(FINAL, wait_s=30)
    (warning,) = log.warnings()
    assert "t0k" not in warning


def test_the_end_waits_its_time_once_when_the_queue_is_full_too():
    hold = threading.Event()
    stuck = Recording(hold=hold)
    log = TrackerLog({"a": lambda: stuck}, {}, {}, lambda ids: None)
    log.start()
    log.point({"x": 0.0}, 0)
    assert stuck.logging.wait(30)
    for step in range(1, QUEUED_POINTS + 1):
        assert log.point({"x": float(step)}, step)  # the queue is full: the end's put waits its time
    joined: list[float] = []
    (thread,) = log._threads
    thread.join = joined.append  # type: ignore[method-assign]
    log.end(FINAL, wait_s=0.05)
    assert joined[0] < 0.05  # what is left of the time the put took, not the time again
    hold.set()


def test_a_tracker_that_hangs_costs_the_others_nothing():
    hold = threading.Event()

    class Releasing(Recording):
        def end(self, final: Final) -> None:
            super().end(final)
            hold.set()  # the other is held until this one has ended

    stuck, working = Recording(hold=hold), Releasing()
    log = TrackerLog({"a": lambda: stuck, "b": lambda: working}, {}, {}, lambda ids: None)
    log.start()
    log.point({"x": 0.0}, 0)
    log.end(FINAL, wait_s=30)
    assert working.points == [({"x": 0.0}, 0)]
    assert working.ended is stuck.ended is FINAL
    assert log.warnings() == []
