"""--control SOCKET: steering a running command from the shell, against a stand-in agent that logs arrivals.

The runs here are processes of their own (they are steered over a socket while they run, and
stopped by signals); the refusals before a run starts run in-process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollfilter.cli.control import CONTROL_CLIENTS
from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    invoke,
    lines_of,
    read_jsonl,
    rows_jsonl,
    simple_rows,
    start,
    summary_of,
    wait_for,
)
from tests.servers.arrivals_agent import ArrivalsAgent


@pytest.fixture
def agent() -> Iterator[ArrivalsAgent]:
    server = ArrivalsAgent()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A folder whose paths fit a Unix socket's address (108 bytes; pytest's tmp_path may not)."""
    path = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def rows_file(folder: Path, count: int, latency: float) -> Path:
    path = folder / "rows.jsonl"
    lines = [
        json.dumps({"id": number, "latency": latency, "responses_create_params": {"input": "hi"}})
        for number in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


def ask(path: Path, command: bytes) -> dict[str, Any]:
    """One command over a connection of its own, and its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.settimeout(SUBPROCESS_TIMEOUT)
        client.connect(str(path))
        client.sendall(command + b"\n")
        answer = json.loads(client.makefile("rb").readline())
    assert isinstance(answer, dict)
    return answer


def ended_at_rollfilter(control: Path, count: int) -> bool:
    """`count` rows ended as rollfilter counts them: the agent's count of replies is no witness,
    as a reply it has let go of may still be on its way."""
    return ask(control, b"status").get("ended") == count


def finished(process: subprocess.Popen[bytes]) -> tuple[int, bytes, bytes]:
    stdout, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT)
    return process.returncode, stdout, stderr


def test_after_pause_is_acknowledged_no_request_arrives(agent: ArrivalsAgent, short_dir: Path):
    control = short_dir / "run.sock"
    rows = rows_file(short_dir, 12, latency=0.05)
    agent.gate.clear()  # the first four wait at the agent until the run is paused
    process = start(["-u", agent.run_url, "-j", "4", "--control", str(control), str(rows)])
    errors = lines_of(process.stderr)
    wait_for(lambda: agent.in_flight == 4)
    assert stat.S_IMODE(os.stat(control).st_mode) == 0o600
    answer = ask(control, b"pause")
    acknowledged = time.monotonic()
    assert answer["ok"]
    assert answer["paused"]
    agent.gate.set()
    wait_for(lambda: ended_at_rollfilter(control, 4))  # what was out finishes
    time.sleep(0.25)  # a row held back would have been sent as soon as a slot freed up
    assert agent.arrived_after(acknowledged) == []
    process.send_signal(signal.SIGUSR1)
    while not (line := errors.get(timeout=SUBPROCESS_TIMEOUT)).startswith(b"rollfilter: status:"):
        assert line, "no status line"
    assert line.startswith(b"rollfilter: status: paused, 4 done")
    assert ask(control, b"resume")["paused"] is False
    assert process.wait(timeout=SUBPROCESS_TIMEOUT) == 0
    while errors.get(timeout=SUBPROCESS_TIMEOUT):  # to its end, so that its pipe can be closed
        pass
    for pipe in (process.stdout, process.stderr):
        assert pipe is not None
        pipe.close()
    assert len(agent.arrivals) == 12
    assert not control.exists()


def test_after_concurrency_4_at_most_4_are_in_flight(agent: ArrivalsAgent, short_dir: Path):
    control = short_dir / "run.sock"
    rows = rows_file(short_dir, 24, latency=0.05)  # 16 sent after the change: enough to see its bound
    agent.gate.clear()  # no slot frees up before the change is acknowledged
    process = start(["-u", agent.run_url, "-j", "8", "--control", str(control), str(rows)])
    wait_for(lambda: agent.in_flight == 8)
    answer = ask(control, b"concurrency 4")
    acknowledged = time.monotonic()
    assert answer["ok"]
    assert answer["concurrency"] == 4
    agent.gate.set()
    returncode, stdout, _ = finished(process)
    assert returncode == 0
    assert len(stdout.splitlines()) == 24
    after = agent.arrived_after(acknowledged)
    assert after
    assert len(agent.arrivals) == 24
    assert max(arrival.in_flight for arrival in after) <= 4


def test_ctrl_c_while_paused_stops_with_the_summary_and_resume_finishes(agent: ArrivalsAgent, short_dir: Path):
    control = short_dir / "run.sock"
    output = short_dir / "out.jsonl"
    rows = rows_file(short_dir, 12, latency=0.05)
    args = ["-u", agent.run_url, "-j", "4", "-o", str(output), "--control", str(control), str(rows)]
    agent.gate.clear()  # the first four wait at the agent until the run is paused
    process = start(args)
    wait_for(lambda: agent.in_flight == 4)
    assert ask(control, b"pause")["paused"]
    agent.gate.set()
    wait_for(lambda: ended_at_rollfilter(control, 4))
    process.send_signal(signal.SIGINT)
    returncode, _, stderr = finished(process)
    assert returncode == 130
    summary = summary_of(stderr)["rollfilter"]
    assert summary["succeeded"] == 4
    assert summary["stopped"] == "interrupted"
    assert not control.exists()
    resumed = invoke(["--resume", *args])
    assert resumed.returncode == 0, resumed.stderr
    assert sorted(result["id"] for result in read_jsonl(output)) == list(range(12))
    assert len(agent.arrivals) == 12


def flood(path: Path) -> dict[str, Any]:
    """A megabyte without a newline, and the answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as flooding:
        flooding.settimeout(SUBPROCESS_TIMEOUT)
        flooding.connect(str(path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # let go before it was all sent
            flooding.sendall(b"x" * 1_000_000)
        answer = json.loads(flooding.makefile("rb").readline())
    assert isinstance(answer, dict)
    return answer


def test_silent_and_flooding_clients_hold_nothing_up(agent: ArrivalsAgent, short_dir: Path):
    control = short_dir / "run.sock"
    rows = rows_file(short_dir, 20, latency=0.01)
    agent.gate.clear()  # the run cannot end while the clients come and go
    process = start(["-u", agent.run_url, "-j", "2", "--control", str(control), str(rows)])
    wait_for(lambda: agent.in_flight == 2)  # sent: the socket listens (its file is there a moment before)
    silent = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(CONTROL_CLIENTS)]
    try:
        for client in silent:
            client.connect(str(control))
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as busy:  # accepted after them: no place left
            busy.settimeout(SUBPROCESS_TIMEOUT)
            busy.connect(str(control))
            assert "busy" in json.loads(busy.makefile("rb").readline())["error"]
        for _ in range(2):
            silent.pop().close()
        # A place is free once the server has seen its client go; until then the answer is "busy".
        wait_for(lambda: "at most 4096 bytes" in flood(control)["error"])
        wait_for(lambda: "whole number" in ask(control, b"concurrency x")["error"])  # a bad command changes nothing
        wait_for(lambda: ask(control, b"status").get("concurrency") == 2)
        agent.gate.set()
        returncode, stdout, _ = finished(process)  # the silent clients are still connected
        assert returncode == 0
        assert len(stdout.splitlines()) == 20
        assert not control.exists()
    finally:
        for client in silent:
            client.close()


def test_a_path_that_is_no_stale_socket_is_refused(short_dir: Path):
    taken = short_dir / "file"
    taken.write_text("mine\n")
    listening = short_dir / "live.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as other_run:
        other_run.bind(str(listening))
        other_run.listen()
        for path, problem in (
            (taken, b"exists and is not a socket"),
            (listening, b"another run is listening on it"),
            (short_dir / "no" / "such.sock", b"cannot listen there"),
            ("", b"--control needs a path"),
        ):
            result = invoke(["--demo", "--control", str(path)], input=b'{"responses_create_params": {"input": "hi"}}\n')
            assert result.returncode == 2
            assert result.stdout == b""
            assert result.stderr.count(b"\n") == 1
            assert problem in result.stderr
        assert listening.exists()
    assert taken.read_text() == "mine\n"


def test_a_stale_socket_that_cannot_be_removed_is_refused(short_dir: Path, monkeypatch: pytest.MonkeyPatch):
    stale = short_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead_run:
        dead_run.bind(str(stale))

    def read_only(path: str) -> None:  # as on a read-only file system (root may write any folder)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(os, "unlink", read_only)
    result = invoke(["--demo", "--control", str(stale)], input=b'{"responses_create_params": {"input": "hi"}}\n')
    assert result.returncode == 2
    problem = f"--control {stale}: cannot take over the stale socket: Read-only file system"
    assert result.stderr == f"rollfilter: {problem}\n".encode()
    assert result.stdout == b""


def test_a_stale_socket_is_taken_over_and_removed_at_the_end(short_dir: Path):
    stale = short_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as dead_run:
        dead_run.bind(str(stale))  # closed without unlinking: what a killed run leaves
    result = invoke(["--demo", "--control", str(stale)], input=b'{"responses_create_params": {"input": "hi"}}\n')
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 1
    assert not stale.exists()


def test_the_socket_is_removed_when_a_second_interrupt_ends_the_wind_down_at_once(
    demo_server: DemoServer, short_dir: Path
):
    control = short_dir / "run.sock"
    data = short_dir / "rows.jsonl"
    data.write_text(rows_jsonl(simple_rows(5000)))
    # Nobody reads stdout: once the pipe is full the wind-down cannot finish (as in test_faults.py).
    read_end, write_end = os.pipe()
    probe = os.open(f"/proc/self/fd/{write_end}", os.O_WRONLY)
    full = select.poll()
    full.register(probe, select.POLLOUT)
    process = start(["-u", demo_server.url, "--control", str(control), str(data)], stdout=write_end)
    os.close(write_end)
    try:
        assert process.stderr is not None
        errors = lines_of(process.stderr)
        wait_for(lambda: not full.poll(0))
        assert control.exists()
        process.send_signal(signal.SIGINT)
        process.send_signal(signal.SIGUSR1)  # answered once the interrupt has been taken
        assert errors.get(timeout=SUBPROCESS_TIMEOUT).startswith(b"rollfilter: status: ")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=SUBPROCESS_TIMEOUT) == 130
        assert not control.exists()
    finally:
        process.kill()
        process.wait(timeout=SUBPROCESS_TIMEOUT)
        assert process.stderr is not None
        process.stderr.close()
        for fd in (read_end, probe):
            os.close(fd)
