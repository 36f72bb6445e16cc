"""cli/control.py: each command line and its answer, over a run on trio's MockClock."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from rollfilter import Config
from rollfilter.api.in_trio import RolloutRun, open_rollouts_in_trio
from rollfilter.cli.control import (
    CONTROL_CLIENTS,
    CONTROL_IDLE_SECONDS,
    CONTROL_LINE_BYTES,
    ControlServer,
    ControlSocket,
)
from rollfilter.errors import UsageError
from rollfilter.outcomes import Outcome
from tests.conftest import ROOT, URL
from tests.engine.test_steering import StandIn, collect, rows


@pytest.fixture
def control() -> Iterator[ControlSocket]:
    folder = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))  # a socket's path is at most 108 bytes
    socket = ControlSocket(str(folder / "run.sock"))
    try:
        yield socket
    finally:
        socket.remove()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def run() -> AsyncIterator[RolloutRun]:
    config = Config(url=URL, concurrency=4, policy_version=1)
    async with open_rollouts_in_trio(rows(8), config, transport=StandIn(lambda row: 10.0)) as run:
        yield run
        run.resume()
        assert len([outcome async for outcome in run]) == 8


async def answer(server: ControlServer, line: bytes) -> dict[str, Any]:
    text = await server.command(line)
    assert text.endswith(b"\n")
    assert text.count(b"\n") == 1
    answered = json.loads(text)
    assert isinstance(answered, dict)
    return answered


@pytest.mark.parametrize(
    ("line", "error"),
    [
        (b"", "no command"),
        (b"   ", "no command"),
        (b"\xff", "UTF-8"),
        (b"stop", "'stop' is no command"),
        (b"pause now", "pause takes no argument"),
        (b"drain 1 2", "at most one argument"),
        (b"drain soon", "number of seconds"),
        (b"drain -1", "number of seconds"),
        (b"drain inf", "number of seconds"),
        (b"concurrency", "concurrency takes one argument: concurrency N"),
        (b"version 2 3", "version takes one argument: version V"),
        (b"rpm =600", "no agent before '='"),
        (b"concurrency x", "whole number"),
        (b"concurrency 0", "at least 1"),
        (b"concurrency 1.5", "whole number"),
        (b"rpm fast", "[AGENT=]N"),
        (b"rpm 0", "at least"),
        (b"rpm nan", "N a number in the digits 0-9"),
        ("concurrency \u0663".encode(), "whole number in the digits 0-9, not '\u0663'"),  # an Arabic-Indic 3
        ("concurrency \uff13".encode(), "whole number in the digits 0-9"),  # a full-width 3
        (b"concurrency 1_0", "whole number in the digits 0-9, not '1_0'"),
        (b"concurrency +3", "whole number in the digits 0-9"),
        (b"version 1_0", "whole number in the digits 0-9"),
        ("version \u0663".encode(), "whole number in the digits 0-9"),
        (b"version -", "whole number in the digits 0-9"),
        (b"version -1", "cannot go back from 1 to -1"),  # a version may be negative: this one goes back
        (b"rpm 1_000", "N a number in the digits 0-9, not '1_000'"),
        ("tpm \u0663".encode(), "N a number in the digits 0-9"),
        (b"drain 1_0", "number of seconds in the digits 0-9"),
        ("drain \u0663".encode(), "number of seconds in the digits 0-9"),
        (b"drain 1e400", "number of seconds"),
        (
            b"rpm my agent=600",
            "rpm takes one argument: rpm [AGENT=]N|off (quote an agent's name with a space: rpm \"my",
        ),
        (b'rpm "my agent=600', "a quote is not closed"),
        (b'rpm ""=600', "no agent before '='"),
        (b"tpm other=5", "no agent 'other'"),
        (b"version x", "whole number"),
        (b"version 0", "cannot go back"),
    ],
)
async def test_a_command_refused_answers_its_error_and_changes_nothing(
    autojump_clock: trio.testing.MockClock, control: ControlSocket, run: RolloutRun, line: bytes, error: str
):
    assert run._run is not None
    server = ControlServer(control, run._run)
    before = run.statistics().steering
    answered = await answer(server, line)
    assert answered["ok"] is False
    assert error in answered["error"]
    assert run.statistics().steering == before


async def test_each_command_answers_what_is_in_force_after_it(
    autojump_clock: trio.testing.MockClock, control: ControlSocket, run: RolloutRun
):
    assert run._run is not None
    heard: list[str] = []
    server = ControlServer(control, run._run, heard.append, fit=lambda wanted: min(wanted, 100))
    await trio.sleep(1)
    assert (await answer(server, b"pause"))["paused"] is True
    drained = await answer(server, b"drain 100")
    assert (drained["ok"], drained["drained"], drained["requests_out"]) == (True, True, 0)
    assert (await answer(server, b"concurrency 2"))["concurrency"] == 2
    fitted = await answer(server, b"concurrency 1000")
    assert fitted["concurrency"] == 100
    assert "open files" in fitted["note"]
    assert (await answer(server, b"rpm 600"))["rates"] == {"(no name)": {"rpm": 600.0, "tpm": None}}
    assert (await answer(server, b"tpm 5000"))["rates"] == {"(no name)": {"rpm": 600.0, "tpm": 5000.0}}
    assert (await answer(server, b"rpm off"))["rates"] == {"(no name)": {"rpm": None, "tpm": 5000.0}}
    assert (await answer(server, b"tpm off"))["rates"] == {}
    assert (await answer(server, b"version 2"))["policy_version"] == 2
    status = await answer(server, b" status ")
    assert (status["paused"], status["ended"], status["concurrency"]) == (True, 4, 100)
    assert (await answer(server, b"resume"))["paused"] is False
    assert heard == [
        "--control: pause",
        "--control: drain 100",
        "--control: concurrency 2",
        "--control: concurrency 1000",
        "--control: rpm 600",
        "--control: tpm 5000",
        "--control: rpm off",
        "--control: tpm off",
        "--control: version 2",
        "--control: resume",
    ]


def test_the_man_page_gives_the_bounds_the_control_keeps():
    man = (ROOT / "man" / "rollfilter.1").read_text().replace("\\-", "-")
    assert f"at most {CONTROL_CLIENTS} at once" in man
    assert f"a line of at most {CONTROL_LINE_BYTES} bytes" in man
    assert f"a client silent for {CONTROL_IDLE_SECONDS / 60:g} minutes" in man


class OutOfFiles:
    """A listener whose first accepts fail as a process out of file descriptors sees them fail."""

    def __init__(self, listener: trio.SocketListener, failures: int) -> None:
        self.listener = listener
        self.failures = failures

    async def accept(self) -> trio.SocketStream:
        if self.failures:
            self.failures -= 1
            await trio.lowlevel.checkpoint()
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        return await self.listener.accept()


async def test_a_client_met_with_no_file_descriptor_left_ends_nothing(
    autojump_clock: trio.testing.MockClock, control: ControlSocket, run: RolloutRun
):
    assert run._run is not None
    server = ControlServer(control, run._run)
    listener = OutOfFiles(server._listener, failures=3)
    server._listener = listener  # type: ignore[assignment]  # accepts as the real one does
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve)
        async with await trio.open_unix_socket(control.path) as client:
            await client.send_all(b"status\n")
            answered = b""
            while not answered.endswith(b"\n"):
                answered += await client.receive_some()
        assert json.loads(answered)["ok"] is True
        assert listener.failures == 0
        nursery.cancel_scope.cancel()


async def test_a_client_that_reads_no_answer_is_let_go(
    autojump_clock: trio.testing.MockClock, control: ControlSocket, run: RolloutRun
):
    assert run._run is not None
    server = ControlServer(control, run._run)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve)
        async with await trio.open_unix_socket(control.path) as client:
            # Commands enough that their answers fill both buffers; none of them is read.
            await client.send_all(b"status\n" * 20_000)
            await trio.testing.wait_all_tasks_blocked()
            assert server.clients == 1
            await trio.sleep(CONTROL_IDLE_SECONDS + 1)
            assert server.clients == 0  # let go: its place is free for another
        nursery.cancel_scope.cancel()


async def test_the_status_answers_from_the_runs_snapshot(
    autojump_clock: trio.testing.MockClock, control: ControlSocket, run: RolloutRun
):
    steered = run._run
    assert steered is not None
    taken = steered.statistics()
    shown = dataclasses.replace(taken, succeeded=77, failed=3, in_flight=6)
    steered.statistics = lambda: shown  # type: ignore[method-assign]
    try:
        status = await answer(ControlServer(control, steered), b"status")
    finally:
        del steered.statistics
    assert (status["ended"], status["failed"], status["in_flight"]) == (80, 3, 6)
    assert status["concurrency"] == taken.steering.concurrency


async def test_an_agents_name_with_a_space_is_given_quoted(
    autojump_clock: trio.testing.MockClock, control: ControlSocket
):
    named = [{**row, "agent_ref": {"name": "my agent"}} for row in rows(2)]
    config = Config(endpoints={"my agent": (URL,), "other": (URL,)}, concurrency=2)
    async with open_rollouts_in_trio(named, config, transport=StandIn(lambda row: 1.0)) as run:
        assert run._run is not None
        server = ControlServer(control, run._run)
        await trio.sleep(0.5)
        assert (await answer(server, b'rpm "my agent"=600'))["rates"] == {"my agent": {"rpm": 600.0, "tpm": None}}
        rates = (await answer(server, b"tpm 'my agent'=5000"))["rates"]
        assert rates == {"my agent": {"rpm": 600.0, "tpm": 5000.0}}
        assert (await answer(server, b"rpm my\\ agent=off"))["rates"] == {"my agent": {"rpm": None, "tpm": 5000.0}}
        assert len([outcome async for outcome in run]) == 2


async def test_after_a_drain_the_rows_taken_wait_on_the_pause_not_in_flight(
    autojump_clock: trio.testing.MockClock, control: ControlSocket
):
    async with open_rollouts_in_trio(rows(12), Config(url=URL, concurrency=4), transport=StandIn()) as run:
        assert run._run is not None
        server = ControlServer(control, run._run)
        taken: list[Outcome] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, run, taken)
            await trio.sleep(1)  # four out at the agent
            drained = await answer(server, b"drain")
            await trio.testing.wait_all_tasks_blocked()  # the four slots freed are taken again, and held
            status = await answer(server, b"status")
            run.resume()
        assert len(taken) == 12
    assert (drained["drained"], drained["requests_out"]) == (True, 0)
    assert (status["ended"], status["requests_out"], status["in_flight"], status["waiting_on_pause"]) == (4, 0, 0, 4)
    assert (status["waiting_on_rate_limits"], status["waiting_on_window"], status["waiting_on_policy_version"]) == (
        0,
        0,
        0,
    )


def test_the_socket_appears_at_its_path_already_listening(monkeypatch: pytest.MonkeyPatch):
    import os
    import socket as socket_module

    from rollfilter.cli import control as control_module

    folder = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))
    path = str(folder / "run.sock")
    seen: list[tuple[bool, bool]] = []
    link = os.link

    def linking(source: str, target: str) -> None:
        probe = socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM)
        try:
            probe.connect(source)  # refused if it were bound and not yet listening
            seen.append((True, os.path.exists(target)))
        finally:
            probe.close()
        link(source, target)

    monkeypatch.setattr(control_module.os, "link", linking)
    made = ControlSocket(path)
    try:
        assert seen == [(True, False)]  # listening before the path names it
        assert sorted(os.listdir(folder)) == ["run.sock"]  # the private name is gone
    finally:
        made.remove()
        shutil.rmtree(folder, ignore_errors=True)


def test_a_path_taken_while_the_socket_was_made_is_refused_not_replaced(monkeypatch: pytest.MonkeyPatch):
    import os

    from rollfilter.cli import control as control_module

    folder = Path(tempfile.mkdtemp(prefix="rf-", dir="/tmp"))
    path = folder / "run.sock"
    link = os.link

    def taken_first(source: str, target: str) -> None:
        path.write_text("another run's\n")
        link(source, target)

    monkeypatch.setattr(control_module.os, "link", taken_first)
    try:
        with pytest.raises(UsageError, match="another run is listening on it"):
            ControlSocket(str(path))
        assert path.read_text() == "another run's\n"
        assert sorted(os.listdir(folder)) == ["run.sock"]
    finally:
        shutil.rmtree(folder, ignore_errors=True)


async def test_with_groups_status_says_the_rollouts_back_in_open_groups(
    autojump_clock: trio.testing.MockClock, control: ControlSocket
):
    """A group's rollout that has ended is counted done when its group closes: `status` says how
    many wait so, as SIGUSR1's status block does (the same snapshot)."""
    agent = StandIn(lambda row: 1.0 if row["_ng_rollout_index"] == 0 else 10.0)
    config = Config(url=URL, concurrency=4, repeats=2, groups=True)
    async with open_rollouts_in_trio(rows(2), config, transport=agent) as run:
        assert run._run is not None
        server = ControlServer(control, run._run)
        taken: list[Outcome] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(collect, run, taken)
            await trio.sleep(5)  # each task's first rollout back, its second out
            status = await answer(server, b"status")
    assert (status["ended"], status["in_flight"], status["in_open_groups"]) == (0, 2, 2)
