"""cli/files/progress_file.py: the progress file, kept as the run's snapshot says."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import trio
import trio.testing

from rollfilter.cli.files.progress_file import PROGRESS_SECONDS, publish_progress
from rollfilter.formats.writers import WholeFile
from rollfilter.run.statistics import RunStatistics


async def test_the_file_holds_the_finished_rollouts_of_each_snapshot(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
):
    taken = RunStatistics.empty()
    finished = [12]
    path = tmp_path / "_progress"
    file = WholeFile(str(path), "--progress-file")
    said: list[str] = []

    def statistics() -> RunStatistics:
        return dataclasses.replace(taken, finished=finished[0])

    async with trio.open_nursery() as nursery:
        nursery.start_soon(publish_progress, file, statistics, said.append)
        await trio.sleep(PROGRESS_SECONDS / 2)
        assert path.read_text() == "12\n"
        finished[0] = 30
        await trio.sleep(PROGRESS_SECONDS)
        assert path.read_text() == "30\n"
        nursery.cancel_scope.cancel()
    file.close()
    assert said == []
