"""The progress display, under a real pseudo-terminal: on the terminal only, never on stdout."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.conftest import SUBPROCESS_TIMEOUT, clean_env, rows_jsonl, run, start
from tests.e2e.test_control import ask as ask_control

ESC = b"\x1b["


def rows_file(tmp_path: Path, rows: int = 200) -> Path:
    """Rows of a hundredth of a second: at -j 4, 200 make a run long enough to see the display
    refreshed. A display draws its first frame as it starts, so a few rows are enough to see it
    missing."""
    path = tmp_path / "rows.jsonl"
    path.write_text(rows_jsonl([{"responses_create_params": {"input": "x"}, "demo": {"latency": 0.01}}] * rows))
    return path


def run_on_pty(args: list[str], tmp_path: Path, **env: str) -> tuple[int, bytes, bytes]:
    """Run with stderr on a pseudo-terminal and stdout to a file; return (status, stdout, terminal bytes)."""
    controller, terminal = pty.openpty()
    environment = clean_env(**{"TERM": "xterm-256color", "COLUMNS": "160", **env})
    if "NO_COLOR" not in env:
        environment.pop("NO_COLOR", None)
    out = tmp_path / "stdout"
    with out.open("wb") as stdout_file:
        proc = start(args, stdout=stdout_file, stderr=terminal, env=environment)
    os.close(terminal)
    screen = b""
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    while time.monotonic() < deadline:
        ready, _, _ = select.select([controller], [], [], 0.2)
        if ready:
            try:
                data = os.read(controller, 65536)
            except OSError:  # the terminal closed: the process is gone
                break
            if not data:
                break
            screen += data
        elif proc.poll() is not None:
            break
    status = proc.wait(timeout=SUBPROCESS_TIMEOUT)
    os.close(controller)
    return status, out.read_bytes(), screen


def test_progress_shows_on_a_terminal_and_never_on_stdout(tmp_path):
    status, stdout, screen = run_on_pty(["--demo", "-j", "4", str(rows_file(tmp_path))], tmp_path)
    assert status == 0
    assert b" done" in screen
    assert b"in flight" in screen
    assert b"rows/s" in screen
    assert re.search(rb"\d+%", screen)  # the total is known (a regular file): a percentage and an ETA
    assert ESC in screen
    assert ESC not in stdout
    assert stdout.count(b"\n") == 200
    assert b"\r\n  reward " in screen  # the summary follows the display


def test_no_color_removes_colour_codes(tmp_path):
    status, _, screen = run_on_pty(["--demo", "-j", "4", str(rows_file(tmp_path, 8))], tmp_path, NO_COLOR="1")
    assert status == 0
    assert b" done" in screen
    assert b"\x1b[38;" not in screen
    assert b"\x1b[3" not in screen.replace(b"\x1b[2K", b"")


def test_no_progress_and_dumb_terminals(tmp_path):
    for args, env in ((["--no-progress"], {}), ([], {"TERM": "dumb"}), (["-q"], {})):
        status, _, screen = run_on_pty(["--demo", *args, str(rows_file(tmp_path, 8))], tmp_path, **env)
        assert status == 0
        assert b" done" not in screen, (args, env)


def test_no_progress_when_stderr_is_a_pipe(tmp_path):
    proc = run(["--demo", str(rows_file(tmp_path, 8))])
    assert proc.returncode == 0
    assert ESC not in proc.stderr
    assert b" done" not in proc.stderr
    assert ESC not in proc.stdout


def test_progress_where_stderr_is_no_terminal_writes_plain_lines_and_the_summary_last(tmp_path):
    proc = run(["--demo", "-j", "4", "--progress", str(rows_file(tmp_path))])
    assert proc.returncode == 0, proc.stderr
    assert ESC not in proc.stderr
    assert b"\r" not in proc.stderr
    *lines, summary = proc.stderr.decode().splitlines()
    assert json.loads(summary)["rollfilter"]["succeeded"] == 200
    assert lines  # the run takes half a second at -j 4: at least one line on the way
    pattern = r"rollfilter: (\d+) of 200 rollouts finished \((\d+)%\), [\d.,]+ rollouts/s, 0 failed, 0:00:\d\d elapsed"
    counts = []
    for line in lines:
        found = re.fullmatch(pattern, line)
        assert found, line
        counts.append(int(found[1]))
        assert int(found[2]) == int(found[1]) * 100 // 200
    assert counts == sorted(set(counts))  # a line only for a new step
    assert len(proc.stdout.splitlines()) == 200


def test_a_terminal_that_hangs_up_ends_the_display_not_the_run(tmp_path):
    controller, terminal = pty.openpty()
    environment = clean_env(TERM="xterm-256color", COLUMNS="160")
    out = tmp_path / "stdout"
    with out.open("wb") as stdout_file:
        proc = start(
            ["--demo", "-j", "4", str(rows_file(tmp_path))], stdout=stdout_file, stderr=terminal, env=environment
        )
    os.close(terminal)
    ready, _, _ = select.select([controller], [], [], SUBPROCESS_TIMEOUT)
    assert ready
    assert ESC in os.read(controller, 65536)  # the display is up...
    os.close(controller)  # ...and its terminal goes away: every write to it fails (EIO)
    assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == 74  # the summary, an output, could not be written
    assert len(out.read_bytes().splitlines()) == 200


def test_a_full_stderr_ends_the_display_and_lost_failure_lines_exit_74(tmp_path):
    rows = rows_file(tmp_path)
    with open("/dev/full", "wb") as full:
        proc = run(["--demo", "--progress", "-q", str(rows)], stderr=full)
        assert (proc.returncode, len(proc.stdout.splitlines())) == (0, 200)  # the display is only shown
        proc = run(["--demo", "--progress", "-q"], input=rows.read_bytes() + b"not json\n", stderr=full)
        assert proc.returncode == 74  # the failure's line was lost
        proc = run(["--demo", "--progress", str(rows)], stderr=full)
        assert (proc.returncode, len(proc.stdout.splitlines())) == (74, 200)  # the summary was lost


def ask(path: Path, command: bytes) -> dict[str, Any]:
    """One command over the control socket at `path`, and its answer, which must say ok."""
    answer = ask_control(path, command)
    assert answer["ok"], answer
    return answer


def read_until(controller: int, pattern: bytes) -> bytes:
    """What the terminal shows until `pattern` (a regular expression) is seen, or to its end."""
    screen = b""
    deadline = time.monotonic() + SUBPROCESS_TIMEOUT
    while not re.search(pattern, screen):
        assert time.monotonic() < deadline, screen[-2000:]
        ready, _, _ = select.select([controller], [], [], 0.2)
        if ready:
            try:
                screen += os.read(controller, 65536)
            except OSError:  # the terminal closed: the process is gone
                break
    return screen


def test_the_line_and_the_status_say_the_rollouts_waiting_for_the_policy_version_and_on_the_pause(tmp_path):
    folder = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))  # a socket's path is at most 108 bytes
    control = folder / "run.sock"
    rows = tmp_path / "rows.jsonl"
    rows.write_text(rows_jsonl([{"responses_create_params": {"input": "x"}, "demo": {"latency": 0.02}}] * 3))
    # Version 0 admits group 0 alone; once it is written, -j 4 takes the four rows of groups 1 and 2.
    staleness = ["-r", "2", "--groups", "--policy-version", "0", "--max-staleness", "0", "--batch-groups", "1"]
    args = ["--demo", "-j", "4", *staleness, "--control", str(control), str(rows)]
    controller, terminal = pty.openpty()
    out = tmp_path / "stdout"
    with out.open("wb") as stdout_file:
        proc = start(args, stdout=stdout_file, stderr=terminal, env=clean_env(TERM="xterm-256color", COLUMNS="250"))
    os.close(terminal)
    try:
        read_until(controller, rb"0 in flight .*4 waiting for the policy version")
        proc.send_signal(signal.SIGUSR1)
        read_until(controller, rb"status: 2 done, 0 failed, 0 in flight \(4 waiting for the policy version\)")
        ask(control, b"pause")
        ask(control, b"version 2")  # every group admitted: the pause holds their rows now
        read_until(controller, rb"0 in flight .*paused, 4 waiting on the pause")
        proc.send_signal(signal.SIGUSR1)
        read_until(controller, rb"status: paused, 2 done, 0 failed, 0 in flight \(4 waiting on the pause\)")
        ask(control, b"resume")
        read_until(controller, rb"6 rollouts: 6 succeeded")  # the summary, for a person at a terminal
        assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == 0
    finally:
        if proc.poll() is None:  # a failed step: the run waits for a version nobody will give
            proc.kill()
            proc.wait(timeout=SUBPROCESS_TIMEOUT)
        os.close(controller)
        shutil.rmtree(folder, ignore_errors=True)
    assert len(out.read_bytes().splitlines()) == 6
