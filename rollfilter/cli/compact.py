"""The summary for a person at a terminal: a few lines read at a glance, in place of the whole
JSON object (which a pipe, a file and `--metrics` still get whole).

It renders the summary object and nothing else: every figure here is one of the summary's, found
by its key, and a block the summary lacks (groups, cost, health) is a line left out. Its lines
never pass `MOST_LINES`, so the headline stays on the screen whatever the run held.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollfilter.redact import printable

MOST_LINES = 25
_MOST_PASS_ROWS = 6  # pass@k rows kept: the first ones and K; the whole summary has every k
_MOST_FIELD_ROWS = 4  # other result fields' rows, after the reward's figures
_FIGURE_DIGITS = 4  # significant digits of a mean shown: the interval beside it says how many hold
_WIDEST = 100  # a line of named figures (reward components, checks) is cut here


def compact_summary(summary: Mapping[str, Any], *, whole_at: str | None) -> list[str]:
    """The lines of `summary` for a person (see the module docstring); `whole_at` is the file that
    holds the whole summary (--metrics), None when none does."""
    figures = summary.get("rollfilter", {})
    lines = [_headline(figures), *_means_table(summary)]
    lines += _named_line("reward components", summary.get("reward_components"))
    lines += _health_lines(figures.get("health"))
    lines += _groups_line(figures.get("groups"))
    lines += _usage_line(summary.get("usage"), figures)
    lines += _time_line(figures)
    if whole_at is not None:
        lines.append(f"the whole summary (one JSON line): {whole_at}")
    else:
        lines.append("the whole summary: --metrics FILE, or standard error to a file or a pipe (one JSON line)")
    return lines[: MOST_LINES - 1] + lines[-1:] if len(lines) > MOST_LINES else lines


def _headline(figures: Mapping[str, Any]) -> str:
    """The rollouts and how they ended: succeeded, failed (by kind), and the other ends there were."""
    expected, failed = figures.get("expected"), figures.get("failed", 0)
    ended = figures.get("succeeded", 0) + failed + figures.get("not_persisted", 0)
    counted = f"{ended:,} of {expected:,} rollouts" if expected is not None else f"{ended:,} rollouts"
    parts = [f"{figures.get('succeeded', 0):,} succeeded", f"{failed:,} failed"]
    kinds = figures.get("failed_by_kind") or {}
    if kinds:
        parts[-1] += " (" + ", ".join(f"{kind} {count:,}" for kind, count in kinds.items()) + ")"
    for key, said in (
        ("would_send", "would be sent"),
        ("masked", "masked"),
        ("not_persisted", "not kept (_ng_no_persist)"),
        ("skipped", "done before (--resume)"),
        ("retries", "retries"),
        ("cancelled", "cancelled"),
        ("not_started", "not started"),
    ):
        count = figures.get(key)
        if count:
            parts.append(f"{count:,} {said}")
    return f"{counted}: {', '.join(parts)}"


def _means_table(summary: Mapping[str, Any]) -> list[str]:
    """A row a mean: the reward, mean@K and pass@k, then a few other fields, each with its 95%
    interval and what it is over; a line says how many more the whole summary has."""
    ci95, sizes = summary.get("ci95", {}), summary.get("sample_size", {})
    keys = [key for key in summary if _is_mean(key, summary[key], sizes)]
    passes = [key for key in keys if key.startswith("pass@")]
    if len(passes) > _MOST_PASS_ROWS:
        passes = passes[: _MOST_PASS_ROWS - 1] + passes[-1:]
    fields = [key for key in keys if key != "reward" and not key.startswith(("mean@", "pass@"))]
    shown = [
        *(key for key in keys if key == "reward"),
        *(key for key in keys if key.startswith("mean@")),
        *passes,
        *fields[:_MOST_FIELD_ROWS],
    ]
    rows = [("", "mean", "95% interval", "tasks", "rollouts")]
    for key in shown:
        value, interval, size = summary.get(key), ci95.get(key), sizes.get(key) or {}
        rows.append(
            (
                printable(key),  # a result's field, named by the agent: no control character reaches the terminal
                "-" if value is None else f"{value:.{_FIGURE_DIGITS}g}",
                "-" if not isinstance(interval, list) else f"{interval[0]:g} to {interval[1]:g}",
                _count(size.get("tasks")),
                _count(size.get("rollouts")),
            )
        )
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    lines = ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]
    left_out = len(set(keys) - set(shown))
    if left_out:
        lines.append(f"  ({left_out} more in the whole summary)")
    return lines


def _is_mean(key: str, value: Any, sizes: Mapping[str, Any]) -> bool:
    """Whether the summary's `key` is a mean: a number with its sample size beside it (reward,
    mean@K, pass@k, the result fields'; a count the summary adds at the top is none), or the
    reward, always there (null when no result carried one)."""
    return key == "reward" or (type(value) in (int, float) and key in sizes)


def _count(value: Any) -> str:
    return "-" if value is None else f"{value:,}"


def _named_line(title: str, named: Any) -> list[str]:
    """`title: a 0.5, b 1` for a mapping of names to figures, cut to a line; none for no mapping."""
    if not isinstance(named, Mapping) or not named:
        return []
    line = f"{title}: " + ", ".join(f"{printable(str(name))} {_figure(value)}" for name, value in named.items())
    return [line if len(line) <= _WIDEST else line[: _WIDEST - 3] + "..."]


def _figure(value: Any) -> str:
    return f"{value:.{_FIGURE_DIGITS}g}" if type(value) is float else str(value)


def _health_lines(health: Any) -> list[str]:
    """The health block, when the summary has one and a rollout was unhealthy: the count, the
    tasks with no healthy rollout, and the checks that said so."""
    if not isinstance(health, Mapping) or not health.get("unhealthy"):
        return []
    line = f"unhealthy: {health['unhealthy']:,} rollouts"
    if health.get("tasks_all_unhealthy"):
        line += f", {health['tasks_all_unhealthy']:,} tasks with no healthy one"
    checks = health.get("by_check")
    if isinstance(checks, Mapping) and checks:
        line += " (" + ", ".join(f"{name} {count}" for name, count in checks.items()) + ")"
    return [line if len(line) <= _WIDEST else line[: _WIDEST - 3] + "..."]


def _groups_line(groups: Any) -> list[str]:
    if not isinstance(groups, Mapping):
        return []
    fates = [(key, value) for key, value in groups.items() if isinstance(value, int)]
    said = [f"{value:,} {key.replace('_', ' ')}" for key, value in fates if value or key == "kept"]
    return [f"groups: {', '.join(said)}"]


def _usage_line(usage: Any, figures: Mapping[str, Any]) -> list[str]:
    """Tokens a rollout, and what the run cost (with prices)."""
    parts = []
    if isinstance(usage, Mapping) and ("input_tokens" in usage or "output_tokens" in usage):
        tokens = [f"{usage[key]:,.0f} {key.split('_')[0]}" for key in ("input_tokens", "output_tokens") if key in usage]
        parts.append(f"tokens a rollout: {', '.join(tokens)}")
    if figures.get("cost_usd") is not None:
        parts.append(f"cost ${figures['cost_usd']:,.4f}")
    return ["; ".join(parts)] if parts else []


def _time_line(figures: Mapping[str, Any]) -> list[str]:
    """How long the run took and how fast it went; none for a run that timed nothing."""
    if "elapsed_s" not in figures:
        return []
    line = f"{figures['elapsed_s']:g} s, {figures['rows_per_s']:,g} rollouts/s"
    latency = figures.get("latency_s")
    if isinstance(latency, Mapping):
        line += f", latency p50 {latency['p50']:g} s, p99 {latency['p99']:g} s"
    return [line]
