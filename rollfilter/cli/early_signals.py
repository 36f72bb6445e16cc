"""The stop signals that come while no run listens for them: while the command starts, parses its
options, or opens its outputs. Start-up (`cli/startup.py`) sets `note` as their handler before it
imports anything else; a run takes what was noted (`cli/signals.py`, `StopSignals`) and stops as
soon as it starts, so that its summary is still printed.

It imports nothing but `signal`: start-up loads it within a millisecond of the interpreter's start.
"""

from __future__ import annotations

import signal

TYPE_CHECKING = False  # not typing's: start-up must not load it
if TYPE_CHECKING:
    from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # as cli/signals.py's CAUSE_OF_SIGNAL

received: list[int] = []  # the stop signals noted, oldest first


def note(signum: int, frame: FrameType | None) -> None:
    received.append(signum)


def set_handlers() -> None:
    """Note the stop signals from now on. A hang-up ignored by whoever started the command (nohup)
    stays ignored."""
    for signum in STOP_SIGNALS:
        if signum != signal.SIGHUP or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, note)


def take() -> list[int]:
    """The signals noted so far, forgotten here."""
    taken = list(received)
    received.clear()
    return taken
