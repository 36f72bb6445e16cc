"""A NeMo Gym head server: agent names resolved, headers sent, and each way it fails."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from tests.conftest import (
    ROOT,
    DemoServer,
    HeadServer,
    QuietHandler,
    ThreadedHTTPServer,
    clean_env,
    closed_port_url,
    result_lines,
    rows_jsonl,
    run,
    simple_rows,
    summary_of,
)


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
    message, summary = proc.stderr.decode().splitlines()  # the summary last, as every run's
    assert message.startswith(f"rollfilter: the head server at {server.url}")
    assert reason in message
    assert json.loads(summary)["rollfilter"]["stopped"] == message.removeprefix("rollfilter: ")
    assert server.requests == 1


CONFIG = ROOT / "tests" / "data" / "global_config_dict.yaml"


AGENT = "example_single_tool_call_simple_agent"


SECRET = "dummy-key"  # policy_api_key in the config: must never be printed


@pytest.fixture
def head_server(demo_server: DemoServer) -> Iterator[HeadServer]:
    config = yaml.safe_load(CONFIG.read_text())
    config[AGENT]["responses_api_agents"]["simple_agent"]["port"] = demo_server.port
    config["agent_without_address"] = {"responses_api_agents": {"simple_agent": {"entrypoint": "app.py"}}}
    server = HeadServer(config)
    try:
        yield server
    finally:
        server.close()


def test_head_server_resolves_agent_names(head_server: HeadServer, demo_server: DemoServer):
    rows = [{**row, "agent_ref": {"type": "responses_api_agents", "name": AGENT}} for row in simple_rows(6)]
    rows.append({"responses_create_params": {"input": "x"}, "agent_ref": {"name": "no_such_agent"}})
    rows.append({"responses_create_params": {"input": "x"}, "agent_ref": {"name": "agent_without_address"}})
    proc = run(["--head-server", head_server.url], input=rows_jsonl(rows))
    assert proc.returncode == 1
    results = result_lines(proc.stdout)
    assert sorted(r["_ng_task_index"] for r in results) == list(range(6))
    assert all(r["agent_ref"]["name"] == AGENT for r in results)
    assert demo_server.stats()["requests"] == 6
    messages = [line for line in proc.stderr.decode().splitlines() if not line.startswith("{")]
    assert "no_such_agent" in messages[0]
    assert AGENT in messages[0]  # lists the names it does know
    assert "no host and port" in messages[1]
    assert SECRET not in proc.stderr.decode()


def test_h_headers_go_to_the_head_server_too(head_server: HeadServer, demo_server: DemoServer):
    rows = [{**row, "agent_ref": {"name": AGENT}} for row in simple_rows(1)]
    proc = run(["--head-server", head_server.url, "-H", "Authorization: Bearer t0ken"], input=rows_jsonl(rows))
    assert proc.returncode == 0, proc.stderr
    assert head_server.headers[0]["Authorization"] == "Bearer t0ken"
    assert b"t0ken" not in proc.stderr


def test_head_server_from_the_environment_and_explicit_endpoint_wins(head_server: HeadServer, start_demo):
    other = start_demo()
    rows = [{**row, "agent_ref": {"name": AGENT}} for row in simple_rows(3)]
    env = clean_env(ROLLFILTER_HEAD_SERVER=head_server.url)
    proc = run(["-e", f"{AGENT}={other.base}"], input=rows_jsonl(rows), env=env)
    assert proc.returncode == 0, proc.stderr
    assert other.stats()["requests"] == 3


def test_unknown_agent_name_is_a_usage_error_listing_known_names(head_server: HeadServer, demo_server: DemoServer):
    proc = run(["--head-server", head_server.url, "-a", "nope"], input=rows_jsonl(simple_rows(2)))
    assert proc.returncode == 2
    assert proc.stderr.decode().count("\n") == 1
    assert AGENT in proc.stderr.decode()
    assert SECRET not in proc.stderr.decode()
    assert demo_server.stats()["requests"] == 0


def test_unreachable_head_server_exits_3_before_sending():
    head_server = closed_port_url()
    proc = run(["--head-server", head_server, "-a", AGENT], input=rows_jsonl(simple_rows(2)))
    assert proc.returncode == 3
    assert proc.stdout == b""
    message, _ = proc.stderr.decode().splitlines()
    assert message.startswith(f"rollfilter: cannot reach the head server at {head_server}")
    figures = summary_of(proc.stderr)["rollfilter"]  # the summary last, `2>&1 >/dev/null | tail -n 1 | jq` finds it
    assert figures["stopped"] == message.removeprefix("rollfilter: ")
    assert (figures["rows_read"], figures["succeeded"], figures["failed"]) == (0, 0, 0)
