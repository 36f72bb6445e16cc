"""The viewer's pages, rendered from a `Catalog`: the run's figures and pictures with the rollouts
a page at a time (`index_page`), one rollout's transcript (`rollout_page`), and with a baseline
the comparison (`compare_page`, `compare_task_page`). The figures shown are the summary's own."""

from __future__ import annotations

import math
from typing import Any

from rollfilter.viewer.catalog import NO_INDEX, Catalog, Entry
from rollfilter.viewer.page import document, figure_table, text, url_part
from rollfilter.viewer.pictures import bars, histogram
from rollfilter.viewer.query import PAGE_SIZE, Query
from rollfilter.viewer.transcript import transcript

MOVED_MOST = 20  # tasks shown on the comparison page
SORT_LABELS = (
    *(("", "file order"), ("reward", "reward, low first"), ("-reward", "reward, high first")),
    *(("tokens", "tokens, few first"), ("-tokens", "tokens, many first"), ("task", "task")),
)


def headline(summary: dict[str, Any]) -> str:
    """The figures a reader looks for first, as the summary gives them: the rollouts counted, the
    means with their 95% intervals, failures by kind, masked and unhealthy counts."""
    own = summary.get("rollfilter", {})
    cards = [("succeeded", own.get("succeeded")), ("failed", own.get("failed"))]
    intervals = summary.get("ci95", {})
    for name, value in summary.items():
        if name == "reward" or name.startswith(("mean@", "pass@")):
            interval = intervals.get(name)
            shown = _figure(value) + (f" [{_figure(interval[0])}, {_figure(interval[1])}]" if interval else "")
            cards.append((name, shown))
    cards += [("masked", own["masked"])] if own.get("masked") else []
    health = own.get("health")
    if isinstance(health, dict) and health.get("unhealthy"):
        cards.append(("unhealthy", health["unhealthy"]))
    cards += [(f"failed: {kind}", count) for kind, count in own.get("failed_by_kind", {}).items()]
    return (
        '<div class="cards">'
        + "".join(f'<div class="card"><b>{text(_figure(value))}</b>{text(name)}</div>' for name, value in cards)
        + "</div>"
    )


def _figure(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else "-" if value is None else str(value)


def pictures(catalog: Catalog, summary: dict[str, Any]) -> str:
    """The reward histogram, the pass histogram (the summary's), output tokens and tool calls a
    rollout, and the mean reward by the policy version a rollout was sent under."""
    charts = [histogram("reward", catalog.column("reward"))]
    passed = summary.get("pass_histogram")
    if isinstance(passed, list) and passed:
        labels = [str(number) for number in range(len(passed))]
        charts.append(bars("tasks by rollouts that passed (pass_histogram)", labels, passed, unit="tasks"))
    charts.append(histogram("output tokens a rollout", catalog.column("tokens"), whole=True))
    charts.append(histogram("tool calls a rollout", catalog.column("tool_calls"), whole=True))
    charts.append(_by_version(catalog))
    return '<div class="charts">' + "".join(charts) + "</div>"


def _by_version(catalog: Catalog) -> str:
    versions, rewards = catalog.column("version"), catalog.column("reward")
    if max(versions, default=NO_INDEX) == NO_INDEX:  # no policy version at all: said at C speed
        return ""
    sums: dict[int, list[float]] = {}
    for version, reward in zip(versions, rewards, strict=True):
        if version != NO_INDEX and not math.isnan(reward):
            pair = sums.setdefault(version, [0.0, 0.0])
            pair[0] += reward
            pair[1] += 1
    if not sums:
        return ""
    ordered = sorted(sums)
    means = [sums[version][0] / sums[version][1] for version in ordered]
    return bars("mean reward by policy version", [str(v) for v in ordered], means, unit="mean reward")


def index_page(catalog: Catalog, query: Query, *, compare: bool) -> str:
    """`/`: the figures, the pictures, the filters and a page of the rollouts they keep."""
    summary = catalog.summary
    positions = query.positions(catalog)
    start = query.page * PAGE_SIZE
    shown = positions[start : start + PAGE_SIZE]
    files = ", ".join(catalog.paths)
    parts = [
        f"<h1>rollfilter: {len(catalog)} rollouts</h1><p class=note>{text(files)}</p>",
        headline(summary),
        "".join(f"<p class=failed>{text(problem)}</p>" for problem in catalog.problems),
        '<p><a href="/compare">compared with the baseline</a></p>' if compare else "",
        catalog.drawing("pictures", lambda: pictures(catalog, summary)),
        _filters(query, catalog),
        f"<p>{len(positions)} rollouts kept; {start + 1 if shown else 0} to {start + len(shown)} shown.</p>",
        rollout_table(catalog, shown),
        _pages(query, len(positions)),
        f"<details><summary>The whole summary</summary>{summary_table(summary)}</details>",
    ]
    return document("rollfilter", "".join(parts))


def summary_table(summary: dict[str, Any]) -> str:
    return f'<table class="figures">{figure_table(summary)[len("<table>") : -len("</table>")]}</table>'


def _filters(query: Query, catalog: Catalog) -> str:
    def field(name: str, label: str, value: object, kind: str = "text") -> str:
        shown = "" if value is None else value
        return f'<label>{text(label)}<input type="{kind}" name="{name}" value="{text(shown)}"></label>'

    def check(name: str, label: str, on: bool) -> str:
        checked = " checked" if on else ""
        return f'<label>{text(label)}<input type="checkbox" name="{name}" value="1"{checked}></label>'

    options = "".join(
        f'<option value="{key}"{" selected" if query.sort == key else ""}>{label}</option>'
        for key, label in SORT_LABELS
    )
    return (
        '<form class="filters" method="get" action="/">'
        + field("q", "text", query.q)
        + field("task", "task", query.task)
        + field("min_reward", "min reward", query.min_reward)
        + field("max_reward", "max reward", query.max_reward)
        + field("agent", "agent", query.agent)
        + check("failed", "failed", query.failed)
        + check("unhealthy", "unhealthy", query.unhealthy)
        + f'<label>sort<select name="sort">{options}</select></label>'
        + '<button type="submit">filter</button> <a href="/">clear</a></form>'
    )


def _pages(query: Query, count: int) -> str:
    last = max((count - 1) // PAGE_SIZE, 0)
    links = []
    if query.page > 0:
        links.append(f'<a rel="prev" href="{text(query.url(page=query.page - 1))}">previous</a>')
    if query.page < last:
        links.append(f'<a rel="next" href="{text(query.url(page=query.page + 1))}">next</a>')
    return f"<p>page {query.page + 1} of {last + 1} {' '.join(links)}</p>"


def rollout_link(entry: Entry, *, first: bool = True) -> str:
    """/rollout/TASK/ROLLOUT, or /line/POSITION for a line without them or one whose pair an
    earlier line has (`first` False): that URL shows the earlier one."""
    if entry.task != NO_INDEX and entry.rollout != NO_INDEX and first:
        return f"/rollout/{entry.task}/{entry.rollout}"
    return f"/line/{entry.position}"


def _links(catalog: Catalog, positions: list[int]) -> Any:
    """The link of each line at `positions`: `rollout_link`, told which lines are their pair's first."""
    firsts = catalog.first_of_pairs(positions)
    return lambda entry: rollout_link(entry, first=entry.position in firsts)


def rollout_table(catalog: Catalog, positions: list[int], *, link: Any = None) -> str:
    """A row a rollout: task, rollout, agent, reward, output tokens, tool calls, verdicts, linked."""
    link = link or _links(catalog, positions)
    rows = []
    for position in positions:
        entry = catalog.entry(position)
        marks = " ".join(word for word, on in (("failed", entry.failed), ("unhealthy", entry.unhealthy)) if on)
        task = entry.task if entry.task != NO_INDEX else "-"
        rollout = entry.rollout if entry.rollout != NO_INDEX else "-"
        reward = "-" if math.isnan(entry.reward) else f"{entry.reward:g}"
        rows.append(
            f'<tr><td><a href="{text(link(entry))}">{task}/{rollout}</a></td><td>{text(entry.agent)}</td>'
            f"<td>{reward}</td><td>{entry.tokens}</td><td>{entry.tool_calls}</td>"
            f'<td class="failed">{marks}</td></tr>'
        )
    head = "<tr><th>task/rollout</th><th>agent</th><th>reward</th><th>output tokens</th><th>tool calls</th><th></th>"
    return f'<table class="rollouts">{head}</tr>{"".join(rows)}</table>'


def rollout_page(catalog: Catalog, entry: Entry, beside: Entry | None = None) -> str:
    """A rollout's transcript, the task's other rollouts a click away, and one of them beside it."""
    others = [p for p in catalog.positions_of_task(entry.task) if p != entry.position] if entry.task >= 0 else []
    title = f"task {entry.task}, rollout {entry.rollout}" if entry.task >= 0 else f"line {entry.position}"
    raw = f"/raw/{entry.position}"
    parts = [f'<p><a href="/">all rollouts</a></p><h1>{text(title)}</h1>', _entry_line(entry)]
    if others:
        link = _links(catalog, others[:100])
        links = " ".join(
            f'<a href="{text(link(catalog.entry(p)))}">{catalog.entry(p).rollout}</a>'
            f' (<a href="{text(rollout_link(entry))}?beside={catalog.entry(p).rollout}">beside</a>)'
            for p in others[:100]
        )
        parts.append(f"<p>The task's other rollouts: {links}</p>")
    body = transcript(catalog.record(entry))
    if beside is not None:
        other = transcript(catalog.record(beside))
        parts.append(
            f'<div class="side"><div><h2>rollout {entry.rollout}</h2>{body}</div>'
            f"<div><h2>rollout {beside.rollout}</h2>{other}</div></div>"
        )
    else:
        parts.append(body)
    parts.append(f'<p><a href="{raw}">the raw JSON line</a></p>')
    return document(title, "".join(parts))


def _entry_line(entry: Entry) -> str:
    reward = "-" if math.isnan(entry.reward) else f"{entry.reward:g}"
    marks = ", ".join(word for word, on in (("failed", entry.failed), ("unhealthy", entry.unhealthy)) if on)
    agent = f"agent {text(entry.agent)}, " if entry.agent else ""
    return f"<p>{agent}reward {reward}, {entry.tokens} output tokens, {entry.tool_calls} tool calls {marks}</p>"


def compare_page(catalog: Catalog) -> str:
    """The paired comparison as --compare gives it (the summary's), and the tasks that moved most."""
    assert catalog.baseline is not None
    compared = catalog.summary.get("compare", {})
    moved = moved_most(catalog, catalog.baseline)
    rows = "".join(
        f'<tr><td><a href="/compare/{task}">{task}</a></td><td>{base:.4g}</td><td>{now:.4g}</td>'
        f"<td>{now - base:+.4g}</td></tr>"
        for task, base, now in moved
    )
    parts = [
        '<p><a href="/">all rollouts</a></p><h1>Compared with the baseline</h1>',
        f"<p class=note>baseline: {text(', '.join(catalog.baseline.paths))}</p>",
        f'<table class="figures">{figure_table(compared)[7:-8]}</table>' if compared else "<p>no task paired</p>",
        "<h2>The tasks that moved most (mean reward)</h2>",
        f"<table><tr><th>task</th><th>baseline</th><th>this run</th><th>change</th></tr>{rows}</table>",
    ]
    return document("rollfilter: compared", "".join(parts))


def moved_most(catalog: Catalog, baseline: Catalog) -> list[tuple[int, float, float]]:
    """The tasks of both runs whose mean reward changed most: task, baseline's mean, this run's.
    A picture of the rollouts, not a figure of the run's: --compare's figures are the summary's."""
    ours, theirs = _task_means(catalog), _task_means(baseline)
    paired = [(task, theirs[task], mean) for task, mean in ours.items() if task in theirs]
    paired.sort(key=lambda row: -abs(row[2] - row[1]))
    return paired[:MOVED_MOST]


def _task_means(catalog: Catalog) -> dict[int, float]:
    sums: dict[int, list[float]] = {}
    for task, reward in zip(catalog.column("task"), catalog.column("reward"), strict=True):
        if task != NO_INDEX and not math.isnan(reward):
            pair = sums.setdefault(task, [0.0, 0.0])
            pair[0] += reward
            pair[1] += 1
    return {task: total / count for task, (total, count) in sums.items()}


def compare_task_page(catalog: Catalog, task: int) -> str:
    """A task's rollouts in both runs, side by side."""
    assert catalog.baseline is not None
    columns = []
    for name, source in (("baseline", catalog.baseline), ("this run", catalog)):
        items = []
        for position in source.positions_of_task(task):
            entry = source.entry(position)
            items.append(f"<h3>rollout {entry.rollout}</h3>{_entry_line(entry)}{transcript(source.record(entry))}")
        columns.append(f"<div><h2>{text(name)}</h2>{''.join(items) or '<p>no rollout</p>'}</div>")
    body = f'<p><a href="/compare">the comparison</a></p><h1>task {task}</h1><div class="side">{"".join(columns)}</div>'
    return document(f"task {task}, compared", body)


def link_to(path: str, value: object) -> str:
    return f"{path}/{url_part(value)}"
