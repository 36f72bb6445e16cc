"""The command line's own lines on stderr."""

from __future__ import annotations

import contextlib
import os


def say(text: str) -> None:
    """One line on stderr, which may be closed or full: then it is lost, and the exit status tells."""
    with contextlib.suppress(OSError):
        os.write(2, f"rollfilter: {text}\n".encode(errors="backslashreplace"))
