"""NeMo Gym's files where the two tools meet: a run killed at any moment is finished by either.

NeMo Gym's resume takes the materialized file as the whole job and runs what its results file
and failures sidecar do not hold. `nemo_gym_resume_pairs` is a port of its `_load_from_cache`,
written apart from rollfilter's code.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    SIGNALLED_AT_IMPORT,
    SUBPROCESS_TIMEOUT,
    assert_counts_add_up,
    clean_env,
    nemo_gym_bodies,
    read_jsonl,
    run,
    start,
    summary_of,
    wait_for,
)
from tests.servers.recording_agent import RecordingAgent

MAX_ATTEMPTS = 3  # NeMo Gym's default NEMO_GYM_MAX_ROLLOUT_ATTEMPTS


def input_lines(tasks: int) -> list[str]:
    lines = [json.dumps({"id": i, "responses_create_params": {"input": f"q{i}"}}) + "\n" for i in range(tasks)]
    return [*lines, lines[1]]  # a line seen twice: one task, its rollouts counted on


def pairs_of(records: list[dict[str, Any]]) -> list[tuple[Any, Any]]:
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in records]


def nemo_gym_resume_pairs(out: Path) -> list[tuple[Any, Any]]:
    """The pairs NeMo Gym's `+resume_from_cache=true` runs: the materialized rows, less those done,
    terminal, or out of attempts (`RolloutCollectionHelper._load_from_cache`)."""
    materialized = read_jsonl(out.with_name(out.stem + "_materialized_inputs.jsonl"))
    done = set(pairs_of(read_jsonl(out)))
    attempts: collections.Counter[tuple[Any, Any]] = collections.Counter()
    terminal = set()
    for failure in read_jsonl(out.with_name(out.stem + "_failures.jsonl")):
        key = (failure["_ng_task_index"], failure["_ng_rollout_index"])
        attempts[key] += 1
        if failure.get("_ng_failure_terminal"):
            terminal.add(key)
    gated = done | terminal | {key for key, n in attempts.items() if n >= MAX_ATTEMPTS}
    return [pair for pair in pairs_of(materialized) if pair not in gated]


def gym_args(agent: RecordingAgent, out: Path, *extra: str) -> list[str]:
    return ["-u", agent.run_url, "-a", "agent", "-r", "2", "-j", "4", "--gym-layout", "-o", str(out), *extra]


@pytest.mark.parametrize("source", ["file", "stdin"])
def test_the_materialized_file_is_whole_before_the_first_run_is_sent(
    tmp_path: Path, agent: RecordingAgent, source: str
):
    lines = input_lines(6)
    data = tmp_path / "in.jsonl"
    data.write_text("".join(lines))
    out = tmp_path / "OUT.jsonl"
    agent.hold_after(0)
    proc = start(gym_args(agent, out, *([str(data)] if source == "file" else [])), stdin=-1)
    assert proc.stdin is not None
    if source == "stdin":  # read to its end before anything is planned
        proc.stdin.write(data.read_bytes())
    proc.stdin.close()
    proc.stdin = None  # closed: communicate() has nothing to send
    try:
        assert agent.answered.wait(SUBPROCESS_TIMEOUT)  # the first /run has arrived, and waits
        materialized = out.with_name("OUT_materialized_inputs.jsonl")
        assert read_jsonl(materialized) == nemo_gym_bodies(lines, agent_name="agent", num_repeats=2)
    finally:
        agent.release.set()
        proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0
    assert sorted(pairs_of(read_jsonl(out))) == sorted(pairs_of(read_jsonl(materialized)))


@pytest.mark.parametrize("answered", [0, 3, 9])
def test_a_run_killed_mid_way_is_finished_by_either_tool(tmp_path: Path, agent: RecordingAgent, answered: int):
    lines = input_lines(6)  # 6 tasks (one line twice): 14 pairs with -r 2
    data = tmp_path / "in.jsonl"
    data.write_text("".join(lines))
    out = tmp_path / "results" / "OUT.jsonl"
    args = gym_args(agent, out, str(data))
    agent.hold_after(answered, drop=True)
    proc = start(args)
    try:
        assert agent.answered.wait(SUBPROCESS_TIMEOUT)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=SUBPROCESS_TIMEOUT)
        agent.release.set()
    every_pair = pairs_of(nemo_gym_bodies(lines, agent_name="agent", num_repeats=2))
    done = pairs_of(read_jsonl(out))
    assert len(done) == len(set(done)) <= answered
    # NeMo Gym's resume would run exactly the pairs the results lack: none is lost.
    assert sorted(nemo_gym_resume_pairs(out) + done) == sorted(every_pair)
    assert not out.with_name("OUT_aggregate_metrics.json").exists()  # never left empty: written whole, at the end
    progress = out.with_name("OUT_progress")
    assert not progress.exists() or int(progress.read_text()) <= answered

    # The resume goes to an agent of its own: the killed run's last requests may still reach the first.
    second = RecordingAgent(name="agent")
    try:
        again = run([*gym_args(second, out, str(data)), "--resume"])
    finally:
        second.close()
    assert again.returncode == 0, again.stderr
    assert sorted(pairs_of(read_jsonl(out))) == sorted(every_pair)  # every pair exactly once
    assert sorted(pairs_of(second.bodies)) == sorted(set(every_pair) - set(done))
    assert int(progress.read_text()) == len(every_pair)


def test_a_run_killed_while_reading_stdin_leaves_no_job_list(tmp_path: Path, agent: RecordingAgent):
    out = tmp_path / "OUT.jsonl"
    proc = start(gym_args(agent, out), stdin=-1)
    assert proc.stdin is not None
    proc.stdin.write("".join(input_lines(3)).encode())
    proc.stdin.flush()  # stdin stays open: the run is still reading it to its end
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    # No materialized file, so NeMo Gym's resume starts afresh instead of running nothing.
    assert not out.with_name("OUT_materialized_inputs.jsonl").exists()
    assert agent.bodies == []


def test_a_repeat_count_by_agent_with_no_default_covers_no_other_agent(tmp_path: Path, agent: RecordingAgent):
    data = "".join(
        json.dumps({"responses_create_params": {"input": "q"}, "agent_ref": {"name": name}, "id": i}) + "\n"
        for i, name in enumerate(["agent", "other", "agent"])
    )
    streamed = run(["-e", f"agent={agent.url}", "-e", f"other={agent.url}", "-r", "agent=2"], input=data)
    assert streamed.returncode == 1
    assert sorted(b["id"] for b in agent.bodies) == [0, 0, 2, 2]  # the other agent's row is not run once
    (message,) = [line for line in streamed.stderr.decode().splitlines() if line.startswith("rollfilter: <stdin>:2")]
    assert "no repeat count covers agent 'other'" in message
    assert summary_of(streamed.stderr)["rollfilter"]["failed_by_kind"] == {"bad_input": 1}

    sent = len(agent.bodies)
    out = tmp_path / "OUT.jsonl"
    planned = run(
        ["-e", f"agent={agent.url}", "-e", f"other={agent.url}", "-r", "agent=2", "--gym-layout", "-o", str(out)],
        input=data,
    )
    assert planned.returncode == 2  # as NeMo Gym refuses it, before anything is sent
    (line,) = planned.stderr.decode().splitlines()
    assert line.startswith("rollfilter: -r agent=2 gives no repeat count for 'other', and no default -r K")
    assert "nothing was sent" in line
    assert len(agent.bodies) == sent
    assert not out.with_name("OUT_materialized_inputs.jsonl").exists()


def test_the_progress_file_counts_finished_rollouts(tmp_path: Path, agent: RecordingAgent):
    progress = tmp_path / "deep" / "progress"
    data = "".join(input_lines(4))
    data += '{"responses_create_params": {"input": "x"}, "answer": {"_ng_failure_class": "model_error"}}\n'
    proc = run(["-u", agent.run_url, "-r", "3", "--progress-file", str(progress)], input=data)
    assert proc.returncode == 1  # the failing row
    assert progress.read_text() == "18\n"  # 6 lines x 3 rollouts: failed ones finished too
    assert not [p for p in progress.parent.iterdir() if p.name != "progress"]  # no temporary file left


def test_the_progress_file_says_how_far_a_run_is_while_it_goes(tmp_path: Path, agent: RecordingAgent):
    progress = tmp_path / "progress"
    agent.hold_after(5, waiting=3)  # five answered, the other three wait
    proc = start(["-u", agent.run_url, "-q", "-j", "3", "--progress-file", str(progress)], stdin=subprocess.PIPE)
    assert proc.stdin is not None
    proc.stdin.write("".join(input_lines(8)).encode())
    proc.stdin.close()
    try:
        assert agent.answered.wait(SUBPROCESS_TIMEOUT)
        wait_for(lambda: progress.exists() and progress.read_text() == "5\n")  # read while the run goes
        assert proc.poll() is None
    finally:
        agent.release.set()
    assert proc.wait(SUBPROCESS_TIMEOUT) == 0
    for stream in (proc.stdout, proc.stderr):
        stream.close()  # type: ignore[union-attr]
    assert progress.read_text() == "9\n"  # every line's rollout


def test_a_line_seen_twice_is_one_task_everywhere(tmp_path: Path, agent: RecordingAgent):
    lines = [
        json.dumps({"id": i, "responses_create_params": {"input": "q"}, "reward": reward}) + "\n"
        for i, reward in enumerate([1.0, 0.0, 1.0])
    ]
    data = "".join([lines[0], lines[1], lines[0], lines[2]])  # 4 lines, 3 tasks
    per_task, out = tmp_path / "tasks.jsonl", tmp_path / "out.jsonl"
    proc = run(["-u", agent.run_url, "-r", "2", "--per-task", str(per_task), "-o", str(out)], input=data)
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stderr)
    assert summary["rollfilter"]["tasks"] == 3  # NeMo Gym's numbering: the repeated line is task 0 again
    assert summary["rollfilter"]["tasks_unfinished"] == 0
    records = read_jsonl(per_task)
    assert [(r["_ng_task_index"], r["n"]) for r in records] == [(0, 4), (1, 2), (2, 2)]  # in task order
    assert summary["mean@2"] == pytest.approx(2 / 3)
    assert summary["pass@2"] == pytest.approx(2 / 3)
    recomputed = run(["--summarize", "-r", "2", str(out)])
    assert recomputed.returncode == 0, recomputed.stderr
    figures = json.loads(recomputed.stdout)
    assert figures["rollfilter"]["tasks"] == 3
    assert (figures["mean@2"], figures["pass@2"]) == (summary["mean@2"], summary["pass@2"])


def test_a_resumed_summary_covers_the_whole_output(tmp_path: Path, agent: RecordingAgent):
    rows = [
        {"id": i, "responses_create_params": {"input": "q" * (i + 1)}, "reward": i % 2} for i in range(5)
    ] + [
        {"id": 9, "responses_create_params": {"input": "flaky"}, "reward": 1.0, "answer_times": 1,
         "answer": {"_ng_failure_class": "model_error"}},
    ]  # fmt: skip
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    args = ["-u", agent.run_url, "-r", "3", "-o", str(out), "--errors", str(errors)]
    first = run(args, input="".join(json.dumps(r) + "\n" for r in rows))
    assert first.returncode == 1  # the flaky row's rollouts failed once each
    again = run([*args, "--resume"], input="".join(json.dumps(r) + "\n" for r in rows))
    assert again.returncode == 0, again.stderr
    resumed = summary_of(again.stderr)
    assert (resumed["rollfilter"]["succeeded"], resumed["rollfilter"]["skipped"]) == (3, 15)  # this run's counts
    whole = json.loads(run(["--summarize", "-r", "3", str(out)]).stdout)  # the whole output, recomputed
    for key in ("reward", "usage", "mean@3", "pass@1", "pass@3"):
        assert resumed[key] == pytest.approx(whole[key]), key
    assert resumed["rollfilter"]["tasks"] == whole["rollfilter"]["tasks"] == 6
    assert resumed["rollfilter"]["tasks_unfinished"] == 0


def test_expected_pairs_add_up_when_a_run_is_stopped_mid_way(tmp_path: Path, agent: RecordingAgent):
    lines = input_lines(6)  # 14 pairs with -r 2
    data = tmp_path / "in.jsonl"
    data.write_text("".join(lines))
    out = tmp_path / "OUT.jsonl"
    agent.hold_after(3, waiting=4, drop=True)  # 3 answered, 4 in flight when the run is stopped
    proc = start(gym_args(agent, out, str(data)))
    try:
        assert agent.answered.wait(SUBPROCESS_TIMEOUT)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    finally:
        agent.release.set()
    assert proc.returncode == 143
    figures = summary_of(stderr)["rollfilter"]
    assert figures["expected"] == 14  # planned by the first pass, though the run read less of it
    assert_counts_add_up(summary_of(stderr))
    assert (figures["cancelled"], figures["not_started"]) == (4, 14 - 3 - 4)

    second = RecordingAgent(name="agent")
    try:
        again = run([*gym_args(second, out, str(data)), "--resume"])
    finally:
        second.close()
    figures = summary_of(again.stderr)["rollfilter"]
    assert figures["expected"] == 14
    assert figures["skipped"] == len(read_jsonl(out)) - figures["succeeded"]
    assert_counts_add_up(summary_of(again.stderr))
    assert figures["rows_read"] == 14  # read to the end: every pair read


@pytest.mark.parametrize(
    "extra",
    [
        ["--materialized", "{out}"],
        ["--progress-file", "{out}"],
        ["--metrics", "{out}"],
        ["--errors", "{out}"],
        ["--materialized", "{errors}", "--errors", "{errors}"],
    ],
)
def test_two_outputs_in_one_file_are_refused(tmp_path: Path, agent: RecordingAgent, extra: list[str]):
    out, errors = tmp_path / "o.jsonl", tmp_path / "e.jsonl"
    args = [part.format(out=out, errors=errors) for part in extra]
    proc = run(["-u", agent.run_url, "-o", str(out), *args], input="".join(input_lines(2)))
    assert proc.returncode == 2
    (line,) = proc.stderr.decode().splitlines()
    assert line.endswith("two outputs cannot be one file")
    assert agent.bodies == []


@pytest.mark.parametrize("option", ["--materialized", "--progress-file"])
def test_a_file_renamed_into_place_must_be_a_regular_file(tmp_path: Path, agent: RecordingAgent, option: str):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = run(["-u", agent.run_url, option, str(fifo)], input="".join(input_lines(2)))
    assert proc.returncode == 2  # at once: not blocked opening a FIFO nobody reads
    assert "must be a regular file" in proc.stderr.decode()
    assert agent.bodies == []


def test_a_refused_run_leaves_no_file_behind(tmp_path: Path, agent: RecordingAgent):
    out = tmp_path / "ra" / "out.jsonl"
    data = "".join(
        json.dumps({"responses_create_params": {"input": "q"}, "agent_ref": {"name": n}}) + "\n" for n in "ab"
    )
    proc = run(
        ["-e", f"a={agent.url}", "-e", f"b={agent.url}", "-r", "a=2", "--gym-layout", "-o", str(out)], input=data
    )
    assert proc.returncode == 2
    assert list(out.parent.iterdir()) == []


def test_a_killed_first_pass_leaves_no_temporary_file_for_long(tmp_path: Path, agent: RecordingAgent):
    out = tmp_path / "OUT.jsonl"
    left = tmp_path / ".OUT_materialized_inputs.jsonl.999999999.0badcafe.tmp"  # a pid no process has
    left.write_text("half a job list\n")
    proc = run(gym_args(agent, out), input="".join(input_lines(2)))
    assert proc.returncode == 0, proc.stderr
    assert not left.exists()
    assert len(read_jsonl(out.with_name("OUT_materialized_inputs.jsonl"))) == 6


def test_an_agent_failure_keeps_the_agents_own_fields_beside_rollfilters(tmp_path: Path, agent: RecordingAgent):
    errors = tmp_path / "errors.jsonl"
    own = {"_ng_failure_class": "tool_crash", "error": "the agent's own words", "line": 999, "reward": 0.0}
    data = json.dumps({"responses_create_params": {"input": "q"}, "answer": own}) + "\n"
    proc = run(["-u", agent.run_url, "-a", "agent", "--errors", str(errors)], input=data)
    assert proc.returncode == 1
    (record,) = read_jsonl(errors)
    assert (record["error"]["kind"], record["line"], record["reward"]) == ("agent_failure", 1, 0.0)
    assert record["agent_fields"] == {"error": "the agent's own words", "line": 999}


@pytest.mark.parametrize("module", ["trio", "typer", "rollfilter.cli.collect"])
def test_sigusr1_while_starting_does_not_end_the_run(agent: RecordingAgent, module: str):
    proc = subprocess.run(
        [sys.executable, "-c", SIGNALLED_AT_IMPORT, module, "SIGUSR1", "-u", agent.run_url, "-a", "agent"],
        input="".join(input_lines(2)).encode(),
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr  # the default action of SIGUSR1 is to end the process
    assert len(proc.stdout.splitlines()) == 3


def test_the_progress_count_is_the_same_after_a_resume_that_gives_pairs_up(tmp_path: Path, agent: RecordingAgent):
    data = tmp_path / "in.jsonl"
    failing = {"_ng_failure_class": "model_error"}
    data.write_text(
        "".join(input_lines(3)) + json.dumps({"responses_create_params": {"input": "x"}, "answer": failing}) + "\n"
    )
    out = tmp_path / "OUT.jsonl"
    args = [*gym_args(agent, out, str(data)), "--max-attempts", "1"]
    assert run(args).returncode == 1
    progress = out.with_name("OUT_progress")
    assert progress.read_text() == "10\n"  # 5 lines x 2 rollouts, the 2 failed ones included
    again = run([*args, "--resume"])
    assert again.returncode == 0, again.stderr  # the failed pairs are out of attempts: given up
    assert summary_of(again.stderr)["rollfilter"]["not_retried"] == 2
    assert progress.read_text() == "10\n"
