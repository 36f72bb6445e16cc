"""Several replicas of one agent: a killed one costs no row."""

from __future__ import annotations

import pytest

from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    result_lines,
    rows_jsonl,
    simple_rows,
    start,
    summary_of,
    wait_for,
)


@pytest.mark.parametrize("replicas", [2, 3])
def test_replicas_survive_one_killed_mid_run(tmp_path, start_demo, replicas: int):
    servers = [start_demo("--latency", "0.02") for _ in range(replicas)]
    n = 600
    data, out = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    data.write_text(rows_jsonl(simple_rows(n)))
    urls = ",".join(server.base for server in servers)
    proc = start(["-e", f"a={urls}", "-a", "a", "-j", "24", "-o", str(out), str(data)], stdout=None)
    wait_for(lambda: sum(s.stats()["requests"] for s in servers) > 150)
    victim_requests = servers[0].stats()["requests"]
    servers[0].kill()
    _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, stderr
    results = result_lines(out.read_bytes())
    assert sorted(r["_ng_task_index"] for r in results) == list(range(n))  # every row once
    figures = summary_of(stderr)["rollfilter"]
    counts = {entry["url"]: entry for entry in figures["replicas"]}
    assert len(counts) == replicas
    assert counts[servers[0].url]["requests"] >= victim_requests
    assert counts[servers[0].url]["failures"] >= 1  # its rows went to another replica
    survivors = [s.stats()["requests"] for s in servers[1:]]
    assert sum(survivors) + victim_requests >= n
    # Least-outstanding choice over equal replicas spreads the load evenly.
    assert min(survivors) >= 0.5 * max(survivors)
    assert victim_requests >= 0.5 * (150 / replicas)
