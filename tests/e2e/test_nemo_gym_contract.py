"""NeMo Gym's run contract: the bodies sent, the agent named, the results stamped, failures and resume.

The expected bodies come from `nemo_gym_bodies`, a port of NeMo Gym's own row materialization
(`RolloutCollectionHelper._preprocess_rows_from_config`), written apart from rollfilter's code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    clean_env,
    nemo_gym_bodies,
    read_jsonl,
    result_lines,
    rollfilter_command,
    run,
    summary_of,
)
from tests.servers.recording_agent import RecordingAgent


@pytest.fixture
def other_agent() -> Iterator[RecordingAgent]:
    server = RecordingAgent(name="other")
    try:
        yield server
    finally:
        server.close()


def as_sent(body: dict[str, Any]) -> bytes:
    """A body encoded as NeMo Gym encodes it (orjson: compact, UTF-8, key order kept)."""
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


LINES = [
    '{"id": "a", "responses_create_params": {"input": "héllo", "temperature": 1.0}}\n',
    '{"id": "b", "responses_create_params": {"input": "x"}, "agent_ref": {"type": "t", "name": "other"}}\n',
    '{"id": "a", "responses_create_params": {"input": "héllo", "temperature": 1.0}}\n',  # same text as line 1
    '{"id": "c", "responses_create_params": {"input": "y"}, "_ng_task_index": 7}\n',  # its own index
    '{"id": "d", "responses_create_params": {"input": "z", "metadata": {"extra_body": "{\\"top_k\\": 5}"}},'
    ' "_ng_rollout_id": "r-d", "skills_ref": {"hash": "h"}}\n',
    '{"id": "e", "responses_create_params": {"input": "w"}, "_ng_task_index": 7}\n',  # shares task 7: counts on
]


def test_bodies_are_exactly_what_nemo_gym_sends(tmp_path: Path, agent: RecordingAgent, other_agent: RecordingAgent):
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(LINES))
    proc = run(
        ["-e", f"agent={agent.url}", "-e", f"other={other_agent.url}", "-a", "agent", "-r", "2",
         "-p", "temperature=0.5", "-p", "max_output_tokens=64", "--repeat-seeds", str(data)],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    expected = nemo_gym_bodies(
        LINES, agent_name="agent", num_repeats=2, overrides={"temperature": 0.5, "max_output_tokens": 64}, add_seed=True
    )
    sent = sorted(agent.raw_bodies + other_agent.raw_bodies)
    assert sent == sorted(as_sent(body) for body in expected)
    # The row's own agent wins over -a; -a fills only rows that name none.
    assert {b["id"] for b in other_agent.bodies} == {"b"}
    assert {b["agent_ref"]["name"] for b in agent.bodies} == {"agent"}
    tasks = {(b["id"], b["_ng_task_index"], b["_ng_rollout_index"]) for b in agent.bodies + other_agent.bodies}
    assert ("a", 0, 3) in tasks  # the repeated line continues task 0's count
    assert ("e", 7, 3) in tasks  # a task index given twice continues its count too
    assert ("d", 2, 0) in tasks  # the counter skipped the rows with their own index
    # Results carry the row's agent_ref (not the agent's own), its indices and pass-through keys.
    results = result_lines(proc.stdout)
    assert len(results) == 12
    assert all(r["agent_ref"] in ({"name": "agent"}, {"type": "t", "name": "other"}) for r in results)
    d_results = [r for r in results if r["_ng_task_index"] == 2]
    assert all(r["_ng_rollout_id"] == "r-d" and r["skills_ref"] == {"hash": "h"} for r in d_results)
    seeds = [json.loads(b["responses_create_params"]["metadata"]["extra_body"]) for b in agent.bodies if b["id"] == "d"]
    assert sorted(s["seed"] for s in seeds) == [0, 1]
    assert all(s["top_k"] == 5 for s in seeds)


def test_repeats_per_agent_and_a_default(tmp_path: Path, agent: RecordingAgent, other_agent: RecordingAgent):
    rows = [
        {"id": 1, "responses_create_params": {"input": "q"}},
        {"id": 2, "responses_create_params": {"input": "q"}, "agent_ref": {"name": "other"}},
    ]
    args = ["-e", f"agent={agent.url}", "-e", f"other={other_agent.url}", "-a", "agent"]
    proc = run([*args, "-r", "2", "-r", "other=3", "-r", "typo_agent=4"], input="".join(map(to_line, rows)))
    assert proc.returncode == 0, proc.stderr
    assert sorted(b["_ng_rollout_index"] for b in agent.bodies) == [0, 1]
    assert sorted(b["_ng_rollout_index"] for b in other_agent.bodies) == [0, 1, 2]
    warnings = [line for line in proc.stderr.decode().splitlines() if "typo_agent" in line]
    assert len(warnings) == 1  # once, at the end
    assert proc.stderr.decode().splitlines()[-1].startswith("{")  # then the summary
    expected = nemo_gym_bodies([to_line(r) for r in rows], agent_name="agent", num_repeats={"other": 3, "_default": 2})
    assert sorted(agent.raw_bodies + other_agent.raw_bodies) == sorted(as_sent(b) for b in expected)


def test_rows_without_an_agent_fail_as_no_route_and_terminal(tmp_path: Path, agent: RecordingAgent):
    errors = tmp_path / "errors.jsonl"
    rows = [
        {"responses_create_params": {"input": "q"}},
        {"responses_create_params": {"input": "r"}, "agent_ref": {"name": "agent"}},
    ]
    proc = run(["-e", f"agent={agent.url}", "--errors", str(errors)], input="".join(map(to_line, rows)))
    assert proc.returncode == 1
    (record,) = read_jsonl(errors)
    assert record["_ng_failure_class"] == "no_route"
    assert record["_ng_failure_terminal"] is True
    assert record["error"]["kind"] == "no_route"
    assert len(agent.bodies) == 1


def test_a_malformed_rollout_id_fails_as_bad_input_and_is_not_sent(tmp_path: Path, agent: RecordingAgent):
    errors = tmp_path / "errors.jsonl"
    ids = ["ok-1.a_b", "", ".hidden", "-dash", "a/b", "a b", "trailing\n", 7, ["x"], None]
    rows = [
        {"id": i, "responses_create_params": {"input": "q"}, "_ng_rollout_id": given} for i, given in enumerate(ids)
    ]
    proc = run(["-u", agent.url, "--errors", str(errors)], input="".join(map(to_line, rows)))
    assert proc.returncode == 1, proc.stderr
    sent = sorted(body["id"] for body in agent.bodies)
    assert sent == [0, 9]  # a good id, and a null one (no id at all)
    records = read_jsonl(errors)
    assert sorted(record["line"] for record in records) == list(range(2, 10))
    assert {record["error"]["kind"] for record in records} == {"bad_input"}
    assert all("_ng_rollout_id" in record["error"]["message"] for record in records)
    assert "starts with a letter or a digit" in records[0]["error"]["message"]
    assert all(record["row"]["_ng_rollout_id"] == ids[record["line"] - 1] for record in records)
    assert summary_of(proc.stderr)["rollfilter"]["failed_by_kind"] == {"bad_input": 8}


def to_line(row: dict[str, Any]) -> str:
    return json.dumps(row) + "\n"


FAILING = {"_ng_failure_class": "model_error", "reward": 0.0}


def contract_rows() -> list[dict[str, Any]]:
    return [
        {"id": "ok", "responses_create_params": {"input": "q"}, "reward": 1.0},
        {"id": "fails", "responses_create_params": {"input": "q"}, "answer": FAILING},
        {"id": "terminal", "responses_create_params": {"input": "q"},
         "answer": {**FAILING, "_ng_failure_class": "bad_task", "_ng_failure_terminal": True}},
        {"id": "killed", "responses_create_params": {"input": "q"}, "answer": {"_ng_no_persist": True},
         "answer_times": 1},
    ]  # fmt: skip


def test_agent_reported_failures_and_no_persist(tmp_path: Path, agent: RecordingAgent):
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    args = ["-u", agent.run_url, "-a", "agent", "-o", str(out), "--errors", str(errors)]
    proc = run(args, input="".join(map(to_line, contract_rows())))
    assert proc.returncode == 1  # a rollout failed
    results = read_jsonl(out)
    assert [r["_ng_task_index"] for r in results] == [0]  # failures and no-persist are not results
    summary = summary_of(proc.stderr)
    assert summary["reward"] == 1.0  # the failed rollouts' rewards are in no mean
    figures = summary["rollfilter"]
    assert (figures["succeeded"], figures["failed"], figures["not_persisted"]) == (1, 2, 1)
    assert figures["failed_by_kind"] == {"agent_failure": 2}
    assert figures["failed_by_class"] == {"bad_task": 1, "model_error": 1}
    records = {r["row"]["id"]: r for r in read_jsonl(errors)}
    assert set(records) == {"fails", "terminal"}  # the not-persisted one is written nowhere
    assert records["fails"]["_ng_failure_class"] == "model_error"
    assert "_ng_failure_terminal" not in records["fails"]
    assert records["terminal"]["_ng_failure_terminal"] is True
    for record in records.values():
        assert record["agent_ref"] == {"name": "agent"}
        assert (record["_ng_task_index"], record["_ng_rollout_index"]) == (record["row"]["_ng_task_index"], 0)
        assert record["error"]["kind"] == "agent_failure"
        # NeMo Gym's sidecar shape: the agent's own answer at the top level, rollfilter's fields beside it
        assert record["reward"] == 0.0
        assert record["response"]["usage"]["output_tokens"] == 2
        assert record["responses_create_params"] == record["row"]["responses_create_params"]
        assert "answer" not in record
        assert (record["source"], record["attempts"]) == ("<stdin>", 1)


def test_three_resumes_retry_up_to_the_cap_with_attempt_indices(tmp_path: Path, agent: RecordingAgent):
    out, errors, data = tmp_path / "out.jsonl", tmp_path / "errors.jsonl", tmp_path / "rows.jsonl"
    data.write_text("".join(map(to_line, contract_rows())))
    args = ["-u", agent.run_url, "-a", "agent", "-o", str(out), "--errors", str(errors), str(data)]
    sent_per_run = []
    for attempt in range(4):
        before = len(agent.bodies)
        proc = run([*args, "--resume"] if attempt else args)
        sent = [(b["id"], b.get("_ng_attempt_index")) for b in agent.bodies[before:]]
        sent_per_run.append(sorted(sent, key=str))
        assert proc.returncode == (1 if sent else 0), proc.stderr
    assert sent_per_run == [
        sorted([("ok", None), ("fails", None), ("terminal", None), ("killed", None)], key=str),
        sorted([("fails", 1), ("killed", None)], key=str),  # the not-persisted one runs again, as new
        [("fails", 2)],
        [],  # three failed attempts: the cap
    ]
    assert sorted(r["row"]["id"] for r in read_jsonl(errors)) == ["fails", "fails", "fails", "terminal"]
    assert sorted(r["_ng_task_index"] for r in read_jsonl(out)) == [0, 3]  # "ok" and "killed"
    last = summary_of(proc.stderr)["rollfilter"]
    assert (last["skipped"], last["not_retried"]) == (2, 2)


@pytest.mark.parametrize("how", ["option", "environment"])
def test_max_attempts_from_the_option_or_nemo_gyms_variable(tmp_path: Path, agent: RecordingAgent, how: str):
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    rows = "".join(map(to_line, contract_rows()[:2]))
    args = ["-u", agent.run_url, "-o", str(out), "--errors", str(errors)]
    limit = ["--max-attempts", "2"] if how == "option" else []
    env = clean_env(NEMO_GYM_MAX_ROLLOUT_ATTEMPTS="2") if how == "environment" else None
    for resume in ([], ["--resume"], ["--resume"]):
        run([*args, *limit, *resume], input=rows, env=env)
    assert [b["id"] for b in agent.bodies].count("fails") == 2


def test_resume_finishes_a_run_nemo_gym_started(tmp_path: Path, agent: RecordingAgent):
    """Files shaped as ng_collect_rollouts writes them: results, and the failures sidecar."""
    lines = [to_line({"id": i, "responses_create_params": {"input": "q" * i}}) for i in range(4)]
    data, out, failures = tmp_path / "in.jsonl", tmp_path / "OUT.jsonl", tmp_path / "OUT_failures.jsonl"
    data.write_text("".join(lines))
    bodies = nemo_gym_bodies(lines, agent_name="agent", num_repeats=2)
    done = [b for b in bodies if (b["_ng_task_index"], b["_ng_rollout_index"]) in {(0, 0), (0, 1), (1, 0), (3, 1)}]
    out.write_text("".join(to_line({**b, "reward": 1.0, "response": {}}) for b in done))
    sidecar = [
        {**bodies[2 * 1 + 1], "_ng_failure_class": "model_error"},  # task 1 rollout 1 failed once
        {**bodies[2 * 2], "_ng_failure_class": "bad_task", "_ng_failure_terminal": True},  # task 2 rollout 0: terminal
        {**bodies[2 * 2 + 1], "_ng_failure_class": "model_error"},  # task 2 rollout 1: failed three times
        {**bodies[2 * 2 + 1], "_ng_failure_class": "model_error"},
        {**bodies[2 * 2 + 1], "_ng_failure_class": "model_error"},
    ]
    failures.write_text("".join(map(to_line, sidecar)))
    proc = run(["-u", agent.run_url, "-a", "agent", "-r", "2", "--resume", "-o", str(out), "--errors", str(failures),
                str(data)])  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    sent = sorted((b["_ng_task_index"], b["_ng_rollout_index"], b.get("_ng_attempt_index")) for b in agent.bodies)
    assert sent == [(1, 1, 1), (3, 0, None)]  # only what is missing; the retry carries its attempt index
    expected_retry = {**bodies[3], "_ng_attempt_index": 1}
    assert as_sent(expected_retry) in agent.raw_bodies
    assert len(read_jsonl(out)) == len(done) + 2


# A forked child's peak RSS starts at its parent's, and pytest's is large: a small Python in between
# runs the command, and reports the peak of its own child.
PEAK_RSS = (
    "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, code)"
)


def test_resume_with_a_huge_task_index_stays_small(tmp_path: Path, agent: RecordingAgent):
    out = tmp_path / "out.jsonl"
    out.write_text(to_line({"_ng_task_index": 2**39, "_ng_rollout_index": 0, "reward": 1.0}))
    rows = to_line({"responses_create_params": {"input": "q"}, "_ng_task_index": 2**39 + 1})
    proc = subprocess.run(
        [sys.executable, "-c", PEAK_RSS, *rollfilter_command(), "-q", "-u", agent.run_url, "--resume", "-o", str(out)],
        input=rows.encode(), capture_output=True, env=clean_env(), timeout=SUBPROCESS_TIMEOUT,
    )  # fmt: skip
    peak_kib, code = map(int, proc.stdout.split())
    assert code == 0, proc.stderr
    assert peak_kib < 100 * 1024  # the index's value does not size memory
    assert [b["_ng_task_index"] for b in agent.bodies] == [2**39 + 1]


def test_python_api_failure_carries_class_and_terminal(agent: RecordingAgent):
    from rollfilter import Config, rollouts
    from rollfilter.errors import ErrorKind

    with rollouts(contract_rows(), Config(url=agent.run_url, agent="agent")) as run_:
        outcomes = {o.row["id"]: o for o in run_}
    assert outcomes["ok"].ok
    assert (outcomes["fails"].kind, outcomes["fails"].failure_class, outcomes["fails"].terminal) == (
        ErrorKind.AGENT_FAILURE, "model_error", False,
    )  # fmt: skip
    assert (outcomes["terminal"].failure_class, outcomes["terminal"].terminal) == ("bad_task", True)
    assert outcomes["killed"].kind is ErrorKind.NOT_PERSISTED
    assert outcomes["fails"].row["_ng_task_index"] == 1  # the row as sent
    assert run_.summary is not None
    assert run_.summary["rollfilter"]["not_persisted"] == 1


def test_summarize_counts_each_pair_once_after_resumes(tmp_path: Path, agent: RecordingAgent):
    """A failed attempt that a resumed run fixed is a success; three failed attempts are one failure."""
    out, errors, data = tmp_path / "out.jsonl", tmp_path / "errors.jsonl", tmp_path / "rows.jsonl"
    rows = [
        {"id": "ok", "responses_create_params": {"input": "q"}},
        {"id": "fixed", "responses_create_params": {"input": "q"}, "answer": FAILING, "answer_times": 1},
        {"id": "fails", "responses_create_params": {"input": "q"}, "answer": FAILING},
    ]
    data.write_text("".join(map(to_line, rows)))
    args = ["-u", agent.run_url, "-o", str(out), "--errors", str(errors), str(data)]
    for resume in ([], ["--resume"], ["--resume"]):
        run([*args, *resume])
    assert len(read_jsonl(errors)) == 4  # "fixed" once, "fails" three times
    proc = run(["--summarize", "-r", "1", str(out), str(errors)])
    figures = json.loads(proc.stdout)["rollfilter"]
    assert (figures["rows_read"], figures["succeeded"], figures["failed"]) == (3, 2, 1)
    again = run(["--summarize", "-r", "1"], input=errors.read_bytes() + out.read_bytes())  # failures first
    assert json.loads(again.stdout)["rollfilter"]["failed"] == 1
