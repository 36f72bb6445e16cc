"""cli/chart.py: the pass histogram and the comparison, for a person at a terminal."""

from __future__ import annotations

from rollfilter.cli.chart import compare_table


def test_the_comparison_as_a_short_table():
    compare = {
        "reward": {
            "difference": 0.037,
            "stderr": 0.016,
            "ci95": [0.005, 0.069],
            "p_value": 0.022,
            "test": "t",
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
            "improved": 0,
            "worsened": 0,
            "tied": 0,
            "tasks": 0,
        },
    }
    assert compare_table(compare) == [
        "this run minus the baseline, task by task:",
        "          difference  95% interval      p          better  worse  tied  tasks",
        "  reward  +0.037      +0.005 to +0.069  0.022 (t)  95      70     130   295",
        "  turns   -           -                 -          0       0      0     0",
    ]
