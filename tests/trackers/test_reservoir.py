"""trackers/reservoir.py: a uniform sample of at most N results."""

from __future__ import annotations

import collections

from rollfilter.trackers.reservoir import Reservoir


def test_it_keeps_at_most_its_size_and_every_result_while_there_are_fewer():
    reservoir = Reservoir(3, seed=1)
    for number in range(2):
        reservoir.add({"n": number})
    assert reservoir.kept == [{"n": 0}, {"n": 1}]
    for number in range(2, 1000):
        reservoir.add({"n": number})
    assert len(reservoir.kept) == 3
    assert reservoir.seen == 1000


def test_each_result_is_as_likely_to_be_kept_as_any_other():
    kept: collections.Counter[int] = collections.Counter()
    for seed in range(2000):
        reservoir = Reservoir(2, seed=seed)
        for number in range(10):
            reservoir.add({"n": number})
        kept.update(result["n"] for result in reservoir.kept)
    # Each of the 10 is kept 2 times in 10: 400 of 2000 runs, give or take the chance of it.
    assert all(300 < kept[number] < 500 for number in range(10)), kept


def test_a_reservoir_of_none_keeps_none():
    reservoir = Reservoir(0)
    reservoir.add({"n": 1})
    assert reservoir.kept == []
