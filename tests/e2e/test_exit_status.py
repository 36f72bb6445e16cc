"""Exit statuses of the command: full devices, closed and full standard streams, refused outputs, start-up."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollfilter.errors import ExitStatus
from tests.conftest import (
    CLOSED_PORT_URL,
    SIGNALLED_AT_IMPORT,
    SUBPROCESS_TIMEOUT,
    TOO_LARGE,
    DemoServer,
    clean_env,
    closed_port_url,
    result_lines,
    rollfilter_command,
    rows_jsonl,
    run,
    run_process,
    simple_rows,
    start,
    summary_of,
    with_closed_port,
)

DISK_FULL = "No space left on device"  # strerror(ENOSPC)


NEVER_ANSWERED = {"latency": 600}  # longer than any test waits: such a row ends only by being cancelled


def messages(stderr: bytes) -> list[str]:
    """The stderr lines that are not the summary."""
    return [line for line in stderr.decode().splitlines() if not line.startswith("{")]


def read_pairs(path: Path) -> Counter[tuple[int, int]]:
    """(task, rollout) of every line; each line must be a whole JSON object."""
    results = map(json.loads, path.read_text().splitlines())
    return Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in results)


def slow_then_fast(slow: int, fast: int) -> list[dict]:
    """`slow` rows the agent never answers in time, then `fast` rows it answers at once."""
    rows = simple_rows(slow + fast)
    for row in rows[:slow]:
        row["demo"] = NEVER_ANSWERED
    return rows


def run_with_output_on(device: str, args: list[str], rows: list[dict], stream: str = "stdout"):
    with open(device, "wb") as sink:
        return run(args, input=rows_jsonl(rows), **{stream: sink})


def limit_file_size(limit: int) -> Callable[[], None]:
    """For preexec_fn: files the child writes stop at `limit` bytes, as on a full disk.
    SIGXFSZ is ignored (Python ignores it anyway), so the write fails with EFBIG."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return apply


TMPFS_OPT_IN = "ROLLFILTER_TEST_TMPFS"


OUTPUT_OPTIONS = ["-o", "--errors", "--materialized", "--aggregate", "--metrics", "--per-task", "--progress-file"]


SAME_FILE = "input file is output file"  # GNU cat's words


def run_with_closed(descriptor: str, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """rollfilter started with a standard descriptor closed, as `>&-`, `2>&-` or `<&-` in a shell does."""
    closed = {"stdin": "<&-", "stdout": ">&-", "stderr": "2>&-"}[descriptor]
    return run(["-c", f'exec "$@" {closed}', "sh", *rollfilter_command(), *args], command=["/bin/sh"], **kwargs)


BAD_FD = "Bad file descriptor"  # strerror(EBADF)


def test_stdout_on_a_full_device_stops_the_run_and_exits_74(demo_server: DemoServer):
    proc = run_with_output_on("/dev/full", ["-u", demo_server.url], slow_then_fast(5, 20))
    assert proc.returncode == ExitStatus.OUTPUT_FAILED == 74
    assert messages(proc.stderr) == [f"rollfilter: cannot write standard output: {DISK_FULL}"]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert figures["stopped"] == f"cannot write standard output: {DISK_FULL}"
    assert figures["cancelled"] >= 5  # the rows still in flight were cancelled, not waited for


def test_errors_file_on_a_full_device_exits_74_and_keeps_the_results(demo_server: DemoServer):
    rows = [*slow_then_fast(3, 6), "not json"]
    data = "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)
    proc = run(["-u", demo_server.url, "--errors", "/dev/full"], input=data)
    assert proc.returncode == 74
    assert messages(proc.stderr) == [f"rollfilter: cannot write --errors /dev/full: {DISK_FULL}"]
    assert summary_of(proc.stderr)["rollfilter"]["stopped"].startswith("cannot write --errors /dev/full")
    for result in result_lines(proc.stdout):  # what was written is whole lines of finished rows
        assert 3 <= result["_ng_task_index"] < 9


def test_failure_lines_on_a_full_stderr_exit_74(demo_server: DemoServer):
    with open("/dev/full", "wb") as full:
        proc = run(["-u", demo_server.url], input=rows_jsonl(simple_rows(3)) + "not json\n", stderr=full)
    assert proc.returncode == 74  # the failure's line was lost: the run must not say all is well


def test_metrics_file_on_a_full_device_exits_74_after_the_run(demo_server: DemoServer):
    proc = run(["-u", demo_server.url, "--metrics", "/dev/full"], input=rows_jsonl(simple_rows(5)))
    assert proc.returncode == 74
    assert len(result_lines(proc.stdout)) == 5
    assert messages(proc.stderr) == [f"rollfilter: cannot write --metrics /dev/full: {DISK_FULL}"]
    assert summary_of(proc.stderr)["rollfilter"]["succeeded"] == 5  # the summary still reaches stderr


def test_summarize_with_a_full_metrics_file_or_stdout_exits_74(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text(rows_jsonl([{"_ng_task_index": i, "_ng_rollout_index": 0, "reward": 1.0} for i in range(3)]))
    proc = run(["--summarize", "--metrics", "/dev/full", str(results)])
    assert proc.returncode == 74
    assert json.loads(proc.stdout)["rollfilter"]["succeeded"] == 3
    assert proc.stderr.decode() == f"rollfilter: cannot write --metrics /dev/full: {DISK_FULL}\n"
    proc = run_with_output_on("/dev/full", ["--summarize", str(results)], [])
    assert proc.returncode == 74
    message, summary = proc.stderr.decode().splitlines()
    assert message == f"rollfilter: cannot write standard output: {DISK_FULL}"
    assert json.loads(summary)["rollfilter"]["succeeded"] == 3  # what stdout could not take goes to stderr


def test_per_task_file_on_a_full_device_exits_74(demo_server: DemoServer):
    proc = run(["-u", demo_server.url, "-r", "2", "--per-task", "/dev/full"], input=rows_jsonl(simple_rows(5)))
    assert proc.returncode == 74
    assert messages(proc.stderr) == [f"rollfilter: cannot write --per-task /dev/full: {DISK_FULL}"]


def test_metrics_to_a_pipe_is_written_not_truncated(tmp_path, demo_server: DemoServer):
    out = tmp_path / "out.jsonl"
    proc = run(["-u", demo_server.url, "-o", str(out), "--metrics", "/dev/stdout"], input=rows_jsonl(simple_rows(3)))
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == summary_of(proc.stderr)


def test_dry_run_stops_when_its_reader_goes_away():
    # Standard input stays open: only the closed stdout can end this run.
    proc = start(["--dry-run", "-u", closed_port_url()], stdin=subprocess.PIPE)
    assert proc.stdin
    assert proc.stdout
    assert proc.stderr
    try:
        proc.stdin.write(rows_jsonl(simple_rows(10)).encode())
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline())["id"] == 0
        proc.stdout.close()
        assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == 141
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
        proc.stdin.close()
        proc.stderr.close()


def test_ordered_holdings_are_written_when_another_output_fails(demo_server: DemoServer):
    # Row 0 is never answered, so --ordered holds every later result behind it. Row 5 fails
    # late; its record cannot be written, which stops the run: what was held is written
    # then, in input order, as for an interrupt.
    rows = simple_rows(12)
    rows[0]["demo"] = NEVER_ANSWERED
    rows[5]["demo"] = {"latency": 0.25, "fault": "422"}
    proc = run(["-u", demo_server.url, "-k", "-j", "12", "--errors", "/dev/full"], input=rows_jsonl(rows))
    assert proc.returncode == 74
    assert [r["_ng_task_index"] for r in result_lines(proc.stdout)] == [1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["failed"], figures["cancelled"]) == (10, 1, 1)


@pytest.mark.parametrize("ordered", [False, True])
def test_output_file_that_hits_its_size_limit_then_resume_completes(tmp_path, demo_server: DemoServer, ordered):
    data, out = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    data.write_text(rows_jsonl(simple_rows(300)))
    args = ["-u", demo_server.url, "-j", "16", "-r", "2", "-o", str(out), *(["-k"] if ordered else []), str(data)]
    limit = 30_001  # not on a line boundary: the last write is cut short
    # Coverage (under .ci/run) could not save its data past the limit either: not in this run.
    unmeasured = {k: v for k, v in clean_env().items() if not k.startswith("COVERAGE_")}
    proc = run(args, preexec_fn=limit_file_size(limit), env=unmeasured)
    assert proc.returncode == 74
    assert messages(proc.stderr) == [f"rollfilter: cannot write -o {out}: {TOO_LARGE}"]
    assert summary_of(proc.stderr)["rollfilter"]["stopped"] == f"cannot write -o {out}: {TOO_LARGE}"
    assert out.stat().st_size == limit  # written as far as the limit allowed...
    assert not out.read_bytes().endswith(b"\n")  # ...ending in a torn line
    resumed = run([*args, "--resume"])  # the space is back
    assert resumed.returncode == 0, resumed.stderr
    pairs = read_pairs(out)  # the torn line was cut off: every line parses
    assert sorted(pairs) == [(t, k) for t in range(300) for k in range(2)]
    assert set(pairs.values()) == {1}


def test_a_copy_of_stdin_that_cannot_be_written_exits_74_with_the_summary(tmp_path, demo_server: DemoServer):
    # --materialized plans stdin twice, from a temporary copy: here the file size limit stops it.
    args = ["-u", demo_server.url, "--materialized", str(tmp_path / "m.jsonl")]
    unmeasured = {k: v for k, v in clean_env().items() if not k.startswith("COVERAGE_")}
    proc = run(args, input=rows_jsonl(simple_rows(2000)), preexec_fn=limit_file_size(10_000), env=unmeasured)
    assert proc.returncode == 74
    assert messages(proc.stderr) == [f"rollfilter: cannot write a temporary copy of standard input: {TOO_LARGE}"]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["stopped"]) == (0, messages(proc.stderr)[0].removeprefix("rollfilter: "))
    assert demo_server.stats()["requests"] == 0
    assert not (tmp_path / "m.jsonl").exists()


def test_a_run_record_that_cannot_be_written_exits_74_with_the_summary(tmp_path, demo_server: DemoServer):
    out = tmp_path / "out.jsonl"
    unmeasured = {k: v for k, v in clean_env().items() if not k.startswith("COVERAGE_")}
    args = ["-u", demo_server.url, "-o", str(out), "-p", "long=" + "x" * 300]
    proc = run(args, input=rows_jsonl(simple_rows(3)), preexec_fn=limit_file_size(100), env=unmeasured)
    assert proc.returncode == 74
    record = f"the run record {out}.run.json"
    assert messages(proc.stderr) == [f"rollfilter: cannot write {record}: {TOO_LARGE}"]
    assert summary_of(proc.stderr)["rollfilter"]["rows_read"] == 0  # nothing was sent
    assert demo_server.stats()["requests"] == 0


@pytest.mark.skipif(not os.environ.get(TMPFS_OPT_IN), reason=f"mounts a tmpfs as root: set {TMPFS_OPT_IN}=1")
def test_stdin_spooled_to_a_full_tmpdir_exits_74_with_the_summary(tmp_path, demo_server: DemoServer):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=True, timeout=30)
    try:
        args = ["-u", demo_server.url, "--materialized", str(tmp_path / "m.jsonl")]
        # A process of its own: this one's tempfile has chosen its folder already.
        proc = run_process(args, input=rows_jsonl(simple_rows(5000)), env=clean_env(TMPDIR=str(mount)))
        assert proc.returncode == 74
        assert messages(proc.stderr) == [f"rollfilter: cannot write a temporary copy of standard input: {DISK_FULL}"]
        assert summary_of(proc.stderr)["rollfilter"]["succeeded"] == 0
        assert demo_server.stats()["requests"] == 0
    finally:
        subprocess.run(["umount", str(mount)], check=True, timeout=30)


@pytest.mark.skipif(not os.environ.get(TMPFS_OPT_IN), reason=f"mounts a tmpfs as root: set {TMPFS_OPT_IN}=1")
def test_a_full_tmpfs_then_resume_after_space_is_freed(tmp_path, demo_server: DemoServer):
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True, timeout=30)
    try:
        data, out = tmp_path / "rows.jsonl", mount / "out.jsonl"
        data.write_text(rows_jsonl(simple_rows(2000)))
        args = ["-u", demo_server.url, "-j", "64", "-o", str(out), str(data)]
        proc = run(args)
        assert proc.returncode == 74
        assert messages(proc.stderr) == [f"rollfilter: cannot write -o {out}: {DISK_FULL}"]
        subprocess.run(["mount", "-o", "remount,size=4m", str(mount)], check=True, timeout=30)
        resumed = run([*args, "--resume"])
        assert resumed.returncode == 0, resumed.stderr
        pairs = read_pairs(out)
        assert sorted(pairs) == [(t, 0) for t in range(2000)]
        assert set(pairs.values()) == {1}
    finally:
        subprocess.run(["umount", str(mount)], check=True, timeout=30)


@pytest.mark.parametrize("option", ["-o", "--errors", "--metrics", "--per-task"])
def test_unwritable_output_files_exit_2_before_sending(tmp_path, demo_server: DemoServer, option):
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for path in (a_file / "file.jsonl", tmp_path):  # under a file (no folder can be made there); a folder
        proc = run(["-u", demo_server.url, "-r", "2", option, str(path)], input=rows_jsonl(simple_rows(3)))
        assert proc.returncode == 2, proc.stderr
        assert proc.stdout == b""
        [message] = proc.stderr.decode().splitlines()
        assert message.startswith(f"rollfilter: cannot write {option} {path}: ")
    assert demo_server.stats()["requests"] == 0


@pytest.mark.parametrize("link", ["same path", "symlink", "hard link"])
@pytest.mark.parametrize("option", OUTPUT_OPTIONS)
def test_an_output_that_is_also_an_input_is_refused_before_sending(
    tmp_path, demo_server: DemoServer, option: str, link: str
):
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(simple_rows(3)))
    output = tmp_path / "output.jsonl"
    if link == "symlink":
        output.symlink_to(data)
    elif link == "hard link":
        output.hardlink_to(data)
    else:
        output = data
    # -a: --aggregate asks agents by name, and -u alone names none
    proc = run(["-u", demo_server.url, "-a", "demo", "-r", "2", "--append", option, str(output), str(data)])
    assert proc.returncode == 2
    assert proc.stderr.decode() == f"rollfilter: {option} {output} is also the input {data}: {SAME_FILE}\n"
    assert data.read_text() == rows_jsonl(simple_rows(3))
    assert demo_server.stats()["requests"] == 0


def test_gym_layout_files_and_standard_streams_that_are_inputs_are_refused(tmp_path, demo_server: DemoServer):
    out = tmp_path / "out.jsonl"
    failures = tmp_path / "out_failures.jsonl"
    failures.write_text(rows_jsonl(simple_rows(2)))
    proc = run(["-u", demo_server.url, "-a", "demo", "--gym-layout", "--append", "-o", str(out), str(failures)])
    assert proc.returncode == 2
    assert proc.stderr.decode().endswith(f"{SAME_FILE}\n")
    with failures.open("ab") as appended:  # rollfilter F >> F
        proc = run(["-u", demo_server.url, str(failures)], stdout=appended)
    assert proc.returncode == 2
    assert proc.stderr.decode() == f"rollfilter: standard output is also the input {failures}: {SAME_FILE}\n"
    with failures.open("rb") as given:  # rollfilter -o F < F
        proc = run(["-u", demo_server.url, "--append", "-o", str(failures)], stdin=given)
    assert proc.returncode == 2
    assert proc.stderr.decode().endswith(f"is also the input <stdin>: {SAME_FILE}\n")
    with failures.open("ab") as appended:  # rollfilter --summarize F >> F
        proc = run(["--summarize", str(failures)], stdout=appended)
    assert proc.returncode == 2
    assert failures.read_text() == rows_jsonl(simple_rows(2))
    assert demo_server.stats()["requests"] == 0


def test_a_system_exit_message_is_printed_and_exits_1():
    # main() ends with os._exit, which would drop the message Python prints for sys.exit("...").
    code = "import sys, rollfilter.cli.main as cli\n"
    code += "cli.click_command = lambda: lambda **_: sys.exit('rollfilter: gave up')\ncli.main()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 1
    assert proc.stderr == b"rollfilter: gave up\n"


@pytest.mark.parametrize(
    ("args", "environment"),
    [
        (["--version"], {}),
        (["--help"], {}),
        ([], {"_ROLLFILTER_COMPLETE": "source_bash"}),  # the completion script, as a shell loads it
    ],
)
def test_version_and_help_with_stdout_closed_or_full_exit_74(args: list[str], environment: dict[str, str]):
    proc = run_with_closed("stdout", args, env=clean_env(**environment))
    assert (proc.returncode, proc.stderr.decode()) == (74, f"rollfilter: cannot write standard output: {BAD_FD}\n")
    with open("/dev/full", "wb") as sink:
        proc = run(args, stdout=sink, env=clean_env(**environment))
    assert (proc.returncode, proc.stderr.decode()) == (74, f"rollfilter: cannot write standard output: {DISK_FULL}\n")


def test_help_whose_reader_is_gone_exits_141_without_a_message():
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = run(["--help"], stdout=write_end)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (141, b"")


@pytest.mark.parametrize(("args", "status"), [(["--version"], 0), (["--help"], 0), (["--no-such-option"], 2)])
def test_version_help_and_usage_errors_with_stderr_closed(args: list[str], status: int):
    proc = run_with_closed("stderr", args)
    assert proc.returncode == status
    assert (b"rollfilter" in proc.stdout) == (status == 0)


def test_a_run_with_stdout_closed_exits_74_and_names_it(demo_server: DemoServer):
    proc = run_with_closed("stdout", ["-u", demo_server.url], input=rows_jsonl(simple_rows(3)))
    assert proc.returncode == 74
    assert messages(proc.stderr) == [f"rollfilter: cannot write standard output: {BAD_FD}"]


@pytest.mark.parametrize(("quiet", "status"), [([], 74), (["-q"], 0)])
def test_a_run_with_stderr_closed_writes_only_results_to_its_output_file(
    tmp_path, demo_server: DemoServer, quiet: list[str], status: int
):
    out = tmp_path / "out.jsonl"
    proc = run_with_closed("stderr", ["-u", demo_server.url, *quiet, "-o", str(out)], input=rows_jsonl(simple_rows(3)))
    assert proc.returncode == status  # the summary is an output: lost, it is a failed write (-q asks for none)
    # Descriptor 2 was free: without it held, the -o file got it, and the summary went there.
    assert sorted(r["_ng_task_index"] for r in result_lines(out.read_bytes())) == [0, 1, 2]


def test_a_run_with_stdin_closed_says_it_cannot_read_it(demo_server: DemoServer):
    proc = run_with_closed("stdin", ["-u", demo_server.url])
    assert proc.returncode == 1
    assert messages(proc.stderr) == [f"rollfilter: cannot read <stdin> after line 0: {BAD_FD}"]


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("rollfilter.cli.files.descriptors", ["--demo"]),  # the first import after start-up sets its handlers
        ("msgspec", ["--demo"]),
        ("trio", ["--demo"]),
        ("typer", ["--demo"]),
        ("rollfilter.cli.collect", ["--demo"]),
        ("resource", ["-u", CLOSED_PORT_URL]),  # imported after the options are parsed, before the run starts
        ("rollfilter.cli.progress_lines", ["--demo", "--progress", "-q"]),  # imported once the run has started
    ],
)
def test_ctrl_c_at_any_point_of_start_up_exits_130_with_the_summary(module: str, args: list[str]):
    proc = subprocess.run(
        [sys.executable, "-c", SIGNALLED_AT_IMPORT, module, "SIGINT", *with_closed_port(args)],
        input=rows_jsonl(simple_rows(2)).encode(),
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=clean_env(),
    )
    assert proc.returncode == 130
    assert b"Traceback" not in proc.stderr
    if "-q" not in args:  # nothing sent is a summary too
        assert messages(proc.stderr) == []
        assert summary_of(proc.stderr)["rollfilter"]["stopped"] == "interrupted"


# The command, sent the signals argv[2] (names, comma-separated, 50 ms apart) argv[1] seconds
# after its start-up handlers are set (by a thread of its own, started just before); its
# arguments follow.
SIGNALLED_AFTER = """
import os, signal, sys, threading, time

DELAY, SIGNALS = float(sys.argv[1]), [getattr(signal, name) for name in sys.argv[2].split(",")]

def send():
    time.sleep(DELAY)
    for signum in SIGNALS:
        os.kill(os.getpid(), signum)
        time.sleep(0.05)

sys.argv[:3] = ["rollfilter"]
from rollfilter.cli.startup import main
threading.Thread(target=send, daemon=True).start()
main()
"""
STOPPED_BY = {"SIGINT": (130, "interrupted"), "SIGTERM": (143, "terminated"), "SIGHUP": (129, "hung up")}


MOMENTS = [0.03, 0.1, 0.17, 0.24, 0.35, 0.8]  # in the imports, at start-up's steps, and well into the run
OTHER_STOPS = ["SIGINT,SIGINT", "SIGTERM,SIGTERM", "SIGHUP"]


# Ctrl-C at every moment, and each other stop at two of them: the moment decides which part of
# start-up the signal meets, and each stop takes the one path from there.
@pytest.mark.parametrize(
    ("moment", "signals"),
    [(moment, "SIGINT") for moment in MOMENTS]
    + [(moment, OTHER_STOPS[number % len(OTHER_STOPS)]) for number, moment in enumerate(MOMENTS)],
)
def test_stop_signals_at_any_moment_once_or_twice_end_with_the_summary(moment: float, signals: str):
    # stdin stays open: the run never ends by itself, whatever the moment of the signal.
    with subprocess.Popen(
        [sys.executable, "-c", SIGNALLED_AFTER, str(moment), signals, "--demo"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
    ) as proc:
        assert proc.stdin is not None
        assert proc.stderr is not None
        try:
            proc.stdin.write(rows_jsonl(simple_rows(3)).encode())
            proc.stdin.flush()
            status = proc.wait(timeout=SUBPROCESS_TIMEOUT)
            stderr = proc.stderr.read()
        finally:
            proc.kill()
    expected_status, stopped = STOPPED_BY[signals.split(",")[0]]
    assert status == expected_status, stderr
    assert b"Traceback" not in stderr
    assert summary_of(stderr)["rollfilter"]["stopped"] == stopped


@pytest.mark.parametrize(
    "module", ["rollfilter.cli.files.descriptors", "typer", "rollfilter.cli.parsers", "trio", "rollfilter.cli.collect"]
)
def test_a_status_signal_at_any_point_of_start_up_is_not_fatal(module: str):
    proc = subprocess.run(
        [sys.executable, "-c", SIGNALLED_AT_IMPORT, module, "SIGUSR1", "--demo", "-q"],
        input=rows_jsonl(simple_rows(2)).encode(),
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=clean_env(),
    )
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert len(result_lines(proc.stdout)) == 2


# Each stderr with the summary, and -q once: under -q nothing is written to stderr, so which way
# it would fail makes no difference there.
@pytest.mark.parametrize(
    ("stderr", "quiet", "status"),
    [("full", [], 74), ("a pipe whose reader is gone", [], 74), ("full", ["-q"], 0)],
)
def test_a_summary_that_cannot_be_written_exits_74_with_the_results_whole(
    demo_server: DemoServer, stderr: str, quiet: list[str], status: int
):
    args = ["-u", demo_server.url, *quiet]
    if stderr == "full":
        with open("/dev/full", "wb") as full:
            proc = run_process(args, input=rows_jsonl(simple_rows(5)), stderr=full)
    else:
        read_end, write_end = os.pipe()
        os.close(read_end)
        try:
            proc = run_process(args, input=rows_jsonl(simple_rows(5)), stderr=write_end)
        finally:
            os.close(write_end)
    assert proc.returncode == status
    assert sorted(r["_ng_task_index"] for r in result_lines(proc.stdout)) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_by_a_signal_keeps_its_status_when_the_summary_is_lost(
    demo_server: DemoServer, signum: int, status: int
):
    with open("/dev/full", "wb") as full:
        proc = start(["-u", demo_server.url], stdin=subprocess.PIPE, stderr=full)
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(rows_jsonl(simple_rows(1)).encode())
        proc.stdin.flush()  # stdin stays open: the run waits for more rows
        assert proc.stdout.readline()  # the row's result: the run is going
        proc.send_signal(signum)
        assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == status
        proc.stdin.close()
        proc.stdout.close()


@pytest.mark.parametrize("option", ["-o", "--metrics", "--errors"])
def test_an_output_on_a_standard_stream_the_command_was_started_without_exits_74(
    tmp_path, demo_server: DemoServer, option: str
):
    # Start-up holds the closed descriptor with /dev/null: /dev/stdout must not be opened again onto it.
    data = tmp_path / "rows.jsonl"
    data.write_text(
        rows_jsonl([*simple_rows(3), {"responses_create_params": {"input": "x"}, "demo": {"fault": "422"}}])
    )
    args = ["-u", demo_server.url, "--retries", "0", "-o", str(tmp_path / "out.jsonl")] if option != "-o" else []
    proc = run_with_closed("stdout", ["-u", demo_server.url, *args, option, "/dev/stdout", str(data)])
    assert proc.returncode == 74
    assert f"rollfilter: cannot write {option} /dev/stdout: {BAD_FD}" in messages(proc.stderr)
    assert "rows_read" in summary_of(proc.stderr)["rollfilter"]


def test_a_hang_up_ignored_by_whoever_started_the_command_stays_ignored():
    # nohup's way: SIGHUP ignored before the command starts.
    with subprocess.Popen(
        [*rollfilter_command(), "--demo"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(),
        preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN),
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            proc.stdin.write(rows_jsonl(simple_rows(1)).encode())
            proc.stdin.flush()
            assert proc.stdout.readline()  # the run is going
            proc.send_signal(signal.SIGHUP)
            proc.stdin.write(rows_jsonl(simple_rows(1)).encode())
            proc.stdin.flush()
            assert proc.stdout.readline()  # and still is
            _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
        finally:
            proc.kill()
    assert proc.returncode == 0
    assert summary_of(stderr)["rollfilter"]["succeeded"] == 2
