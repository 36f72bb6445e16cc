"""The pass histogram as a small bar chart, for a person at a terminal (the JSON says it for programs)."""

from __future__ import annotations

import itertools
import locale
from collections.abc import Sequence
from typing import Any

from rollfilter.redact import printable

BAR_WIDTH = 40
# Bars of the pass histogram: -r 16 is drawn bar by bar; past it the counts between the two ends
# are drawn in ranges, so that the chart above the summary stays shorter than a screen.
MOST_BARS = 17
MOST_COMPARED = 8  # rows of the comparison (the reward's first): the whole summary has every mean


def pass_chart(histogram: Sequence[int], threshold: float, *, unicode: bool | None = None) -> list[str]:
    """One line a bar: how many tasks had 0, 1, ..., K rollouts at or over `threshold`. The two
    ends are the tasks whose rollouts all agree (under a binary reward: what --drop-uniform drops)."""
    if unicode is None:
        unicode = locale.getpreferredencoding(False).lower().replace("-", "") == "utf8"
    full, sliver = ("\u2588", "\u258f") if unicode else ("#", "|")
    bars = _bars(histogram)
    most = max((tasks for _, tasks in bars), default=0) or 1
    width = max(len(label) for label, _ in bars)
    count_width = len(str(most))
    lines = [f"groups by rollouts with reward >= {threshold:g} (pass_histogram):"]
    for label, tasks in bars:
        bar = full * round(BAR_WIDTH * tasks / most) or (sliver if tasks else "")
        lines.append(f"  {label:>{width}} {tasks:>{count_width}} {bar}".rstrip())
    return lines


def _bars(histogram: Sequence[int]) -> list[tuple[str, int]]:
    """The chart's bars, a label and a count each: a bar a bin up to `MOST_BARS` bins; past it, the
    two ends (the groups whose rollouts all agree) alone and the bins between summed in ranges."""
    if len(histogram) <= MOST_BARS:
        return [(str(correct), tasks) for correct, tasks in enumerate(histogram)]
    last = len(histogram) - 1
    width = -(-(last - 1) // (MOST_BARS - 2))  # ranges of one width, so that their bars compare; the last may be short
    edges = [*range(1, last, width), last]
    between = [(_range(low, high - 1), sum(histogram[low:high])) for low, high in itertools.pairwise(edges)]
    return [("0", histogram[0]), *between, (str(last), histogram[last])]


def _range(low: int, high: int) -> str:
    return str(low) if low == high else f"{low}-{high}"


def compare_table(compare: dict[str, Any]) -> list[str]:
    """`--compare`'s figures as a short table: a line a mean, this run minus the baseline."""
    lines = ["this run minus the baseline, task by task:"]
    heading = ("", "difference", "95% interval", "p", "detectable", "better", "worse", "tied", "tasks")
    rows: list[tuple[str, ...]] = [heading]
    for name, figures in itertools.islice(compare.items(), MOST_COMPARED):
        interval = figures["ci95"]
        rows.append(
            (
                printable(name),  # a result's field, named by the agent: no control character reaches the terminal
                _signed(figures["difference"]),
                "-" if interval is None else f"{_signed(interval[0])} to {_signed(interval[1])}",
                "-" if figures["p_value"] is None else f"{figures['p_value']:g} ({figures['test']})",
                "-" if figures.get("detectable") is None else f"{figures['detectable']:g}",
                *(str(figures[key]) for key in ("improved", "worsened", "tied", "tasks")),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    if len(compare) > MOST_COMPARED:
        lines.append(f"  ({len(compare) - MOST_COMPARED} more in the whole summary)")
    return lines


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{value:+g}"


def chart_lines(summary: dict[str, Any], *, can_draw: bool) -> list[str]:
    """For a person at a terminal (`can_draw`: standard error is one, not TERM=dumb), the chart
    of `summary`'s pass_histogram and the table of its comparison (`--compare`); else none."""
    if not can_draw:
        return []
    lines = []
    histogram = summary.get("pass_histogram")
    if isinstance(histogram, list) and any(histogram):  # no group ended: nothing to draw
        lines += pass_chart(histogram, summary.get("rollfilter", {}).get("pass_threshold", 1.0))
    compare = summary.get("compare")
    if isinstance(compare, dict) and compare:
        lines += compare_table(compare)
    return lines
