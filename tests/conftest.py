"""Shared test fixtures: the demo agent as a real server on 127.0.0.1, and the installed command."""

from __future__ import annotations

import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
WEATHER = ROOT / "rollfilter" / "examples" / "weather.jsonl"
SUBPROCESS_TIMEOUT = 60  # seconds: every subprocess wait is bounded


def rollfilter_command() -> list[str]:
    """The installed console script beside this interpreter (what users run)."""
    script = Path(sys.executable).parent / "rollfilter"
    if script.exists():
        return [str(script)]
    found = shutil.which("rollfilter")
    assert found, "the rollfilter command is not installed: pip install -e '.[test]'"
    return [found]


def require_tool(name: str) -> str:
    """The path of a program the suite needs. A missing one fails the test (never a skip):
    .ci/run installs it, and anywhere else the suite says what to install."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: the test suite needs it (.ci/run installs it with apt-get)")
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLFILTER_")}
    for proxy in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(proxy, None)
    env.update(extra)
    return env


def run(
    args: Sequence[str],
    *,
    input: bytes | str = b"",
    timeout: float = SUBPROCESS_TIMEOUT,
    env: dict[str, str] | None = None,
    command: Sequence[str] | None = None,
    **popen: Any,
) -> subprocess.CompletedProcess[bytes]:
    """rollfilter (or `command`) to its end; stdout and stderr are captured unless `popen` gives them."""
    data: bytes | None = input.encode() if isinstance(input, str) else input
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    program = rollfilter_command() if command is None else list(command)
    if "stdin" in popen:  # the test's own descriptor instead of `input`
        data = None
    return subprocess.run([*program, *args], input=data, timeout=timeout, env=env or clean_env(), **popen)


def start(args: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
    """rollfilter in the background; stdout and stderr are pipes and the environment clean unless given."""
    popen.setdefault("stdout", subprocess.PIPE)
    popen.setdefault("stderr", subprocess.PIPE)
    popen.setdefault("env", clean_env())
    return subprocess.Popen([*rollfilter_command(), *args], **popen)


def result_lines(stdout: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in stdout.splitlines()]


def summary_of(stderr: bytes) -> dict[str, Any]:
    """The summary: the last stderr line (one JSON object)."""
    last = stderr.strip().splitlines()[-1]
    summary = json.loads(last)
    assert isinstance(summary, dict)
    return summary


def expected_reward(row: dict[str, Any]) -> float:
    """The demo agent's documented formula, written out again independently of its code."""
    if isinstance(row.get("demo"), dict) and "reward" in row["demo"]:
        return float(row["demo"]["reward"])
    value = row["responses_create_params"]["input"]
    text = value if isinstance(value, str) else "".join(m["content"] for m in value)
    return 1.0 if len(text) % 2 == 0 else 0.0


def rows_jsonl(rows: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def simple_rows(n: int, **extra: Any) -> list[dict[str, Any]]:
    return [{"id": i, "responses_create_params": {"input": "q" * (i % 5)}, **extra} for i in range(n)]


class ThreadedHTTPServer:
    """A stdlib HTTP server on 127.0.0.1 in a thread, for stand-ins (head server, proxy)."""

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


class QuietHandler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def send_json(self, status: int, payload: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)


class DemoServer:
    """`python -m rollfilter.demo` in its own process, on a free loopback port."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "rollfilter.demo", "--port", "0", *args],
            stderr=subprocess.PIPE,
            env=clean_env(),
        )
        assert self.process.stderr is not None
        line = self.process.stderr.readline().decode()
        assert "listening on" in line, line
        self.base = line.rsplit(" ", 1)[1].strip()
        self.url = self.base + "/run"
        self.port = int(self.base.rsplit(":", 1)[1])

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.base + "/stats", timeout=10) as response:
            data = json.load(response)
        assert isinstance(data, dict)
        return data

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=SUBPROCESS_TIMEOUT)
        if self.process.stderr:
            self.process.stderr.close()


@pytest.fixture
def demo_server() -> Iterator[DemoServer]:
    server = DemoServer()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture
def start_demo() -> Iterator[Any]:
    """Start demo servers with options; all are killed at the end of the test."""
    servers: list[DemoServer] = []

    def start(*args: str) -> DemoServer:
        server = DemoServer(*args)
        servers.append(server)
        return server

    try:
        yield start
    finally:
        for server in servers:
            server.kill()


def wait_for(predicate: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.02)


@pytest.fixture
def agent() -> Iterator[Any]:
    """A RecordingAgent named "agent" on 127.0.0.1 (tests/recording_agent.py), closed after the test."""
    from tests.recording_agent import RecordingAgent  # it imports this module

    server = RecordingAgent(name="agent")
    try:
        yield server
    finally:
        server.close()
