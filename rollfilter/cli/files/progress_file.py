"""How far a run has come, for those who watch it: the progress file (NeMo Gym's `_progress`),
and the run's total, for the display's ETA."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Sequence

import trio

from rollfilter.formats.source import STDIN
from rollfilter.formats.writers import OutputClosed, OutputFailed, WholeFile
from rollfilter.run.statistics import RunStatistics

PROGRESS_SECONDS = 0.5  # how often the progress file is brought up to date


async def publish_progress(
    file: WholeFile,
    statistics: Callable[[], RunStatistics],
    say: Callable[[str], None],
    *,
    seconds: float = PROGRESS_SECONDS,
) -> None:
    """Keep `file` holding the number of finished rollouts of the run's snapshot (`statistics`),
    earlier runs' included, as NeMo Gym's `_progress` artifact: a plain integer, replaced at once.
    Best effort: a write that fails is reported once and the run goes on without it."""
    published = None
    while True:
        count = statistics().finished
        if count != published:
            try:
                file.replace(b"%d\n" % count)
            except (OutputClosed, OutputFailed) as failure:
                say(f"{failure}; the run goes on without it")
                return
            published = count
        await trio.sleep(seconds)


def count_lines(paths: Sequence[str]) -> int | None:
    """Lines in regular files (None for stdin or a pipe): the run's total, for an ETA.
    Blank lines are counted too, so it is an estimate when the input has them."""
    total = 0
    for path in paths:
        if path == STDIN or not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as file:
            last = b"\n"
            while chunk := file.read(1 << 20):
                total += chunk.count(b"\n")
                last = chunk[-1:]
            total += last != b"\n"
    return total


def known_total(
    inputs: Sequence[str], *, limit: int | None, shard: tuple[int, int] | None, repeats: int | None
) -> Callable[[], int | None]:
    """How to count the run's rollouts (run in a thread), for the display's total and ETA:
    None when they cannot be known before reading (stdin, repeats that depend on the rows)."""

    def count() -> int | None:
        lines = None if limit is not None and STDIN in inputs else count_lines(inputs)
        if limit is not None:
            lines = limit if lines is None else min(lines, limit)
        if lines is None or repeats is None:
            return None
        shards = shard[1] if shard else 1
        return -(-lines // shards) * repeats

    return count
