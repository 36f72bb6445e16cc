"""cli/chart.py: the pass histogram and the comparison, for a person at a terminal."""

from __future__ import annotations

import os
import pty

from rollfilter.cli.chart import MOST_BARS, MOST_COMPARED, chart_lines, compare_table
from rollfilter.cli.environment import Environment


def test_the_comparison_as_a_short_table():
    compare = {
        "reward": {
            "difference": 0.037,
            "stderr": 0.016,
            "ci95": [0.005, 0.069],
            "p_value": 0.022,
            "test": "t",
            "detectable": 0.045,
            "improved": 95,
            "worsened": 70,
            "tied": 130,
            "tasks": 295,
        },
        "turns": {
            "difference": None,
            "stderr": None,
            "ci95": None,
            "p_value": None,
            "test": "t",
            "detectable": None,
            "improved": 0,
            "worsened": 0,
            "tied": 0,
            "tasks": 0,
        },
    }
    assert compare_table(compare) == [
        "this run minus the baseline, task by task:",
        "          difference  95% interval      p          detectable  better  worse  tied  tasks",
        "  reward  +0.037      +0.005 to +0.069  0.022 (t)  0.045       95      70     130   295",
        "  turns   -           -                 -          -           0       0      0     0",
    ]


def can_draw(stderr: int) -> bool:
    return Environment.of_descriptors(stderr=stderr, variables={"TERM": "xterm"}).stderr_can_draw


def test_the_table_is_drawn_for_a_terminal_only():
    reward = {"difference": 0.5, "stderr": None, "ci95": None, "p_value": 1.0, "test": "sign"}
    summary = {"compare": {"reward": {**reward, "improved": 1, "worsened": 0, "tied": 0, "tasks": 1}}}
    controller, terminal = pty.openpty()
    try:
        assert chart_lines(summary, can_draw=can_draw(terminal))[0] == "this run minus the baseline, task by task:"
    finally:
        os.close(controller)
        os.close(terminal)
    read_end, write_end = os.pipe()
    try:
        assert chart_lines(summary, can_draw=can_draw(write_end)) == []
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_histogram_of_no_group_is_not_drawn():
    assert chart_lines({"pass_histogram": [0, 0, 0, 0, 0]}, can_draw=True) == []
    assert chart_lines({"pass_histogram": [0, 1, 0]}, can_draw=True)[0].endswith("(pass_histogram):")


def test_a_histogram_of_many_rollouts_a_task_and_a_comparison_of_many_fields_stay_short():
    histogram = [0] * 1025
    histogram[0], histogram[500], histogram[1024] = 2, 1, 3
    chart = chart_lines({"pass_histogram": histogram}, can_draw=True)
    assert len(chart) == 1 + MOST_BARS
    assert [line.split()[:2] for line in (chart[1], chart[-1])] == [["0", "2"], ["1024", "3"]]
    assert sum(int(line.split()[1]) for line in chart[1:]) == 6  # every group in some bar
    assert [line.split()[0] for line in chart[2:4]] == ["1-69", "70-138"]  # ranges of one width
    assert chart[-2].split()[0] == "967-1023"
    widths = [len(line) for line in chart_lines({"pass_histogram": [1] * 21}, can_draw=True)[2:-2]]
    assert len(set(widths)) == 1  # -r 20: each range two bins wide, its bar as long as the others
    figures = {"difference": 0.0, "stderr": 0.0, "ci95": [0.0, 0.0], "p_value": 1.0, "test": "t"}
    figures |= {"detectable": 0.0, "improved": 0, "worsened": 0, "tied": 20, "tasks": 20}
    table = compare_table({f"f{number}": figures for number in range(30)})
    assert len(table) == 2 + MOST_COMPARED + 1
    assert table[-1] == f"  ({30 - MOST_COMPARED} more in the whole summary)"
