"""cli/statuses.py: how a run's end becomes an exit status, and a tracker run's status."""

from __future__ import annotations

import pytest

from rollfilter.cli.statuses import EXIT_STATUS_OF_STOP, RunEnd, exit_status, tracker_status
from rollfilter.errors import ExitStatus
from rollfilter.stops import StopCause


@pytest.mark.parametrize("cause", [None, *StopCause])
def test_a_tracker_run_ends_finished_for_0_and_1_killed_for_a_signal_failed_for_the_rest(cause: StopCause | None):
    status = exit_status(RunEnd(cause))
    signals = {ExitStatus.INTERRUPTED, ExitStatus.TERMINATED, ExitStatus.HUNG_UP, ExitStatus.BROKEN_PIPE}
    expected = (
        "FINISHED" if status in (ExitStatus.OK, ExitStatus.ROWS_FAILED) else "KILLED" if status in signals else "FAILED"
    )
    assert tracker_status(cause) == expected
    assert tracker_status(cause, failed=True) == "FAILED"
    assert cause is None or cause is StopCause.TARGET_REACHED or cause in EXIT_STATUS_OF_STOP
