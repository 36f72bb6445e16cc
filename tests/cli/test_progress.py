"""cli/progress.py: the live display's line, written to a pipe as to a terminal."""

from __future__ import annotations

import os

import pytest
import trio
import trio.testing

from rollfilter.cli.progress import ProgressDisplay
from rollfilter.engine.metrics import Metrics


@pytest.mark.parametrize(("paused", "shown"), [(True, True), (False, False)])
async def test_the_line_says_paused_while_the_run_is(paused: bool, shown: bool):
    read, write = os.pipe()
    try:
        # COLUMNS: the width of a terminal, which a pipe has none of
        display = ProgressDisplay(fd=write, variables={"COLUMNS": "200"}, force_terminal=True, steered=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(display.run, Metrics(), None, lambda: paused)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        os.set_blocking(read, False)
        screen = os.read(read, 1 << 16)
    finally:
        os.close(read)
        os.close(write)
    assert b" done" in screen
    assert (b"paused" in screen) is shown
