"""cli/fields.py: library messages name Config fields; the command line names their options."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from rollfilter import Config, Failure, rollouts
from rollfilter.cli import options
from rollfilter.cli.fields import OPTION_OF_FIELD, in_options
from rollfilter.cli.options import typer_app
from rollfilter.config import CommandConfig, ConfigError, FailureLimit
from rollfilter.errors import ErrorKind, UsageError, name_options
from tests.conftest import QuietHandler, ThreadedHTTPServer, closed_port_url, rows_jsonl, run, simple_rows, summary_of
from tests.conftest import run as run_command


def test_every_config_field_has_its_command_line_name():
    import dataclasses

    from rollfilter.cli.fields import OPTION_OF_FIELD
    from rollfilter.config import Config, FailureLimit, Retries, Timeouts, Tls

    config_fields = {field.name for field in dataclasses.fields(Config) if field.init}  # the ones a caller sets
    parts = {"retries": Retries, "timeout": Timeouts, "tls": Tls, "max_failures": FailureLimit}
    config_fields |= {f"{name}.{field.name}" for name, part in parts.items() for field in dataclasses.fields(part)}
    assert config_fields <= set(OPTION_OF_FIELD) <= config_fields | {f.name for f in dataclasses.fields(CommandConfig)}


PACKAGE = Path(__file__).parent.parent / "rollfilter"


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


def test_a_field_becomes_its_option_and_an_unknown_name_stays():
    text = "Config.url is not given, nor Config.endpoints; CommandConfig.output FILE; Config.no_such_field"
    assert name_options(text, OPTION_OF_FIELD) == (
        "-u/--url is not given, nor -e/--endpoint; -o FILE; Config.no_such_field"
    )
    assert name_options("reward 1.0 from agent 'Config'", OPTION_OF_FIELD) == "reward 1.0 from agent 'Config'"


def test_a_bad_setting_is_its_field_in_python_and_its_option_on_the_command_line(demo_server):
    with pytest.raises(UsageError) as caught:
        list(rollouts(simple_rows(1), Config(url=demo_server.url, max_cost=5.0)))
    assert str(caught.value) == "Config.max_cost needs Config.prices: without them nothing is spent"
    proc = run_command(["-u", demo_server.url, "--max-cost", "5"], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 2
    assert proc.stderr.decode() == "rollfilter: --max-cost needs --prices: without them nothing is spent\n"
    assert demo_server.stats()["requests"] == 0


def test_a_row_without_a_route_is_told_the_fields_in_python_and_the_options_on_the_command_line(demo_server, tmp_path):
    rows = simple_rows(2)  # no agent_ref: only a default agent could take them
    config = Config(endpoints={"demo": demo_server.url})
    failures = [outcome for outcome in rollouts(rows, config) if isinstance(outcome, Failure)]
    assert [failure.kind for failure in failures] == [ErrorKind.NO_ROUTE] * 2
    advice = "row has no agent_ref.name; give {} NAME to name its agent, or {} URL"
    assert {failure.message for failure in failures} == {advice.format("Config.agent", "Config.url")}

    errors = tmp_path / "errors.jsonl"
    proc = run_command(["-e", f"demo={demo_server.url}", "--errors", str(errors)], input=rows_jsonl(rows))
    assert proc.returncode == 1
    records = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [record["error"]["message"] for record in records] == [advice.format("-a/--agent", "-u/--url")] * 2
    proc = run_command(["-e", f"demo={demo_server.url}", "-q"], input=rows_jsonl(rows[:1]))
    assert proc.stderr.decode() == f"rollfilter: <stdin>:1: no_route: {advice.format('-a/--agent', '-u/--url')}\n"
    assert demo_server.stats()["requests"] == 0


def test_the_stopped_reason_names_the_field_in_python_and_the_option_on_the_command_line():
    with socket.socket() as listener:  # a port nothing listens on: bound, then closed
        listener.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/run"
    rows = simple_rows(30)
    config = Config(url=url, retries=0, concurrency=1, max_failures=FailureLimit(count=2))
    with rollouts(rows, config) as run:
        assert len(list(run)) == 2
    assert run.summary is not None
    assert run.summary["rollfilter"]["stopped"] == "stopped after 2 failed rows (Config.max_failures 2)"
    proc = run_command(["-u", url, "--retries", "0", "-j", "1", "--max-failures", "2"], input=rows_jsonl(rows))
    assert proc.returncode == 1
    assert "rollfilter: stopped after 2 failed rows (--max-failures 2)\n" in proc.stderr.decode()
    assert summary_of(proc.stderr)["rollfilter"]["stopped"] == "stopped after 2 failed rows (--max-failures 2)"


def test_a_verbose_event_names_the_option_that_the_engine_names_by_its_field(agent):
    row = {"responses_create_params": {"input": "q"}, "answer": {"_ng_no_persist": True}}
    proc = run_command(["-u", agent.run_url, "-a", "agent", "-v", "-q"], input=rows_jsonl([row]))
    assert proc.returncode == 1
    lines = proc.stderr.decode().splitlines()
    assert [line for line in lines if "not persisted" in line] == [
        "rollfilter: <stdin>:1 task 0 rollout 0: not persisted (the agent's _ng_no_persist); --resume runs it again"
    ]


def test_config_errors_name_the_field_and_the_command_line_names_the_option():
    with pytest.raises(ConfigError, match=r"^Config\.concurrency must be at least 1$") as caught:
        Config(url="http://h/run", concurrency=0)
    assert caught.value.field == "concurrency"
    proc = run(["-u", closed_port_url(), "-j", "1", "--shard", "3/2"])
    assert proc.stderr.decode() == "rollfilter: --shard I/N wants 0 <= I < N\n"


URL = "http://127.0.0.1:1/run"  # nothing is sent: the command line is only parsed
# For each field, a use of the option OPTION_OF_FIELD names for it (with what that option
# needs beside it): parsing it must change that field.
USE_OF_FIELD: dict[str, list[str]] = {
    "url": ["-u", "http://127.0.0.1:2/run"],
    "endpoints": ["-e", "a=http://127.0.0.1:3/run"],
    "agent": ["-a", "a"],
    "concurrency": ["-j", "3"],
    "limit": ["-n", "5"],
    "repeats": ["-r", "2"],
    "repeats_by_agent": ["-r", "a=2"],
    "repeat_seeds": ["--repeat-seeds", "-r", "2"],
    "params": ["-p", "temperature=0.5"],
    "retries": ["--retries", "7"],
    "retries.count": ["--retries", "7"],
    "retries.budget": ["--retry-budget", "0.5"],
    "retries.statuses": ["--retry-on", "500"],
    "timeout": ["--timeout", "9"],
    "timeout.attempt": ["--timeout", "9"],
    "timeout.connect": ["--connect-timeout", "9"],
    "tls": ["--cacert", "ca.pem"],
    "tls.cacert": ["--cacert", "ca.pem"],
    "tls.insecure": ["--insecure"],
    "max_failures": ["--max-failures", "3"],
    "max_failures.count": ["--max-failures", "3"],
    "max_failures.fraction": ["--max-failures", "10%"],
    "prices": ["--prices", "prices.json"],
    "max_cost": ["--max-cost", "5", "--prices", "prices.json"],
    "headers": ["-H", "X-Test: 1"],
    "shard": ["--shard", "1/2"],
    "pass_threshold": ["--pass-threshold", "0.5"],
    "head_server": ["--head-server", "http://127.0.0.1:4"],
    "proxy": ["--proxy", "http://127.0.0.1:5"],
    "adaptive": ["--adaptive"],
    "aggregate": ["--aggregate", "aggregate.json"],
    "cross_origin_redirects": ["--cross-origin-redirects"],
    "max_reply_bytes": ["--max-reply-bytes", "1000"],
    "output": ["-o", "out.jsonl"],
    "errors_file": ["--errors", "errors.jsonl"],
    "metrics_file": ["--metrics", "metrics.json"],
    "per_task_file": ["--per-task", "tasks.jsonl", "-r", "2"],
    "aggregate_file": ["--aggregate", "aggregate.json"],
    "materialized_file": ["--materialized", "materialized.jsonl", "-o", "out.jsonl"],
    "progress_file": ["--progress-file", "progress"],
    "resume": ["--resume", "-o", "out.jsonl"],
    "max_attempts": ["--max-attempts", "5"],
}


def parsed(args: list[str], monkeypatch: pytest.MonkeyPatch) -> CommandConfig:
    """The CommandConfig the command line `args` gives its run."""
    given: list[CommandConfig] = []
    monkeypatch.setattr(options, "run", lambda config, **_: given.append(config))
    start = options.typer_app(args=["-u", URL, *args, "rows.jsonl"], prog_name="rollfilter", standalone_mode=False)
    start()
    return given[0]


def field_value(config: CommandConfig, name: str) -> Any:
    """The value of field `name` (`retries.budget`: of a Config part) that `config` holds."""
    engine_fields = {field.name for field in dataclasses.fields(config.engine)}
    value: Any = config.engine if name.split(".")[0] in engine_fields else config
    for part in name.split("."):
        value = getattr(value, part)
    return value


def test_every_field_is_set_by_the_option_it_is_named_as(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A message that names a field sends the user to the option that sets it: each mapping is
    checked by parsing that option, and fields that share an option are each set by it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prices.json").write_text('{"a": [1, 2]}')
    assert set(USE_OF_FIELD) == set(OPTION_OF_FIELD)
    before = parsed([], monkeypatch)
    unset = []
    for name, use in USE_OF_FIELD.items():
        flags = OPTION_OF_FIELD[name].split(" ")[0].split("/")
        assert use[0] in flags, f"{name}: {use[0]} is not {OPTION_OF_FIELD[name]}"
        if field_value(parsed(use, monkeypatch), name) == field_value(before, name):
            unset.append(f"{name}: {' '.join(use)}")
    assert unset == []
    # Fields named as one and the same option are set together, by the same use of it; a part's
    # field named as its part's option is the part (--max-failures 3 sets a count, 10% a fraction).
    by_option: dict[str, set[str]] = {}
    for name, option in OPTION_OF_FIELD.items():
        part = name.split(".")[0]
        if part != name and OPTION_OF_FIELD.get(part) == option:
            continue
        by_option.setdefault(option, set()).add(" ".join(USE_OF_FIELD[name]))
    assert {option: uses for option, uses in by_option.items() if len(uses) > 1} == {}


def test_every_field_the_library_names_in_its_own_words_becomes_an_option():
    """No quote the library opens by chance hides one of its own field names from the rewrite."""
    known = re.compile(rf"\b(?:Command)?Config\.({'|'.join(OPTION_OF_FIELD)})\b")
    left = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}: {in_options(node.value)!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] not in {"cli", "demo"}
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and known.search(node.value)
        if known.search(in_options(node.value))
    ]
    assert left == []


class _Answers:
    """What the agent says: a 400 quoting a setting, or an answer that reports the agent's failure."""

    status = 400
    body = b"Config.timeout is too low; raise Config.timeout"


class _QuotingAgent(QuietHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_json(_Answers.status, _Answers.body)


@pytest.fixture
def quoting_agent() -> Iterator[str]:
    server = ThreadedHTTPServer(_QuotingAgent)
    yield f"{server.url}/run"
    server.close()


def test_a_server_s_text_is_left_as_it_is_on_the_command_line(quoting_agent: str, tmp_path: Path):
    proc = run(["-u", quoting_agent], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 1
    expected = "HTTP 400 Bad Request: 'Config.timeout is too low; raise Config.timeout'"
    assert proc.stderr.decode().splitlines()[0] == f"rollfilter: <stdin>:1: http_status: {expected}"
    errors = tmp_path / "errors.jsonl"
    run(["-u", quoting_agent, "--errors", str(errors)], input=rows_jsonl(simple_rows(1)))
    assert json.loads(errors.read_text())["error"]["message"] == expected


def test_an_agent_s_failure_reason_is_left_as_it_is_on_the_command_line(
    quoting_agent: str, monkeypatch: pytest.MonkeyPatch
):
    answer = {"_ng_failure_class": "tool_error", "failure_reason": "Config.url answered 500", "reward": 0.0}
    monkeypatch.setattr(_Answers, "status", 200)
    monkeypatch.setattr(_Answers, "body", json.dumps(answer).encode())
    proc = run(["-u", quoting_agent], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 1
    message = "the agent reported failure class 'tool_error': 'Config.url answered 500'"
    assert proc.stderr.decode().splitlines()[0] == f"rollfilter: <stdin>:1: agent_failure: {message}"
