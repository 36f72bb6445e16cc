"""cli/exporter.py: the address bound up front, the /metrics endpoint, the file for node_exporter."""

from __future__ import annotations

import errno
import functools
import os
import select
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing
from prometheus_client import CollectorRegistry, Counter

from rollfilter.cli.exporter import MAX_CONNECTIONS, Scrapes, accept, listen, publish, reply, serve
from rollfilter.errors import UsageError
from rollfilter.formats.writers import WholeFile


def a_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("rollfilter_test_total", "A test counter.", registry=registry).inc(3)
    return registry


def test_replies_only_get_and_head_of_metrics():
    registry = Scrapes(a_registry())
    ok = reply(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", registry)
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" in ok
    head, body = ok.split(b"\r\n\r\n", 1)
    assert f"Content-Length: {len(body)}".encode() in head
    assert b"rollfilter_test_total 3.0" in body
    assert reply(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n", registry).startswith(b"HTTP/1.1 200 ")
    head_only = reply(b"HEAD /metrics HTTP/1.1\r\n\r\n", registry)
    assert head_only.endswith(b"\r\n\r\n")
    assert f"Content-Length: {len(body)}".encode() in head_only
    assert reply(b"GET / HTTP/1.1\r\n\r\n", registry).startswith(b"HTTP/1.1 404 ")
    assert reply(b"POST /metrics HTTP/1.1\r\n\r\n", registry).startswith(b"HTTP/1.1 405 ")
    assert reply(b"hello\r\n\r\n", registry).startswith(b"HTTP/1.1 400 ")


class SlowFigures:
    """A collector that takes a while to read, counting its reads."""

    def __init__(self) -> None:
        self.reads = 0

    def collect(self):
        import time

        from prometheus_client.core import CounterMetricFamily

        self.reads += 1
        time.sleep(0.05)
        return [CounterMetricFamily("rollfilter_slow_total", "Slow.", value=self.reads)]


def test_scrapes_one_after_another_reuse_figures_slow_to_make():
    registry = CollectorRegistry(auto_describe=False)
    figures = SlowFigures()
    registry.register(figures)
    scrapes = Scrapes(registry)
    first = scrapes.text()
    assert scrapes.text() == first  # made within ten times what the first took: the run's loop is spared
    assert figures.reads == 1


def test_listen_refuses_a_port_in_use_in_one_line_naming_the_option():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=rf"^--prometheus 127.0.0.1:{port}: cannot listen there: Address already"):
            listen("127.0.0.1", port)
    with pytest.raises(UsageError, match=r"^--prometheus no-such-host.invalid:9464: cannot listen there: "):
        listen("no-such-host.invalid", 9464)


async def test_serves_scrapes_and_outlives_scrapers_that_go_away():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sockets = listen("127.0.0.1", port)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve, sockets, Scrapes(a_registry()))
        await trio.lowlevel.checkpoint()
        gone = await trio.open_tcp_stream("127.0.0.1", port)
        await gone.send_all(b"GET /met")
        await gone.aclose()  # a scraper that leaves mid-request costs nothing but its answer
        for _ in range(2):
            stream = await trio.open_tcp_stream("127.0.0.1", port)
            await stream.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while data := await stream.receive_some():
                answer += data
            await stream.aclose()
            assert answer.startswith(b"HTTP/1.1 200 OK")
            assert b"rollfilter_test_total 3.0" in answer
        nursery.cancel_scope.cancel()
    with pytest.raises(OSError, match="onnect"):  # the server closed its socket when it was cancelled
        await trio.open_tcp_stream("127.0.0.1", port)


async def test_the_file_is_replaced_whole_and_a_failure_is_said_once(tmp_path: Path):
    path = tmp_path / "m.prom"
    said: list[str] = []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: publish(WholeFile(str(path), "--prometheus-file"), a_registry(), said.append))
        await trio.lowlevel.checkpoint()
        nursery.cancel_scope.cancel()
    assert "rollfilter_test_total 3.0" in path.read_text()
    assert said == []
    gone = tmp_path / "gone" / "m.prom"
    file = WholeFile(str(gone), "--prometheus-file")
    gone.parent.rmdir()  # its folder removed while the run goes
    with trio.fail_after(5):
        await publish(file, a_registry(), said.append, seconds=0.01)
    assert said == [f"cannot write --prometheus-file {gone}: No such file or directory; the run goes on without it"]


def test_the_command_imports_prometheus_client_only_for_a_run_that_exports():
    code = (
        "import sys\n"
        "from rollfilter.cli import collect, main, options\n"
        "from rollfilter.cli.files import outputs\n"
        "from rollfilter.api import rollouts, in_trio, in_asyncio\n"
        "assert 'prometheus_client' not in sys.modules, 'imported'\n"
        "from rollfilter.cli import exporter\n"
        "assert 'prometheus_client' in sys.modules\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()


def a_free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_connections_past_the_cap_wait_until_one_ends():
    port = a_free_port()
    sockets = listen("127.0.0.1", port)
    slots = trio.Semaphore(2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(serve, sockets, Scrapes(a_registry()), slots=slots))
        idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(2)]  # connections that send nothing
        scrape = await trio.open_tcp_stream("127.0.0.1", port)
        await scrape.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)
        assert slots.value == 0
        readable = select.poll()
        readable.register(scrape.socket.fileno(), select.POLLIN)
        assert readable.poll(0) == []  # not answered: it waits in the listen backlog
        await idle[0].aclose()
        answer = b""
        while data := await scrape.receive_some():
            answer += data
        assert answer.startswith(b"HTTP/1.1 200 OK")
        for stream in (idle[1], scrape):
            await stream.aclose()
        nursery.cancel_scope.cancel()


class OutOfDescriptorsOnce(trio.abc.Listener[trio.SocketStream]):
    """A listener whose first accept finds no descriptor free (EMFILE), as a flood leaves it."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream: trio.SocketStream | None = stream
        self.accepts = 0

    async def accept(self) -> trio.SocketStream:
        self.accepts += 1
        if self.accepts == 1:
            raise OSError(errno.EMFILE, os.strerror(errno.EMFILE))
        if self.stream is None:
            await trio.sleep_forever()
        stream, self.stream = self.stream, None
        return stream

    async def aclose(self) -> None:
        pass


async def test_an_accept_with_no_descriptor_free_is_tried_again_without_a_word(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
):
    client, server = trio.socket.socketpair()
    listener = OutOfDescriptorsOnce(trio.SocketStream(server))
    scraper = trio.SocketStream(client)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(accept, listener, trio.Semaphore(MAX_CONNECTIONS), Scrapes(a_registry()), nursery)
        await scraper.send_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while data := await scraper.receive_some():
            answer += data
        assert answer.startswith(b"HTTP/1.1 200 OK")
        nursery.cancel_scope.cancel()
    await scraper.aclose()
    assert listener.accepts >= 2
    assert caplog.records == []
