"""Documents that cannot drift: options, exit statuses and runnable examples, checked against the program."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from rollfilter.errors import ErrorKind, ExitStatus
from tests.conftest import ROOT, clean_env, require_tool, rollfilter_command

README = (ROOT / "README.md").read_text()
MAN_PAGE = ROOT / "man" / "rollfilter.1"
MAN = MAN_PAGE.read_text()
# Commands that need nothing running: they start the demo agent, or send nothing at all.
SELF_CONTAINED = ("--demo", "--summarize", "--dry-run")


def help_options() -> set[str]:
    proc = subprocess.run(
        [*rollfilter_command(), "--help"], capture_output=True, text=True, env=clean_env(COLUMNS="200")
    )
    assert proc.returncode == 0
    return set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", proc.stdout)) - {"-"}


def man_text() -> str:
    """The man page's text with roff's hyphen and font escapes made plain."""
    return re.sub(r"\\f[BIRP]", "", MAN).replace("\\-", "-")


def test_every_help_option_is_in_the_man_page_and_the_readme():
    options = {o for o in help_options() if o.startswith("-") and not o.startswith("--help-")}
    assert {"--url", "--concurrency", "--summarize", "--progress", "--no-progress", "-j"} <= options
    missing_man = sorted(o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", man_text()))
    missing_readme = sorted(o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", README))
    assert missing_man == []
    assert missing_readme == []


def test_every_exit_status_and_error_kind_is_documented():
    exit_section = man_text().split(".SH EXIT STATUS")[1].split(".SH ")[0]
    for status in ExitStatus:
        assert f".B {status.value}\n" in exit_section, status
        assert f"| {status.value} |" in README, status
    for kind in ErrorKind:
        assert kind.value in man_text(), kind
        assert f"`{kind.value}`" in README, kind


def test_environment_variables_are_documented():
    proc = subprocess.run(
        [*rollfilter_command(), "--help"], capture_output=True, text=True, env=clean_env(COLUMNS="200")
    )
    variables = set(re.findall(r"ROLLFILTER_[A-Z_]+", proc.stdout))
    assert "ROLLFILTER_HEAD_SERVER" in variables
    environment = man_text().split(".SH ENVIRONMENT")[1].split(".SH ")[0]
    for variable in variables:
        assert variable in environment, variable
        assert variable in README, variable


def test_man_page_renders_without_warnings():
    require_tool("groff")
    proc = subprocess.run(["groff", "-ww", "-man", "-Tutf8", str(MAN_PAGE)], capture_output=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stderr == b""
    for section in (
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "EXIT STATUS",
        "ENVIRONMENT",
        "EXAMPLES",
        "FILES",
        "BUGS",
        "SEE ALSO",
    ):
        assert f".SH {section}\n" in MAN, section


def readme_recipes() -> list[tuple[str, list[str]]]:
    """($ command, expected stdout lines) from the README's console blocks."""
    recipes: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", README, re.S):
        expected: list[str] | None = None  # output lines belong to the $ line above them
        for line in block.splitlines():
            if line.startswith("$ "):
                expected = []
                recipes.append((line[2:], expected))
            elif expected is not None:
                expected.append(line)
    return [(c, e) for c, e in recipes if runnable(c)]


def runnable(command: str) -> bool:
    """Needs no agent of its own: uses the demo agent, sends nothing, or is a helper (jq, split)."""
    if "pip install" in command or command.startswith(("parallel ", "sbatch ")):
        return False
    invokes_rollfilter = re.search(r"(?<![\w/.-])rollfilter(?=\s)", command) is not None
    return not invokes_rollfilter or any(flag in command for flag in SELF_CONTAINED)


def test_the_suite_runs_every_recipe_that_needs_only_the_demo_agent():
    # The README says so; a recipe left out must need an agent (or hosts) of its own.
    section = README.split("\n## Recipes\n")[1].split("\n## ")[0]
    commands = [line[2:] for line in section.splitlines() if line.startswith("$ ")]
    run_by_the_suite = {command for command, _ in readme_recipes()}
    left_out = [command for command in commands if command not in run_by_the_suite]
    assert len(commands) - len(left_out) >= 10
    for command in left_out:
        assert re.search(r"^(parallel|sbatch) |(-u |-e \S+=|--head-server )https?://", command), command


def man_examples() -> list[str]:
    examples = man_text().split(".SH EXAMPLES")[1].split(".SH ")[0]
    commands = []
    for block in re.findall(r"\.nf\n(.*?)\.fi", examples, re.S):
        commands += [line.replace("\\(aq", "'").replace("\\(dq", '"') for line in block.splitlines()]
    return [c for c in commands if runnable(c)]


@pytest.fixture
def workdir(tmp_path_factory) -> Path:
    """A scratch directory of each test's own, where rollfilter/examples/ resolves as in a checkout."""
    require_tool("jq")
    path = tmp_path_factory.mktemp("recipes")
    (path / "rollfilter").mkdir()
    (path / "rollfilter" / "examples").symlink_to(ROOT / "rollfilter" / "examples")
    return path


def run_shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = str(Path(rollfilter_command()[0]).parent)
    env = clean_env(PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    return subprocess.run(["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=120, env=env)


def test_readme_recipes_run_and_print_what_they_show(workdir: Path):
    recipes = readme_recipes()
    assert len(recipes) >= 10
    for command, expected in recipes:
        proc = run_shell(command, workdir)
        assert proc.returncode == 0, (command, proc.stderr)
        if expected:
            assert proc.stdout.splitlines() == expected, command


def test_man_page_examples_run(workdir: Path):
    examples = man_examples()
    assert len(examples) >= 5
    printed = 0
    for command in examples:
        proc = run_shell(command, workdir)
        assert proc.returncode == 0, (command, proc.stderr)
        for line in proc.stdout.splitlines():  # every example ends in jq: JSON out
            json.loads(line)
        printed += bool(proc.stdout.strip())
    assert printed >= 4


def test_changelog_keeps_a_changelog():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "keepachangelog.com" in changelog
    assert "## [Unreleased]" in changelog
    from rollfilter import __version__

    assert f"## [{__version__}]" in changelog
