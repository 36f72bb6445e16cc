"""http/connection.py: one HTTP/1.1 connection, its keep-alive and the check before reuse."""

from __future__ import annotations

import json
import os
import resource
import socket
import ssl
import threading
from collections.abc import Iterator

import httpx
import pytest
import trio
import trio.testing

from rollfilter.http import HTTP11Transport
from tests.conftest import (
    read_request,
    serve_raw,
    wait_idle_connections_readable,
)
from tests.servers.wire_server import Conn, Request, WireServer, echo, reply


async def test_a_connection_closed_while_idle_is_not_reused():
    connections = 0
    # What each connection received after the server's FIN.
    after_close_in, after_close = trio.open_memory_channel[bytes](2)

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        # A keep-alive timeout on the server, without saying so. Only its FIN: it still reads,
        # so a request sent on this connection anyway is seen here (a resend would hide it).
        await stream.send_eof()
        received = b""
        while chunk := await stream.receive_some(65536):
            received += chunk
        await after_close_in.send(received)

    async with trio.open_nursery() as nursery:
        url = await serve_raw(nursery, handler)
        transport = HTTP11Transport()
        await transport.post(url, b"{}")
        await wait_idle_connections_readable(transport)  # the server's FIN has arrived
        reply = await transport.post(url, b"{}")
        assert reply.status == 200
        assert connections == 2
        await transport.aclose()
        with trio.fail_after(10):
            assert [await after_close.receive() for _ in range(2)] == [b"", b""]  # the closed one was not used
        nursery.cancel_scope.cancel()


@pytest.fixture
def high_descriptors() -> Iterator[None]:
    """Every socket opened meanwhile gets a descriptor above 1024, where select() fails."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.fail(f"the hard open-file limit ({hard}) is too low for this test")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    placeholders = [os.open(os.devnull, os.O_RDONLY) for _ in range(1030)]
    try:
        yield
    finally:
        for fd in placeholders:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def test_a_reply_sent_while_the_connection_is_idle_is_never_read_as_the_next_answer():
    first_read, sent_stray = threading.Event(), threading.Event()

    def late_408(request: Request, conn: Conn) -> None:
        conn.send(echo(request))
        if request.connection == 0:
            first_read.wait(10)  # the client has its answer: the connection is idle in its pool
            conn.send(reply(408, b"", reason="Request Timeout"))  # idle too long, says the server
            sent_stray.set()

    transport = HTTP11Transport()
    try:
        with WireServer(late_408) as server:
            url = httpx.URL(server.url)
            first = await transport.post(url, b'{"id": 0}')
            first_read.set()
            await trio.to_thread.run_sync(sent_stray.wait, 10)
            second = await transport.post(url, b'{"id": 1}')
            assert (json.loads(first.body)["echo"], second.status, json.loads(second.body)["echo"]) == (0, 200, 1)
            assert server.connections == 2
    finally:
        await transport.aclose()


async def test_agent_connections_have_tcp_keepalive():
    transport = HTTP11Transport()
    try:
        with WireServer() as server:
            await transport.post(httpx.URL(server.url), b'{"id": 0}')
            (idle,) = next(iter(transport._idle.values()))
            options = [
                idle.socket.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
                idle.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
                idle.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
                idle.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
            ]
            assert options == [1, 60, 10, 3]  # as NeMo Gym sets them
    finally:
        await transport.aclose()


async def test_the_check_before_reuse_works_above_descriptor_1024(high_descriptors, mock_clock):
    closed_once = threading.Event()

    def close_the_third(request: Request, conn: Conn) -> None:
        conn.send(echo(request))
        if request.index == 2:
            conn.close()  # a keep-alive timeout, without saying so
            closed_once.set()

    transport = HTTP11Transport()
    try:
        with WireServer(close_the_third) as server:
            url = httpx.URL(server.url)
            for i in range(3):
                mock_clock.jump(0.6)  # idle long enough (on trio's clock) that the old code checked with select()
                assert json.loads((await transport.post(url, b'{"id": %d}' % i)).body)["echo"] == i
            assert server.connections == 1  # a healthy idle connection is reused, not dropped
            await trio.to_thread.run_sync(closed_once.wait, 10)
            assert json.loads((await transport.post(url, b'{"id": 3}')).body)["echo"] == 3
            assert server.connections == 2  # the closed one was noticed and replaced
    finally:
        await transport.aclose()


async def test_bytes_a_tls_stream_holds_past_its_socket_are_seen(certificate):
    """trio keeps TLS records it has read off the socket, not yet decrypted, in a private BIO
    (`SSLStream._incoming`): if trio moves it, this fails, and every TLS connection would count
    as holding bytes (never reused) until `tls_holds_bytes` looks where trio keeps them now."""
    from rollfilter.http.connection import tls_holds_bytes

    cert, key = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))
    client_raw, server_raw = trio.testing.memory_stream_pair()
    client = trio.SSLStream(client_raw, client_context, server_hostname="127.0.0.1")
    server = trio.SSLStream(server_raw, server_context, server_side=True)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.do_handshake)
        nursery.start_soon(server.do_handshake)
    assert hasattr(client, "_incoming")  # where trio keeps what it read off the socket
    assert not tls_holds_bytes(client)
    await server.send_all(b"first reply")
    await server.send_all(b"a stray second record")
    assert await client.receive_some(len(b"first reply")) == b"first reply"
    assert tls_holds_bytes(client)  # the second record came with the first: off the socket already
    assert await client.receive_some(100) == b"a stray second record"
    assert not tls_holds_bytes(client)
