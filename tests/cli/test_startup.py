"""cli/startup.py: what the command does before its modules are imported."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rollfilter import __version__
from tests.conftest import SUBPROCESS_TIMEOUT, clean_env, rows_jsonl, simple_rows

# Each module the command imports, as it imports it, on a line of the file argv[1].
IMPORTS_LOGGED = """
import sys
log = open(sys.argv[1], "w", buffering=1)
sys.addaudithook(lambda event, args: event == "import" and log.write(args[0] + "\\n"))
sys.argv[:2] = ["rollfilter"]
from rollfilter.cli.startup import main
main()
"""


def test_a_run_imports_neither_httpxs_command_line_nor_yaml(tmp_path):
    log = tmp_path / "imports"
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS_LOGGED, str(log), "--demo", "-q"],
        input=rows_jsonl(simple_rows(2)).encode(),
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2
    imported = set(log.read_text().split())
    assert {"trio", "httpx", "msgspec", "typer"} <= imported  # the run's own
    # httpx tries to import its command line (which imports rich and pygments), and is refused;
    # yaml is for --prices FILE
    assert "httpx._main" in imported
    assert imported.isdisjoint({"rich", "pygments", "yaml"}), imported & {"rich", "pygments", "yaml"}


# Loaded by the runs that use them, and by no other: re-scoring, the --materialized file,
# --aggregate, the --control socket, --summarize and --compare, an adaptive window's median, the
# trackers and their clients.
LOADED_WHEN_USED = {
    "rollfilter.run.tracking",
    "rollfilter.trackers.log",
    "mlflow",
    "wandb",
    "rollfilter.run.reverify",
    "rollfilter.run.materialize",
    "rollfilter.run.aggregate",
    "rollfilter.cli.control",
    "rollfilter.cli.summarize",
    "rollfilter.figures.compare",
    "statistics",
}


@pytest.mark.parametrize("demo", [True, False])
def test_a_plain_run_imports_nothing_it_does_not_use(tmp_path, agent, demo: bool):
    log = tmp_path / "imports"
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS_LOGGED, str(log), "-q", *(["--demo"] if demo else ["-u", agent.run_url])],
        input=rows_jsonl(simple_rows(2)).encode(),
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 2
    imported = set(log.read_text().split())
    assert "rollfilter.run.run" in imported  # the log is whole
    unused = LOADED_WHEN_USED if demo else {*LOADED_WHEN_USED, "rollfilter.demo", "rollfilter.demo.agent"}
    assert imported.isdisjoint(unused), imported & unused


def test_the_entry_point_imports_only_signal_before_it_sets_its_handlers():
    # `main` sets SIGINT's and SIGUSR1's handling first: what runs before it is the entry point's
    # own import, which must load nothing of its own (a traceback would name what was loading).
    code = "import sys; before = set(sys.modules); import rollfilter.cli.startup; print(*set(sys.modules) - before)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, timeout=SUBPROCESS_TIMEOUT, env=clean_env()
    )
    loaded = set(proc.stdout.decode().split())
    assert {name for name in loaded if name.startswith("rollfilter")} == {
        "rollfilter",
        "rollfilter._version",
        "rollfilter.cli",
        "rollfilter.cli.startup",
        "rollfilter.cli.early_signals",
    }
    assert loaded.isdisjoint({"typing", "importlib.abc", "tempfile", "dataclasses", "typer", "trio"}), loaded


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],  # answered before the command line is built
        ["-q", "--version"],  # by typer
        ["--help"],
        ["--no-such-option"],
        ["--concurrency", "x"],
    ],
)
def test_version_help_and_usage_errors_import_neither_trio_nor_httpx(tmp_path, args: list[str]):
    log = tmp_path / "imports"
    proc = subprocess.run(
        [sys.executable, "-c", IMPORTS_LOGGED, str(log), *args],
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=clean_env(),
    )
    assert proc.returncode == (0 if "--version" in args or "--help" in args else 2), proc.stderr
    imported = set(log.read_text().split())
    heavy = {"trio", "httpx", "msgspec", "pydantic", "rich", "yaml", "rollfilter.config", "rollfilter.engine.nursery"}
    if args == ["--version"]:
        heavy.add("typer")
    assert imported.isdisjoint(heavy), imported & heavy


def test_version_answers_the_same_before_and_after_the_command_line_is_built():
    answers = [
        subprocess.run(
            [sys.executable, "-c", IMPORTS_LOGGED, os.devnull, *args],
            capture_output=True,
            timeout=SUBPROCESS_TIMEOUT,
            env=clean_env(),
        )
        for args in (["--version"], ["-q", "--version"])
    ]
    answer = (0, f"rollfilter {__version__}\n".encode(), b"")
    assert [(a.returncode, a.stdout, a.stderr) for a in answers] == [answer, answer]


def test_version_on_a_full_device_exits_74_and_says_so():
    with open("/dev/full", "wb") as full:
        proc = subprocess.run(
            [sys.executable, "-c", IMPORTS_LOGGED, os.devnull, "--version"],
            stdout=full,
            stderr=subprocess.PIPE,
            timeout=SUBPROCESS_TIMEOUT,
            env=clean_env(),
        )
    assert proc.returncode == 74
    assert proc.stderr == b"rollfilter: cannot write standard output: No space left on device\n"
