"""The run record beside the output (OUT.jsonl.run.json): what --resume checks, shards and --summarize read."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rollfilter.errors import ExitStatus
from tests.conftest import DemoServer, array_task, clean_env, invoke, rows_jsonl, run, simple_rows
from tests.servers.recording_agent import RecordingAgent


@pytest.fixture
def agent() -> Iterator[RecordingAgent]:
    server = RecordingAgent()
    try:
        yield server
    finally:
        server.close()


Command = Callable[..., tuple[int, str]]


@pytest.fixture
def rollfilter(capfd: pytest.CaptureFixture[str]) -> Command:
    """The command in this process, as a function of its arguments (and `env`): its exit status,
    and what it wrote on descriptor 2 (-q: no summary there)."""

    def command(args: Sequence[str], env: dict[str, str] | None = None) -> tuple[int, str]:
        proc = invoke(["-q", *args], env=clean_env(**(env or {})))
        return proc.returncode, proc.stderr.decode()

    return command


def pairs(path: Path) -> list[tuple[int, int]]:
    return [(r["_ng_task_index"], r["_ng_rollout_index"]) for r in map(json.loads, path.read_text().splitlines())]


def sent_pairs(agent: RecordingAgent) -> list[tuple[int, int]]:
    return [(body["_ng_task_index"], body["_ng_rollout_index"]) for body in agent.bodies]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text(rows_jsonl(simple_rows(6)))
    return path


FIRST = ["-r", "2", "-p", "temperature=0.7", "-a", "agent", "--repeat-seeds", "-n", "5"]


def varied(option: str, value: str | None) -> list[str]:
    """FIRST with one option's value changed (a flag left out when `value` is None)."""
    args = list(FIRST)
    if option not in args:
        return [*args, option, value or ""]
    at = args.index(option)
    if value is None:
        del args[at]
    else:
        args[at + 1] = value
    return args


def summarize(capfd: pytest.CaptureFixture[str], paths: Sequence[Path]) -> tuple[int, str, dict[str, Any]]:
    """--summarize in this process: it writes its summary and its problems to descriptors 1 and 2."""
    proc = invoke(["--summarize", *map(str, paths)])
    return proc.returncode, proc.stderr.decode(), json.loads(proc.stdout)


def test_a_run_records_what_shapes_its_bodies_beside_its_output(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command
):
    out = tmp_path / "results" / "out.jsonl"
    status, stderr = rollfilter(["-u", agent.run_url, *FIRST, "--shard", "1/2", "-o", str(out), str(data)])
    assert status == ExitStatus.OK, stderr
    record = json.loads((tmp_path / "results" / "out.jsonl.run.json").read_text())
    assert record == {
        "inputs": [{"name": "data.jsonl", "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}],
        "params": [["temperature", 0.7]],
        "agent": "agent",
        "repeats": 2,
        "repeats_by_agent": {},
        "repeat_seeds": True,
        "shard": [1, 2],
        "limit": 5,
        "groups": False,
        "drop_uniform": False,
        "group_field": None,
        "reverify": None,
        "judge_failed_only": False,
    }
    assert sorted(p.name for p in out.parent.iterdir()) == ["out.jsonl", "out.jsonl.run.json"]  # no temporary left


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("-p", "temperature=0.9", "-p: temperature=0.7 then, temperature=0.9 now"),
        ("-a", "other", "-a: agent then, other now"),
        ("--repeat-seeds", None, "--repeat-seeds: on then, off now"),
        ("-n", "6", "-n: 5 then, 6 now"),
        ("-r", "1", "-r: 2 then, 1 now"),
        ("--shard", "0/2", "--shard: none then, 0/2 now"),
    ],
)
def test_resume_refuses_other_options_and_sends_nothing(
    tmp_path: Path, agent: RecordingAgent, data: Path, option: str, value: str | None, named: str, rollfilter: Command
):
    out = tmp_path / "out.jsonl"
    assert rollfilter(["-u", agent.run_url, *FIRST, "-o", str(out), str(data)])[0] == ExitStatus.OK
    out.write_text("".join(out.read_text().splitlines(keepends=True)[:3]))  # an interrupted run
    before = (out.read_bytes(), (tmp_path / "out.jsonl.run.json").read_bytes(), len(agent.bodies))
    status, stderr = rollfilter(["-u", agent.run_url, *varied(option, value), "--resume", "-o", str(out), str(data)])
    assert status == ExitStatus.USAGE
    assert stderr.count("\n") == 1
    assert stderr.startswith(f"rollfilter: --resume: {out} was made from other inputs or options")
    assert named in stderr
    assert (out.read_bytes(), (tmp_path / "out.jsonl.run.json").read_bytes(), len(agent.bodies)) == before


# A run begun by the build this release started from (0.2.0's line, before Config had parts), in
# tests/data: `rollfilter --demo -j 1 EARLIER --target-groups 1 -o out.jsonl rows.jsonl`, which
# kept task 3's group and dropped task 1's as uniform, then stopped at its target. Its files, as
# that build wrote them: the results, the held file and the run record.
EARLIER_RUN = Path(__file__).parent.parent / "data" / "resume_across_upgrade"
EARLIER = ["-a", "main", "-r", "4", "-r", "other=4", "-p", "temperature=0.7", "--repeat-seeds", "-n", "8"]
EARLIER += ["--shard", "1/2", "--drop-uniform", "--group-field", "reward"]


@pytest.fixture
def earlier_run(tmp_path: Path) -> Path:
    """A copy of the earlier build's run, its output's path."""
    for file in EARLIER_RUN.iterdir():
        shutil.copy(file, tmp_path)
    return tmp_path / "out.jsonl"


def test_resume_finishes_a_run_an_earlier_build_began(earlier_run: Path, demo_server: DemoServer, rollfilter: Command):
    record = json.loads(Path(f"{earlier_run}.run.json").read_text())
    assert (record["groups"], record["repeats_by_agent"], record["group_field"]) == (True, {"other": 4}, "reward")
    inputs = str(earlier_run.parent / "rows.jsonl")
    status, stderr = rollfilter(["-u", demo_server.url, *EARLIER, "--resume", "-o", str(earlier_run), inputs])
    assert status == ExitStatus.OK, stderr
    assert demo_server.stats()["requests"] == 8  # tasks 5 and 7 of shard 1/2: the groups it had not ended
    assert sorted(pairs(earlier_run)) == [(task, rollout) for task in (3, 5, 7) for rollout in range(4)]
    assert json.loads(Path(f"{earlier_run}.run.json").read_text()) == record


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (["--group-field", "accuracy"], "--group-field: reward then, accuracy now"),
        (["-r", "other=5"], "-r: 4 other=4 then, 4 other=5 now (a group keeps its size)"),
        (["-a", "second"], "-a: main then, second now"),
    ],
)
def test_resume_refuses_what_differs_from_the_record_an_earlier_build_wrote(
    earlier_run: Path, demo_server: DemoServer, rollfilter: Command, given: list[str], named: str
):
    inputs = str(earlier_run.parent / "rows.jsonl")
    status, stderr = rollfilter(["-u", demo_server.url, *EARLIER, *given, "--resume", "-o", str(earlier_run), inputs])
    assert (status, demo_server.stats()["requests"]) == (ExitStatus.USAGE, 0)
    assert named in stderr


def test_resume_refuses_other_inputs(tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command):
    out = tmp_path / "out.jsonl"
    assert rollfilter(["-u", agent.run_url, "-o", str(out), str(data)])[0] == ExitStatus.OK
    sent = len(agent.bodies)
    data.write_text(rows_jsonl(simple_rows(7)))
    status, stderr = rollfilter(["-u", agent.run_url, "--resume", "-o", str(out), str(data)])
    assert (status, len(agent.bodies)) == (ExitStatus.USAGE, sent)
    assert "input 1 (data.jsonl): other bytes than then" in stderr
    other = tmp_path / "other.jsonl"
    other.write_text(rows_jsonl(simple_rows(6)))
    status, stderr = rollfilter(["-u", agent.run_url, "--resume", "-o", str(out), str(other), str(other)])
    assert (status, len(agent.bodies)) == (ExitStatus.USAGE, sent)
    assert "inputs: data.jsonl then, other.jsonl other.jsonl now" in stderr


def test_resume_with_the_same_inputs_under_another_name_goes_on(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command
):
    out = tmp_path / "out.jsonl"
    assert rollfilter(["-u", agent.run_url, "-o", str(out), str(data)])[0] == ExitStatus.OK
    out.write_text("".join(out.read_text().splitlines(keepends=True)[:4]))
    missing = {(task, 0) for task in range(6)} - set(pairs(out))
    moved = tmp_path / "copied-to-another-node.jsonl"
    moved.write_bytes(data.read_bytes())
    del agent.bodies[:]
    assert rollfilter(["-u", agent.run_url, "--resume", "-o", str(out), str(moved)])[0] == ExitStatus.OK
    assert sorted(sent_pairs(agent)) == sorted(missing)


def test_a_larger_r_on_resume_adds_the_missing_rollouts(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command
):
    out = tmp_path / "out.jsonl"
    assert rollfilter(["-u", agent.run_url, "-r", "2", "-o", str(out), str(data)])[0] == ExitStatus.OK
    del agent.bodies[:]
    status, stderr = rollfilter(["-u", agent.run_url, "-r", "3", "--resume", "-o", str(out), str(data)])
    assert status == ExitStatus.OK, stderr
    assert sorted(sent_pairs(agent)) == [(task, 2) for task in range(6)]
    assert sorted(Counter(pairs(out)).values()) == [1] * 18
    assert json.loads((tmp_path / "out.jsonl.run.json").read_text())["repeats"] == 3  # a later resume wants -r 3


@pytest.mark.parametrize("stdout", ["file", "pipe"])
def test_the_record_sits_beside_the_file_written_not_the_name_given(tmp_path: Path, agent: RecordingAgent, stdout):
    # -o /dev/stdout: standard output's own file gets the record; a pipe, or /dev itself, none.
    out = tmp_path / "out.jsonl"
    data = tmp_path / "data.jsonl"
    data.write_text(rows_jsonl(simple_rows(2)))
    with open(out, "wb") as file:
        proc = run(
            ["-u", agent.run_url, "-q", "-o", "/dev/stdout", str(data)], stdout=file if stdout == "file" else None
        )
    assert proc.returncode == 0, proc.stderr
    assert not Path("/dev/stdout.run.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "data.jsonl",
        "out.jsonl",
        *(["out.jsonl.run.json"] * (stdout == "file")),
    ]


def test_a_fresh_run_refused_for_a_used_output_keeps_that_outputs_record(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command
):
    out = tmp_path / "out.jsonl"
    assert rollfilter(["-u", agent.run_url, "--shard", "0/2", "-o", str(out), str(data)])[0] == ExitStatus.OK
    record = (tmp_path / "out.jsonl.run.json").read_bytes()
    status, stderr = rollfilter(["-u", agent.run_url, "-p", "temperature=1", "-o", str(out), str(data)])
    assert status == ExitStatus.USAGE
    assert "already holds lines of another run" in stderr
    assert (tmp_path / "out.jsonl.run.json").read_bytes() == record


def test_a_resumed_shard_is_the_shard_its_record_holds(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command
):
    out = tmp_path / "out.jsonl"
    assert rollfilter(["-u", agent.run_url, "--shard", "1/3", "-o", str(out), str(data)])[0] == ExitStatus.OK
    assert sorted(pairs(out)) == [(1, 0), (4, 0)]
    out.write_text(out.read_text().splitlines(keepends=True)[0])
    del agent.bodies[:]
    status, stderr = rollfilter(["-u", agent.run_url, "--resume", "-o", str(out), str(data)])  # no --shard
    assert status == ExitStatus.OK, stderr
    assert sorted(pairs(out)) == [(1, 0), (4, 0)]
    assert len(agent.bodies) == 1
    status, stderr = rollfilter(["-u", agent.run_url, "--shard", "2/3", "--resume", "-o", str(out), str(data)])
    assert status == ExitStatus.USAGE
    assert "--shard: 1/3 then, 2/3 now" in stderr


def test_shard_auto_outside_a_job_array_is_a_usage_error(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command
):
    status, stderr = rollfilter(["-u", agent.run_url, "--shard", "auto", str(data)])
    assert (status, agent.bodies) == (ExitStatus.USAGE, [])
    assert stderr == "rollfilter: --shard auto works inside a Slurm job array (sbatch --array): give --shard I/N\n"


def test_a_resubmitted_array_task_finishes_its_own_shard(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command
):
    # Task 3 of --array=1-4 is shard 2/4; resubmitted alone (--array=3) it sees an array of one.
    out = tmp_path / "shard-3.jsonl"
    args = ["-u", agent.run_url, "-r", "2", "--shard", "auto", "--resume", "-o", str(out), str(data)]
    assert rollfilter(args, env=array_task(3, 1, 4))[0] == ExitStatus.OK
    whole = sorted(pairs(out))
    assert {task for task, _ in whole} == {2}
    out.write_text(out.read_text().splitlines(keepends=True)[0])
    del agent.bodies[:]
    status, stderr = rollfilter(args, env=array_task(3, 3, 1))
    assert status == ExitStatus.OK, stderr
    assert sorted(pairs(out)) == whole
    assert len(agent.bodies) == 1


@pytest.mark.parametrize("resubmitted", [(2, 3), (0, 1), (1, 3)])
def test_shard_auto_refuses_a_part_of_an_array_submitted_again(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command, resubmitted: tuple[int, int]
):
    # --array=0-3: two tasks run; the other two, cancelled while pending, are resubmitted alone as
    # --array=A,B, where each sees an array of two. Their shards of 4 are in no file yet.
    def args(task: int) -> list[str]:
        return ["-u", agent.run_url, "--shard", "auto", "--resume", "-o", str(tmp_path / f"shard-{task}.jsonl")]

    for task in sorted(set(range(4)) - set(resubmitted)):
        assert rollfilter([*args(task), str(data)], env=array_task(task, 0, 4))[0] == ExitStatus.OK
    sent = len(agent.bodies)
    for position, task in enumerate(resubmitted):
        env = {**array_task(task, resubmitted[0], 2), "SLURM_ARRAY_TASK_STEP": str(resubmitted[1] - resubmitted[0])}
        status, stderr = rollfilter([*args(task), str(data)], env=env)
        assert status == ExitStatus.USAGE
        (line,) = stderr.splitlines()
        assert line.startswith(f"rollfilter: --shard auto makes this array task shard {position}/2, but ")
        assert line.endswith("give --shard I/N, the shard this task had in the array first submitted")
        assert not (tmp_path / f"shard-{task}.jsonl").exists()
    assert len(agent.bodies) == sent
    for task in resubmitted:  # the form that survives: the task's own shard, given whole
        command = ["-u", agent.run_url, "--shard", f"{task}/4", "--resume", "-o", str(tmp_path / f"shard-{task}.jsonl")]
        assert rollfilter([*command, str(data)], env=array_task(task, resubmitted[0], 2))[0] == ExitStatus.OK
    shards = [tmp_path / f"shard-{task}.jsonl" for task in range(4)]
    proc = invoke(["--summarize", *map(str, shards)])
    assert proc.returncode == ExitStatus.OK, proc.stderr
    assert json.loads(proc.stdout)["rollfilter"]["shards"] == {"of": 4, "present": [0, 1, 2, 3], "missing": []}
    assert sorted(Counter(sent_pairs(agent)).values()) == [1] * 6  # every pair of the six rows once


def test_shard_auto_refuses_a_shard_another_output_holds(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command
):
    first = ["-u", agent.run_url, "--shard", "auto", "-o", str(tmp_path / "a-1.jsonl"), str(data)]
    assert rollfilter(first, env=array_task(1, 0, 3))[0] == ExitStatus.OK
    again = ["-u", agent.run_url, "--shard", "auto", "-o", str(tmp_path / "b-1.jsonl"), str(data)]
    status, stderr = rollfilter(again, env=array_task(1, 0, 3))
    assert status == ExitStatus.USAGE
    assert f"shard 1/3, which {tmp_path / 'a-1.jsonl'} holds already" in stderr
    other_inputs = tmp_path / "other.jsonl"
    other_inputs.write_text(rows_jsonl(simple_rows(2)))
    another_run = ["-u", agent.run_url, "--shard", "auto", "-o", str(tmp_path / "c-1.jsonl"), str(other_inputs)]
    assert rollfilter(another_run, env=array_task(1, 0, 2))[0] == ExitStatus.OK  # not the same run: no matter


def test_summarize_says_which_shards_of_n_it_was_given(
    tmp_path: Path, agent: RecordingAgent, data: Path, capfd, rollfilter: Command
):
    shards = [tmp_path / f"shard-{i}.jsonl" for i in range(3)]
    for i, path in enumerate(shards):
        assert rollfilter(["-u", agent.run_url, "--shard", f"{i}/3", "-o", str(path), str(data)])[0] == 0
    status, stderr, summary = summarize(capfd, shards)
    assert (status, stderr) == (ExitStatus.OK, "")
    assert summary["rollfilter"]["succeeded"] == 6
    assert summary["rollfilter"]["shards"] == {"of": 3, "present": [0, 1, 2], "missing": []}
    status, stderr, summary = summarize(capfd, [shards[0], shards[2]])
    assert status == ExitStatus.ROWS_FAILED
    assert stderr == "rollfilter: --summarize: shard 1 of 3 is missing (present: 0, 2)\n"
    assert summary["rollfilter"]["shards"] == {"of": 3, "present": [0, 2], "missing": [1]}
    proc = invoke(["--summarize"], input=b"".join(path.read_bytes() for path in (shards[0], shards[2])))
    assert proc.returncode == ExitStatus.OK  # nothing could be checked, and that is said
    assert proc.stderr.decode() == (
        "rollfilter: --summarize: shards cannot be checked from standard input (no run record beside its lines):"
        " give the result files themselves, as in rollfilter --summarize shard-*.jsonl\n"
    )
    assert json.loads(proc.stdout)["rollfilter"]["succeeded"] == 4
    proc = invoke(["--summarize", str(shards[0]), "-"], input=b"".join(path.read_bytes() for path in shards[1:]))
    assert proc.returncode == ExitStatus.OK  # shards 1 and 2 came on standard input: none is said missing
    assert proc.stderr.decode().startswith("rollfilter: --summarize: shards cannot be checked from standard input")
    assert proc.stderr.count(b"\n") == 1
    assert json.loads(proc.stdout)["rollfilter"]["shards"] == {"of": 3, "present": [0], "missing": None}
    status, stderr, _ = summarize(capfd, [*shards, shards[1]])
    assert status == ExitStatus.ROWS_FAILED
    assert stderr == (
        f"rollfilter: 2 results repeat a (task, rollout) pair counted already, counted once; the first: {shards[1]}:1\n"
        f"rollfilter: --summarize: shard 1/3 is given 2 times: {shards[1]} {shards[1]}\n"
    )


def test_summarize_names_shards_that_are_not_of_one_run(
    tmp_path: Path, agent: RecordingAgent, data: Path, capfd, rollfilter: Command
):
    one, other, whole = (tmp_path / name for name in ("one.jsonl", "other.jsonl", "whole.jsonl"))
    assert rollfilter(["-u", agent.run_url, "--shard", "0/2", "-o", str(one), str(data)])[0] == 0
    assert (
        rollfilter(["-u", agent.run_url, "-r", "1", "-p", "x=1", "--shard", "1/2", "-o", str(other), str(data)])[0] == 0
    )
    assert rollfilter(["-u", agent.run_url, "-o", str(whole), str(data)])[0] == 0
    status, stderr, _ = summarize(capfd, [one, other, whole])
    assert status == ExitStatus.ROWS_FAILED
    assert stderr.splitlines() == [
        # whole.jsonl has every pair of the other two again
        f"rollfilter: 6 results repeat a (task, rollout) pair counted already, counted once; the first: {whole}:1",
        f"rollfilter: --summarize: {other} is not from the run {one} is from: -p: none in {one}, x=1 here",
        f"rollfilter: --summarize: {whole} is not a shard: its run had no --shard",
    ]


def test_summarize_leaves_files_without_a_record_out_of_the_coverage(
    tmp_path: Path, agent: RecordingAgent, data: Path, capfd, rollfilter: Command
):
    # An errors record, or results NeMo Gym wrote: their shard is unknown, and they still count.
    one, errors = tmp_path / "one.jsonl", tmp_path / "errors.jsonl"
    assert rollfilter(["-u", agent.run_url, "--shard", "0/1", "-o", str(one), str(data)])[0] == 0
    errors.write_text('{"_ng_task_index": 9, "_ng_rollout_index": 0, "error": {"kind": "timeout"}}\n')
    status, stderr, summary = summarize(capfd, [one, errors])
    assert (status, stderr) == (ExitStatus.OK, "")
    assert summary["rollfilter"]["failed"] == 1
    assert summary["rollfilter"]["shards"] == {"of": 1, "present": [0], "missing": []}


def test_compare_takes_a_baseline_in_shards_as_a_quoted_glob_and_names_a_shard_missing(
    tmp_path: Path, agent: RecordingAgent, data: Path, rollfilter: Command
):
    for i in range(3):
        shard = ["-u", agent.run_url, "--shard", f"{i}/3", "-o", str(tmp_path / f"A-{i}.jsonl"), str(data)]
        assert rollfilter(shard)[0] == ExitStatus.OK
    assert rollfilter(["-u", agent.run_url, "-o", str(tmp_path / "b.jsonl"), str(data)])[0] == ExitStatus.OK
    results = str(tmp_path / "b.jsonl")
    pattern = str(tmp_path / "A-*")  # the run records beside the shards match too, and are left out
    proc = invoke(["--summarize", "--compare", pattern, results])
    assert proc.returncode == ExitStatus.OK, proc.stderr
    assert proc.stderr == b""
    assert json.loads(proc.stdout)["rollfilter"]["compared_tasks"]["paired"] == 6
    (tmp_path / "A-1.jsonl").unlink()
    proc = invoke(["--summarize", "--compare", pattern, results])
    assert proc.returncode == ExitStatus.ROWS_FAILED
    assert "rollfilter: --compare: shard 1 of 3 is missing (present: 0, 2)\n" in proc.stderr.decode()
    assert json.loads(proc.stdout)["rollfilter"]["compared_tasks"]["only_in_this_run"] == 2
    nothing = invoke(["--summarize", "--compare", str(tmp_path / "C-*.jsonl"), results])
    assert nothing.returncode == ExitStatus.USAGE
    assert nothing.stderr.decode() == f"rollfilter: --compare {tmp_path / 'C-*.jsonl'}: no file matches it\n"
