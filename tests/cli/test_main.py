"""cli/main.py: the command as a function of its arguments and its `Environment`, which gives it
its standard streams and its variables; this process's own are left alone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollfilter.cli.environment import Environment
from rollfilter.cli.main import run_command
from tests.conftest import (
    DemoServer,
    clean_env,
    closed_port_url,
    invoke,
    result_lines,
    rows_jsonl,
    run_process,
    simple_rows,
    summary_of,
)


def test_a_run_reads_and_writes_its_environment_only(
    demo_server: DemoServer, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("ROLLFILTER_URL", closed_port_url())  # this process's, not the command's
    proc = invoke([], input=rows_jsonl(simple_rows(3)), env=clean_env(ROLLFILTER_URL=demo_server.url))
    assert proc.returncode == 0, proc.stderr
    assert sorted(result["_ng_task_index"] for result in result_lines(proc.stdout)) == [0, 1, 2]
    assert summary_of(proc.stderr)["rollfilter"]["succeeded"] == 3
    demo = invoke(["--demo", "-q"], input=rows_jsonl(simple_rows(2)), env=clean_env())
    assert (demo.returncode, len(result_lines(demo.stdout))) == (0, 2)
    assert capfd.readouterr() == ("", "")  # nothing on this process's descriptors 1 and 2


def test_help_is_as_wide_as_the_environment_says(capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch):
    narrow = clean_env(COLUMNS="70")
    monkeypatch.setenv("COLUMNS", "200")
    proc = invoke(["--help"], env=narrow)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == run_process(["--help"], env=narrow).stdout  # as wide as in a process of its own
    assert capfd.readouterr() == ("", "")


def test_shell_completion_is_asked_for_by_the_environment(monkeypatch: pytest.MonkeyPatch):
    proc = invoke([], env=clean_env(_ROLLFILTER_COMPLETE="source_bash"))
    assert proc.returncode == 0, proc.stderr
    assert b"complete " in proc.stdout  # the script a shell sources
    without = clean_env()
    monkeypatch.setenv("_ROLLFILTER_COMPLETE", "source_bash")  # this process's: the command runs
    proc = invoke([], env=without)
    assert proc.returncode == 2
    assert proc.stderr.decode().startswith("rollfilter: no agent to send to")


def test_rows_typed_at_a_terminal_are_said_to_be_read_from_it(tmp_path: Path):
    read_end, write_end = os.pipe()
    os.close(write_end)  # Ctrl-D at once
    out, err = (os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT) for name in ("out", "err"))
    try:
        environment = Environment(stdin=read_end, stdout=out, stderr=err, stdin_is_terminal=True)
        status = run_command(["--summarize", "-q"], environment)
    finally:
        for fd in (read_end, out, err):
            os.close(fd)
    assert status == 0
    lines = (tmp_path / "err").read_text().splitlines()
    assert lines[0].startswith("rollfilter: reading result lines from the terminal")
