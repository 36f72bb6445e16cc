"""cli/progress_lines.py: --progress's plain lines where stderr is no terminal, on trio's mock clock."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator

import pytest
import trio
import trio.testing

from rollfilter.cli.progress_lines import ProgressLines
from rollfilter.engine.metrics import Metrics
from rollfilter.run.statistics import RunStatistics, statistics_of


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    read_end, write_end = os.pipe()
    os.set_blocking(read_end, False)
    try:
        yield read_end, write_end
    finally:
        os.close(read_end)
        os.close(write_end)


class Counts:
    """A run's counts as a test sets them: the rollouts finished, and those expected once known."""

    def __init__(self, finished: int) -> None:
        self.metrics = Metrics(clock=trio.current_time)
        self.finished = finished
        self.expected: int | None = None

    def statistics(self) -> RunStatistics:
        earlier = self.finished - self.metrics.ended  # the snapshot adds the ended to those finished before
        return statistics_of(self.metrics, expected=self.expected, finished_earlier=earlier)


def lines_written(fd: int) -> list[str]:
    try:
        return os.read(fd, 65536).decode().splitlines()
    except BlockingIOError:
        return []


async def test_a_line_at_each_hundredth_of_the_total_and_after_a_quiet_minute(
    pipe: tuple[int, int], autojump_clock: trio.testing.MockClock
):
    read_end, write_end = pipe
    counts = Counts(0)
    counts.expected = 1000  # known from the start (a materialized file)
    lines = ProgressLines(fd=write_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lines.serve, counts.statistics)
        await trio.sleep(1)
        counts.finished = 9
        await trio.sleep(1)
        assert lines_written(read_end) == []  # under 1%
        counts.finished = 10
        counts.metrics.failed = 2
        await trio.sleep(1)
        (line,) = lines_written(read_end)
        assert line.startswith("rollfilter: 10 of 1,000 rollouts finished (1%), ")
        assert line.endswith(", 2 failed, 0:00:02 elapsed")
        assert "rollouts/s" in line
        counts.finished = 35  # three steps at once: one line, and the next at 40
        await trio.sleep(1)
        assert [line.split(" rollouts")[0] for line in lines_written(read_end)] == ["rollfilter: 35 of 1,000"]
        counts.finished = 39
        await trio.sleep(58)
        assert lines_written(read_end) == []
        await trio.sleep(2)  # a minute since the last line
        assert [line.split(",")[0] for line in lines_written(read_end)] == ["rollfilter: 39 of 1"]
        counts.finished = 40
        await trio.sleep(1)
        assert len(lines_written(read_end)) == 1
        nursery.cancel_scope.cancel()


async def test_without_a_total_a_line_a_minute_and_the_runs_expected_pairs_once_known(
    pipe: tuple[int, int], autojump_clock: trio.testing.MockClock
):
    read_end, write_end = pipe
    counts = Counts(5)
    lines = ProgressLines(fd=write_end)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lines.serve, counts.statistics)
        await trio.sleep(59)
        assert lines_written(read_end) == []
        await trio.sleep(2)
        (line,) = lines_written(read_end)
        assert line.startswith("rollfilter: 5 rollouts finished, ")
        counts.expected = 100
        await trio.sleep(1)
        counts.finished = 6
        await trio.sleep(1)
        assert [line.split(" (")[0] for line in lines_written(read_end)] == ["rollfilter: 6 of 100 rollouts finished"]
        nursery.cancel_scope.cancel()


async def test_a_write_that_fails_ends_the_lines_not_the_run(autojump_clock: trio.testing.MockClock):
    full = os.open("/dev/full", os.O_WRONLY)
    try:
        lines = ProgressLines(fd=full)
        with trio.move_on_after(600):
            await lines.serve(Counts(1).statistics)
        assert lines.failed
    finally:
        os.close(full)


def test_the_line_says_what_the_snapshot_says():
    taken = RunStatistics.empty()
    shown = dataclasses.replace(taken, finished=1234, failed=7, rows_per_s=2.5, elapsed_s=3725.0)
    line = ProgressLines(fd=-1).line(shown, 2000).decode()
    assert line == "rollfilter: 1,234 of 2,000 rollouts finished (61%), 2.5 rollouts/s, 7 failed, 1:02:05 elapsed\n"


def test_the_line_says_the_rollouts_waiting_and_what_on():
    taken = RunStatistics.empty()
    steering = dataclasses.replace(taken.steering, paused=True, waiting_on_policy_version=12)
    shown = dataclasses.replace(taken, finished=4, waiting_on_pause=7, steering=steering)
    line = ProgressLines(fd=-1).line(shown, 40).decode()
    assert line == (
        "rollfilter: 4 of 40 rollouts finished (10%), 0.0 rollouts/s, 0 failed, 0:00:00 elapsed,"
        " paused, 7 waiting on the pause, 12 waiting for the policy version\n"
    )


def test_the_line_says_the_unhealthy_rollouts_once_there_are_any():
    shown = dataclasses.replace(RunStatistics.empty(), finished=40, failed=1, unhealthy=1234)
    line = ProgressLines(fd=-1).line(shown, None).decode()
    assert line == "rollfilter: 40 rollouts finished, 0.0 rollouts/s, 1 failed, 1,234 unhealthy, 0:00:00 elapsed\n"


def test_the_line_says_the_rollouts_back_in_open_groups():
    """With --groups they are not finished until their group closes: said apart, as SIGUSR1 says them."""
    shown = dataclasses.replace(RunStatistics.empty(), finished=4, in_open_groups=6)
    line = ProgressLines(fd=-1).line(shown, 40).decode()
    assert line == (
        "rollfilter: 4 of 40 rollouts finished (10%), 0.0 rollouts/s, 0 failed, 0:00:00 elapsed,"
        " 6 back in open groups\n"
    )
