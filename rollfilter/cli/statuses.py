"""How a run's end becomes the command's exit status: the one table `main` applies.

A run (`cli/collect.py`, `cli/summarize.py`) ends with a `RunEnd`: why it was stopped, if it was,
whether rows or inputs were lost, whether an output failed. `exit_status` says which of
`errors.ExitStatus` that is, and nothing else in the package decides one.
"""

from __future__ import annotations

import dataclasses

from rollfilter.errors import ExitStatus, RollfilterError
from rollfilter.stops import StopCause

EXIT_STATUS_OF_STOP = {
    StopCause.LIMIT_REACHED: ExitStatus.ROWS_FAILED,
    StopCause.INTERRUPTED: ExitStatus.INTERRUPTED,
    StopCause.TERMINATED: ExitStatus.TERMINATED,
    StopCause.HUNG_UP: ExitStatus.HUNG_UP,
    StopCause.READER_GONE: ExitStatus.BROKEN_PIPE,
    StopCause.OUTPUT_FAILED: ExitStatus.OUTPUT_FAILED,
    StopCause.AGENT_UNREACHABLE: ExitStatus.SERVICE_UNAVAILABLE,
    StopCause.UNHEALTHY: ExitStatus.ROWS_FAILED,
}


@dataclasses.dataclass(frozen=True, slots=True)
class RunEnd:
    """How a run ended: `stopped` before its rows ran out (None: it ran to the end), with rows,
    lines or inputs `incomplete`, and an output that could not be written whole (`output_failed`)."""

    stopped: StopCause | None = None
    incomplete: bool = False
    output_failed: bool = False
    summary_lost: bool = False  # the summary could not be written on stderr (closed, full, no reader)
    refused: RollfilterError | None = None  # what stopped the run before it sent (its line and summary said)


def exit_status(end: RunEnd) -> ExitStatus:
    if end.output_failed:  # whatever stopped the run first, what it wrote is incomplete
        return ExitStatus.OUTPUT_FAILED
    if end.refused is not None:
        return end.refused.exit_status
    if end.stopped is not None and end.stopped is not StopCause.TARGET_REACHED:  # a target reached is the end
        return EXIT_STATUS_OF_STOP[end.stopped]  # a stop says why, even when its summary was lost
    if end.summary_lost:
        # The summary is one of the run's outputs, as the results are: when it could not be
        # written, part of what the run reports is missing, so the run failed to write an output.
        return ExitStatus.OUTPUT_FAILED
    return ExitStatus.ROWS_FAILED if end.incomplete else ExitStatus.OK


# The stops that end a tracker run KILLED (a signal, or the reader of the results gone); others
# that are faults end it FAILED, as the exit statuses 2, 3 and 74 do.
KILLED_BY = frozenset({StopCause.INTERRUPTED, StopCause.TERMINATED, StopCause.HUNG_UP, StopCause.READER_GONE})
FAILED_BY = frozenset({StopCause.OUTPUT_FAILED, StopCause.AGENT_UNREACHABLE})


def tracker_status(stopped: StopCause | None, *, failed: bool = False) -> str:
    """How a tracker run ends for a run `stopped` so (None: not stopped), or one that `failed`
    (an output, a service): FINISHED for the exit statuses 0 and 1, KILLED for a signal, FAILED
    for 2, 3 and 74."""
    if failed or stopped in FAILED_BY:
        return "FAILED"
    return "KILLED" if stopped in KILLED_BY else "FINISHED"
