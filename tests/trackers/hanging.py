"""`python -m tests.trackers.hanging ARGS`: the command, its MLflow client a stand-in that hangs.

The stand-in's run never starts (its `start` waits for ever), so the end of the run waits its
bounded time for it; a line on stderr says when that wait begins, for a test to signal then."""

from __future__ import annotations

import importlib.util
import sys
import threading
from collections.abc import Mapping
from typing import Any

from rollfilter.cli.startup import main
from rollfilter.run import tracking
from rollfilter.trackers.log import Final, TrackerLog

WAITING = b"test: the run waits for its trackers\n"


class Hanging:
    name = "Hanging"

    def start(self, params: Mapping[str, str], run_id: str | None) -> str:
        threading.Event().wait()
        raise AssertionError("never")

    def log(self, metrics: Mapping[str, float], step: int) -> None: ...

    def log_versions(self, means: Mapping[int, float]) -> None: ...

    def end(self, final: Final) -> None: ...


def _said_first(end: Any) -> Any:
    def said(self: TrackerLog, final: Final, *, wait_s: float) -> None:
        sys.stderr.buffer.write(WAITING)
        sys.stderr.flush()
        end(self, final, wait_s=wait_s)

    return said


if __name__ == "__main__":
    found = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *args: object() if name == "mlflow" else found(name, *args)  # type: ignore[assignment]
    tracking._mlflow = lambda uri, experiment, run_name: Hanging()  # type: ignore[assignment]
    TrackerLog.end = _said_first(TrackerLog.end)  # type: ignore[method-assign]
    main()
