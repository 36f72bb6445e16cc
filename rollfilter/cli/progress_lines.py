"""--progress where stderr is no terminal: a plain status line now and then, for a batch job's log.

On a Slurm node stderr is a file, and a live display's carriage returns and colours would fill it
with noise. So, as NeMo Gym's collector does, the run says where it is in one whole line every 1% of
the rollouts it expects, or after a minute without one (always, when the total is not known):
rollouts finished of those expected, the rate, the failures so far, the time elapsed, and while
rollouts taken wait rather than go, how many and on what (the pause, a rate limit, an adaptive window,
the policy version). The lines
are only shown: a write that fails ends them, never the run. They stop before the summary is
written, which stays the last line.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from rollfilter.cli.messages import back_in_open_groups, message_line, waiting_words
from rollfilter.formats.writers import OutputClosed, OutputFailed, write_all
from rollfilter.run.statistics import RunStatistics

CHECK_SECONDS = 0.25  # how often the count is looked at: a step crossed between two looks gives one line
QUIET_SECONDS = 60.0  # the longest a run goes without a line
STEPS = 100  # a line each hundredth of the expected rollouts


class ProgressLines:
    """Writes the status lines of a run to `fd` (see the module docstring): the rollouts finished,
    earlier runs' included, as the total counts them."""

    def __init__(self, *, fd: int) -> None:
        self._fd = fd
        self.failed = False  # a write failed: nothing more is written

    def line(self, statistics: RunStatistics, total: int | None) -> bytes:
        """The status line of a run's snapshot."""
        finished = statistics.finished
        if total:
            done = f"{finished:,} of {total:,} rollouts finished ({100 * finished // total}%)"
        else:
            done = f"{finished:,} rollouts finished"
        elapsed = int(statistics.elapsed_s)
        hours, rest = divmod(elapsed, 3600)
        clock = f"{hours}:{rest // 60:02d}:{rest % 60:02d}"
        rate, failed = statistics.rows_per_s, statistics.failed
        status = statistics.status()
        words = [*waiting_words(status, paused=True), *back_in_open_groups(status)]
        waiting = "".join(f", {part}" for part in words)
        unhealthy = f", {statistics.unhealthy:,} unhealthy" if statistics.unhealthy else ""
        return message_line(f"{done}, {rate:,.1f} rollouts/s, {failed:,} failed{unhealthy}, {clock} elapsed{waiting}")

    async def serve(
        self, statistics: Callable[[], RunStatistics], count: Callable[[], int | None] | None = None
    ) -> None:
        """Write a line at each step of the total, or after QUIET_SECONDS without one, until cancelled,
        from a snapshot the run's `statistics` give at each look; `count` (run in a thread) finds the
        total, and the run's `expected` pairs replace it once known."""
        total = await trio.to_thread.run_sync(count, abandon_on_cancel=True) if count is not None else None
        last_line_at = trio.current_time()
        next_step: int | None = None
        while not self.failed:
            await trio.sleep(CHECK_SECONDS)
            now = statistics()
            if now.expected is not None:
                total = now.expected
            step = -(-total // STEPS) if total else None
            finished = now.finished
            if next_step is None and step is not None:
                next_step = (finished // step + 1) * step
            stepped = next_step is not None and finished >= next_step
            if not stepped and trio.current_time() - last_line_at < QUIET_SECONDS:
                continue
            self._write(self.line(now, total))
            last_line_at = trio.current_time()
            if step is not None:
                next_step = (finished // step + 1) * step

    def _write(self, line: bytes) -> None:
        try:
            write_all(self._fd, line, "standard error")
        except (OutputClosed, OutputFailed):
            self.failed = True
