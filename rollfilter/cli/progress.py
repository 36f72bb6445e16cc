"""The live progress display on a terminal's stderr (rich), refreshed a few times a second.

Imported only when the display is shown: rich is slow to import.

It never writes to stdout. Lines meant for stderr while it is shown (failures, -v events)
are printed above it through the same console, so they do not tear the display. A write
that fails (a terminal hung up, a full or closed stderr) ends the display, which is only
shown, never needed; the lines after it go to `fallback`, which reports its own failures.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import trio
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

from rollfilter.cli.messages import back_in_open_groups, waiting_words
from rollfilter.formats.writers import LineWriter, OutputClosed, OutputFailed, write_all
from rollfilter.run.statistics import RunStatistics

REFRESH_SECONDS = 0.25


class _Terminal:
    """The display's descriptor as the file rich writes to: a failed write raises OutputClosed
    or OutputFailed, as the command's own writers do."""

    encoding = "utf-8"

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def write(self, text: str) -> int:
        write_all(self._fd, text.encode(errors="replace"), "standard error")
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def fileno(self) -> int:
        return self._fd


class ProgressDisplay:
    """done, failed, in flight (and the --adaptive window), rows/s, tokens/s, mean reward, the rollouts
    waiting and what on (and "paused"), and done/total with an ETA when known."""

    def __init__(
        self,
        *,
        fd: int,
        variables: Mapping[str, str],
        force_terminal: bool = False,
        adaptive: bool = False,
        priced: bool = False,
        limited: bool = False,
        steered: bool = False,
        grouped: bool = False,
        fallback: LineWriter | None = None,
    ) -> None:
        self._statistics: Callable[[], RunStatistics] | None = None  # the run's, from run() on
        self._fallback = fallback
        self.failed = False  # a write failed: nothing more is shown
        terminal: Any = _Terminal(fd)
        # rich reads TERM, NO_COLOR and COLUMNS from these rather than from os.environ.
        self.console = Console(
            file=terminal, force_terminal=force_terminal or None, highlight=False, _environ=variables
        )
        window = (TextColumn("window {task.fields[window]:>5,}"),) if adaptive else ()
        cost = (TextColumn("${task.fields[cost]:,.4f}"),) if priced else ()
        # Rollouts waiting (not sent) on the pause, --rpm/--tpm, the window or the policy version rather
        # than out at the agent, and with groups those back in groups still open: said while any wait so.
        waiting = (TextColumn("{task.fields[waiting]}"),) if limited or steered or adaptive or grouped else ()
        self._progress = Progress(
            TextColumn("{task.completed:>8,.0f} done"),
            TextColumn("{task.fields[failed]:>6,} failed"),
            TextColumn("{task.fields[unhealthy]}"),  # said once there are any
            TextColumn("{task.fields[in_flight]:>5,} in flight"),
            *window,
            TextColumn("{task.fields[rate]:>8,.1f} rows/s"),
            TextColumn("{task.fields[tokens]:>9,.0f} tokens/s"),
            TextColumn("reward {task.fields[reward]:.3f}"),
            *cost,
            *waiting,
            BarColumn(),
            TaskProgressColumn(),
            TimeRemainingColumn(),
            console=self.console,
            auto_refresh=False,
            transient=True,
        )
        self._task = self._progress.add_task(
            "rollouts",
            total=None,
            failed=0,
            unhealthy="",
            in_flight=0,
            window=0,
            rate=0.0,
            tokens=0.0,
            reward=0.0,
            cost=0.0,
            waiting="",
        )

    def set_total(self, total: int | None) -> None:
        self._progress.update(self._task, total=total)

    def write(self, line: bytes, release: Callable[[], None] | None = None) -> None:
        """Print one stderr line above the display (the same interface as a BatchWriter)."""
        text = line.decode(errors="replace").rstrip("\n")
        self._shown(lambda: self.console.print(text, markup=False, highlight=False, soft_wrap=True))
        if self.failed and self._fallback is not None:
            self._fallback.write(line, release)
        elif release is not None:
            release()

    def _shown(self, show: Callable[[], object]) -> None:
        if self.failed:
            return
        try:
            show()
        except (OutputClosed, OutputFailed):
            self.failed = True

    def refresh(self) -> None:
        self._shown(self._refresh)

    def _refresh(self) -> None:
        assert self._statistics is not None, "refreshed from run() only"
        s = self._statistics()
        status = s.status()
        self._progress.update(
            self._task,
            completed=s.ended,
            failed=s.failed,
            unhealthy=f"{s.unhealthy:,} unhealthy" if s.unhealthy else "",
            in_flight=s.in_flight,
            window=s.window or 0,
            rate=s.rows_per_s,
            tokens=s.tokens_per_s or 0.0,
            reward=s.reward_mean,
            cost=s.cost_usd or 0.0,
            waiting=", ".join([*waiting_words(status, paused=True), *back_in_open_groups(status)]),
        )
        self._progress.refresh()

    async def serve(
        self, statistics: Callable[[], RunStatistics], count: Callable[[], int | None] | None = None
    ) -> None:
        """Show the run's figures, a snapshot from `statistics` at each refresh, until cancelled;
        `count` (run in a thread) finds the total."""
        self._statistics = statistics
        self._shown(self._progress.start)
        try:
            if count is not None:
                self.set_total(await trio.to_thread.run_sync(count, abandon_on_cancel=True))
            while not self.failed:
                self.refresh()
                await trio.sleep(REFRESH_SECONDS)
        finally:
            # Stopped even after a failed write: stopping also gives back what rich took over.
            with contextlib.suppress(OutputClosed, OutputFailed):
                self._progress.stop()
