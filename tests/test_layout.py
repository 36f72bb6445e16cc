"""The package's layout: layers that import only downward, no import cycle, only cli/ imports typer or
exits, short functions."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
import typer

from rollfilter.cli.options import typer_app

PACKAGE = Path(__file__).parent.parent / "rollfilter"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.cache  # parsed once for every test here, which only read the trees
def modules() -> dict[str, ast.Module]:
    return {module_name(path): ast.parse(path.read_text(encoding="utf-8")) for path in PACKAGE.rglob("*.py")}


def imported(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules that `name` imports anywhere in its code, inside functions too."""
    found: set[str] = set()
    package = name if (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists() else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        found.update(target for target in targets if target in known and target != name)
    return found


# What ends the process when called, or when passed on to be called (`callback=sys.exit`).
EXITS = {"os._exit", "os.abort", "sys.exit", "exit", "quit", "builtins.exit", "builtins.quit"}


def exits(tree: ast.Module) -> list[int]:
    """The lines that end the process: an EXITS function named (under any name it is imported
    as) or imported, or SystemExit raised."""
    bound: dict[str, str] = {}  # a name the module binds by importing -> what it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound.update((alias.asname, alias.name) for alias in node.names if alias.asname)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            bound.update((alias.asname or alias.name, f"{node.module}.{alias.name}") for alias in node.names)

    def qualified(node: ast.expr) -> str:
        if isinstance(node, ast.Name):
            return bound.get(node.id, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return f"{qualified(node.value)}.{node.attr}"
        return ""

    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            raised = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            found = qualified(raised) in {"SystemExit", "builtins.SystemExit"}
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found = any(f"{node.module}.{alias.name}" in EXITS for alias in node.names)
        else:
            found = isinstance(node, ast.Name | ast.Attribute) and qualified(node) in EXITS
        if found:
            lines.add(node.lineno)
    return sorted(lines)


@pytest.mark.parametrize(
    "code",
    [
        "import sys\nsys.exit(1)",
        "import os\nos._exit(1)",
        "import os\nos.abort()",
        "import sys as system\nsystem.exit()",
        "from os import _exit\n_exit(1)",
        "from sys import exit as leave\nleave(2)",
        "exit()",
        "quit(1)",
        "import builtins\nbuiltins.exit()",
        "raise SystemExit",
        "raise SystemExit(2)",
        "import builtins\nraise builtins.SystemExit(2)",
        "from sys import exit",
        "def stop():\n    raise SystemExit(2) from None",
        "import signal, sys\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit())",
        "import atexit, os\natexit.register(os._exit, 0)",
    ],
)
def test_every_way_of_exiting_is_found(code: str):
    assert exits(ast.parse(code)) != []


@pytest.mark.parametrize(
    "code",
    [
        "import sys\ntry:\n    pass\nexcept SystemExit:\n    pass",
        "class Run:\n    def __exit__(self, *exc):\n        self.exit()",
        "import os\nos.exit_code = 1\nos.path.exists('x')",
        "import sys\nsys.exitfunc = None\nprint(sys.argv)",
        "raise ValueError('exit')",
        "from rollfilter.errors import ExitStatus",
    ],
)
def test_what_does_not_exit_is_not_found(code: str):
    assert exits(ast.parse(code)) == []


def test_no_module_imports_itself_through_others():
    trees = modules()
    # Edges out of a package's __init__ count too: a module that imports its own package's root
    # while the root exports it is a loop (rollfilter -> rollout_run -> connect -> rollfilter).
    graph = {name: imported(name, tree, set(trees)) for name, tree in trees.items()}
    cycles: list[list[str]] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph[name]):
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_only_the_command_line_imports_typer_or_exits():
    trees = modules()
    offenders = []
    for name, tree in sorted(trees.items()):
        if name == "rollfilter.cli" or name.startswith("rollfilter.cli."):
            continue
        imports = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        imports |= {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        if any(target == "typer" or target.startswith("typer.") for target in imports):
            offenders.append(f"{name} imports typer")
        command_line = {t for t in imports if t == "rollfilter.cli" or t.startswith("rollfilter.cli.")}
        if command_line and name != "rollfilter.__main__":  # `python -m rollfilter` is the command
            offenders.append(f"{name} imports the command line")
        if name != "rollfilter.demo.command_line":  # the demo agent's own `python -m rollfilter.demo`
            offenders += [f"{name}:{line} exits" for line in exits(tree)]
    assert offenders == []


# What the command takes from its process, read where the command starts only: the rest of cli/
# reads the `Environment` it is given (cli/environment.py), so that a test can give its own.
PROCESS_INPUTS = {
    *("os.environ", "os.environb", "os.getenv", "os.getenvb", "sys.argv"),
    *("sys.stdin", "sys.stdout", "sys.stderr", "sys.__stdin__", "sys.__stdout__", "sys.__stderr__"),
    *("os.get_terminal_size", "shutil.get_terminal_size"),
}
# os functions that, given 0, 1 or 2, read or write the process's own standard descriptors.
DESCRIPTOR_FUNCTIONS = {"isatty", "write", "read", "fstat", "dup", "dup2", "lseek", "get_terminal_size"}
ENTRY_POINT = {"rollfilter.cli.startup", "rollfilter.cli.main", "rollfilter.cli.environment"}


def process_inputs(tree: ast.Module) -> list[str]:
    """Where `tree` reads PROCESS_INPUTS (under any name it imports them as), or calls an os
    function on descriptor 0, 1 or 2 by number."""
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("os", "sys", "shutil"):
            bound.update((alias.asname or alias.name, f"{node.module}.{alias.name}") for alias in node.names)

    def qualified(node: ast.expr) -> str:
        if isinstance(node, ast.Name):
            return bound.get(node.id, node.id)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            return f"{node.value.id}.{node.attr}"
        return ""

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name | ast.Attribute) and qualified(node) in PROCESS_INPUTS:
            found.append(f"{node.lineno} reads {qualified(node)}")
        elif (
            isinstance(node, ast.Call)
            and qualified(node.func).removeprefix("os.") in DESCRIPTOR_FUNCTIONS
            and qualified(node.func).startswith("os.")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value in (0, 1, 2)
        ):
            found.append(f"{node.lineno} calls {qualified(node.func)} on descriptor {node.args[0].value}")
    return found


def test_only_the_entry_point_reads_the_process_streams_and_environment():
    """cli/ takes the standard streams, the environment variables and the terminal from the
    `Environment` its entry point makes: nothing else in it reads them from the process."""
    offenders = [
        f"{name}:{where}"
        for name, tree in sorted(modules().items())
        if name.startswith("rollfilter.cli.") and name not in ENTRY_POINT
        for where in process_inputs(tree)
    ]
    assert offenders == []


def test_process_inputs_are_found_under_any_name():
    code = "import os, sys\nfrom os import environ as env\nenv.get('X')\nsys.stdout.write('')\n"
    code += "os.isatty(2)\nos.isatty(fd)\n"
    assert sorted(process_inputs(ast.parse(code))) == [
        "3 reads os.environ",
        "4 reads sys.stdout",
        "5 calls os.isatty on descriptor 2",
    ]


def test_no_function_is_over_80_lines():
    """Bodies, that is: a typer command's signature (one option a parameter) is not counted."""
    long = [
        f"{name}.{node.name}: {node.end_lineno - node.body[0].lineno + 1} lines"
        for name, tree in sorted(modules().items())
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno is not None
        and node.end_lineno - node.body[0].lineno + 1 > 80
    ]
    assert long == []


# The packages from the bottom up; "" is the package's own modules (errors, config, rows, outcomes):
# the vocabulary every layer speaks. Each package imports only packages below it or itself.
LAYERS = ["http", "", "formats", "figures", "engine", "trackers", "run", "api", "viewer", "demo", "cli"]
# The package root and `python -m rollfilter` hand on names from above (on first use): not a layer.
ENTRANCES = {"rollfilter", "rollfilter.__main__"}


def layer_of(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1] if len(parts) > 1 and parts[1] in LAYERS else "")


def test_layer_of_reads_a_modules_package():
    assert layer_of("rollfilter.http.pool") == 0
    assert layer_of("rollfilter.config") == 1
    assert layer_of("rollfilter.demo") == layer_of("rollfilter.demo.agent")
    assert layer_of("rollfilter.engine.nursery") < layer_of("rollfilter.run.run") < layer_of("rollfilter.cli.collect")
    assert layer_of("rollfilter.cli.files.locks") == LAYERS.index("cli")


def test_no_package_imports_a_package_above_it():
    trees = modules()
    known = set(trees)
    upward = [
        f"{name} -> {target}"
        for name, tree in sorted(trees.items())
        if name not in ENTRANCES
        for target in sorted(imported(name, tree, known))
        if target not in ENTRANCES and layer_of(target) > layer_of(name)
    ]
    assert upward == []


def imports_at_run_time(tree: ast.Module) -> set[str]:
    """The modules `tree` imports when it runs: those under `if TYPE_CHECKING:` are left out."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.update([node.module or "", *(f"{node.module}.{alias.name}" for alias in node.names)])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def test_imports_under_type_checking_are_not_counted_as_made():
    code = "from typing import TYPE_CHECKING\nimport a\nif TYPE_CHECKING:\n    import b\nelse:\n    import c\n"
    code += "def f():\n    from d import e\n"
    assert imports_at_run_time(ast.parse(code)) == {"typing", "typing.TYPE_CHECKING", "a", "c", "d", "d.e"}


# The packages that reach the engine only through a run (rollfilter.run), as httpx's command line
# reaches the library through a few of its names: they use what the engine does, not its parts.
THROUGH_THE_RUN = ("cli", "api")


def test_the_command_line_and_the_api_reach_the_engine_through_the_run_only():
    """cli/ and api/ take their names from run/ (the door), the top of the package (config,
    errors, outcomes, stops) or figures/; they may name the engine's types for type checking."""
    reaching = [
        f"{name} -> {target}"
        for name, tree in sorted(modules().items())
        if name.split(".")[1:2] and name.split(".")[1] in THROUGH_THE_RUN
        for target in sorted(imports_at_run_time(tree))
        if target == "rollfilter.engine" or target.startswith("rollfilter.engine.")
    ]
    assert reaching == []


# No module is longer than this: a module past it holds more than one concept (httpx's are about
# 300 lines, h11 keeps one concept a module).
MAX_MODULE_LINES = 800


def test_no_module_is_over_800_lines():
    long = [
        f"{path.relative_to(PACKAGE)}: {lines} lines"
        for path in sorted(PACKAGE.rglob("*.py"))
        if (lines := len(path.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES
    ]
    assert long == []


# The middle stays thin: the run, and the command line's adapter over it, each one screen of
# concerns, not a second place where a run is wired.
MAX_LINES = {("run/run.py", "Run"): 320, ("cli/collect.py", "_CommandLineRun"): 150, ("cli/collect.py", ""): 300}


def test_the_run_and_the_command_lines_adapter_stay_within_their_sizes():
    sizes = {}
    for path, name in MAX_LINES:
        text = (PACKAGE / path).read_text(encoding="utf-8")
        if not name:
            sizes[path, name] = len(text.splitlines())
            continue
        found = [node for node in ast.parse(text).body if isinstance(node, ast.ClassDef) and node.name == name]
        assert found, f"{path} defines no {name}"
        end = found[0].end_lineno
        assert end is not None
        sizes[path, name] = end - found[0].lineno + 1
    assert {key: size for key, size in sizes.items() if size > MAX_LINES[key]} == {}


def test_each_package_is_a_layer():
    """A new folder under rollfilter/ takes its place in LAYERS, so the rule above sees it."""
    folders = {path.parent.name for path in PACKAGE.glob("*/__init__.py")}
    assert folders - {"examples"} == set(LAYERS) - {""}


def test_each_test_module_is_named_for_the_module_it_tests():
    """tests/PATH/test_<module>.py tests rollfilter/PATH/<module>.py: the tests' folders are the
    package's. Tests of the command as a whole are in tests/e2e/, and this module checks the
    package's layout itself."""
    tests = Path(__file__).parent
    unplaced = []
    for path in sorted(tests.rglob("test_*.py")):
        folder = path.parent.relative_to(tests)
        if folder.parts[:1] in {("e2e",), ("perf",), ("servers",)} or path.name == "test_layout.py":
            continue
        if not (PACKAGE / folder / f"{path.stem.removeprefix('test_')}.py").is_file():
            unplaced.append(str(path.relative_to(tests)))
    assert unplaced == []


def test_exit_statuses_are_chosen_in_one_place():
    """errors.py defines ExitStatus; cli/statuses.py maps how a run ended to one, and cli/main.py,
    the error boundary, applies it: no other module names an exit status."""
    named = sorted(
        name
        for name, tree in modules().items()
        if any(
            isinstance(node, ast.Name | ast.alias)
            and "ExitStatus" in (getattr(node, "id", None), getattr(node, "name", None))
            for node in ast.walk(tree)
        )
    )
    assert named == ["rollfilter.cli.main", "rollfilter.cli.statuses", "rollfilter.errors"]


def test_no_module_imports_the_package_root():
    """The root only exports names (imported on first use): a module that needs the version reads
    rollfilter/_version.py, as h11 does, so importing any module never loads the root's exports."""
    trees = modules()
    importers = sorted(name for name, tree in trees.items() if "rollfilter" in imported(name, tree, set(trees)))
    assert importers == []


# The command line's own packages, which may name its options (the demo agent's included).
COMMAND_LINE_MODULES = {"cli", "demo"}


def command_line_options() -> set[str]:
    command = typer.main.get_command(typer_app)
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts) if name.startswith("-")}


def messages_of(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module that are not docstrings, with their lines."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_string_outside_the_command_line_names_an_option():
    options = command_line_options()
    assert {"-u", "--url", "-a", "--cacert", "--resume", "-v"} <= options  # the scan looks for real names
    alternatives = "|".join(map(re.escape, sorted(options, key=len, reverse=True)))
    named = re.compile(rf"(?<![\w-])({alternatives})(?![\w-])")
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in COMMAND_LINE_MODULES
        for line, text in messages_of(path)
        if named.search(text)
    ]
    assert found == []


# Where a message may name a Config field: the refusals of a Config that cannot be used.
CONFIG_ERRORS = {"config.py", "run.py"}


def test_failures_and_events_name_no_setting():
    """A failure's message, an event or a stop reads the same from Python and from the command line:
    what happened, in plain words. Only a ConfigError names a Config field (and the command line
    checks its options before it builds a Config, naming them)."""
    named = re.compile(r"\b(?:Command)?Config\.[a-z_]+")
    found = [
        f"{path.relative_to(PACKAGE)}:{line}: {text!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in COMMAND_LINE_MODULES and path.name not in CONFIG_ERRORS
        for line, text in messages_of(path)
        if named.search(text)
    ]
    assert found == []
