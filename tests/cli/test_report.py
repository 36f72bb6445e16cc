"""report.py: what the command says when a run has ended, its summary last."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rollfilter.cli.environment import Environment
from rollfilter.cli.report import report_unsent
from rollfilter.config import Config
from rollfilter.stops import StopCause, StopControl


async def test_a_run_stopped_before_it_was_made_gives_the_summary_of_a_run_of_its_config(tmp_path: Path):
    """Every summary the command prints is a Run's: one of nothing sent has the figures of the
    options given (here mean@3 and pass@k, of no task), and says why it stopped."""
    control = StopControl()
    control.stop(StopCause.TERMINATED)
    stderr = tmp_path / "stderr"
    fd = os.open(stderr, os.O_WRONLY | os.O_CREAT)
    try:
        end = await report_unsent(
            Config(url="http://127.0.0.1:9/run", repeats=3), control, None, Environment(stderr=fd), quiet=False
        )
    finally:
        os.close(fd)
    summary = json.loads(stderr.read_text().splitlines()[-1])
    assert end.stopped is StopCause.TERMINATED
    assert (summary["mean@3"], summary["rollfilter"]["tasks"]) == (None, 0)
    assert (summary["rollfilter"]["rows_read"], summary["rollfilter"]["stopped"]) == (0, "terminated")
