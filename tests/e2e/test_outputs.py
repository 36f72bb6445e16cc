"""Where outputs meet: two outputs that are one file, an output on a standard stream, the run
record's name, and one run on an output at a time (its lock). Nothing is lost or doubled."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import IO

import pytest

from rollfilter.errors import ExitStatus
from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    read_jsonl,
    rows_jsonl,
    run,
    simple_rows,
    start,
    summary_of,
    wait_for,
)
from tests.servers.recording_agent import RecordingAgent

SAME_FILE = "two outputs cannot be one file"
WHOLE_FILE_OPTIONS = ["--metrics", "--materialized", "--aggregate", "--progress-file"]


@pytest.fixture
def data(tmp_path: Path) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text(rows_jsonl(simple_rows(20)))
    return path


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def stdout_spelling(spelling: str, tmp_path: Path, stdout_file: Path) -> str:
    """A name of standard output's file: by the system's links to descriptor 1, or a link of ours."""
    if spelling == "symlink":
        (tmp_path / "link").symlink_to(stdout_file)
        return str(tmp_path / "link")
    if spelling == "hard link":
        (tmp_path / "hard").hardlink_to(stdout_file)
        return str(tmp_path / "hard")
    return spelling


SPELLINGS = ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "symlink", "hard link"]
# Every spelling with one option, and every other option with one spelling each: one check serves
# all the options, so their whole product would run the same lines twenty times.
OPTION_SPELLINGS = [(WHOLE_FILE_OPTIONS[0], spelling) for spelling in SPELLINGS] + [
    (option, SPELLINGS[number]) for number, option in enumerate(WHOLE_FILE_OPTIONS[1:], start=1)
]


@pytest.mark.parametrize(("option", "spelling"), OPTION_SPELLINGS)
def test_a_whole_file_output_on_the_results_file_is_refused(
    tmp_path: Path, agent: RecordingAgent, data: Path, option: str, spelling: str
):
    results = tmp_path / "o.txt"
    results.touch()
    name = stdout_spelling(spelling, tmp_path, results)
    before = listing(tmp_path)
    with results.open("wb") as stdout:
        proc = run(["-u", agent.run_url, "-a", "agent", "-q", option, name, str(data)], stdout=stdout)
    assert proc.returncode == ExitStatus.USAGE
    assert proc.stderr.decode() == f"rollfilter: {option} {name} is also standard output: {SAME_FILE}\n"
    assert agent.bodies == []
    assert results.read_bytes() == b""
    assert listing(tmp_path) == before  # nothing created


@pytest.mark.parametrize("option", ["--metrics", "--errors", "--per-task", "--aggregate"])
def test_an_output_on_the_file_of_standard_error_is_refused(
    tmp_path: Path, agent: RecordingAgent, data: Path, option: str
):
    errors = tmp_path / "e.txt"
    with errors.open("wb") as stderr:
        proc = run(["-u", agent.run_url, "-a", "agent", "-r", "2", option, "/dev/stderr", str(data)], stderr=stderr)
    assert proc.returncode == ExitStatus.USAGE
    assert errors.read_text() == f"rollfilter: {option} /dev/stderr is also standard error: {SAME_FILE}\n"
    assert agent.bodies == []


def test_an_output_on_the_pipe_of_the_results_is_refused(tmp_path: Path, agent: RecordingAgent, data: Path):
    # `rollfilter --metrics /dev/stdout | jq` would read the summary as one more result.
    proc = run(["-u", agent.run_url, "--errors", "/dev/stdout", str(data)])
    assert proc.returncode == ExitStatus.USAGE
    assert proc.stderr.decode() == f"rollfilter: --errors /dev/stdout is also standard output: {SAME_FILE}\n"
    assert agent.bodies == []


def test_standard_output_is_free_for_the_summary_when_results_go_to_a_file(
    tmp_path: Path, agent: RecordingAgent, data: Path
):
    out = tmp_path / "out.jsonl"
    proc = run(["-u", agent.run_url, "-q", "-o", str(out), "--metrics", "/dev/stdout", str(data)])
    assert proc.returncode == ExitStatus.OK, proc.stderr
    assert json.loads(proc.stdout)["rollfilter"]["succeeded"] == 20
    assert len(read_jsonl(out)) == 20


def test_dev_null_may_take_several_outputs(agent: RecordingAgent, data: Path):
    args = ["-u", agent.run_url, "-q", "--metrics", "/dev/null", "--errors", "/dev/null", "--per-task", "/dev/null"]
    with open(os.devnull, "wb") as null:
        proc = run([*args, "-r", "2", str(data)], stdout=null)
    assert proc.returncode == ExitStatus.OK, proc.stderr
    assert len(agent.bodies) == 40


@pytest.mark.parametrize("spelling", ["same", "dot", "symlink", "hard link", "dangling symlink"])
def test_two_outputs_that_are_one_file_are_refused_by_any_name(
    tmp_path: Path, agent: RecordingAgent, data: Path, spelling: str
):
    out = tmp_path / "out.jsonl"
    if spelling in ("symlink", "hard link"):
        out.touch()
    other = {
        "same": out,
        "dot": tmp_path / "." / "out.jsonl",
        "symlink": tmp_path / "to-out",
        "hard link": tmp_path / "hard-out",
        "dangling symlink": tmp_path / "to-new",
    }[spelling]
    if spelling in ("symlink", "dangling symlink"):
        other.symlink_to(out)
    elif spelling == "hard link":
        other.hardlink_to(out)
    before = listing(tmp_path)
    proc = run(["-u", agent.run_url, "-o", str(out), "--metrics", str(other), str(data)])
    assert proc.returncode == ExitStatus.USAGE
    assert proc.stderr.decode() == f"rollfilter: --metrics {other} is also -o {out}: {SAME_FILE}\n"
    assert listing(tmp_path) == before
    assert agent.bodies == []


def test_each_output_has_a_record_of_its_own(tmp_path: Path, agent: RecordingAgent, data: Path):
    # a.jsonl and a.json used to share a_run.json: resuming one was refused with the other's options.
    first = run(["-u", agent.run_url, "-q", "-r", "2", "-o", str(tmp_path / "a.jsonl"), str(data)])
    second = run(["-u", agent.run_url, "-q", "-r", "3", "-o", str(tmp_path / "a.json"), str(data)])
    assert (first.returncode, second.returncode) == (0, 0)
    assert json.loads((tmp_path / "a.jsonl.run.json").read_text())["repeats"] == 2
    assert json.loads((tmp_path / "a.json.run.json").read_text())["repeats"] == 3
    again = run(["-u", agent.run_url, "-q", "-r", "2", "--resume", "-o", str(tmp_path / "a.jsonl"), str(data)])
    assert again.returncode == ExitStatus.OK, again.stderr
    assert summary_of(run(["--summarize", str(tmp_path / "a.jsonl")]).stdout)["rollfilter"]["succeeded"] == 40


@pytest.mark.parametrize("option", ["-o", "--errors", "--metrics", "--progress-file"])
def test_an_output_named_as_a_run_record_is_refused(tmp_path: Path, agent: RecordingAgent, data: Path, option: str):
    out = tmp_path / "out.jsonl"
    assert run(["-u", agent.run_url, "-q", "-o", str(out), str(data)]).returncode == 0
    record = (tmp_path / "out.jsonl.run.json").read_bytes()
    target = tmp_path / "out.jsonl.run.json"
    args = ["-o", str(tmp_path / "new.jsonl")] if option != "-o" else []
    proc = run(["-u", agent.run_url, *args, option, str(target), str(data)])
    assert proc.returncode == ExitStatus.USAGE
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith(f"rollfilter: {option} {target}: a name ending in .run.json is a run record's")
    assert target.read_bytes() == record
    assert not (tmp_path / "new.jsonl").exists()


def test_the_run_record_of_this_run_is_one_of_its_outputs(tmp_path: Path, agent: RecordingAgent, data: Path):
    out = tmp_path / "out.jsonl"
    link = tmp_path / "record-link"
    link.symlink_to(tmp_path / "out.jsonl.run.json")
    proc = run(["-u", agent.run_url, "-o", str(out), "--metrics", str(link), str(data)])
    assert proc.returncode == ExitStatus.USAGE
    assert "a name ending in .run.json is a run record's" in proc.stderr.decode()
    assert agent.bodies == []


# One run on an output at a time.


def hold(path: Path, *, shared: bool = False) -> int:
    """An open file description of `path` with a flock on it, as another run's would be."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o666)
    fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
    return fd


@pytest.mark.parametrize("option", ["-o", "--errors", "--per-task"])
@pytest.mark.parametrize("resume", [False, True])
def test_an_output_another_run_holds_is_refused_at_once(
    tmp_path: Path, agent: RecordingAgent, data: Path, option: str, resume: bool
):
    out, target = tmp_path / "out.jsonl", tmp_path / "held.jsonl"
    held = hold(target)
    try:
        args = ["-u", agent.run_url, "-r", "2", *(["--resume"] * resume)]
        args += ["-o", str(out)] if option != "-o" else []
        proc = run([*args, option, str(target), str(data)])
    finally:
        os.close(held)
    assert proc.returncode == ExitStatus.OUTPUT_IN_USE
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith(f"rollfilter: {option} {target} is in use by process {os.getpid()} (")
    assert line.endswith("one run writes an output at a time (--wait-lock waits)")
    assert agent.bodies == []
    assert target.read_bytes() == b""
    assert not out.exists() or option == "-o"  # what it created it removed


def test_runs_that_append_share_an_output_but_not_with_a_run_that_owns_it(
    tmp_path: Path, agent: RecordingAgent, data: Path
):
    out = tmp_path / "out.jsonl"
    held = hold(out, shared=True)  # another --append run
    try:
        appended = run(["-u", agent.run_url, "-q", "--append", "-o", str(out), str(data)])
        fresh = run(["-u", agent.run_url, "-q", "-o", str(tmp_path / "other.jsonl"), "--errors", str(out), str(data)])
    finally:
        os.close(held)
    assert appended.returncode == ExitStatus.OK, appended.stderr
    assert fresh.returncode == ExitStatus.OUTPUT_IN_USE
    assert len(read_jsonl(out)) == 20


def test_a_lock_dies_with_the_process_that_held_it(tmp_path: Path, agent: RecordingAgent, data: Path):
    out = tmp_path / "out.jsonl"
    code = "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT); fcntl.flock(fd, 2)"
    holder = subprocess.Popen([sys.executable, "-c", code + "; print(flush=True); time.sleep(60)", str(out)],
                              stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert holder.stdout is not None
        holder.stdout.readline()  # it holds the lock
        refused = run(["-u", agent.run_url, "-q", "-o", str(out), str(data)])
        assert refused.returncode == ExitStatus.OUTPUT_IN_USE
        assert f"process {holder.pid} (python" in refused.stderr.decode()
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(SUBPROCESS_TIMEOUT)
        holder.stdout.close()  # type: ignore[union-attr]
    proc = run(["-u", agent.run_url, "-q", "-o", str(out), str(data)])
    assert proc.returncode == ExitStatus.OK, proc.stderr
    assert len(read_jsonl(out)) == 20


def test_wait_lock_waits_for_the_run_holding_the_output(tmp_path: Path, agent: RecordingAgent, data: Path):
    out = tmp_path / "out.jsonl"
    held = hold(out)
    waiting = start(["-u", agent.run_url, "-q", "--wait-lock", "-o", str(out), str(data)])
    try:
        assert waiting.stderr is not None
        line = waiting.stderr.readline().decode()
        assert line.startswith(f"rollfilter: -o {out} is in use by process {os.getpid()} (")
        assert line.endswith(": waiting for it (--wait-lock)\n")
        time.sleep(0.3)
        assert waiting.poll() is None
        assert agent.bodies == []
    finally:
        os.close(held)
    assert waiting.wait(SUBPROCESS_TIMEOUT) == ExitStatus.OK
    waiting.stderr.close()
    waiting.stdout.close()  # type: ignore[union-attr]
    assert len(read_jsonl(out)) == 20


def is_locked(path: Path) -> bool:
    """Whether another open file description holds a flock on `path`."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_second_run_on_an_output_in_use_exits_at_once_and_writes_nothing(
    tmp_path: Path, agent: RecordingAgent, data: Path
):
    # The first run plans NeMo Gym's files from its piped rows, and holds -o while its pipe is open.
    out = tmp_path / "out.jsonl"
    first = start(["-u", agent.run_url, "-q", "-a", "agent", "--gym-layout", "-o", str(out)], stdin=subprocess.PIPE)
    assert first.stdin is not None
    first.stdin.write(data.read_bytes())
    first.stdin.flush()
    wait_for(lambda: is_locked(out))
    second = run(["-u", agent.run_url, "-q", "-a", "agent", "--gym-layout", "-o", str(out), str(data)])
    assert second.returncode == ExitStatus.OUTPUT_IN_USE
    assert second.stderr.decode().startswith(f"rollfilter: -o {out} is in use by process {first.pid} (rollfilter)")
    first.stdin.close()
    assert first.wait(SUBPROCESS_TIMEOUT) == ExitStatus.OK
    for stream in (first.stdout, first.stderr):
        stream.close()  # type: ignore[union-attr]
    pairs = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(out))
    assert pairs == Counter({(task, 0): 1 for task in range(20)})
    assert len(read_jsonl(tmp_path / "out_materialized_inputs.jsonl")) == 20
    assert len(agent.bodies) == 20


def test_two_resumes_started_together_finish_every_pair_once(tmp_path: Path, data: Path):
    slow = DemoServer("--latency", "0.03")
    try:
        out = tmp_path / "out.jsonl"
        args = ["-u", slow.url, "-q", "-j", "4", "-r", "5", "-o", str(out), str(data)]
        killed = start(args)
        wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 8)
        killed.send_signal(signal.SIGKILL)
        killed.wait(SUBPROCESS_TIMEOUT)
        for stream in (killed.stdout, killed.stderr):
            stream.close()  # type: ignore[union-attr]
        resumes = [start([*args, "--resume"]) for _ in range(2)]
        ended = [(process.wait(SUBPROCESS_TIMEOUT), process.stderr.read().decode()) for process in resumes]  # type: ignore[union-attr]
        for process in resumes:
            process.stdout.close()  # type: ignore[union-attr]
            process.stderr.close()  # type: ignore[union-attr]
        assert sorted(status for status, _ in ended) == [ExitStatus.OK, ExitStatus.OUTPUT_IN_USE], ended
        pairs = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in read_jsonl(out))
        assert pairs == Counter({(task, rollout): 1 for task in range(20) for rollout in range(5)})
    finally:
        slow.kill()


def test_results_to_dev_stdout_on_a_pipe_keep_no_record(tmp_path: Path, agent: RecordingAgent, data: Path):
    # A pipe's real path is no path ("pipe:[N]"): there is nothing to keep a record beside.
    proc = run(["-u", agent.run_url, "-q", "-o", "/dev/stdout", str(data)], cwd=tmp_path)
    assert proc.returncode == ExitStatus.OK, proc.stderr
    assert len(proc.stdout.splitlines()) == 20
    assert listing(tmp_path) == ["data.jsonl"]


def test_an_output_that_is_an_input_pipe_is_refused(tmp_path: Path, agent: RecordingAgent, data: Path):
    # --errors /dev/stdin would feed its records back as rows, and the run would never end.
    proc = run(
        ["-u", agent.run_url, "--errors", "/dev/stdin", "-o", str(tmp_path / "out.jsonl")], input=data.read_text()
    )
    assert proc.returncode == ExitStatus.USAGE
    assert (
        proc.stderr.decode() == "rollfilter: --errors /dev/stdin is also the input <stdin>: input file is output file\n"
    )
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    proc = run(["-u", agent.run_url, "--errors", str(fifo), str(fifo)])  # refused before either is opened
    assert proc.returncode == ExitStatus.USAGE
    assert agent.bodies == []


def test_a_refused_run_removes_the_folders_it_made(tmp_path: Path, agent: RecordingAgent, data: Path):
    used = tmp_path / "used.jsonl"
    used.write_text("{}\n")
    proc = run(
        ["-u", agent.run_url, "-o", str(tmp_path / "new" / "sub" / "out.jsonl"), "--errors", str(used), str(data)]
    )
    assert proc.returncode == ExitStatus.USAGE
    assert listing(tmp_path) == ["data.jsonl", "used.jsonl"]
    held = hold(tmp_path / "held.jsonl")
    try:
        proc = run(
            [
                "-u",
                agent.run_url,
                "-o",
                str(tmp_path / "held.jsonl"),
                "--errors",
                str(tmp_path / "e" / "e.jsonl"),
                str(data),
            ]
        )
    finally:
        os.close(held)
    assert proc.returncode == ExitStatus.OUTPUT_IN_USE
    assert listing(tmp_path) == ["data.jsonl", "held.jsonl", "used.jsonl"]


def test_a_materialized_file_another_run_builds_or_holds_is_refused(tmp_path: Path, agent: RecordingAgent, data: Path):
    materialized = tmp_path / "m.jsonl"
    args = ["-u", agent.run_url, "-q", "-a", "agent", "--materialized", str(materialized)]
    # The first run holds its materialized file from before its first pass, which waits for stdin.
    first = start([*args, "-o", str(tmp_path / "a.jsonl")], stdin=subprocess.PIPE)
    assert first.stdin is not None
    try:
        wait_for(lambda: any(name.endswith(".claim.tmp") for name in os.listdir(tmp_path)))
        second = run([*args, "-o", str(tmp_path / "b.jsonl"), str(data)])
        assert second.returncode == ExitStatus.OUTPUT_IN_USE
        assert second.stderr.decode().startswith(
            f"rollfilter: --materialized {materialized} is in use by process {first.pid} ("
        )
        first.stdin.write(data.read_bytes())
        first.stdin.close()
        assert first.wait(SUBPROCESS_TIMEOUT) == ExitStatus.OK
    finally:
        if first.poll() is None:
            first.kill()
            first.wait(SUBPROCESS_TIMEOUT)
        for stream in (first.stdout, first.stderr):
            stream.close()  # type: ignore[union-attr]
    assert len(read_jsonl(materialized)) == 20
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".tmp")]
    held = hold(materialized)  # as the first run held the file it made, until it ended
    try:
        again = run([*args, "--append", "-o", str(tmp_path / "a.jsonl"), str(data)])
    finally:
        os.close(held)
    assert again.returncode == ExitStatus.OUTPUT_IN_USE
    assert len(read_jsonl(materialized)) == 20


def test_overwrite_replaces_an_output_of_another_run_and_its_record(tmp_path: Path, agent: RecordingAgent, data: Path):
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    assert run(["-u", agent.run_url, "-p", "x=1", "-o", str(out), "--errors", str(errors), str(data)]).returncode == 0
    errors.write_text('{"error": "an earlier run\'s"}\n')
    other = tmp_path / "other.jsonl"
    other.write_text(rows_jsonl(simple_rows(3)))
    again = ["-u", agent.run_url, "-o", str(out), "--errors", str(errors), str(other)]
    refused = run(again)
    assert refused.returncode == ExitStatus.USAGE
    assert "--overwrite to replace it" in refused.stderr.decode()
    proc = run([*again, "--overwrite"])
    assert proc.returncode == 0, proc.stderr
    assert sorted(line["_ng_task_index"] for line in read_jsonl(out)) == [0, 1, 2]  # this run's alone
    assert errors.read_bytes() == b""
    record = json.loads((tmp_path / "out.jsonl.run.json").read_text())
    assert "x=1" not in json.dumps(record)  # the record is this run's
    assert run([*again, "--resume"]).returncode == 0  # and a resume of it agrees with it


def test_overwrite_takes_the_lock_before_it_empties_anything(tmp_path: Path, agent: RecordingAgent, data: Path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0}\n')
    held = hold(out)
    try:
        proc = run(["-u", agent.run_url, "-o", str(out), "--overwrite", str(data)])
    finally:
        os.close(held)
    assert proc.returncode == ExitStatus.OUTPUT_IN_USE
    assert out.read_text() == '{"_ng_task_index": 0, "_ng_rollout_index": 0}\n'
    assert agent.bodies == []


@pytest.mark.parametrize("others", [[], ["--resume"], ["--append"]])
def test_overwrite_wants_an_output_of_its_own(tmp_path: Path, agent: RecordingAgent, data: Path, others: list[str]):
    output = ["-o", str(tmp_path / "out.jsonl")] if others else []
    proc = run(["-u", agent.run_url, *output, "--overwrite", *others, str(data)])
    assert proc.returncode == ExitStatus.USAGE
    assert proc.stderr.decode() == (
        "rollfilter: --overwrite replaces -o FILE with a new run: give -o, and neither --resume nor --append\n"
    )


def test_a_signal_while_wait_lock_waits_stops_with_the_summary_of_nothing_sent(
    tmp_path: Path, agent: RecordingAgent, data: Path
):
    out = tmp_path / "out.jsonl"
    held = hold(out)
    waiting = start(["-u", agent.run_url, "--wait-lock", "-o", str(out), str(data)])
    try:
        assert waiting.stderr is not None
        assert waiting.stderr.readline().decode().endswith(": waiting for it (--wait-lock)\n")
        waiting.send_signal(signal.SIGTERM)
        assert waiting.wait(SUBPROCESS_TIMEOUT) == ExitStatus.TERMINATED
        figures = summary_of(waiting.stderr.read())["rollfilter"]
    finally:
        os.close(held)
        waiting.kill()
        waiting.wait(SUBPROCESS_TIMEOUT)
    assert (figures["stopped"], figures["rows_read"]) == ("terminated", 0)
    assert agent.bodies == []
    waiting.stderr.close()
    waiting.stdout.close()  # type: ignore[union-attr]


def nameless_file(folder: Path, nameless: str) -> IO[bytes]:
    """A file in `folder` with no name: made so (anonymous), or whose name was removed (deleted)."""
    if nameless == "anonymous":
        return tempfile.TemporaryFile(dir=folder)
    file = (folder / "out.jsonl").open("w+b")
    (folder / "out.jsonl").unlink()
    return file


# Each spelling once and each nameless file once: both spellings are stat()ed to the one file, so
# their product would run the same lines twice over.
@pytest.mark.parametrize(("nameless", "spelling"), [("anonymous", "/dev/stdout"), ("deleted", "/proc/self/fd/1")])
def test_an_output_with_no_name_of_its_own_gets_no_file_beside_it(tmp_path: Path, nameless: str, spelling: str):
    # Its real path is "#N (deleted)" or "out.jsonl (deleted)": a file made beside it would take
    # a name no later run finds (or another's, once the inode number is reused).
    folder = tmp_path / "folder"
    folder.mkdir()
    with nameless_file(folder, nameless) as results:
        proc = run(["--demo", "-r", "2", "--groups", "-o", spelling], input=rows_jsonl(simple_rows(3)), stdout=results)
        assert proc.returncode == 0, proc.stderr
        results.seek(0)
        pairs = sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in map(json.loads, results))
    assert pairs == [(task, rollout) for task in range(3) for rollout in range(2)]
    assert listing(folder) == []


@pytest.mark.parametrize("resume", [[], ["--resume"]])
def test_the_files_beside_an_output_are_no_more_readable_than_it(tmp_path: Path, resume: list[str]):
    out = tmp_path / "out.jsonl"
    out.touch(mode=0o600)
    out.chmod(0o600)
    held = tmp_path / "out.jsonl.held"
    if resume:  # one an earlier run made wider than -o
        held.touch()
        held.chmod(0o644)
    proc = run(["--demo", "-r", "2", "--groups", "-o", str(out), *resume], input=rows_jsonl(simple_rows(3)))
    assert proc.returncode == 0, proc.stderr
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in tmp_path.iterdir()}
    assert modes == {"out.jsonl": 0o600, "out.jsonl.held": 0o600, "out.jsonl.run.json": 0o600}
