"""--shard: every task in exactly one shard, by the row's own task index."""

from __future__ import annotations

import random
from collections import Counter

from tests.conftest import (
    DemoServer,
    clean_env,
    documented_shard,
    result_lines,
    rows_jsonl,
    run,
    simple_rows,
    task_indices,
)


def test_string_task_indices_split_across_processes_cover_every_task_once(tmp_path, demo_server: DemoServer):
    rows = [{**row, "_ng_task_index": f"task-{row['id']}"} for row in simple_rows(40)]
    assert any(documented_shard(row["_ng_task_index"], 3) != line % 3 for line, row in enumerate(rows))
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(rows))
    pairs: Counter[tuple[str, int]] = Counter()
    for shard in range(3):
        # Each process hashes strings with its own seed: a shard chosen by hash() would differ.
        env = clean_env(PYTHONHASHSEED=str(shard + 1))
        proc = run(["-u", demo_server.url, "-r", "2", "--shard", f"{shard}/3", str(data)], env=env)
        assert proc.returncode == 0, proc.stderr
        results = result_lines(proc.stdout)
        expected = {row["_ng_task_index"] for row in rows if documented_shard(row["_ng_task_index"], 3) == shard}
        assert {r["_ng_task_index"] for r in results} == expected
        pairs.update((r["_ng_task_index"], r["_ng_rollout_index"]) for r in results)
    assert sorted(pairs) == sorted((row["_ng_task_index"], k) for row in rows for k in range(2))
    assert set(pairs.values()) == {1}


def test_shards_follow_the_rows_own_task_index_not_the_line(tmp_path, demo_server: DemoServer):
    indices = [100 + 7 * i for i in range(30)]
    random.Random(3).shuffle(indices)
    rows = [{**row, "_ng_task_index": index} for row, index in zip(simple_rows(30), indices, strict=True)]
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(rows))
    seen: list[int] = []
    for shard in range(3):
        proc = run(["-u", demo_server.url, "--shard", f"{shard}/3", str(data)])
        assert proc.returncode == 0, proc.stderr
        assert sorted(task_indices(proc.stdout)) == sorted(i for i in indices if i % 3 == shard)
        seen += task_indices(proc.stdout)
    assert sorted(seen) == sorted(indices)


def test_three_shards_partition_the_job(tmp_path, demo_server: DemoServer):
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(simple_rows(50)))
    whole = run(["-u", demo_server.url, "-r", "2", str(data)])
    parts = [run(["-u", demo_server.url, "-r", "2", "--shard", f"{i}/3", str(data)]) for i in range(3)]
    key = lambda r: (r["_ng_task_index"], r["_ng_rollout_index"], r["reward"])  # noqa: E731
    shard_sets = [{key(r) for r in result_lines(p.stdout)} for p in parts]
    for i, shard in enumerate(shard_sets):
        assert shard
        assert all(task % 3 == i for task, _, _ in shard)
    assert sum(len(s) for s in shard_sets) == len(set().union(*shard_sets))  # disjoint
    assert set().union(*shard_sets) == {key(r) for r in result_lines(whole.stdout)}
