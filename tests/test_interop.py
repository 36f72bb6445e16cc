"""NeMo Gym interop and scale-out: head-server names, replicas, shards, pass@k, recompute."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    QuietHandler,
    ThreadedHTTPServer,
    clean_env,
    result_lines,
    rows_jsonl,
    run,
    simple_rows,
    start,
    summary_of,
    wait_for,
)

CONFIG = Path(__file__).parent / "data" / "global_config_dict.yaml"
AGENT = "example_single_tool_call_simple_agent"
SECRET = "dummy-key"  # policy_api_key in the config: must never be printed


class HeadServer(ThreadedHTTPServer):
    """A stand-in NeMo Gym head server: GET /global_config_dict_yaml answers a JSON string of YAML."""

    def __init__(self, config: dict) -> None:
        body = json.dumps(yaml.safe_dump(config)).encode()
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                server.headers.append(dict(self.headers))
                if self.path != "/global_config_dict_yaml":
                    self.send_error(404)
                    return
                self.send_json(200, body)

        super().__init__(Handler)


@pytest.fixture
def head_server(demo_server: DemoServer) -> Iterator[HeadServer]:
    config = yaml.safe_load(CONFIG.read_text())
    config[AGENT]["responses_api_agents"]["simple_agent"]["port"] = demo_server.port
    config["agent_without_address"] = {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}}
    server = HeadServer(config)
    try:
        yield server
    finally:
        server.close()


def test_head_server_resolves_agent_names(head_server: HeadServer, demo_server: DemoServer):
    rows = [{**row, "agent_ref": {"type": "responses_api_agents", "name": AGENT}} for row in simple_rows(6)]
    rows.append({"responses_create_params": {"input": "x"}, "agent_ref": {"name": "no_such_agent"}})
    rows.append({"responses_create_params": {"input": "x"}, "agent_ref": {"name": "agent_without_address"}})
    proc = run(["--head-server", head_server.url], input=rows_jsonl(rows))
    assert proc.returncode == 1
    results = result_lines(proc.stdout)
    assert sorted(r["_ng_task_index"] for r in results) == list(range(6))
    assert all(r["agent_ref"]["name"] == AGENT for r in results)
    assert demo_server.stats()["requests"] == 6
    messages = [line for line in proc.stderr.decode().splitlines() if not line.startswith("{")]
    assert "no_such_agent" in messages[0]
    assert AGENT in messages[0]  # lists the names it does know
    assert "no host and port" in messages[1]
    assert SECRET not in proc.stderr.decode()


def test_h_headers_go_to_the_head_server_too(head_server: HeadServer, demo_server: DemoServer):
    rows = [{**row, "agent_ref": {"name": AGENT}} for row in simple_rows(1)]
    proc = run(["--head-server", head_server.url, "-H", "Authorization: Bearer t0ken"], input=rows_jsonl(rows))
    assert proc.returncode == 0, proc.stderr
    assert head_server.headers[0]["Authorization"] == "Bearer t0ken"
    assert b"t0ken" not in proc.stderr


def test_head_server_from_the_environment_and_explicit_endpoint_wins(head_server: HeadServer, start_demo):
    other = start_demo()
    rows = [{**row, "agent_ref": {"name": AGENT}} for row in simple_rows(3)]
    env = clean_env(ROLLFILTER_HEAD_SERVER=head_server.url)
    proc = run(["-e", f"{AGENT}={other.base}"], input=rows_jsonl(rows), env=env)
    assert proc.returncode == 0, proc.stderr
    assert other.stats()["requests"] == 3


def test_unknown_agent_name_is_a_usage_error_listing_known_names(head_server: HeadServer, demo_server: DemoServer):
    proc = run(["--head-server", head_server.url, "-a", "nope"], input=rows_jsonl(simple_rows(2)))
    assert proc.returncode == 2
    assert proc.stderr.decode().count("\n") == 1
    assert AGENT in proc.stderr.decode()
    assert SECRET not in proc.stderr.decode()
    assert demo_server.stats()["requests"] == 0


def test_unreachable_head_server_exits_3_before_sending():
    proc = run(["--head-server", "http://127.0.0.1:9", "-a", AGENT], input=rows_jsonl(simple_rows(2)))
    assert proc.returncode == 3
    assert proc.stdout == b""
    assert proc.stderr.decode().startswith("rollfilter: cannot reach the head server at http://127.0.0.1:9")
    assert proc.stderr.decode().count("\n") == 1


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


def direct_pass_at_k(results: list[dict], k: int, threshold: float = 1.0) -> float:
    by_task: dict[int, list[float]] = defaultdict(list)
    for result in results:
        by_task[result["_ng_task_index"]].append(result["reward"])
    values = []
    for rewards in by_task.values():
        n, c = len(rewards), sum(r >= threshold for r in rewards)
        values.append(1.0 if n - c < k else 1 - math.comb(n - c, k) / math.comb(n, k))
    return sum(values) / len(values)


def test_pass_at_k_and_mean_at_k_match_a_direct_computation(tmp_path, demo_server: DemoServer):
    rng = random.Random(5)
    rows = [
        {"id": i, "responses_create_params": {"input": "x"}, "demo": {"reward_p": rng.choice([0.1, 0.5, 0.9])}}
        for i in range(40)
    ]
    per_task = tmp_path / "tasks.jsonl"
    proc = run(["-u", demo_server.url, "-r", "8", "--per-task", str(per_task)], input=rows_jsonl(rows))
    assert proc.returncode == 0, proc.stderr
    results = result_lines(proc.stdout)
    summary = summary_of(proc.stderr)
    for k in (1, 2, 4, 8):
        assert summary[f"pass@{k}"] == pytest.approx(direct_pass_at_k(results, k))
    assert 0 < summary["pass@1"] < summary["pass@8"] < 1
    by_task: dict[int, list[float]] = defaultdict(list)
    for result in results:
        by_task[result["_ng_task_index"]].append(result["reward"])
    assert summary["mean@8"] == pytest.approx(sum(sum(r) / len(r) for r in by_task.values()) / len(by_task))
    tasks = [json.loads(line) for line in per_task.read_text().splitlines()]
    assert sorted(t["_ng_task_index"] for t in tasks) == list(range(40))
    assert all(t["n"] == 8 and t["failed"] == 0 for t in tasks)
    assert summary["rollfilter"]["tasks"] == 40


def test_tasks_with_failed_rollouts_count_as_incorrect(tmp_path, demo_server: DemoServer):
    rows = [
        {"responses_create_params": {"input": "xx"}},  # reward 1.0 every time
        {"responses_create_params": {"input": "xx"}, "demo": {"fault": "422"}},  # every rollout fails
    ]
    proc = run(["-u", demo_server.url, "-r", "2"], input=rows_jsonl(rows))
    assert proc.returncode == 1
    summary = summary_of(proc.stderr)
    assert summary["pass@1"] == 0.5
    assert summary["rollfilter"]["tasks"] == 2
    assert summary["rollfilter"]["tasks_with_failed_rollouts"] == 1


def test_summarize_counts_nemo_gym_failure_lines_and_lines_it_cannot_use():
    lines = [
        '{"_ng_task_index": 0, "_ng_rollout_index": 0, "_ng_failure_class": "timeout"}',  # NeMo Gym's sidecar
        '{"_ng_failure_class": "crash"}',  # no indices to pair it with: a failure all the same
        '{"_ng_task_index": 1, "_ng_rollout_index": 0, "reward": 1.0}',
        '{"reward": 1e400}',  # a JSON object, but with a number no float holds
        "[1]",
    ]
    proc = run(["--summarize"], input="".join(line + "\n" for line in lines))
    assert proc.returncode == 1
    [message] = proc.stderr.decode().splitlines()
    assert message.startswith(
        "rollfilter: 2 lines are not results, counted as failed (bad_input); the first: <stdin>:4:"
    )
    summary = json.loads(proc.stdout)
    assert summary["reward"] == 1.0
    figures = summary["rollfilter"]
    assert (figures["rows_read"], figures["succeeded"], figures["failed"]) == (5, 1, 4)
    assert figures["failed_by_kind"] == {"agent_failure": 2, "bad_input": 2}
    assert figures["failed_by_class"] == {"crash": 1, "timeout": 1}


def test_summarize_recomputes_the_live_summary(tmp_path, demo_server: DemoServer):
    rows = [{"responses_create_params": {"input": "x" * i}, "demo": {"reward_p": 0.5}} for i in range(30)]
    rows[3]["demo"] = {"fault": "422"}
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    live = run(["-u", demo_server.url, "-r", "4", "-o", str(out), "--errors", str(errors)], input=rows_jsonl(rows))
    assert live.returncode == 1
    again = run(["--summarize", "-r", "4", str(out), str(errors)])
    assert again.returncode == 0, again.stderr
    live_summary, recomputed = summary_of(live.stderr), json.loads(again.stdout)
    figures = ("rows_read", "succeeded", "failed", "failed_by_kind", "tasks", "tasks_with_failed_rollouts")
    for key in ("reward", "accuracy", "mean@4", "pass@1", "pass@2", "pass@4"):
        assert recomputed[key] == pytest.approx(live_summary[key]), key
    for key in figures:
        assert recomputed["rollfilter"][key] == live_summary["rollfilter"][key], key
    # The same from a pipe, after cat-ing the pieces in another order.
    piped = run(["--summarize", "-r", "4"], input=errors.read_bytes() + out.read_bytes())
    assert json.loads(piped.stdout)["pass@2"] == pytest.approx(live_summary["pass@2"])
