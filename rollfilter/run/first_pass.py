"""A run's rows counted, or planned whole, before or after the pass that sends them.

A run that writes a materialized file plans every body and writes it before the first /run is
sent, as NeMo Gym's collector does (`plan_first`); standard input is read to its end first, into
a temporary file that both passes read. A run stopped before its rows ran out (a target reached)
counts its rows again from the start, when they can be read again, so that its summary says how
many were never started (`expected_rollouts`).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import trio

from rollfilter.config import Config
from rollfilter.engine.plan import LineSource, Planner
from rollfilter.engine.routing import Router
from rollfilter.errors import UsageError
from rollfilter.formats.keytable import KeyTable
from rollfilter.formats.source import STDIN, LineReader
from rollfilter.formats.writers import OutputFailed, write_all
from rollfilter.stops import StopCause, StopControl

STDIN_COPY = "a temporary copy of standard input"
CHECKPOINT_JOBS = 4096  # jobs counted between two scheduler checkpoints (a stop is seen at once)
# The stops after which the rows are counted again, when they can be read again: the summary's
# not_started, the rows never sent. After other stops the count would wait on a run being left.
COUNTED_AFTER = frozenset({StopCause.TARGET_REACHED, StopCause.AGENT_UNREACHABLE})


@runtime_checkable
class Rereadable(Protocol):
    """A source of rows that can hand out its rows again from the start (files, a list)."""

    def read_again(self) -> LineSource | None:
        """A new source of the same rows from the first; None when they cannot be read twice."""
        ...


class RepeatsMissing(UsageError):
    """Some rows name an agent that has no repeat count, and there is no default one; nothing
    was sent. `agents` are those agents (None: rows naming no agent)."""

    def __init__(self, agents: frozenset[str | None]) -> None:
        self.agents = sorted(agents, key=lambda name: (name is not None, name or ""))
        shown = ", ".join("rows naming no agent" if name is None else repr(name) for name in self.agents)
        super().__init__(f"no repeat count for {shown}, and no default one; nothing was sent")


async def count_rollouts(source: LineSource, config: Config) -> int:
    """The rollouts `source` holds, planned from its first row (it is closed at the end)."""
    planner = Planner(source, config)
    count = 0
    try:
        while await planner.next_job() is not None:
            count += 1
            if count % CHECKPOINT_JOBS == 0:
                await trio.lowlevel.checkpoint()  # a stop (a signal) ends the count
    finally:
        if isinstance(source, LineReader):
            source.close()
    return count


async def expected_rollouts(
    source: LineSource | None, config: Config, control: StopControl, *, read_whole: int | None
) -> int | None:
    """Every rollout of a run's input, when it is known: `read_whole`, the rollouts a run that read
    it all to its end read; or after a stop that left rows unread (`COUNTED_AFTER`), counted
    again from the first row when `source` can be read again. None when it cannot be known."""
    if read_whole is not None:
        return read_whole
    if control.cause not in COUNTED_AFTER or not isinstance(source, Rereadable):
        return None
    again = source.read_again()
    if again is None:
        return None
    # After another stop, a scope of the control's is cancelled already: the command line
    # ends at a second signal then (its signals' way out), so the count is not stoppable.
    with control.stoppable() if control.cause is StopCause.TARGET_REACHED else trio.CancelScope():
        return await count_rollouts(again, config)


async def plan_first(
    reader: LineReader,
    config: Config,
    router: Router,
    path: str,
    *,
    name: str,
    keep_existing: bool,
    already: KeyTable | None,
    on_staged: Callable[[int], None] | None = None,
) -> int:
    """Write every body of `reader`'s inputs to the materialized file `path` (`name` is how
    messages name it; after its lines, and those `already` there left out, with `keep_existing`);
    returns the number of rollouts the inputs hold. `reader`, the run's, reads a copy of standard
    input afterwards; `on_staged` gets the file being built (see `write_materialized`).

    Raises RepeatsMissing, with nothing sent, when some rows have no repeat count (as NeMo Gym
    refuses them), and OutputFailed when the file or the copy cannot be written."""
    from rollfilter.run.materialize import write_materialized  # loaded by the runs that write the file

    first_stdin = stdin_fd = reader.stdin_fd
    if STDIN in reader.inputs:
        first_stdin = await trio.to_thread.run_sync(spooled, stdin_fd, abandon_on_cancel=True)
        reader.use_stdin(first_stdin)
    first = LineReader(reader.inputs, max_line_bytes=reader.max_line_bytes, stdin_fd=first_stdin)
    try:
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
        raise RepeatsMissing(plan.agents_without_repeats)
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
