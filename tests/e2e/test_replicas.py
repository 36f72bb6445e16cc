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


# --route task: every rollout of a task on one replica, against a stand-in fleet with prefix caches.

import json  # noqa: E402
import threading  # noqa: E402

from tests.conftest import QuietHandler, ThreadedHTTPServer, run  # noqa: E402
from tests.servers.fleet import fleet  # noqa: E402

K = 8


def task_rows(n: int) -> str:
    return rows_jsonl([{"responses_create_params": {"input": f"prompt of task {task}"}} for task in range(n)])


def served_by(stats: list[dict]) -> dict[str, set[int]]:
    """Each task, and the replicas that served it."""
    replicas: dict[str, set[int]] = {}
    for index, replica in enumerate(stats):
        for task in replica["tasks"]:
            replicas.setdefault(task, set()).add(index)
    return replicas


@pytest.mark.parametrize("route", [None, "task", "least-outstanding"])
def test_a_tasks_rollouts_go_to_one_replica_and_share_its_prefix_cache(route: str | None):
    n = 40
    with fleet(replicas=4, slots=8, hit_s=0.01, miss_s=0.04) as stand_in:
        args = ["-e", f"a={','.join(stand_in.urls)}", "-a", "a", "-r", str(K), "-j", "32"]
        proc = run([*args, *(["--route", route] if route else [])], input=task_rows(n))
        assert proc.returncode == 0, proc.stderr
        stats = stand_in.stats()
    assert len(result_lines(proc.stdout)) == n * K
    spread = served_by(stats)
    hits = sum(replica["hits"] for replica in stats) / (n * K)
    replicas = summary_of(proc.stderr)["rollfilter"]["replicas"]
    if route == "least-outstanding":
        assert any(len(where) > 1 for where in spread.values())
        assert "tasks" not in replicas[0]
        return
    assert all(len(where) == 1 for where in spread.values())  # by task, the default with -r 8
    assert hits >= 0.85
    assert sum(replica["tasks"] for replica in replicas) == n


def test_a_replica_that_dies_mid_run_moves_its_tasks_and_costs_no_rollout():
    n = 60
    with fleet(replicas=4, slots=8, hit_s=0.02, miss_s=0.08, deaths={2: 0.3}) as stand_in:
        args = ["-e", f"a={','.join(stand_in.urls)}", "-a", "a", "-r", str(K), "-j", "32", "--route", "task"]
        proc = run(args, input=task_rows(n))
        stats = stand_in.stats()
    assert proc.returncode == 0, proc.stderr
    pairs = [(line["_ng_task_index"], line["_ng_rollout_index"]) for line in result_lines(proc.stdout)]
    assert sorted(pairs) == [(task, rollout) for task in range(n) for rollout in range(K)]  # each exactly once
    assert stats[2].get("down")
    replicas = summary_of(proc.stderr)["rollfilter"]["replicas"]
    assert replicas[2]["tasks_moved_for_failure"] >= 1
    assert replicas[2]["failures"] >= 1


@pytest.mark.parametrize("route", ["task", "least-outstanding"])
def test_a_replica_that_blips_gets_its_share_again_once_back(route: str):
    n = 500
    with fleet(replicas=3, slots=8, hit_s=0.01, miss_s=0.04, blips={1: (0.3, 0.6)}) as stand_in:
        args = ["-e", f"a={','.join(stand_in.urls)}", "-a", "a", "-r", "4", "-j", "32", "--route", route]
        proc = run(args, input=task_rows(n))
        stats = stand_in.stats()
    assert proc.returncode == 0, proc.stderr
    pairs = [(line["_ng_task_index"], line["_ng_rollout_index"]) for line in result_lines(proc.stdout)]
    assert sorted(pairs) == [(task, rollout) for task in range(n) for rollout in range(4)]  # each exactly once
    assert stats[1]["requests_since_back"] > 0.1 * sum(replica["requests"] for replica in stats)
    assert summary_of(proc.stderr)["rollfilter"]["replicas"][1]["failures"] >= 1


class HeaderRecorder(ThreadedHTTPServer):
    """An agent that answers every /run and records the value of one header, by task."""

    def __init__(self, name: str) -> None:
        self.seen: list[tuple[int, str | None]] = []
        lock = threading.Lock()
        recorder = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                row = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                with lock:
                    recorder.seen.append((row["_ng_task_index"], self.headers.get(name)))
                self.send_json(200, b'{"reward": 1.0}')

        super().__init__(Handler)


def test_the_affinity_header_carries_one_value_a_task_the_same_in_every_run():
    recorder = HeaderRecorder("X-Session-ID")
    try:
        url = recorder.url + "/run"
        for _ in range(2):
            proc = run(["-u", url, "-r", "3", "--affinity-header", "X-Session-ID"], input=task_rows(5))
            assert proc.returncode == 0, proc.stderr
    finally:
        recorder.close()
    values: dict[int, set[str | None]] = {}
    for task, value in recorder.seen:
        values.setdefault(task, set()).add(value)
    assert len(recorder.seen) == 2 * 5 * 3
    assert all(len(found) == 1 and None not in found for found in values.values())  # one value, both runs
    assert len({next(iter(found)) for found in values.values()}) == 5  # distinct across tasks


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--route", "random"], "the policies are task and least-outstanding"),
        (["--affinity-header", "Session ID"], "not an HTTP header name"),
        (["--affinity-header", "Content-Length"], "every request carries Content-Length already"),
        (["--affinity-header", "X-Run", "-H", "X-Run: 1"], "--affinity-header X-Run: -H sets it already"),
        (["--affinity-header", "x-session-id", "-H", "X-Session-ID: 1"], "leave it out of -H"),
    ],
)
def test_route_options_that_cannot_work_exit_2_in_one_line(args: list[str], said: str):
    recorder = HeaderRecorder("X-Run")
    try:
        proc = run(["-u", recorder.url + "/run", *args], input=task_rows(1))
    finally:
        recorder.close()
    assert proc.returncode == 2
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1
    assert said in lines[0]
    assert lines[0].lower().count("x-session-id") <= 1  # never the header refused as what to give instead
    assert recorder.seen == []
