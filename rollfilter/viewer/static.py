"""The viewer written as one page (--html): the figures, the pictures, the rollouts' list and their
transcripts, in one HTML file with its style inline and no script, to be opened with no server.
Past `max_rollouts`, a uniform sample of the transcripts is kept, and the page says so."""

from __future__ import annotations

import random

from rollfilter.viewer.catalog import Catalog, Entry
from rollfilter.viewer.page import document, figure_table, text
from rollfilter.viewer.pages import headline, moved_most, pictures, rollout_table, summary_table
from rollfilter.viewer.transcript import transcript

SAMPLE_SEED = 0  # the same files give the same sample, and the same page


def sampled(count: int, most: int) -> list[int]:
    """`most` positions of `count`, drawn uniformly, in file order; all of them when they fit."""
    if count <= most:
        return list(range(count))
    return sorted(random.Random(SAMPLE_SEED).sample(range(count), most))


def _anchor(entry: Entry) -> str:
    return f"#line-{entry.position}"


def _compared(catalog: Catalog) -> str:
    """With a baseline: the comparison as the summary gives it, and the tasks that moved most."""
    if catalog.baseline is None:
        return ""
    moved = "".join(
        f"<tr><td>{task}</td><td>{base:.4g}</td><td>{now:.4g}</td><td>{now - base:+.4g}</td></tr>"
        for task, base, now in moved_most(catalog, catalog.baseline)
    )
    return (
        f"<h2>Compared with the baseline</h2>{figure_table(catalog.summary.get('compare', {}))}"
        f"<h3>The tasks that moved most (mean reward)</h3><table><tr><th>task</th><th>baseline</th>"
        f"<th>this run</th><th>change</th></tr>{moved}</table>"
    )


def static_page(catalog: Catalog, *, max_rollouts: int) -> str:
    """The page of `catalog` (refreshed by the caller), with at most `max_rollouts` transcripts."""
    positions = sampled(len(catalog), max_rollouts)
    kept = (
        f"<p class=note>A uniform sample of {len(positions)} of the {len(catalog)} rollouts is kept here"
        "; the figures and pictures cover them all.</p>"
        if len(positions) < len(catalog)
        else ""
    )
    parts = [
        f"<h1>rollfilter: {len(catalog)} rollouts</h1><p class=note>{text(', '.join(catalog.paths))}</p>",
        headline(catalog.summary),
        pictures(catalog, catalog.summary),
        _compared(catalog),
        f"<details><summary>The whole summary</summary>{summary_table(catalog.summary)}</details>",
        "<h2>Rollouts</h2>",
        kept,
        rollout_table(catalog, positions, link=_anchor),
    ]
    for position in positions:
        entry = catalog.entry(position)
        title = f"task {entry.task}, rollout {entry.rollout}" if entry.task >= 0 else f"line {position}"
        parts.append(
            f'<details id="line-{position}"><summary>{text(title)}</summary>'
            f"{transcript(catalog.record(entry))}</details>"
        )
    return document("rollfilter", "".join(parts), inline_style=True)
