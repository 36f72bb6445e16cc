"""cli/messages.py: every line the command line writes to stderr is made, and written, in one place."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rollfilter.cli.messages import message_line
from rollfilter.engine import nursery as engine
from tests.conftest import DemoServer, closed_port_url, rows_jsonl, run, simple_rows

COMMAND_LINE = Path(__file__).parent.parent.parent / "rollfilter" / "cli"
# Calls that write to a descriptor or to Python's stderr; the others write to stderr when given it.
WRITES = {"os.write", "sys.stderr.write"}
TO_STDERR_WHEN_TOLD = {"print": "file", "typer.echo": "err", "typer.secho": "err"}


def dotted(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{dotted(node.value)}.{node.attr}"
    return ""


def names_stderr(node: ast.expr) -> bool:
    """An argument that says stderr: descriptor 2, `err=True`, or a name with stderr in it."""
    if isinstance(node, ast.Constant):
        return (type(node.value) is int and node.value == 2) or node.value is True
    return "stderr" in dotted(node)


def writes_stderr(call: ast.Call) -> bool:
    name = dotted(call.func)
    if name == "os.write" and call.args and isinstance(call.args[0], ast.Constant) and call.args[0].value == 1:
        return False  # standard output, by number (--version's answer)
    if name in WRITES:
        return True
    if name == "write_all":
        return names_stderr(call.args[0])
    told = TO_STDERR_WHEN_TOLD.get(name)
    return any(keyword.arg == told and names_stderr(keyword.value) for keyword in call.keywords)


def test_nothing_on_the_command_line_writes_stderr_but_its_messages_module():
    """Lines on stderr are made by message_line (one prefix, one escaping) and written by say,
    write_stderr, or a run's writers fed with them. The progress display draws itself on its
    own descriptor through rich, and prints the lines it is given above itself."""
    offenders = []
    for path in sorted(COMMAND_LINE.rglob("*.py")):
        if path.name == "messages.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            where = f"{path.name}:{getattr(node, 'lineno', '?')}"
            if isinstance(node, ast.Call) and writes_stderr(node):
                offenders.append(f"{where}: {dotted(node.func)} to stderr")
            elif isinstance(node, ast.Constant) and str(node.value).startswith("rollfilter:"):
                offenders.append(f"{where}: a line with its own prefix")
    assert offenders == []


def test_a_message_line_escapes_control_characters_and_undecodable_bytes():
    name = "rows\x1b[2J\r\udcff.jsonl"  # a file name as os.fsdecode gives one with a byte that is not UTF-8
    assert message_line(f"cannot read {name}") == b"rollfilter: cannot read rows\\x1b[2J\\r\\udcff.jsonl\n"
    assert message_line("agent 'ünï'") == "rollfilter: agent 'ünï'\n".encode()


def test_the_command_escapes_a_control_character_in_its_message(tmp_path: Path):
    missing = tmp_path / "rows\x1b]0;owned\x07.jsonl"
    proc = run(["-u", closed_port_url() + "/run", str(missing)])  # refused before anything is sent
    assert proc.returncode == 2
    assert proc.stderr.count(b"\n") == 1
    assert b"\x1b" not in proc.stderr
    assert b"\x07" not in proc.stderr
    assert proc.stderr.startswith(b"rollfilter: ")
    assert b"rows\\x1b]0;owned\\x07.jsonl" in proc.stderr


def test_an_internal_error_says_that_v_shows_it_unless_v_is_given(
    demo_server: DemoServer, monkeypatch: pytest.MonkeyPatch
):
    def broken(*args: object) -> None:
        raise RuntimeError("a bug met by this row")

    monkeypatch.setattr(engine, "judge", broken)
    proc = run(["-u", demo_server.url], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 1
    failure = proc.stderr.decode().splitlines()[0]
    assert failure == "rollfilter: <stdin>:1: internal: unexpected RuntimeError while handling this row (-v shows it)"
    proc = run(["-u", demo_server.url, "-v"], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 1
    lines = proc.stderr.decode().splitlines()
    assert "rollfilter: <stdin>:1 task 0 rollout 0: internal error: RuntimeError: a bug met by this row" in lines
    assert "rollfilter: <stdin>:1: internal: unexpected RuntimeError while handling this row" in lines
