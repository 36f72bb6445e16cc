"""NeMo Gym's files and metrics: /aggregate_metrics, materialized inputs, usage, the drop-in layout."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import read_jsonl, result_lines, run, summary_of
from tests.servers.recording_agent import RecordingAgent

HEAVY = {"ng_trajectory": {"turns": [1, 2, 3]}, "ng_agent_observations": {"x": 1}, "ng_model_call_capture": {"c": 1}}


@pytest.fixture
def agents() -> Iterator[dict[str, RecordingAgent]]:
    servers = {name: RecordingAgent(name=name) for name in ("alpha", "beta")}
    try:
        yield servers
    finally:
        for server in servers.values():
            server.close()


def endpoints(agents: dict[str, RecordingAgent]) -> list[str]:
    return [arg for name, agent in agents.items() for arg in ("-e", f"{name}={agent.url}")]


def rows(n: int, agent: str | None = None, **extra: Any) -> str:
    lines = []
    for i in range(n):
        row: dict[str, Any] = {"id": i, "responses_create_params": {"input": "q" * i}, "reward": i % 2, **extra}
        if agent is not None:
            row["agent_ref"] = {"name": agent}
        lines.append(json.dumps(row) + "\n")
    return "".join(lines)


def test_aggregate_sends_stripped_results_and_writes_what_each_agent_answered(
    tmp_path: Path, agents: dict[str, RecordingAgent]
):
    out, aggregate = tmp_path / "out.jsonl", tmp_path / "agg.json"
    data = rows(6, "alpha", answer=HEAVY) + rows(4, "beta")
    proc = run([*endpoints(agents), "-o", str(out), "--aggregate", str(aggregate)], input=data)
    assert proc.returncode == 0, proc.stderr
    for name, count in (("alpha", 6), ("beta", 4)):
        (payload,) = agents[name].aggregate_payloads  # one call per agent
        entries = payload["verify_responses"]
        assert len(entries) == count
        for entry in entries:
            assert set(entry) & {"responses_create_params", *HEAVY} == set()
            assert entry["response"] == {"usage": entry["response"]["usage"]}  # only usage is kept
            assert entry["response"]["usage"]["output_tokens"] == 2
            assert entry["agent_ref"] == {"name": name}
        # What the agent was sent is the results file's lines, stripped.
        results = [r for r in read_jsonl(out) if r["agent_ref"]["name"] == name]
        assert sorted(e["_ng_task_index"] for e in entries) == sorted(r["_ng_task_index"] for r in results)
    written = json.loads(aggregate.read_text())
    assert [entry["agent_ref"] for entry in written] == [{"name": "alpha"}, {"name": "beta"}]
    for entry in written:
        (answer,) = agents[entry["agent_ref"]["name"]].aggregate_answers
        assert {k: entry[k] for k in answer} == answer  # the file holds what the agent answered
    summary = summary_of(proc.stderr)
    assert summary["key_metrics"] == {e["agent_ref"]["name"]: e["key_metrics"] for e in written}


def test_an_aggregate_some_agents_did_not_answer_holds_the_others_and_exits_1(tmp_path: Path):
    """The results are whole, but the aggregate file asked for is not: a line for each agent that
    gave none, the answers of those that did in the file, and exit 1 (never 0 with a short file)."""
    # Results that name no agent fail the run alike: tests/e2e/test_options.py holds that case.
    answering = RecordingAgent(name="answering")
    missing, failing = RecordingAgent(aggregate_status=404), RecordingAgent(aggregate_status=500)
    servers = {"answering": answering, "missing": missing, "failing": failing}
    try:
        data = "".join(rows(2, name) for name in servers)
        args = [arg for name, server in servers.items() for arg in ("-e", f"{name}={server.url}")]
        proc = run([*args, "--aggregate", str(tmp_path / "agg.json")], input=data)
    finally:
        for server in servers.values():
            server.close()
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.decode().splitlines()
    problems = [line for line in lines if line.startswith("rollfilter: --aggregate:")]
    assert len(problems) == 2
    assert any("'missing'" in line and "404" in line for line in problems)
    assert any("'failing'" in line and "HTTP 500" in line for line in problems)
    (entry,) = json.loads((tmp_path / "agg.json").read_text())
    assert entry["agent_ref"] == {"name": "answering"}
    (answer,) = answering.aggregate_answers
    assert {key: entry[key] for key in answer} == answer
    summary = json.loads(lines[-1])  # the summary, last
    assert summary["rollfilter"]["succeeded"] == 6  # the rollouts themselves succeeded
    assert summary["key_metrics"] == {"answering": answer["key_metrics"]}


def test_materialized_holds_every_body_exactly_as_sent_in_order(tmp_path: Path, agents: dict[str, RecordingAgent]):
    materialized = tmp_path / "sent.jsonl"
    data = rows(5, "alpha") + '{"not": "routed"}\n' + "not json\n"
    proc = run([*endpoints(agents), "-j", "1", "-r", "2", "--materialized", str(materialized)], input=data)
    assert proc.returncode == 1  # the two bad rows
    assert materialized.read_bytes().splitlines() == agents["alpha"].raw_bodies  # rows never sent are not in it


def test_gym_layout_writes_nemo_gyms_four_files_and_resumes_from_them(
    tmp_path: Path, agents: dict[str, RecordingAgent]
):
    out = tmp_path / "results" / "OUT.jsonl"  # the folder does not exist yet
    data = tmp_path / "in.jsonl"
    data.write_text(rows(4, "alpha") + rows(1, "beta", answer={"_ng_failure_class": "model_error"}, id=99))
    args = [*endpoints(agents), "-r", "2", "--gym-layout", "-o", str(out), str(data)]
    first = run(args)
    assert first.returncode == 1  # beta's rollouts failed
    names = sorted(p.name for p in out.parent.iterdir())
    assert names == [
        "OUT.jsonl",
        "OUT.jsonl.run.json",  # rollfilter's run record
        "OUT_aggregate_metrics.json",
        "OUT_failures.jsonl",
        "OUT_materialized_inputs.jsonl",
        "OUT_progress",
    ]
    assert (out.parent / "OUT_progress").read_text() == "10\n"  # every rollout finished, failed ones too
    assert len(read_jsonl(out)) == 8
    failures = read_jsonl(out.parent / "OUT_failures.jsonl")
    assert [f["_ng_failure_class"] for f in failures] == ["model_error", "model_error"]
    materialized = read_jsonl(out.parent / "OUT_materialized_inputs.jsonl")
    assert len(materialized) == 10
    (alpha,) = json.loads((out.parent / "OUT_aggregate_metrics.json").read_text())  # beta has no successes
    assert alpha["agent_metrics"]["count"] == 8

    again = run([*args, "--resume", "-r", "3"])  # one more rollout a task; beta's failed pairs retried
    assert again.returncode == 1
    assert len(read_jsonl(out)) == 12
    pairs = [
        (m["_ng_task_index"], m["_ng_rollout_index"]) for m in read_jsonl(out.parent / "OUT_materialized_inputs.jsonl")
    ]
    assert len(pairs) == len(set(pairs)) == 15  # new pairs added once; retried pairs not written again
    assert len(read_jsonl(out.parent / "OUT_failures.jsonl")) == 5
    (alpha,) = json.loads((out.parent / "OUT_aggregate_metrics.json").read_text())
    assert alpha["agent_metrics"]["count"] == 12  # the aggregate covers the earlier results too
    assert (out.parent / "OUT_progress").read_text() == "15\n"  # seeded with the 8 earlier results, 7 more
    sent = agents["alpha"].aggregate_payloads[-1]["verify_responses"]
    assert len(sent) == 12
    # Sorted by (task, rollout) as NeMo Gym sends them, though rollout 2 of each task came last.
    assert [(e["_ng_task_index"], e["_ng_rollout_index"]) for e in sent] == [(t, r) for t in range(4) for r in range(3)]


def test_summarize_aggregates_shards_in_one_call_per_agent(tmp_path: Path, agents: dict[str, RecordingAgent]):
    data = tmp_path / "in.jsonl"
    data.write_text(rows(9, "alpha") + rows(3, "beta"))
    shards = []
    for i in range(3):
        shard = tmp_path / f"shard-{i}.jsonl"
        assert run([*endpoints(agents), "--shard", f"{i}/3", "-o", str(shard), str(data)]).returncode == 0
        shards.append(shard)
    assert agents["alpha"].aggregate_payloads == []  # no aggregate unless asked
    aggregate = tmp_path / "agg.json"
    proc = run(
        ["--summarize", *endpoints(agents), "--aggregate", str(aggregate)],
        input=b"".join(s.read_bytes() for s in shards),
    )
    assert proc.returncode == 0, proc.stderr
    assert [len(p["verify_responses"]) for p in agents["alpha"].aggregate_payloads] == [9]
    assert [len(p["verify_responses"]) for p in agents["beta"].aggregate_payloads] == [3]
    summary = json.loads(proc.stdout)
    assert set(summary["key_metrics"]) == {"alpha", "beta"}
    assert len(json.loads(aggregate.read_text())) == 2


def test_summary_has_usage_means_and_a_split_by_agent(agents: dict[str, RecordingAgent]):
    proc = run(endpoints(agents), input=rows(4, "alpha") + rows(2, "beta", answer={"_ng_failure_class": "x"}, id=7))
    results = result_lines(proc.stdout)
    summary = summary_of(proc.stderr)
    usage = [r["response"]["usage"] for r in results]
    for key in ("input_tokens", "output_tokens", "total_tokens"):
        assert summary["usage"][key] == pytest.approx(sum(u[key] for u in usage) / len(usage))
    assert summary["agents"]["alpha"]["succeeded"] == 4
    assert summary["agents"]["beta"] == {"succeeded": 0, "failed": 2, "masked": 0, "reward": None, "usage": {}}
    assert summary["agents"]["alpha"]["reward"] == summary["reward"]
    assert summary["rollfilter"]["tokens_per_s"] > 0


def test_one_agent_has_no_split(agents: dict[str, RecordingAgent]):
    proc = run(endpoints(agents), input=rows(3, "alpha"))
    assert "agents" not in summary_of(proc.stderr)


def test_python_api_gets_the_aggregate_without_a_file(agents: dict[str, RecordingAgent]):
    from rollfilter import Config, rollouts

    config = Config(endpoints={name: (a.url,) for name, a in agents.items()}, aggregate=True)
    data = [json.loads(line) for line in (rows(3, "alpha") + rows(2, "beta")).splitlines()]
    with rollouts(data, config) as run_:
        assert sum(outcome.ok for outcome in run_) == 5
    assert run_.aggregate is not None
    assert [entry["agent_ref"]["name"] for entry in run_.aggregate] == ["alpha", "beta"]
    assert run_.summary is not None
    assert run_.summary["key_metrics"]["beta"] == agents["beta"].aggregate_answers[0]["key_metrics"]
    assert run_.aggregate_problems == []


def test_asyncio_api_gets_the_aggregate_too(agents: dict[str, RecordingAgent]):
    import asyncio

    from rollfilter import Config, open_rollouts

    config = Config(endpoints={name: (a.url,) for name, a in agents.items()}, aggregate=True)
    data = [json.loads(line) for line in rows(2, "alpha").splitlines()]

    async def main() -> Any:
        async with open_rollouts(data, config) as run_:
            assert [outcome.ok async for outcome in run_] == [True, True]
        return run_

    run_ = asyncio.run(main())
    assert [entry["agent_ref"]["name"] for entry in run_.aggregate] == ["alpha"]
    assert run_.summary["key_metrics"]["alpha"]["mean/reward"] == 0.5


def test_a_non_ascii_header_value_reaches_the_aggregate_call_too(tmp_path: Path, agents: dict[str, RecordingAgent]):
    aggregate = tmp_path / "agg.json"
    args = [*endpoints(agents), "-H", "X-Key: sécret", "--aggregate", str(aggregate)]
    proc = run(args, input=rows(2, "alpha"))
    assert proc.returncode == 0, proc.stderr
    assert [entry["agent_ref"]["name"] for entry in json.loads(aggregate.read_text())] == ["alpha"]
    assert "sécret" not in proc.stderr.decode()


def test_a_resumed_aggregate_groups_earlier_and_new_results_alike(tmp_path: Path):
    """Rows routed by -u, named by -a (-u alone is refused: its rows name no agent to ask), to an
    agent that names itself in its results: one aggregate for both runs."""
    agent = RecordingAgent(name="self-named")
    out, data = tmp_path / "out.jsonl", tmp_path / "in.jsonl"
    data.write_text(rows(3))
    try:
        args = ["-u", agent.run_url, "-a", "self-named", "-o", str(out), "--aggregate", str(tmp_path / "agg.json")]
        args.append(str(data))
        assert run(args).returncode == 0
        assert run([*args, "--resume", "-r", "2"]).returncode == 0
    finally:
        agent.close()
    assert [len(p["verify_responses"]) for p in agent.aggregate_payloads] == [3, 6]
