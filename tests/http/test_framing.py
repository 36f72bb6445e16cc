"""http/framing.py: how a reply's body is framed, and replies that break the rules."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from rollfilter.http import DEFAULT_MAX_REPLY_BYTES, BadReply, HTTP11Transport
from rollfilter.http.connection import Connection
from rollfilter.http.framing import MAX_HEAD_BYTES
from tests.conftest import (
    read_request,
    serve_raw,
)
from tests.servers.wire_server import Conn, Request, WireServer, echo, padded, reply


@pytest.mark.parametrize(
    ("response", "body", "reusable"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", b"{}", True),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1\r\n}\r\n0\r\n\r\n", b"{}", True),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", b"{}", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", b"{}", False),
        (b"HTTP/1.0 200 OK\r\n\r\n{}", b"{}", False),  # the body ends with the connection
    ],
)
async def test_response_framing(response: bytes, body: bytes, reusable: bool):
    connections = 0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await read_request(stream)
            except (trio.BrokenResourceError, StopIteration, ValueError):
                return
            await stream.send_all(response)
            if not reusable:
                await stream.aclose()
                return

    async with trio.open_nursery() as nursery:
        url = await serve_raw(nursery, handler)
        transport = HTTP11Transport()
        for _ in range(2):
            with trio.fail_after(10):
                reply = await transport.post(url, b'{"a": 1}')
            assert (reply.status, reply.body) == (200, body)
        assert connections == (1 if reusable else 2)
        await transport.aclose()
        nursery.cancel_scope.cancel()


async def test_truncated_response_is_a_protocol_error():
    async def handler(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        url = await serve_raw(nursery, handler)
        transport = HTTP11Transport()
        with pytest.raises(httpx.RemoteProtocolError):
            await transport.post(url, b"{}")
        await transport.aclose()
        nursery.cancel_scope.cancel()


class EndlessHead:
    """A stream that serves `first`, then `then` over and over: a head that never ends."""

    def __init__(self, first: bytes, then: bytes) -> None:
        self.first, self.then = first, then
        self.served = 0

    async def send_all(self, data: bytes) -> None:
        pass

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        chunk = self.then if self.served else self.first
        self.served += len(chunk)
        assert self.served < 100 * MAX_HEAD_BYTES, "still reading a head far past the limit"
        return chunk


def framing_by_request(request: Request, conn: Conn) -> None:
    # The framing of each reply is read from its status and headers, in h11's order.
    if request.index == 0:
        conn.send(b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n")  # no body, whatever it says
    elif request.index == 1:
        conn.send(echo(request))
    else:
        body = padded(request, 10)
        conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n")
        conn.send(b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))  # chunked wins


def head_with_a_length(request: Request, conn: Conn) -> None:
    conn.send(reply(200, b"", "Content-Length: 5", length=False))  # the length a GET would have had


@pytest.mark.parametrize(
    ("first", "then"),
    [
        (b"HTTP/1.1 200 OK\r\nX-Endless: ", b"h" * 1024),  # one header line that never ends
        (b"HTTP/1.1 100 Continue\r\n\r\n", b"HTTP/1.1 100 Continue\r\n\r\n" * 40),  # no end of 1xx replies
    ],
)
async def test_a_head_that_never_ends_is_refused_once_past_the_limit(first: bytes, then: bytes):
    # Checked between reads: httptools gathers a header line by concatenation, in time
    # quadratic in its length, and hands it over only once it ends.
    stream = EndlessHead(first, then)
    connection = Connection.__new__(Connection)
    connection.stream = stream  # type: ignore[assignment]
    connection.max_reply_bytes = DEFAULT_MAX_REPLY_BYTES
    with pytest.raises(BadReply, match="header block is over 64 KiB"):
        await connection.exchange(b"POST", b"POST /run HTTP/1.1\r\n\r\n")
    assert stream.served <= MAX_HEAD_BYTES + 2048


async def test_framing_is_decided_once_from_method_status_and_headers():
    async with httpx.AsyncClient(trust_env=False) as client:
        with WireServer(framing_by_request) as server:
            oracle = [await client.post(server.url, json={"id": i}) for i in range(3)]
    answered = [(204, b""), (200, b'{"echo": '), (200, b'{"echo": ')]
    assert [(r.status_code, r.content[:9]) for r in oracle] == answered
    transport = HTTP11Transport()
    try:
        with WireServer(framing_by_request) as server:
            url = httpx.URL(server.url)
            replies = [await transport.post(url, b'{"id": %d}' % i) for i in range(4)]
            assert [(r.status, r.body[:9]) for r in replies[:3]] == [(r.status_code, r.content[:9]) for r in oracle]
            assert json.loads(replies[2].body)["echo"] == 2
            # A reply framed both ways may be two replies in one: that connection is not used again.
            assert (server.connections, replies[3].status) == (2, 204)  # the first reply on the new one
    finally:
        await transport.aclose()


async def test_a_reply_to_head_has_no_body_whatever_its_headers_say():
    with WireServer(head_with_a_length) as server:
        async with httpx.AsyncClient(trust_env=False) as client:
            oracle = await client.head(server.url)
        transport = HTTP11Transport()
        try:
            with trio.fail_after(10):
                answer = await transport.request(b"HEAD", httpx.URL(server.url))
        finally:
            await transport.aclose()
    assert (answer.status, answer.body) == (oracle.status_code, oracle.content) == (200, b"")


@pytest.mark.parametrize(
    "codings",
    [
        b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n",  # two lines: one list of codings
        b"Transfer-Encoding: gzip, chunked\r\n",
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: gzip\r\n",
        b"Transfer-Encoding: chunked, identity\r\n",  # chunked not last: no framing of chunks
    ],
)
async def test_a_coding_other_than_chunked_alone_is_a_bad_reply_as_h11_refuses_it(codings: bytes):
    response = b"HTTP/1.1 200 OK\r\n" + codings + b"\r\n2\r\n{}\r\n0\r\n\r\n"

    async def handler(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(response)
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        url = await serve_raw(nursery, handler)
        transport = HTTP11Transport()
        with trio.fail_after(10), pytest.raises(BadReply, match="only chunked is decoded"):
            await transport.post(url, b"{}")
        await transport.aclose()
        nursery.cancel_scope.cancel()


def test_chunked_is_found_over_every_transfer_encoding_line():
    from rollfilter.http.framing import Framing, UnsupportedCoding, body_framing

    assert body_framing(b"POST", 200, [(b"Transfer-Encoding", b" Chunked ")]) is Framing.CHUNKED
    both = [(b"Content-Length", b"2"), (b"transfer-encoding", b"chunked")]
    assert body_framing(b"POST", 200, both) is Framing.CHUNKED  # over Content-Length, whichever comes first
    identity_first = [(b"Transfer-Encoding", b"identity"), (b"Transfer-Encoding", b"chunked")]
    assert body_framing(b"POST", 200, identity_first) is Framing.CHUNKED
    assert body_framing(b"POST", 200, [(b"Transfer-Encoding", b"identity")]) is Framing.TO_CLOSE
    with pytest.raises(UnsupportedCoding):
        body_framing(b"POST", 200, [(b"Transfer-Encoding", b"chunked"), (b"Transfer-Encoding", b"chunked")])
    assert body_framing(b"HEAD", 200, [(b"Transfer-Encoding", b"gzip")]) is Framing.NONE
