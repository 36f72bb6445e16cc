"""http/pool.py: idle connections expire before the server closes them; a kept-alive one lost is sent on once more."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from rollfilter.http import BadReply, HTTP11Transport, pool
from tests.conftest import read_request, serve_raw
from tests.servers.wire_server import WireServer


async def test_idle_connections_expire_before_the_server_times_them_out(mock_clock):
    transport = HTTP11Transport()
    try:
        with WireServer() as server:
            url = httpx.URL(server.url)
            await transport.post(url, b'{"id": 0}')
            await transport.post(url, b'{"id": 1}')
            assert server.connections == 1  # kept alive...
            mock_clock.jump(pool.IDLE_EXPIRY - 0.01)  # idle on trio's clock, which the pool reads
            await transport.post(url, b'{"id": 2}')
            assert server.connections == 1  # ...up to the expiry...
            mock_clock.jump(pool.IDLE_EXPIRY + 0.01)
            await transport.post(url, b'{"id": 3}')
            assert server.connections == 2  # ...but not past the expiry
    finally:
        await transport.aclose()


UVICORN_KEEP_ALIVE = 5  # seconds: uvicorn's default keep-alive timeout
SOONER = 5  # the race below is run this many times faster, on uvicorn's own clock as well


@pytest.mark.slow
@pytest.mark.parametrize("expiry", [pool.IDLE_EXPIRY, 60.0], ids=["expiry", "no expiry"])
async def test_uvicorn_keep_alive_timeout_race_costs_no_rows(uvicorn_server, expiry: float, monkeypatch):
    """60 connections reused after idling from 0.05 s before to 0.05 s after uvicorn's keep-alive
    timeout. The client expires idle connections first, so none is lost. Without that, the check
    before reuse covers most of the race, and a request on a connection uvicorn closed as it
    arrived (a reset, with the request unread) is sent once more on a new one: no row is lost
    either way, and each request reached the agent once. The timeout and the expiry are both cut
    to a fifth of their own, so that the race comes sooner."""
    assert pool.IDLE_EXPIRY < UVICORN_KEEP_ALIVE
    monkeypatch.setattr(pool, "IDLE_EXPIRY", expiry / SOONER)
    keep_alive = UVICORN_KEEP_ALIVE / SOONER
    server = uvicorn_server("--timeout-keep-alive", str(int(keep_alive)))
    url = httpx.URL(server.url)
    width = 60
    answers: dict[int, list[int]] = {}
    transport = HTTP11Transport()

    async def reuse_after(i: int, idle: float) -> None:
        first = await transport.post(url, b'{"id": %d}' % i)
        await trio.sleep(idle)  # real time: the subject is uvicorn's own keep-alive clock
        second = await transport.post(url, b'{"id": %d}' % (width + i))
        answers[i] = [json.loads(first.body)["echo"], json.loads(second.body)["echo"]]

    try:
        async with trio.open_nursery() as nursery:
            for i in range(width):  # all at once: each on its own connection
                nursery.start_soon(reuse_after, i, keep_alive - 0.05 + 0.1 * i / width)
    finally:
        await transport.aclose()
    assert answers == {i: [i, width + i] for i in range(width)}
    assert server.requests() == 2 * width  # a request lost to the reset never reached the agent


ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


async def serve_in_turn(nursery: trio.Nursery, actions: list[str], seen: list[int]) -> httpx.URL:
    """A server that meets each request, in the order they come, with the next of `actions`:
    "answer" (and keep the connection), "close" (read it, then close without a byte of reply), or
    "part" (a part of a reply, then close). `seen` gets each request's connection, counted from 0."""
    connections = 0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal connections
        connection, connections = connections, connections + 1
        while actions:
            await read_request(stream)
            seen.append(connection)
            action = actions.pop(0)
            if action != "answer":
                if action == "part":
                    await stream.send_all(ANSWER[:20])
                break
            await stream.send_all(ANSWER)
        await stream.aclose()

    return await serve_raw(nursery, handler)


async def test_a_kept_alive_connection_lost_before_any_reply_byte_is_sent_on_once_more():
    """The server reads the request on a kept-alive connection and closes it without a byte of
    reply, as a server that closes after every reply without saying so does when the request
    races its close: the request goes once more, on a new connection, as curl sends it."""
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        url = await serve_in_turn(nursery, ["answer", "close", "answer"], seen)
        transport = HTTP11Transport()
        await transport.post(url, b"{}")
        reply = await transport.post(url, b"{}")
        assert (reply.status, reply.body) == (200, b"{}")
        assert seen == [0, 0, 1]
        await transport.aclose()
        nursery.cancel_scope.cancel()


async def test_a_request_goes_once_more_only_and_never_after_a_byte_of_its_reply():
    seen: list[int] = []
    async with trio.open_nursery() as nursery:
        url = await serve_in_turn(nursery, ["answer", "close", "close", "close", "answer", "part"], seen)
        transport = HTTP11Transport()
        await transport.post(url, b"{}")
        with pytest.raises(httpx.ReadError):
            await transport.post(url, b"{}")  # lost on the kept-alive one, then on the new one
        assert seen == [0, 0, 1]
        with pytest.raises(httpx.ReadError):
            await transport.post(url, b"{}")  # a new connection: nothing was kept alive
        assert seen == [0, 0, 1, 2]
        await transport.post(url, b"{}")
        with pytest.raises(BadReply):
            await transport.post(url, b"{}")  # the server answered in part: it may have run it
        assert seen == [0, 0, 1, 2, 3, 3]
        await transport.aclose()
        nursery.cancel_scope.cancel()
