"""spool.py: the on-disk sort of results for /aggregate_metrics."""

from __future__ import annotations

import json
import random


async def test_the_aggregate_spool_hands_out_results_sorted_by_task_and_rollout_from_many_runs():
    from rollfilter.formats.spool import ResultSpool

    pairs = [(task, rollout) for task in [*range(40), "a", "b"] for rollout in range(3)]
    random.Random(3).shuffle(pairs)
    spool = ResultSpool(run_bytes=300)  # a sorted run every few results: many runs to merge
    try:
        for task, rollout in pairs:
            spool.add("agent", {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 1.0, "response": {}})
        body = b"".join([chunk async for chunk in spool.body("agent")])
        assert len(body) == spool.body_size("agent")
        sent = json.loads(body)["verify_responses"]
    finally:
        spool.close()
    expected = [(task, rollout) for task in [*range(40), "a", "b"] for rollout in range(3)]
    assert [(e["_ng_task_index"], e["_ng_rollout_index"]) for e in sent] == expected
