"""--reverify: saved rollouts re-scored at their resources servers' /verify, against stand-ins.

The stand-in resources server scores a body by `verify_reward` (the response's text holds the
materialized input's `expected`), so every reward below is computed here from the rollouts made.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    HeadServer,
    closed_port_url,
    invoke,
    read_jsonl,
    result_lines,
    run,
    serving,
    start,
    summary_of,
    wait_for,
)
from tests.servers.resources_server import ResourcesServer, verify_reward

TASKS, K = 12, 4


@pytest.fixture
def verifier() -> Iterator[ResourcesServer]:
    server = ResourcesServer()
    try:
        yield server
    finally:
        server.close()


def materialized_row(task: int, rollout: int, agent: str = "agent") -> dict[str, Any]:
    return {
        "responses_create_params": {"input": f"question {task}"},
        "expected": f"answer {task % 5}",
        "agent_ref": {"type": "responses_api_agents", "name": agent},
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
    }


def rollout_line(task: int, rollout: int, agent: str = "agent", **extra: Any) -> dict[str, Any]:
    text = f"answer {(task * rollout) % 5}"
    return {
        "responses_create_params": {"input": f"question {task}"},
        "response": {"output": [{"type": "message", "content": [{"type": "output_text", "text": text}]}]},
        "reward": 0.5,  # the old score, replaced
        "_ng_task_index": task,
        "_ng_rollout_index": rollout,
        "agent_ref": {"name": agent},
        **extra,
    }


def expected_reward(task: int, rollout: int) -> float:
    row = materialized_row(task, rollout) | {"response": rollout_line(task, rollout)["response"]}
    return verify_reward(row)


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def files(tmp_path: Path, agent: str = "agent") -> tuple[Path, Path]:
    pairs = [(t, r) for t in range(TASKS) for r in range(K)]
    materialized = write_jsonl(tmp_path / "out_materialized_inputs.jsonl", [materialized_row(*p, agent) for p in pairs])
    random.Random(3).shuffle(pairs)  # rollouts finish out of order
    rollouts = write_jsonl(tmp_path / "out.jsonl", [rollout_line(*p, agent) for p in pairs])
    return materialized, rollouts


def test_with_r_the_groups_are_the_tasks_as_summarize_counts_them(tmp_path: Path, verifier: ResourcesServer):
    """-r K: each task's K lines are one group of its pass histogram, not K groups of one."""
    materialized, rollouts = files(tmp_path)
    proc = run(["--reverify", str(materialized), "-u", verifier.url, "-r", str(K), str(rollouts)])
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stderr)
    assert sum(summary["pass_histogram"]) == TASKS
    (tmp_path / "rescored.jsonl").write_bytes(proc.stdout)
    summarized = summary_of(run(["--summarize", "-r", str(K), str(tmp_path / "rescored.jsonl")]).stdout)
    assert summary["pass_histogram"] == summarized["pass_histogram"]
    assert summary[f"pass@{K}"] == summarized[f"pass@{K}"]


def test_each_rollout_is_re_scored_at_verify_and_written_as_gym_writes_it(tmp_path: Path, verifier: ResourcesServer):
    materialized, rollouts = files(tmp_path)
    proc = run(["--reverify", str(materialized), "-u", verifier.url, "-j", "8", "-r", str(K), str(rollouts)])
    assert proc.returncode == 0, proc.stderr
    lines = result_lines(proc.stdout)
    assert sorted((line["_ng_task_index"], line["_ng_rollout_index"]) for line in lines) == [
        (t, r) for t in range(TASKS) for r in range(K)
    ]
    for line in lines:
        task, rollout = line["_ng_task_index"], line["_ng_rollout_index"]
        assert line["reward"] == expected_reward(task, rollout)
        assert line["agent_ref"] == materialized_row(task, rollout)["agent_ref"]  # the materialized input's
        assert line["response"] == rollout_line(task, rollout)["response"]
    # Each body is the materialized input with the rollout's response, and nothing else.
    by_pair = {(body["_ng_task_index"], body["_ng_rollout_index"]): body for body in verifier.bodies}
    assert len(verifier.bodies) == len(by_pair) == TASKS * K
    for (task, rollout), body in by_pair.items():
        assert body == materialized_row(task, rollout) | {"response": rollout_line(task, rollout)["response"]}
    assert verifier.mode_asked == 1
    summary = summary_of(proc.stderr)
    rewards = [expected_reward(t, r) for t in range(TASKS) for r in range(K)]
    assert summary["reward"] == pytest.approx(sum(rewards) / len(rewards))
    assert 0 < summary["reward"] < 1
    assert summary["rollfilter"]["succeeded"] == TASKS * K
    assert "pass@4" in summary
    assert "unsafe" not in summary["rollfilter"]


@pytest.mark.parametrize("mode", ["unsupported", "unknown", "something else"])
def test_a_server_that_is_not_stateless_refuses_the_run_unless_forced(
    tmp_path: Path, verifier: ResourcesServer, mode: str
):
    verifier.mode = mode
    materialized, rollouts = files(tmp_path)
    args = ["--reverify", str(materialized), "-u", verifier.url, str(rollouts)]
    refused = run(args)
    assert refused.returncode == 2
    (line,) = refused.stderr.decode().splitlines()
    host = urlsplit(verifier.url).netloc
    assert line.startswith("rollfilter: resources server ")
    assert host in line
    assert mode in line
    assert refused.stdout == b""
    assert verifier.bodies == []

    forced = run([*args, "--force"])
    assert forced.returncode == 0, forced.stderr
    warnings = [line for line in forced.stderr.decode().splitlines() if "forced" in line]
    assert len(warnings) == 1
    assert summary_of(forced.stderr)["rollfilter"]["unsafe"] is True
    assert len(result_lines(forced.stdout)) == TASKS * K


def test_a_rollout_that_cannot_be_re_scored_fails_as_bad_input_and_nothing_is_lost(
    tmp_path: Path, verifier: ResourcesServer
):
    materialized, _ = files(tmp_path)
    no_response = rollout_line(0, 0)
    del no_response["response"]
    lines = [
        json.dumps(no_response),
        json.dumps(rollout_line(99, 0)),  # no materialized input
        "not json",
        json.dumps({"response": {}}),  # no indices
        json.dumps(rollout_line(1, 1)),
        json.dumps(rollout_line(2, 3)),
    ]
    errors = tmp_path / "errors.jsonl"
    proc = run(["--reverify", str(materialized), "-u", verifier.url, "--errors", str(errors)], input="\n".join(lines))
    assert proc.returncode == 1
    assert b"Traceback" not in proc.stderr
    assert sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in result_lines(proc.stdout)) == [(1, 1), (2, 3)]
    records = read_jsonl(errors)
    assert sorted(record["line"] for record in records) == [1, 2, 3, 4]
    assert {record["error"]["kind"] for record in records} == {"bad_input"}
    messages = " ".join(record["error"]["message"] for record in records)
    assert "no response" in messages
    assert "no line for task 99 rollout 0" in messages
    assert len(verifier.bodies) == 2
    assert summary_of(proc.stderr)["rollfilter"]["failed_by_kind"] == {"bad_input": 4}


def test_a_rollout_made_from_other_inputs_is_bad_input_naming_the_field_that_differs(
    tmp_path: Path, verifier: ResourcesServer
):
    materialized, _ = files(tmp_path)
    other_dataset = rollout_line(0, 0, responses_create_params={"input": "question from elsewhere"})
    other_agent = rollout_line(1, 0, agent="another agent")
    normalised = rollout_line(
        2,
        0,
        responses_create_params={"input": "question 2", "temperature": None, "tool_choice": "auto"},
        agent_ref={"type": "responses_api_agents", "name": "agent", "extra": 1},
    )
    messages = rollout_line(3, 0, responses_create_params={"input": [{"role": "user", "content": "question 3"}]})
    lines = [other_dataset, other_agent, normalised, messages]
    errors = tmp_path / "errors.jsonl"
    proc = run(
        ["--reverify", str(materialized), "-u", verifier.url, "--errors", str(errors)],
        input="".join(json.dumps(line) + "\n" for line in lines),
    )
    assert proc.returncode == 1
    assert [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in result_lines(proc.stdout)] == [(2, 0)]
    records = sorted(read_jsonl(errors), key=lambda record: record["line"])
    assert [record["error"]["kind"] for record in records] == ["bad_input"] * 3
    first, second, third = (record["error"]["message"] for record in records)
    assert "responses_create_params.input differs from its materialized input's (task 0 rollout 0)" in first
    assert "agent_ref.name differs" in second
    assert "responses_create_params.input differs" in third  # a list where a string was sent
    assert len(verifier.bodies) == 1


def test_without_r_the_error_bars_are_clustered_by_the_lines_own_tasks(tmp_path: Path, verifier: ResourcesServer):
    materialized, rollouts = files(tmp_path)
    proc = run(["--reverify", str(materialized), "-u", verifier.url, str(rollouts)])
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stderr)
    assert summary["sample_size"]["reward"] == {"tasks": TASKS, "rollouts": TASKS * K}
    assert summary["rollfilter"]["tasks"] == TASKS
    assert not [key for key in summary if key.startswith(("mean@", "pass@", "pass_histogram"))]  # no K was given
    with_k = summary_of(run(["--reverify", str(materialized), "-u", verifier.url, "-r", str(K), str(rollouts)]).stderr)
    assert summary["stderr"]["reward"] == with_k["stderr"]["reward"]


def test_judge_failed_only_re_sends_only_the_judge_failures(tmp_path: Path, verifier: ResourcesServer):
    materialized, _ = files(tmp_path)
    lines = [
        rollout_line(0, 0),
        rollout_line(0, 1, _ng_failure_class="judge_failed"),
        rollout_line(3, 2, _ng_failure_class="judge_failed"),
        rollout_line(4, 0, _ng_failure_class="model_error"),
    ]
    rollouts = write_jsonl(tmp_path / "failures.jsonl", lines)
    proc = run(["--reverify", str(materialized), "-u", verifier.url, "--judge-failed-only", str(rollouts)])
    assert proc.returncode == 0, proc.stderr
    assert sorted((b["_ng_task_index"], b["_ng_rollout_index"]) for b in verifier.bodies) == [(0, 1), (3, 2)]
    written = result_lines(proc.stdout)
    assert [(line["_ng_task_index"], line["_ng_rollout_index"]) for line in written] in (
        [(0, 1), (3, 2)],
        [(3, 2), (0, 1)],
    )
    assert all(line["reward"] == expected_reward(line["_ng_task_index"], line["_ng_rollout_index"]) for line in written)
    assert summary_of(proc.stderr)["rollfilter"]["not_judge_failed"] == 2


def test_each_agents_rollouts_go_to_its_resources_server_by_the_head_server_or_verifier(tmp_path: Path):
    with serving(ResourcesServer()) as math, serving(ResourcesServer()) as code:
        rows = [materialized_row(t, 0, "math_agent" if t % 2 else "code_agent") for t in range(6)]
        materialized = write_jsonl(tmp_path / "m.jsonl", rows)
        rollouts = write_jsonl(
            tmp_path / "r.jsonl", [rollout_line(t, 0, "math_agent" if t % 2 else "code_agent") for t in range(6)]
        )

        def server(name: str, url: str) -> dict[str, Any]:
            port = int(urlsplit(url).port or 0)
            return {name: {"resources_servers": {name: {"host": "127.0.0.1", "port": port, "api_key": "sk-secret"}}}}

        def agent(name: str, resources: str) -> dict[str, Any]:
            block = {
                "host": "127.0.0.1",
                "port": 1,
                "resources_server": {"type": "resources_servers", "name": resources},
            }
            return {name: {"responses_api_agents": {"simple_agent": block}}}

        config = server("math", math.url) | server("code", code.url) | agent("math_agent", "math")
        config |= agent("code_agent", "code")
        with serving(HeadServer(config)) as head:
            proc = run(["--reverify", str(materialized), "--head-server", head.url, str(rollouts)])
        assert proc.returncode == 0, proc.stderr
        assert b"sk-secret" not in proc.stderr
        assert sorted(b["_ng_task_index"] for b in math.bodies) == [1, 3, 5]
        assert sorted(b["_ng_task_index"] for b in code.bodies) == [0, 2, 4]
        assert (math.mode_asked, code.mode_asked) == (1, 1)

        math.bodies.clear()
        code.bodies.clear()
        verifiers = ["--verifier", f"math_agent={math.url}", "--verifier", f"code_agent={math.url}/verify"]
        proc = run(["--reverify", str(materialized), *verifiers, str(rollouts)])
        assert proc.returncode == 0, proc.stderr
        assert (len(math.bodies), len(code.bodies)) == (6, 0)


def test_a_resumed_re_scoring_sends_only_what_is_missing(tmp_path: Path, verifier: ResourcesServer):
    materialized, rollouts = files(tmp_path)
    out, errors = tmp_path / "rescored.jsonl", tmp_path / "rescored_failures.jsonl"
    verifier.failing = {"answer 1", "answer 3"}
    args = ["--reverify", str(materialized), "-u", verifier.url, "--retries", "0", "-o", str(out)]
    args += ["--errors", str(errors), str(rollouts)]
    first = run(args)
    assert first.returncode == 1
    failed = {(t, r) for t in range(TASKS) for r in range(K) if t % 5 in (1, 3)}
    assert len(read_jsonl(out)) == TASKS * K - len(failed)
    verifier.failing = set()
    verifier.bodies.clear()
    resumed = run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert {(b["_ng_task_index"], b["_ng_rollout_index"]) for b in verifier.bodies} == failed
    assert len(verifier.bodies) == len(failed)
    pairs = sorted((line["_ng_task_index"], line["_ng_rollout_index"]) for line in read_jsonl(out))
    assert pairs == [(t, r) for t in range(TASKS) for r in range(K)]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--judge-failed-only"], "give --reverify MATERIALIZED"),
        (["--verifier", "a=http://127.0.0.1:1"], "give --reverify MATERIALIZED"),
        (["--reverify", "M", "-e", "a=http://127.0.0.1:1"], "not with -e"),
        (["--reverify", "M", "--summarize"], "not with --summarize"),
        (["--reverify", "M", "-u", "http://127.0.0.1:1", "--verifier", "broken"], "--verifier wants NAME=URL"),
    ],
)
def test_options_that_do_not_go_with_re_scoring_are_usage_errors(args: list[str], message: str):
    proc = run(args)
    assert proc.returncode == 2
    assert message in proc.stderr.decode()


@pytest.mark.parametrize("kind", ["missing", "directory", "pipe", "fifo"])
def test_a_materialized_file_that_cannot_be_read_by_offset_is_a_usage_error(
    tmp_path: Path, verifier: ResourcesServer, kind: str
):
    """It is indexed, then read back by offset: a pipe or a directory is refused with one line,
    as a missing file is, before any output is made (-o naming it too makes no empty file of it)."""
    materialized, rollouts = files(tmp_path)
    given = {"missing": tmp_path / "missing.jsonl", "directory": tmp_path, "pipe": Path("/dev/stdin")}
    path = given.get(kind, tmp_path / "fifo")
    if kind == "fifo":
        os.mkfifo(path)  # no writer: opening it must not wait for one
    args = ["--reverify", str(path), "-u", verifier.url, str(rollouts)]
    proc = run([*args, "-o", str(path)] if kind == "missing" else args, input=materialized.read_bytes())
    assert proc.returncode == 2
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith(f"rollfilter: cannot read the materialized inputs {path}: ")
    assert line.endswith("No such file or directory" if kind == "missing" else "(its lines are read by offset)")
    assert not (tmp_path / "missing.jsonl").exists()
    assert verifier.bodies == []


def test_progress_counts_one_rollout_a_line_whatever_k_is(tmp_path: Path, verifier: ResourcesServer):
    materialized, rollouts = files(tmp_path)
    verifier.latency = 0.01  # half a second in all, one at a time: a line on the way
    args = ["--reverify", str(materialized), "-u", verifier.url, "-r", str(K), "-j", "1", "--progress"]
    proc = run([*args, str(rollouts)])
    assert proc.returncode == 0, proc.stderr
    progress = [line for line in proc.stderr.decode().splitlines() if "rollouts finished" in line]
    assert progress
    assert all(f" of {TASKS * K} rollouts" in line for line in progress)


def gym_line(answer: dict[str, Any], row: dict[str, Any]) -> bytes:
    """The line NeMo Gym's `gym eval reverify` writes for /verify's `answer` to `row` (its
    `RolloutReverificationHelper.run_from_config`, ported): the answer stamped with the row's pair,
    agent_ref and skills_ref, encoded compact (orjson's form)."""
    result = dict(answer)
    result["_ng_task_index"] = row["_ng_task_index"]
    result["_ng_rollout_index"] = row["_ng_rollout_index"]
    result["agent_ref"] = row["agent_ref"]
    if "skills_ref" in row:
        result["skills_ref"] = row["skills_ref"]
    return json.dumps(result, separators=(",", ":"), ensure_ascii=False).encode()


def test_the_lines_written_are_those_gym_eval_reverify_writes(tmp_path: Path, verifier: ResourcesServer):
    rows = [
        materialized_row(t, r) | {"skills_ref": {"hash": f"h{t}"}, "_ng_rollout_id": f"id-{t}-{r}", "note": "é"}
        for t in range(3)
        for r in range(2)
    ]
    materialized = write_jsonl(tmp_path / "m.jsonl", rows)
    rollouts = write_jsonl(tmp_path / "r.jsonl", [rollout_line(t, r) for t in range(3) for r in range(2)])
    proc = run(["--reverify", str(materialized), "-u", verifier.url, "-k", str(rollouts)])
    assert proc.returncode == 0, proc.stderr
    expected = []
    for row in rows:
        body = row | {"response": rollout_line(row["_ng_task_index"], row["_ng_rollout_index"])["response"]}
        answer = {"responses_create_params": body["responses_create_params"], "response": body["response"]}
        expected.append(gym_line({**answer, "reward": verify_reward(body)}, row))
    assert proc.stdout.splitlines() == expected


def whole_pairs(path: Path) -> list[tuple[int, int]]:
    """The pairs of the whole result lines in `path` (a kill may leave the last one torn)."""
    pairs = []
    for line in path.read_bytes().split(b"\n"):
        try:
            result = json.loads(line)
        except ValueError:
            continue
        pairs.append((result["_ng_task_index"], result["_ng_rollout_index"]))
    return pairs


def test_after_a_kill_9_a_resume_sends_only_what_is_missing(tmp_path: Path, verifier: ResourcesServer):
    verifier.latency = 0.05  # a few seconds in all, two at a time: killed part of the way
    materialized, rollouts = files(tmp_path)
    out = tmp_path / "rescored.jsonl"
    args = ["--reverify", str(materialized), "-u", verifier.url, "-j", "2", "-o", str(out), str(rollouts)]
    proc = start(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: out.exists() and len(whole_pairs(out)) >= 10)
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
    done = set(whole_pairs(out))
    assert 10 <= len(done) < TASKS * K
    verifier.latency = 0.0
    verifier.bodies.clear()
    resumed = run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    every = {(t, r) for t in range(TASKS) for r in range(K)}
    assert {(b["_ng_task_index"], b["_ng_rollout_index"]) for b in verifier.bodies} == every - done
    # The killed run's last requests (-j 2) may reach the server's threads after the clear above:
    # past those two, each missing pair was sent once.
    assert len(every - done) <= len(verifier.bodies) <= len(every - done) + 2
    assert sorted(whole_pairs(out)) == sorted(every)  # each pair once


def test_shards_and_a_limit_re_score_their_part(tmp_path: Path, verifier: ResourcesServer):
    materialized, rollouts = files(tmp_path)
    parts = []
    for shard in range(3):
        proc = run(["--reverify", str(materialized), "-u", verifier.url, "--shard", f"{shard}/3", str(rollouts)])
        assert proc.returncode == 0, proc.stderr
        pairs = [(line["_ng_task_index"], line["_ng_rollout_index"]) for line in result_lines(proc.stdout)]
        assert {task % 3 for task, _ in pairs} == {shard}
        parts += pairs
    assert sorted(parts) == [(t, r) for t in range(TASKS) for r in range(K)]
    limited = run(["--reverify", str(materialized), "-u", verifier.url, "-n", "5", str(rollouts)])
    assert len(result_lines(limited.stdout)) == 5


def test_a_dry_run_prints_each_verify_body_and_sends_nothing(tmp_path: Path, verifier: ResourcesServer):
    """Nothing at all: not even /reverify_mode is asked (a server that would refuse re-scoring
    does not refuse a dry run, which shows what would be sent)."""
    materialized, rollouts = files(tmp_path)
    verifier.mode = "stateful"
    proc = run(["--reverify", str(materialized), "-u", verifier.url, "--dry-run", "-n", "3", str(rollouts)])
    assert proc.returncode == 0, proc.stderr
    bodies = result_lines(proc.stdout)
    assert len(bodies) == 3
    for body in bodies:
        pair = (body["_ng_task_index"], body["_ng_rollout_index"])
        assert body == materialized_row(*pair) | {"response": rollout_line(*pair)["response"]}
    assert b"/verify" in proc.stderr
    assert verifier.bodies == []
    assert verifier.mode_asked == 0


def test_resuming_with_another_materialized_file_or_as_a_run_is_refused(tmp_path: Path, verifier: ResourcesServer):
    materialized, rollouts = files(tmp_path)
    out = tmp_path / "rescored.jsonl"
    args = ["-u", verifier.url, "-o", str(out), str(rollouts)]
    assert run(["--reverify", str(materialized), *args]).returncode == 0
    other = tmp_path / "other_materialized_inputs.jsonl"
    other.write_bytes(materialized.read_bytes().replace(b"question", b"another question"))
    for given in (["--reverify", str(other)], [], ["--reverify", str(materialized), "--judge-failed-only"]):
        verifier.bodies.clear()
        proc = run([*given, *args, "--resume"])
        assert proc.returncode == 2, given
        assert "--reverify" in proc.stderr.decode() or "--judge-failed-only" in proc.stderr.decode()
        assert verifier.bodies == []
    assert run(["--reverify", str(materialized), *args, "--resume"]).returncode == 0


def test_a_url_under_a_prefix_with_a_slash_is_verified_at_its_verify(tmp_path: Path):
    """-u http://host/prefix/ is the base of a resources server under a prefix: /reverify_mode is
    asked there and every rollout is POSTed to /prefix/verify, none to /prefix/ itself."""
    materialized, rollouts = files(tmp_path)
    with serving(ResourcesServer(prefix="/prefix")) as server:
        proc = invoke(["--reverify", str(materialized), "-u", f"{server.url}/prefix/", str(rollouts)])
        assert proc.returncode == 0, proc.stderr
        assert server.mode_asked == 1
        assert len(result_lines(proc.stdout)) == len(server.bodies) == TASKS * K


@pytest.mark.parametrize("prefix", ["", "/prefix"])
def test_a_server_without_reverify_mode_is_refused_by_its_url_unless_forced(tmp_path: Path, prefix: str):
    """An older resources server answers /reverify_mode with 404: its mode is unknown. Refused
    (exit 2) by the URL asked, its path included; re-scored and marked unsafe with --force."""
    materialized, rollouts = files(tmp_path)
    with serving(ResourcesServer(mode_status=404, prefix=prefix)) as server:
        refused = run(["--reverify", str(materialized), "-u", f"{server.url}{prefix}/", str(rollouts)])
        assert refused.returncode == 2, refused.stderr
        (line,) = refused.stderr.decode().splitlines()
        assert line.startswith(
            f"rollfilter: resources server {server.url}{prefix}/reverify_mode (HTTP 404: mode unknown) "
        )
        assert server.bodies == []
        forced = run(["--reverify", str(materialized), "-u", f"{server.url}{prefix}/verify", "--force", str(rollouts)])
        assert forced.returncode == 0, forced.stderr
        assert summary_of(forced.stderr)["rollfilter"]["unsafe"] is True
        assert len(result_lines(forced.stdout)) == len(server.bodies) == TASKS * K


@pytest.mark.parametrize("failure", ["HTTP 500", "unreachable"])
def test_a_failing_reverify_mode_exits_3_with_the_summary_last_and_leaves_no_file(tmp_path: Path, failure: str):
    materialized, rollouts = files(tmp_path)
    out = tmp_path / "rescored.jsonl"
    with serving(ResourcesServer(mode_status=500)) as server:
        url = server.url if failure == "HTTP 500" else closed_port_url()
        proc = run(["--reverify", str(materialized), "-u", url, "-o", str(out), str(rollouts)])
        quiet = run(["--reverify", str(materialized), "-u", url, "-q", str(rollouts)])
        assert server.bodies == []
    assert proc.returncode == 3
    message, summary = proc.stderr.decode().splitlines()  # `2>&1 >/dev/null | tail -n 1 | jq` finds the summary
    assert f"resources server {url}/reverify_mode" in message
    assert failure.removeprefix("unreachable") in message
    figures = json.loads(summary)["rollfilter"]
    assert figures["stopped"] == message.removeprefix("rollfilter: ")
    assert (figures["rows_read"], figures["succeeded"]) == (0, 0)
    assert sorted(path.name for path in tmp_path.iterdir()) == sorted([materialized.name, rollouts.name])
    assert (quiet.returncode, quiet.stderr.decode().splitlines()) == (3, [message])  # -q: no summary


@pytest.mark.parametrize("link", ["same path", "symlink", "hard link"])
@pytest.mark.parametrize(
    "given",
    [
        ["-o", "{}", "--overwrite"],
        ["-o", "{}", "--append"],
        ["--errors", "{}"],
        ["--metrics", "{}"],
        ["--aggregate", "{}"],
        ["--gym-layout", "-o", "rescored.jsonl"],
        ["> {}"],
    ],
)
def test_a_materialized_file_that_is_an_output_is_refused_and_left_as_it_is(
    tmp_path: Path, verifier: ResourcesServer, link: str, given: list[str]
):
    """Re-scoring reads the materialized file as an input: an output that is that file, by path or
    by inode, would empty it or append results to it, after which it joins nothing."""
    materialized, rollouts = files(tmp_path)
    gym_layout = "--gym-layout" in given  # its failures file beside -o is the output
    output = tmp_path / ("rescored_failures.jsonl" if gym_layout else "output.jsonl")
    if link == "symlink":
        output.symlink_to(materialized)
    elif link == "hard link":
        output.hardlink_to(materialized)
    elif gym_layout:
        materialized = materialized.rename(output)
    else:
        output = materialized
    before = materialized.read_bytes()
    args = ["--reverify", str(materialized), "-u", verifier.url, str(rollouts)]
    if given == ["> {}"]:
        with output.open("ab") as stdout:
            proc = run(args, stdout=stdout)
    else:
        proc = run([*args, *(arg.format(output) for arg in given)], cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.decode().splitlines()
    assert line.endswith(f"is also the input --reverify {materialized}: input file is output file")
    assert materialized.read_bytes() == before
    assert verifier.bodies == []


@pytest.mark.parametrize("answer", [b"stateless", b'{"mode": "stateless"}'])
def test_a_reverify_mode_that_is_no_json_string_exits_3_as_documented(
    tmp_path: Path, verifier: ResourcesServer, answer: bytes
):
    verifier.mode_body = answer
    materialized, rollouts = files(tmp_path)
    proc = run(["--reverify", str(materialized), "-u", verifier.url, str(rollouts)])
    assert proc.returncode == 3
    assert proc.stderr.decode().splitlines()[0].endswith("/reverify_mode answered no mode (a JSON string)")
    assert verifier.bodies == []


def test_an_unhealthy_saved_response_fails_for_good_with_unhealthy_fail(tmp_path: Path, verifier: ResourcesServer):
    """Re-scoring sends the saved response again, whose verdict no retry can change: with
    --unhealthy fail it is a terminal failure, verified once and not sent again by --resume."""
    materialized = write_jsonl(tmp_path / "materialized.jsonl", [materialized_row(0, 0), materialized_row(1, 0)])
    empty = rollout_line(0, 0) | {"response": {"output": []}}
    rollouts = write_jsonl(tmp_path / "out.jsonl", [empty, rollout_line(1, 0)])
    errors = tmp_path / "errors.jsonl"
    args = ["--reverify", str(materialized), "-u", verifier.url, "--unhealthy", "fail", "--retries", "3"]
    args += ["--retry-budget", "off", "-o", str(tmp_path / "rescored.jsonl"), "--errors", str(errors)]
    first = run([*args, str(rollouts)])
    assert first.returncode == 1, first.stderr
    assert summary_of(first.stderr)["rollfilter"]["failed_by_kind"] == {"unhealthy": 1}
    (record,) = read_jsonl(errors)
    assert (record["_rf_health"], record["_ng_failure_terminal"]) == (["empty_output"], True)
    assert len(verifier.bodies) == 2
    resumed = run([*args, "--resume", str(rollouts)])
    assert len(verifier.bodies) == 2, resumed.stderr
