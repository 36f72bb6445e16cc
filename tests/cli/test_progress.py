"""cli/progress.py: the live display's line, written to a pipe as to a terminal."""

from __future__ import annotations

import dataclasses
import os

import pytest
import trio
import trio.testing

from rollfilter.cli.progress import ProgressDisplay
from rollfilter.config import Config
from rollfilter.run.run import Run


@pytest.mark.parametrize(("paused", "shown"), [(True, True), (False, False)])
async def test_the_line_says_paused_while_the_run_is(paused: bool, shown: bool):
    read, write = os.pipe()
    try:
        # COLUMNS: the width of a terminal, which a pipe has none of
        display = ProgressDisplay(fd=write, variables={"COLUMNS": "200"}, force_terminal=True, steered=True)
        async with trio.open_nursery() as nursery:
            run = Run(Config(url="http://127.0.0.1:9/run"))
            if paused:
                run.steering.pause()
            nursery.start_soon(display.run, run.statistics, None)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        os.set_blocking(read, False)
        screen = os.read(read, 1 << 16)
    finally:
        os.close(read)
        os.close(write)
    assert b" done" in screen
    assert (b"paused" in screen) is shown


async def test_the_line_shows_the_snapshot_the_run_gives(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "200")
    taken = Run(Config(url="http://127.0.0.1:9/run")).statistics()
    shown = dataclasses.replace(taken, started=1300, succeeded=1234, failed=56, reward_mean=0.625)
    read, write = os.pipe()
    try:
        display = ProgressDisplay(fd=write, variables={"COLUMNS": "200"}, force_terminal=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(display.run, lambda: shown, None)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        os.set_blocking(read, False)
        screen = os.read(read, 1 << 16)
    finally:
        os.close(read)
        os.close(write)
    assert b"1,290 done" in screen  # the ended: succeeded and failed
    assert b"56 failed" in screen
    assert b"10 in flight" in screen
    assert b"reward 0.625" in screen
