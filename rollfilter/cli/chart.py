"""The pass histogram as a small bar chart, for a person at a terminal (the JSON says it for programs)."""

from __future__ import annotations

import locale
import os
from collections.abc import Sequence
from typing import Any

BAR_WIDTH = 40


def pass_chart(histogram: Sequence[int], threshold: float, *, unicode: bool | None = None) -> list[str]:
    """One line a bar: how many tasks had 0, 1, ..., K rollouts at or over `threshold`. The two
    ends are the tasks whose rollouts all agree (under a binary reward: what --drop-uniform drops)."""
    if unicode is None:
        unicode = locale.getpreferredencoding(False).lower().replace("-", "") == "utf8"
    full, sliver = ("\u2588", "\u258f") if unicode else ("#", "|")
    most = max(histogram, default=0) or 1
    width = len(str(len(histogram) - 1))
    count_width = len(str(max(histogram, default=0)))
    lines = [f"groups by rollouts with reward >= {threshold:g} (pass_histogram):"]
    for correct, tasks in enumerate(histogram):
        bar = full * round(BAR_WIDTH * tasks / most) or (sliver if tasks else "")
        lines.append(f"  {correct:>{width}} {tasks:>{count_width}} {bar}".rstrip())
    return lines


def chart_lines(summary: dict[str, Any], stderr_fd: int) -> list[str]:
    """The chart of `summary`'s pass_histogram when standard error is a terminal; else none."""
    histogram = summary.get("pass_histogram")
    if not isinstance(histogram, list) or not histogram or not _is_terminal(stderr_fd):
        return []
    threshold = summary.get("rollfilter", {}).get("pass_threshold", 1.0)
    return pass_chart(histogram, threshold)


def _is_terminal(fd: int) -> bool:
    return os.isatty(fd) and os.environ.get("TERM") != "dumb"
