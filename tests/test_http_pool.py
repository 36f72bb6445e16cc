"""http/pool.py: idle connections expire before the server closes them."""

from __future__ import annotations

import json

import httpx
import pytest
import trio

from rollfilter.http import HTTP11Transport, pool
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


@pytest.mark.slow
@pytest.mark.parametrize("expiry", [pool.IDLE_EXPIRY, 60.0], ids=["expiry", "no expiry"])
async def test_uvicorn_keep_alive_timeout_race_costs_no_rows(uvicorn_server, expiry: float, monkeypatch):
    """60 connections reused after idling 4.95 to 5.05 s, around uvicorn's keep-alive timeout
    (5 s). The client expires idle connections first; without that, the check before reuse
    and the resend of a request the server reset must cover the race."""
    monkeypatch.setattr(pool, "IDLE_EXPIRY", expiry)
    server = uvicorn_server()
    url = httpx.URL(server.url)
    width = 60
    answers: dict[int, list[int]] = {}
    transport = HTTP11Transport()

    async def reuse_after(i: int, idle: float) -> None:
        first = await transport.post(url, b'{"id": %d}' % i)
        await trio.sleep(idle)  # real time: the subject is uvicorn's own 5 s keep-alive clock
        second = await transport.post(url, b'{"id": %d}' % (width + i))
        answers[i] = [json.loads(first.body)["echo"], json.loads(second.body)["echo"]]

    try:
        async with trio.open_nursery() as nursery:
            for i in range(width):  # all at once: each on its own connection
                nursery.start_soon(reuse_after, i, 4.95 + 0.1 * i / width)
    finally:
        await transport.aclose()
    assert answers == {i: [i, width + i] for i in range(width)}
    assert server.requests() == 2 * width
