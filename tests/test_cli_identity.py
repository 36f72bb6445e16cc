"""cli/identity.py: comparing run records."""

from __future__ import annotations

from rollfilter.cli.identity import RunRecord, differences


def test_a_larger_r_is_one_that_gives_every_agents_rows_at_least_the_rollouts_they_had():
    recorded = RunRecord(inputs=(), repeats=2, repeats_by_agent={"agent": 4})
    for repeats, by_agent, refused in (
        (2, {"agent": 4}, None),
        (3, {"agent": 5, "new": 2}, None),
        (3, {"new": 1}, "-r: 2 agent=4 then, 3 new=1 now"),
        (5, {}, None),
        (2, {"agent": 3}, "-r: 2 agent=4 then, 2 agent=3 now"),
        (3, {}, "-r: 2 agent=4 then, 3 now"),
        (None, {"agent": 4}, "-r: 2 agent=4 then, agent=4 now"),  # the other agents' rows would fail
    ):
        found = differences(recorded, RunRecord(inputs=(), repeats=repeats, repeats_by_agent=by_agent))
        assert found == ([] if refused is None else [f"{refused} (only a larger -r adds to an output)"])
