"""The first pass of a run that writes a materialized file (--materialized, --gym-layout): every
body planned and written before the first /run is sent, as NeMo Gym's collector does.

Standard input is read to its end first, into a temporary file that both passes read.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable

import trio

from rollfilter.config import Config
from rollfilter.engine.plan import Planner
from rollfilter.engine.routing import Router
from rollfilter.errors import UsageError
from rollfilter.formats.keytable import KeyTable
from rollfilter.formats.source import STDIN, LineReader
from rollfilter.formats.writers import OutputFailed, write_all
from rollfilter.run.materialize import write_materialized

STDIN_COPY = "a temporary copy of standard input"


async def count_rollouts(inputs: tuple[str, ...], config: Config, max_line_bytes: int) -> int | None:
    """The rollouts `inputs` hold, planned again from the start; None when an input cannot be read
    twice (standard input, a pipe) or a line cannot be read."""
    for path in inputs:
        try:
            if path == STDIN or not stat.S_ISREG(os.stat(path).st_mode):
                return None
        except OSError:
            return None
    reader = LineReader(inputs, max_line_bytes=max_line_bytes)
    planner = Planner(reader, config)
    count = 0
    try:
        while await planner.next_job() is not None:
            count += 1
            if count % 4096 == 0:
                await trio.lowlevel.checkpoint()  # a stop (a signal) ends the count
    finally:
        reader.close()
    return count


async def plan_first(
    path: str,
    *,
    inputs: tuple[str, ...],
    config: Config,
    router: Router,
    reader: LineReader,
    stdin_fd: int,
    max_line_bytes: int,
    keep_existing: bool,
    already: KeyTable | None,
    on_staged: Callable[[int], None] | None = None,
) -> int:
    """Write every body of `inputs` to the materialized file `path` (after its lines, and those
    `already` there left out, with `keep_existing`); returns the number of rollouts the inputs
    hold. `reader`, the run's, reads a copy of standard input afterwards; `on_staged` gets the
    file being built (see `write_materialized`).

    Raises UsageError, with nothing sent, when some rows have no repeat count (as NeMo Gym
    refuses them), and OutputFailed when the file or the copy cannot be written."""
    first_stdin = stdin_fd
    if STDIN in inputs:
        first_stdin = await trio.to_thread.run_sync(spooled, stdin_fd, abandon_on_cancel=True)
        reader.use_stdin(first_stdin)
    first = LineReader(inputs, max_line_bytes=max_line_bytes, stdin_fd=first_stdin)
    try:
        name = f"--materialized {path}"
        plan = await write_materialized(
            Planner(first, config),
            router,
            path,
            name=name,
            keep_existing=keep_existing,
            already=already,
            on_staged=on_staged,
        )
    finally:
        first.close()
    if first_stdin != stdin_fd:
        os.lseek(first_stdin, 0, os.SEEK_SET)  # the second pass reads it again (its reader closes it)
    if plan.agents_without_repeats:
        names = sorted(plan.agents_without_repeats, key=lambda name: (name is not None, name or ""))
        shown_names = ", ".join("rows naming no agent" if name is None else repr(name) for name in names)
        given = ", ".join(f"{name}={count}" for name, count in sorted(config.repeats_by_agent.items()))
        raise UsageError(
            f"-r {given} gives no repeat count for {shown_names}, and no default -r K: give -r K for"
            " the agents it does not name, or -r NAME=K for each; nothing was sent"
        )
    return plan.rollouts


def spooled(fd: int) -> int:
    """A temporary file holding all that `fd` gives until its end, read from the start."""
    try:
        spool = tempfile.TemporaryFile()  # noqa: SIM115 - the descriptor outlives the file object
    except OSError as exc:  # TMPDIR missing, or not writable
        raise OutputFailed(STDIN_COPY, exc) from None
    spool_fd = os.dup(spool.fileno())
    spool.close()
    while chunk := os.read(fd, 1 << 20):
        write_all(spool_fd, chunk, STDIN_COPY)
    os.lseek(spool_fd, 0, os.SEEK_SET)
    return spool_fd
