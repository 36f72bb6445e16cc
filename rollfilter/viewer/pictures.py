"""The viewer's charts, drawn as SVG text by the server (no script, no library): bars of counts,
with their labels. Every text in them is escaped."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from html import escape

WIDTH, HEIGHT, MARGIN = 360, 150, 24
BINS = 20


def bars(title: str, labels: Sequence[str], counts: Sequence[float], *, unit: str = "rollouts") -> str:
    """A bar a count, labelled below: an <svg> with a <title> a bar (the browser shows it on hover)."""
    most = max(counts, default=0) or 1
    width = (WIDTH - 2 * MARGIN) / max(len(counts), 1)
    parts = [
        f'<figure class="chart"><figcaption>{escape(title)}</figcaption>'
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {HEIGHT + MARGIN}" role="img"'
        f' aria-label="{escape(title)}">'
    ]
    for number, (label, count) in enumerate(zip(labels, counts, strict=True)):
        height = (HEIGHT - MARGIN) * count / most
        x, y = MARGIN + number * width, HEIGHT - height
        shown = f"{count:g}" if isinstance(count, float) else str(count)
        parts.append(
            f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{max(width - 1, 1):.1f}" height="{height:.1f}">'
            f"<title>{escape(label)}: {escape(shown)} {escape(unit)}</title></rect>"
        )
    for number, label in _spaced_labels(labels):
        x = MARGIN + (number + 0.5) * width
        parts.append(f'<text class="label" x="{x:.1f}" y="{HEIGHT + 14}">{escape(label)}</text>')
    parts.append(f'<text class="label" x="{MARGIN}" y="12">{escape(f"{most:g}")}</text></svg></figure>')
    return "".join(parts)


def _spaced_labels(labels: Sequence[str]) -> Iterable[tuple[int, str]]:
    step = max(1, math.ceil(len(labels) / 6))
    return ((number, label) for number, label in enumerate(labels) if number % step == 0 or number == len(labels) - 1)


def histogram(title: str, values: Iterable[float], *, whole: bool = False) -> str:
    """The values (NaN left out) in up to BINS bins between their least and greatest; `whole`
    numbers get a bin a number when they span few. The values are counted by value first (in C):
    rewards, tokens and tool calls take few distinct values, so the bins are filled from those."""
    counted = [(value, count) for value, count in Counter(values).items() if value == value]
    if not counted:
        return ""
    low, high = min(value for value, _ in counted), max(value for value, _ in counted)
    bins = int(high - low) + 1 if whole and high - low < BINS else BINS
    counts = [0] * bins
    for value, count in counted:
        counts[min(int(_fraction(value, low, high) * bins), bins - 1)] += count
    if whole and bins == int(high - low) + 1:
        labels = [f"{low + number:g}" for number in range(bins)]
    else:  # between low and high, weighed: a span past the float range (-1e308 to 1e308) stays finite
        labels = [f"{low * (1 - number / bins) + high * (number / bins):.3g}" for number in range(bins)]
    return bars(title, labels, counts)


def _fraction(value: float, low: float, high: float) -> float:
    """How far `value` is from `low` to `high`, 0 to 1; halved first when the span is past the float range."""
    span = high - low
    if math.isinf(span):
        return (value / 2 - low / 2) / (high / 2 - low / 2)
    return (value - low) / span if span else 0.0
