"""One test per exit path: outputs that cannot be written (74), unusable options and files (2),
a head server that cannot be used (3), a message carried by SystemExit (1), closed standard
descriptors and a Ctrl-C during start-up."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollfilter.errors import ExitStatus
from rollfilter.writers import BatchWriter, OutputClosed, OutputFailed
from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    QuietHandler,
    ThreadedHTTPServer,
    clean_env,
    result_lines,
    rollfilter_command,
    rows_jsonl,
    run,
    simple_rows,
    start,
    summary_of,
)

DISK_FULL = "No space left on device"  # strerror(ENOSPC)
TOO_LARGE = "File too large"  # strerror(EFBIG)
NOT_AN_AGENT = "http://127.0.0.1:9"  # the discard port: nothing listens there
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


# -- 74: an output cannot be written ------------------------------------------------------------


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
    assert proc.stderr.decode() == f"rollfilter: cannot write standard output: {DISK_FULL}\n"


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
    proc = start(["--dry-run", "-u", NOT_AN_AGENT], stdin=subprocess.PIPE)
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
    rows[5]["demo"] = {"latency": 2, "fault": "422"}
    proc = run(["-u", demo_server.url, "-k", "-j", "12", "--errors", "/dev/full"], input=rows_jsonl(rows))
    assert proc.returncode == 74
    assert [r["_ng_task_index"] for r in result_lines(proc.stdout)] == [1, 2, 3, 4, 6, 7, 8, 9, 10, 11]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["failed"], figures["cancelled"]) == (10, 1, 1)


def limit_file_size(limit: int) -> Callable[[], None]:
    """For preexec_fn: files the child writes stop at `limit` bytes, as on a full disk.
    SIGXFSZ is ignored (Python ignores it anyway), so the write fails with EFBIG."""

    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return apply


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


@pytest.fixture
def file_size_limit() -> Iterator[Callable[[int], None]]:
    """Set this process's file size limit for one test; the old limit comes back after it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN  # Python's default: EFBIG, not a kill
    try:
        yield lambda limit: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


async def test_a_writer_writes_nothing_after_a_failed_write(tmp_path, file_size_limit):
    # A later write that succeeded (the space freed meanwhile) would leave the torn line of
    # the failed one in the middle of the file, where --resume cannot cut it off.
    path = tmp_path / "out.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    failures: list[OutputClosed | OutputFailed] = []
    released: list[int] = []
    lines = [b'{"n":0}\n', b'{"n":1,"text":"' + b"x" * 100 + b'"}\n', b'{"n":2}\n']
    writer = BatchWriter(fd, name=f"-o {path}", on_failure=failures.append)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.run)
            file_size_limit(len(lines[0]) + 10)
            for n, line in enumerate(lines):
                if n == 2:
                    file_size_limit(resource.RLIM_INFINITY)  # the space is back
                writer.write(line, lambda n=n: released.append(n))
                await trio.testing.wait_all_tasks_blocked()
            writer.close()
            await writer.drained.wait()
    finally:
        os.close(fd)
    assert path.read_bytes() == lines[0] + lines[1][:10]
    assert [str(f) for f in failures] == [f"cannot write -o {path}: {TOO_LARGE}"]
    assert released == [0, 1, 2]  # every line's slot is given back, written or not


TMPFS_OPT_IN = "ROLLFILTER_TEST_TMPFS"


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


# -- 2: an option or file that cannot be used; nothing is sent ----------------------------------


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


OUTPUT_OPTIONS = ["-o", "--errors", "--materialized", "--aggregate", "--metrics", "--per-task", "--progress-file"]
SAME_FILE = "input file is output file"  # GNU cat's words


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
    proc = run(["-u", demo_server.url, "-r", "2", "--append", option, str(output), str(data)])
    assert proc.returncode == 2
    assert proc.stderr.decode() == f"rollfilter: {option} {output} is also the input {data}: {SAME_FILE}\n"
    assert data.read_text() == rows_jsonl(simple_rows(3))
    assert demo_server.stats()["requests"] == 0


def test_gym_layout_files_and_standard_streams_that_are_inputs_are_refused(tmp_path, demo_server: DemoServer):
    out = tmp_path / "out.jsonl"
    failures = tmp_path / "out_failures.jsonl"
    failures.write_text(rows_jsonl(simple_rows(2)))
    proc = run(["-u", demo_server.url, "--gym-layout", "--append", "-o", str(out), str(failures)])
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


@pytest.mark.parametrize("agent", [["-u", NOT_AN_AGENT], ["-e", f"a={NOT_AN_AGENT}"], ["--head-server", NOT_AN_AGENT]])
def test_demo_beside_an_agent_is_a_usage_error(agent: list[str]):
    proc = run(["--demo", *agent], input=rows_jsonl(simple_rows(2)))
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert proc.stderr.decode() == f"rollfilter: --demo starts its own agent: it cannot be combined with {agent[0]}\n"


def test_demo_replaces_agent_defaults_from_the_environment():
    env = clean_env(ROLLFILTER_URL="http://127.0.0.1:9", ROLLFILTER_HEAD_SERVER="http://127.0.0.1:9")
    proc = run(["--demo"], input=rows_jsonl(simple_rows(3)), env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["_ng_task_index"] for r in result_lines(proc.stdout)) == [0, 1, 2]


# -- 3: the head server answers, but not with its config -----------------------------------------


class ScriptedHeadServer(ThreadedHTTPServer):
    """Answers every GET with one status and body."""

    def __init__(self, status: int, body: bytes) -> None:
        self.requests = 0
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                server.requests += 1
                self.send_json(status, body)

        super().__init__(Handler)


HEAD_SERVER_ANSWERS = [
    (500, b'{"detail": "internal error"}', "answered HTTP 500"),
    (404, b'{"detail": "Not Found"}', "answered HTTP 404"),
    (200, b"agent: {host: 127.0.0.1}", "not its config"),  # YAML, but not as a JSON string
    (200, json.dumps("agent: {host: [unclosed").encode(), "not its config"),  # a JSON string, not YAML
    (200, json.dumps("just some words").encode(), "not a mapping"),
    (200, b"[1, 2]", "not a mapping"),
]


@pytest.mark.parametrize(("status", "body", "reason"), HEAD_SERVER_ANSWERS)
def test_a_head_server_that_does_not_answer_its_config_exits_3(status: int, body: bytes, reason: str):
    server = ScriptedHeadServer(status, body)
    try:
        rows = [{**row, "agent_ref": {"name": "simple_agent"}} for row in simple_rows(2)]
        proc = run(["--head-server", server.url], input=rows_jsonl(rows))
    finally:
        server.close()
    assert proc.returncode == 3
    assert proc.stdout == b""
    [message] = proc.stderr.decode().splitlines()
    assert message.startswith(f"rollfilter: the head server at {server.url}")
    assert reason in message
    assert server.requests == 1


# -- 1: a SystemExit that carries a message ------------------------------------------------------


def test_a_system_exit_message_is_printed_and_exits_1():
    # main() ends with os._exit, which would drop the message Python prints for sys.exit("...").
    code = "import sys, rollfilter.cli.main as cli\ncli.typer_app = lambda **_: sys.exit('rollfilter: gave up')\n"
    code += "cli.main()"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 1
    assert proc.stderr == b"rollfilter: gave up\n"


# -- a closed or broken standard stream, a Ctrl-C at start-up: one line at most, never a traceback -


def run_with_closed(descriptor: str, args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """rollfilter started with a standard descriptor closed, as `>&-`, `2>&-` or `<&-` in a shell does."""
    closed = {"stdin": "<&-", "stdout": ">&-", "stderr": "2>&-"}[descriptor]
    return run(["-c", f'exec "$@" {closed}', "sh", *rollfilter_command(), *args], command=["/bin/sh"], **kwargs)


BAD_FD = "Bad file descriptor"  # strerror(EBADF)


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


def test_a_run_with_stderr_closed_writes_only_results_to_its_output_file(tmp_path, demo_server: DemoServer):
    out = tmp_path / "out.jsonl"
    proc = run_with_closed("stderr", ["-u", demo_server.url, "-o", str(out)], input=rows_jsonl(simple_rows(3)))
    assert proc.returncode == 0
    # Descriptor 2 was free: without it held, the -o file got it, and the summary went there.
    assert sorted(r["_ng_task_index"] for r in result_lines(out.read_bytes())) == [0, 1, 2]


def test_a_run_with_stdin_closed_says_it_cannot_read_it(demo_server: DemoServer):
    proc = run_with_closed("stdin", ["-u", demo_server.url])
    assert proc.returncode == 1
    assert messages(proc.stderr) == [f"rollfilter: cannot read <stdin> after line 0: {BAD_FD}"]


# The command, sent signal argv[2] (a name) as module argv[1] starts to be imported; its arguments follow.
SIGNALLED_AT_IMPORT = """
import importlib.abc, os, signal, sys

MODULE, SIGNAL = sys.argv[1], getattr(signal, sys.argv[2])

class Signal(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == MODULE:
            os.kill(os.getpid(), SIGNAL)
        return None

sys.meta_path.insert(0, Signal())
sys.argv[:3] = ["rollfilter"]
from rollfilter.cli.startup import main
main()
"""


@pytest.mark.parametrize(
    ("module", "args"),
    [
        ("msgspec", []),
        ("trio", []),
        ("typer", []),
        ("rollfilter.cli.run", []),
        ("resource", ["-u", NOT_AN_AGENT]),  # imported after the options are parsed, before the run starts
        ("rollfilter.cli.progress", ["--demo", "--progress", "-q"]),  # imported once the run has started
    ],
)
def test_ctrl_c_at_any_point_of_start_up_exits_130_without_a_traceback(module: str, args: list[str]):
    proc = subprocess.run(
        [sys.executable, "-c", SIGNALLED_AT_IMPORT, module, "SIGINT", *args],
        input=rows_jsonl(simple_rows(2)).encode(),
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=clean_env(),
    )
    assert proc.returncode == 130
    assert b"Traceback" not in proc.stderr
    assert len(messages(proc.stderr)) <= 1


# -- 2: every numeric option, whatever its value: refused in one line, or honoured ---------------


def numeric_options() -> dict[str, type]:
    """Every option whose value typer parses as a number, found in the command itself."""
    import typer.main

    from rollfilter.cli.options import typer_app

    found = {}
    for param in typer.main.get_command(typer_app).params:
        annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
        if annotation in (int, float) and param.opts[0].startswith("-"):
            found[param.opts[-1]] = annotation
    return found


NUMERIC_OPTIONS = numeric_options()
EDGE_INTEGERS = st.integers() | st.sampled_from([0, -1, 2**31, 2**32 - 1, 2**32, 2**63, 2**64, 10**30])
EDGE_FLOATS = st.floats().map(repr) | st.sampled_from(["1e400", "-1e400", "1e-400", "1e308", "nan", "inf", "-inf"])
VALUE_OF_KIND = {int: EDGE_INTEGERS.map(str), float: EDGE_FLOATS}
# Options whose text holds numbers of its own form.
NUMBERS_IN_TEXT = {
    "--repeats": EDGE_INTEGERS.map(str) | EDGE_INTEGERS.map(lambda k: f"agent={k}"),
    "--shard": st.tuples(EDGE_INTEGERS, EDGE_INTEGERS).map(lambda pair: f"{pair[0]}/{pair[1]}"),
    "--max-failures": EDGE_INTEGERS.map(str) | EDGE_FLOATS.map(lambda p: f"{p}%"),
    "--retry-on": EDGE_INTEGERS.map(str),
}
OPTION_VALUES = st.one_of(
    *(st.tuples(st.just(option), VALUE_OF_KIND[kind]) for option, kind in NUMERIC_OPTIONS.items()),
    *(st.tuples(st.just(option), values) for option, values in NUMBERS_IN_TEXT.items()),
)


def test_the_numeric_options_are_all_found():
    assert {"--concurrency", "--limit", "--retries", "--timeout", "--pass-threshold"} <= set(NUMERIC_OPTIONS)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(option_value=OPTION_VALUES)
def test_any_value_of_a_numeric_option_is_refused_in_one_line_or_runs(
    tmp_path_factory: pytest.TempPathFactory, capfd: pytest.CaptureFixture[str], option_value: tuple[str, str]
):
    from rollfilter.cli.main import run_command

    option, value = option_value
    folder = tmp_path_factory.mktemp("numeric")
    empty = folder / "rows.jsonl"
    empty.write_text("")
    results = folder / "results.jsonl"
    results.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n')
    for mode in (["--dry-run", "-u", NOT_AN_AGENT, str(empty)], ["--summarize", str(results)]):
        status = run_command([*mode, "-q", f"{option}={value}"])
        stderr = capfd.readouterr().err
        assert status in (0, 1, 2), stderr  # 1: it ran, and a line failed (--max-line-bytes 1, say)
        if status == 2:
            [line] = stderr.splitlines()
            assert line.startswith("rollfilter: ")
        assert all(line.startswith("rollfilter: ") for line in stderr.splitlines()), stderr


@pytest.mark.parametrize(
    "args",
    [
        ["-r", "4294967296"],
        ["-r", "agent=4294967296"],
        ["-r", "1" + "0" * 30],
        ["--pass-threshold", "nan"],
        ["--pass-threshold", "inf"],
        ["--pass-threshold", "-inf"],
        ["--pass-threshold", "1e400"],
    ],
)
def test_a_value_that_cannot_be_honoured_is_a_usage_error(args: list[str]):
    proc = run(["-u", NOT_AN_AGENT, *args], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 2
    [message] = proc.stderr.decode().splitlines()
    assert message.startswith(f"rollfilter: {'-r/--repeats' if args[0] == '-r' else '--pass-threshold'} must be")
