"""http/tls.py: certificates checked, and TLS connections kept alive honestly."""

from __future__ import annotations

import functools
import json
import socket
import ssl
from pathlib import Path

import httpx
import pytest
import trio

from rollfilter import Config, Failure, Rollout, Tls, open_rollouts
from rollfilter.demo import DemoAgent
from rollfilter.demo.server import _serve_connection
from rollfilter.http import HTTP11Transport, tls_context
from tests.conftest import (
    simple_rows,
    wait_idle_connections_readable,
)
from tests.servers.wire_server import Conn, Request, WireServer, echo, reply


async def test_tls_is_verified_unless_insecure(certificate: tuple[Path, Path], monkeypatch):
    cert, key = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    agent = DemoAgent()

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        await _serve_connection(stream, agent)

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_ssl_over_tcp, handler, 0, server_context, host="127.0.0.1")
        listeners = await nursery.start(serve)
        port = listeners[0].transport_listener.socket.getsockname()[1]
        rows = simple_rows(3)
        url = f"https://127.0.0.1:{port}"
        async with open_rollouts(rows, Config(url=url, retries=0)) as run_:
            untrusted = [o async for o in run_]
        assert all(isinstance(o, Failure) and o.kind == "connect" for o in untrusted)
        assert "certificate" in untrusted[0].message.lower()  # type: ignore[union-attr]
        async with open_rollouts(rows, Config(url=url, tls=Tls(insecure=True))) as run_:
            insecure = [o async for o in run_]
        assert all(isinstance(o, Rollout) for o in insecure)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        async with open_rollouts(rows, Config(url=url)) as run_:
            trusted = [o async for o in run_]
        assert all(isinstance(o, Rollout) for o in trusted)
        assert agent.requests == 6
        nursery.cancel_scope.cancel()


def tls_server_context(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


@pytest.mark.parametrize("writes", ["one write", "two writes"])
async def test_over_tls_a_reply_nobody_asked_for_is_never_read_as_the_next_answer(certificate, writes: str):
    """TLS holds what it read off the socket beyond the reply asked for, where poll() cannot see it."""
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    injected = reply(200, b'{"echo": "INJECTED", "reward": 0.5}')

    def stray_after_the_first(request: Request, conn: Conn) -> None:
        if request.json()["id"] != 0:
            conn.send(echo(request))
        elif writes == "one write":
            conn.send(echo(request) + injected)  # one TLS record
        else:
            conn.send(echo(request))
            conn.send(injected)  # a TLS record of its own

    transport = HTTP11Transport(tls=tls_context(cafile=str(cert)))
    try:
        with WireServer(stray_after_the_first, tls=context) as server:
            url = httpx.URL(server.url)
            first = await transport.post(url, b'{"id": 0}')
            await wait_idle_connections_readable(transport)  # the injected reply has arrived
            second = await transport.post(url, b'{"id": 1}')
            assert (json.loads(first.body)["echo"], json.loads(second.body)["echo"]) == (0, 1)
            assert server.connections == 2
    finally:
        await transport.aclose()


async def test_a_tls_connection_is_kept_alive_and_reused(certificate):
    transport = HTTP11Transport(tls=tls_context(cafile=str(certificate[0])))
    try:
        with WireServer(tls=tls_server_context(certificate)) as server:
            url = httpx.URL(server.url)
            answers = [json.loads((await transport.post(url, b'{"id": %d}' % i)).body)["echo"] for i in range(3)]
            assert (answers, server.connections, server.handshakes) == ([0, 1, 2], 1, 1)
    finally:
        await transport.aclose()


async def test_the_check_before_reuse_sees_a_tls_record_that_came_with_the_reply(certificate):
    """Two TLS records in one TCP segment: the reply and one nobody asked for. Reading the
    reply takes both off the socket, so poll() sees nothing: only what TLS holds tells."""
    injected = reply(200, b'{"echo": "INJECTED", "reward": 0.5}')

    def two_records_at_once(request: Request, conn: Conn) -> None:
        if request.json()["id"] != 0:
            conn.send(echo(request))
            return
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)  # hold both records back...
        conn.send(echo(request))
        conn.send(injected)
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 0)  # ...and send them together

    transport = HTTP11Transport(tls=tls_context(cafile=str(certificate[0])))
    try:
        with WireServer(two_records_at_once, tls=tls_server_context(certificate)) as server:
            url = httpx.URL(server.url)
            first = await transport.post(url, b'{"id": 0}')
            second = await transport.post(url, b'{"id": 1}')
            assert (json.loads(first.body)["echo"], json.loads(second.body)["echo"]) == (0, 1)
            assert server.connections == 2
    finally:
        await transport.aclose()
