import math
import re

from rollfilter.viewer.pictures import bars, histogram


def bar_titles(svg: str) -> list[str]:
    return re.findall(r"<title>([^<]*)</title>", svg)


def test_whole_numbers_get_a_bin_each_and_nan_is_left_out():
    svg = histogram("tool calls", [0, 0, 2, 1, 0, math.nan], whole=True)
    assert bar_titles(svg) == ["0: 3 rollouts", "1: 1 rollouts", "2: 1 rollouts"]


def test_reals_are_binned_between_their_least_and_greatest():
    titles = bar_titles(histogram("reward", [0.0, 0.0, 1.0, 0.5]))
    assert len(titles) == 20
    assert (titles[0], titles[10], titles[-1]) == ("0: 2 rollouts", "0.5: 1 rollouts", "0.95: 1 rollouts")


def test_nothing_to_draw_draws_nothing():
    assert histogram("reward", [math.nan]) == ""


def test_labels_are_text():
    svg = bars("<b>", ["<i>"], [1])
    assert "<b>" not in svg
    assert "<i>" not in svg
    assert "&lt;i&gt;: 1 rollouts" in svg


def test_rewards_at_both_float_limits_are_binned():
    titles = bar_titles(histogram("reward", [-1e308, 0.0, 1e308, 1e308]))
    assert len(titles) == 20
    assert (titles[0], titles[10], titles[-1]) == ("-1e+308: 1 rollouts", "0: 1 rollouts", "9e+307: 2 rollouts")
