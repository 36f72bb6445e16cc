"""The live progress display on a terminal's stderr (rich), refreshed a few times a second.

Imported only when the display is shown: rich is slow to import.

It never writes to stdout. Lines meant for stderr while it is shown (failures, -v events)
are printed above it through the same console, so they do not tear the display.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeRemainingColumn

from rollfilter.metrics import Metrics

REFRESH_SECONDS = 0.25


class ProgressDisplay:
    """done, failed, in flight (and the --adaptive window), rows/s, tokens/s, mean reward, and
    done/total with an ETA when known."""

    def __init__(
        self, metrics: Metrics, *, force_terminal: bool = False, adaptive: bool = False, priced: bool = False
    ) -> None:
        self._metrics = metrics
        self.console = Console(stderr=True, force_terminal=force_terminal or None, highlight=False)
        window = (TextColumn("window {task.fields[window]:>5,}"),) if adaptive else ()
        cost = (TextColumn("${task.fields[cost]:,.4f}"),) if priced else ()
        self._progress = Progress(
            TextColumn("{task.completed:>8,.0f} done"),
            TextColumn("{task.fields[failed]:>6,} failed"),
            TextColumn("{task.fields[in_flight]:>5,} in flight"),
            *window,
            TextColumn("{task.fields[rate]:>8,.1f} rows/s"),
            TextColumn("{task.fields[tokens]:>9,.0f} tokens/s"),
            TextColumn("reward {task.fields[reward]:.3f}"),
            *cost,
            BarColumn(),
            TaskProgressColumn(),
            TimeRemainingColumn(),
            console=self.console,
            auto_refresh=False,
            transient=True,
        )
        self._task = self._progress.add_task(
            "rollouts", total=None, failed=0, in_flight=0, window=0, rate=0.0, tokens=0.0, reward=0.0, cost=0.0
        )

    def set_total(self, total: int | None) -> None:
        self._progress.update(self._task, total=total)

    def write(self, line: bytes, release: Callable[[], None] | None = None) -> None:
        """Print one stderr line above the display (the same interface as a BatchWriter)."""
        self.console.print(line.decode(errors="replace").rstrip("\n"), markup=False, highlight=False, soft_wrap=True)
        if release is not None:
            release()

    def refresh(self) -> None:
        m = self._metrics
        self._progress.update(
            self._task,
            completed=m.ended,
            failed=m.failed,
            in_flight=m.taken - m.ended,
            window=m.window() or 0,
            rate=m.rate(),
            tokens=m.tokens() / max(m.elapsed(), 1e-9),
            reward=m.mean("reward"),
            cost=m.spending.total if m.spending is not None else 0.0,
        )
        self._progress.refresh()

    async def run(self, count: Callable[[], int | None] | None = None) -> None:
        """Show and refresh the display until cancelled; `count` (run in a thread) finds the total."""
        self._progress.start()
        try:
            if count is not None:
                self.set_total(await trio.to_thread.run_sync(count, abandon_on_cancel=True))
            while True:
                self.refresh()
                await trio.sleep(REFRESH_SECONDS)
        finally:
            self._progress.stop()
