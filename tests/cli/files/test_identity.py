"""cli/files/identity.py: comparing run records."""

from __future__ import annotations

import pytest

from rollfilter.cli.files.identity import (
    InputDigest,
    RunRecord,
    check_sibling_shards,
    differences,
    is_record_name,
    record_path,
    write_record,
)
from rollfilter.errors import UsageError


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


def test_a_record_is_named_for_the_whole_name_of_its_output(tmp_path):
    assert record_path(str(tmp_path / "a.jsonl")) != record_path(str(tmp_path / "a.json"))
    assert record_path(str(tmp_path / "a.jsonl")) == str(tmp_path / "a.jsonl.run.json")
    assert is_record_name(str(tmp_path / "a.jsonl.run.json"))
    assert not is_record_name(str(tmp_path / "a.jsonl"))
    assert not is_record_name(".run.json")
    (tmp_path / "link").symlink_to(tmp_path / "b.jsonl.run.json")
    assert is_record_name(str(tmp_path / "link"))  # by the file it names too


def test_a_shard_auto_makes_is_checked_against_the_shards_of_the_same_run_beside_it(tmp_path):
    digest = (InputDigest("data.jsonl", "ab" * 32),)
    shard = {index: RunRecord(inputs=digest, shard=(index, 4)) for index in range(4)}
    for index in (0, 1):
        write_record(str(tmp_path / f"shard-{index}.jsonl.run.json"), shard[index])
    write_record(
        str(tmp_path / "other.jsonl.run.json"), RunRecord(inputs=(InputDigest("x.jsonl", "cd" * 32),), shard=(0, 2))
    )
    check_sibling_shards(shard[2], str(tmp_path / "shard-2.jsonl.run.json"))  # one of the same four
    own = str(tmp_path / "shard-2.jsonl.run.json")
    with pytest.raises(UsageError, match=r"shard 0/2, but .*shard-0.jsonl is shard 0/4 of the same run"):
        check_sibling_shards(RunRecord(inputs=digest, shard=(0, 2)), own)
    with pytest.raises(UsageError, match=r"shard 1/4, which .*shard-1.jsonl holds already"):
        check_sibling_shards(shard[1], own)
    check_sibling_shards(RunRecord(inputs=digest, shard=(0, 2), repeats=3), own)  # another run: -r differs
