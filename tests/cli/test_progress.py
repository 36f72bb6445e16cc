"""cli/progress.py: the live display's line, written to a pipe as to a terminal."""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import pytest
import trio
import trio.testing

from rollfilter.cli.progress import ProgressDisplay
from rollfilter.config import Config
from rollfilter.run.run import Run
from rollfilter.run.statistics import RunStatistics


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
            nursery.start_soon(display.serve, run.statistics, None)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        os.set_blocking(read, False)
        screen = os.read(read, 1 << 16)
    finally:
        os.close(read)
        os.close(write)
    assert b" done" in screen
    assert (b"paused" in screen) is shown
    assert b"unhealthy" not in screen  # none yet


async def test_the_line_shows_the_snapshot_the_run_gives(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLUMNS", "200")
    taken = Run(Config(url="http://127.0.0.1:9/run")).statistics()
    shown = dataclasses.replace(
        taken, started=1300, succeeded=1234, failed=56, in_flight=10, reward_mean=0.625, unhealthy=1200
    )
    read, write = os.pipe()
    try:
        display = ProgressDisplay(fd=write, variables={"COLUMNS": "200"}, force_terminal=True)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(display.serve, lambda: shown, None)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        os.set_blocking(read, False)
        screen = os.read(read, 1 << 16)
    finally:
        os.close(read)
        os.close(write)
    assert b"1,290 done" in screen  # the ended: succeeded and failed
    assert b"56 failed 1,200 unhealthy" in screen  # said once there are any
    assert b"10 in flight" in screen
    assert b"reward 0.625" in screen


@pytest.mark.parametrize(
    ("held", "said"),
    [
        ({"paused": True, "waiting_on_pause": 7}, b"0 in flight .* paused, 7 waiting on the pause"),
        ({"waiting_on_policy_version": 12}, b"0 in flight .* 12 waiting for the policy version"),
        ({"waiting_on_rate_limits": 3}, b"0 in flight .* 3 waiting on rate limits"),
        ({"waiting_on_window": 2}, b"0 in flight .* 2 waiting on the adaptive window"),
    ],
)
async def test_the_line_says_the_rollouts_waiting_apart_from_those_in_flight(held: dict[str, Any], said: bytes):
    taken = Run(Config(url="http://127.0.0.1:9/run")).statistics()
    steering = dataclasses.replace(
        taken.steering, **{key: value for key, value in held.items() if hasattr(taken.steering, key)}
    )
    counts = {key: value for key, value in held.items() if not hasattr(taken.steering, key)}
    # 19 taken, 4 ended: the rest are held, none is in flight
    shown = dataclasses.replace(taken, started=19, succeeded=4, in_flight=0, steering=steering, **counts)
    screen = await first_screen(shown, steered=True)
    assert re.search(said, screen), screen


async def test_with_groups_the_line_says_the_rollouts_back_in_open_groups():
    taken = Run(Config(url="http://127.0.0.1:9/run")).statistics()
    shown = dataclasses.replace(taken, started=10, succeeded=4, in_flight=0, in_open_groups=6)
    screen = await first_screen(shown, grouped=True)
    assert re.search(b"0 in flight .* 6 back in open groups", screen), screen


async def first_screen(shown: RunStatistics, **options: bool) -> bytes:
    """What a wide terminal's progress display (`options`) first draws of the snapshot `shown`."""
    read, write = os.pipe()
    try:
        display = ProgressDisplay(fd=write, variables={"COLUMNS": "250"}, force_terminal=True, **options)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(display.serve, lambda: shown, None)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        os.set_blocking(read, False)
        return os.read(read, 1 << 16)
    finally:
        os.close(read)
        os.close(write)
