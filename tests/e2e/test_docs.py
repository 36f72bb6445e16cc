"""Documents that cannot drift: options, exit statuses and runnable examples, checked against the program."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
from pathlib import Path

import pytest

import rollfilter
from rollfilter.errors import ErrorKind, ExitStatus
from tests.conftest import ROOT, clean_env, invoke, require_tool, rollfilter_command

README = (ROOT / "README.md").read_text()
# The pages whose examples the suite runs: the README and every page of docs/.
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text()
    for path in [ROOT / "README.md", *sorted(ROOT.glob("docs/*.md"))]
}
# The page that lists the error kinds, and the sections whose recipes the README says are all run.
FAULTS_PAGE = "docs/faults.md"
RECIPE_SECTIONS = (("README.md", "Recipes"), ("docs/recipes.md", "Recipes"))
# What a fresh machine runs: the README must keep both commands as they are.
VENV = "python3 -m venv .venv && . .venv/bin/activate && "
FRESH_MACHINE = (
    VENV + "pip install . && rollfilter --demo rollfilter/examples/weather.jsonl",
    VENV + "pip install -e '.[test]' && python -m pytest",
)
README_MAX_LINES = 250
MAN_PAGE = ROOT / "man" / "rollfilter.1"
MAN = MAN_PAGE.read_text()
# Commands that need nothing running: they start the demo agent, or send nothing at all.
SELF_CONTAINED = ("--demo", "--summarize", "--dry-run")


@functools.cache
def help_text() -> str:
    """`rollfilter --help`, 200 columns wide (the command in this process, as conftest's `invoke` runs it)."""
    proc = invoke(["--help"], env=clean_env(COLUMNS="200"))
    assert proc.returncode == 0
    return proc.stdout.decode()


def help_options() -> set[str]:
    text = re.sub(r"(?<=\w-)\n\s+", "", help_text())  # an option the help text wraps at its hyphen ("--drop-")
    return set(re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)", text)) - {"-"}


def man_text() -> str:
    """The man page's text with roff's hyphen and font escapes made plain."""
    return re.sub(r"\\f[BIRP]", "", MAN).replace("\\-", "-")


def section(text: str, heading: str) -> str:
    """The text under `## heading`, up to the next section of that level."""
    return text.split(f"\n## {heading}\n")[1].split("\n## ")[0]


def test_every_help_option_is_in_the_man_page():
    # The man page is the reference of every option; the README and docs/ show the ones in use.
    options = {o for o in help_options() if o.startswith("-") and not o.startswith("--help-")}
    assert {"--url", "--concurrency", "--summarize", "--progress", "--no-progress", "-j"} <= options
    missing_man = sorted(o for o in options if not re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", man_text()))
    assert missing_man == []


def test_every_exit_status_and_error_kind_is_documented():
    exit_section = man_text().split(".SH EXIT STATUS")[1].split(".SH ")[0]
    table = section(README, "Exit status")
    for status in ExitStatus:
        assert f".B {status.value}\n" in exit_section, status
        assert f"| {status.value} |" in table, status
    for kind in ErrorKind:
        assert kind.value in man_text(), kind
        assert f"`{kind.value}`" in PAGES[FAULTS_PAGE], kind


def test_environment_variables_are_documented():
    variables = set(re.findall(r"ROLLFILTER_[A-Z_]+", help_text()))
    assert "ROLLFILTER_HEAD_SERVER" in variables
    environment = man_text().split(".SH ENVIRONMENT")[1].split(".SH ")[0]
    options = section(README, "Options")
    for variable in variables:
        assert variable in environment, variable
        assert variable in options, variable


def test_man_page_renders_without_warnings():
    require_tool("groff")
    proc = subprocess.run(["groff", "-ww", "-man", "-Tutf8", str(MAN_PAGE)], capture_output=True, timeout=60)
    assert proc.returncode == 0
    assert proc.stderr == b""
    for section_name in (
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
        assert f".SH {section_name}\n" in MAN, section_name


def console_commands(text: str) -> list[tuple[str, list[str]]]:
    """($ command, expected stdout lines) from the console blocks of `text`, runnable or not."""
    commands: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", text, re.S):
        expected: list[str] | None = None  # output lines belong to the $ line above them
        for line in block.splitlines():
            if line.startswith("$ "):
                expected = []
                commands.append((line[2:], expected))
            elif expected is not None:
                expected.append(line)
    return commands


def recipes(text: str) -> list[tuple[str, list[str]]]:
    """The console commands of `text` that the suite runs."""
    return [(c, e) for c, e in console_commands(text) if runnable(c)]


def runnable(command: str) -> bool:
    """Needs no agent of its own: uses the demo agent, sends nothing, or is a helper (jq, split)."""
    if "pip install" in command or command.startswith(("parallel ", "sbatch ")):
        return False
    invokes_rollfilter = re.search(r"(?<![\w/.-])rollfilter(?=\s)", command) is not None
    return not invokes_rollfilter or any(flag in command for flag in SELF_CONTAINED)


# A page's recipes run in order in one scratch directory: a later one may read what an earlier wrote.
PAGES_WITH_RECIPES = [name for name, text in PAGES.items() if recipes(text)]


def test_recipes_are_collected_from_the_readme_and_every_docs_page():
    assert {"README.md", "docs/recipes.md", "docs/cost.md"} <= set(PAGES_WITH_RECIPES)
    assert len(recipes(README)) >= 10
    assert sum(len(recipes(text)) for text in PAGES.values()) >= 15


def test_the_suite_runs_every_recipe_that_needs_only_the_demo_agent():
    # The README and docs/recipes.md say so; a recipe left out must need an agent (or hosts) of its own.
    for page, heading in RECIPE_SECTIONS:
        text = section(PAGES[page], heading)
        commands = [line[2:] for line in text.splitlines() if line.startswith("$ ")]
        run_by_the_suite = {command for command, _ in recipes(PAGES[page])}
        left_out = [command for command in commands if command not in run_by_the_suite]
        assert len(commands) - len(left_out) >= 5, page
        for command in left_out:
            assert re.search(r"^(parallel|sbatch) |(-u |-e \S+=|--head-server )https?://", command), (page, command)


def test_a_fresh_machine_finds_its_two_commands_in_the_readme():
    commands = {command for command, _ in console_commands(README)}
    for command in FRESH_MACHINE:
        assert command in commands, command


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


def run_recipes(page: str, workdir: Path) -> None:
    for command, expected in recipes(PAGES[page]):
        proc = run_shell(command, workdir)
        assert proc.returncode == 0, (page, command, proc.stderr)
        if expected:
            assert proc.stdout.splitlines() == expected, (page, command)


@pytest.mark.parametrize("page", [page for page in PAGES_WITH_RECIPES if page != "README.md"])
def test_recipes_run_and_print_what_they_show(page: str, workdir: Path):
    run_recipes(page, workdir)


def test_readme_recipes_then_man_page_examples_run(workdir: Path):
    # The man page's examples run where the README's ran: the files they read are there, and an
    # example the README runs word for word (and checks more closely) is not run again.
    run_recipes("README.md", workdir)
    examples = man_examples()
    assert len(examples) >= 5
    in_the_readme = {command for command, _ in recipes(README)}
    printed = 0
    for command in examples:
        if command in in_the_readme:
            continue
        proc = run_shell(command, workdir)
        assert proc.returncode == 0, (command, proc.stderr)
        for line in proc.stdout.splitlines():  # every example ends in jq: JSON out
            json.loads(line)
        printed += bool(proc.stdout.strip())
    assert printed >= 4


def python_examples(text: str) -> list[tuple[str, str]]:
    """(expression, what it prints) from the python blocks of `text` written as a session (>>>)."""
    examples: list[tuple[str, str]] = []
    for block in re.findall(r"```python\n(>>> .*?)```", text, re.S):
        for entry in block.split(">>> ")[1:]:
            source, _, shown = entry.partition("\n")
            examples.append((source, shown.strip()))
    return examples


def shown(source: str) -> str:
    """What an interactive session shows for `source`: its value's repr, or the exception it raises
    (the last line of the traceback)."""
    namespace = {name: getattr(rollfilter, name) for name in rollfilter.__all__}
    try:
        value = eval(source, namespace)
    except Exception as exc:
        return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"
    return repr(value)


def test_python_examples_print_what_they_show():
    examples = [example for text in PAGES.values() for example in python_examples(text)]
    assert len(examples) >= 4
    for source, expected in examples:
        assert shown(source) == expected, source


def headings(text: str) -> set[str]:
    """The anchors of a page's headings, as GitHub makes them (a repeated one gets -1, -2, ...)."""
    seen: dict[str, int] = {}
    anchors: set[str] = set()
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.S), re.M):
        anchor = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(f"{anchor}-{seen[anchor]}" if anchor in seen else anchor)
        seen[anchor] = seen.get(anchor, 0) + 1
    return anchors


def test_links_between_the_documents_resolve():
    pages = {**PAGES, "CONTRIBUTING.md": (ROOT / "CONTRIBUTING.md").read_text()}
    broken = []
    for name, text in pages.items():
        prose = re.sub(r"`[^`\n]*`", "", re.sub(r"```.*?```", "", text, flags=re.S))
        for target in re.findall(r"\]\(([^)\s]+)\)", prose):
            if re.match(r"[a-z]+:", target):
                continue  # another site's
            path, _, anchor = target.partition("#")
            file = (ROOT / name).parent / path if path else ROOT / name
            if not file.is_file():
                broken.append(f"{name}: {target}")
            elif anchor and anchor not in headings(file.read_text()):
                broken.append(f"{name}: {target} (no such heading)")
    assert broken == []


def test_the_readme_is_short_and_links_every_docs_page():
    assert len(README.splitlines()) <= README_MAX_LINES
    pages = [name for name in PAGES if name.startswith("docs/")]
    assert len(pages) >= 8
    for name in pages:
        assert f"]({name}" in README, name


STANDARD_HEADINGS = {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}


def test_changelog_keeps_a_changelog():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "keepachangelog.com" in changelog
    assert "## [Unreleased]" in changelog
    from rollfilter import __version__

    # The newest release is the package's version, dated, right below [Unreleased].
    versions = re.findall(r"^## \[([^\]]+)\]", changelog, re.M)
    assert versions[:2] == ["Unreleased", __version__]
    assert re.search(rf"^## \[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", changelog, re.M)
    for release in re.split(r"^## ", changelog, flags=re.M)[1:]:
        version = release.split("]")[0].lstrip("[")
        kinds = re.findall(r"^### (.+)$", release, re.M)
        assert set(kinds) <= STANDARD_HEADINGS, version
        assert len(kinds) == len(set(kinds)), version  # each heading once a release
        bullets = re.findall(r"^- .*\n(?:  .*\n)*", release, re.M)
        long = [bullet for bullet in bullets if bullet.count("\n") > 2]
        assert long == [], version  # one or two lines a bullet
        # A compare link at the bottom, as Keep a Changelog has it.
        assert re.search(rf"^\[{re.escape(version)}\]: \S+$", changelog, re.M), version


def test_help_examples_that_keep_the_summary_in_a_file_keep_it_parseable_when_rows_fail(workdir: Path, start_demo):
    from rollfilter.cli.definition import EXAMPLES

    server = start_demo()
    port = server.url.rsplit(":", 1)[1]
    rows = [{"responses_create_params": {"input": f"q{i}"}, "demo": {"fault": "422"} if i % 2 else {}}
            for i in range(6)]  # fmt: skip
    (workdir / "in.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    examples = [line.strip() for line in EXAMPLES.splitlines() if "2> summary.json" in line]
    assert examples
    for command in examples:
        proc = run_shell(command.replace(":8000", f":{port}"), workdir)
        assert proc.returncode == 1, (command, proc.stderr)  # half the rows failed
        figures = json.loads((workdir / "summary.json").read_text())["rollfilter"]  # the file jq reads
        assert figures["failed"] == 3, command
