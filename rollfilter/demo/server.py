"""The demo agent on the wire: HTTP/1.1 over trio, one task a connection."""

from __future__ import annotations

import contextlib
import functools
import http
from collections.abc import AsyncIterator

import httptools
import trio

from rollfilter.demo.agent import Aggregation, DemoAgent


class _Requests:
    """httptools request-parser callbacks: collects whole requests as they complete.

    A POST to /aggregate_metrics is aggregated as its body streams in instead."""

    def __init__(self, *, groups: bool = True) -> None:
        self.parser = httptools.HttpRequestParser(self)
        self.done: list[tuple[str, str, bytes | Aggregation, bool]] = []  # method, path, body, keep-alive
        self.expects_continue = False
        self._groups = groups
        self._url = b""
        self._body: list[bytes] = []
        self._aggregation: Aggregation | None = None

    def on_message_begin(self) -> None:
        self._url = b""
        self._body = []
        self._aggregation = None

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"expect" and value.lower() == b"100-continue":
            self.expects_continue = True

    def on_headers_complete(self) -> None:
        if self._path() == "/aggregate_metrics" and self.parser.get_method() == b"POST":
            self._aggregation = Aggregation(groups=self._groups)

    def on_body(self, data: bytes) -> None:
        if self._aggregation is not None:
            self._aggregation.feed(data)
        else:
            self._body.append(data)

    def on_message_complete(self) -> None:
        method = self.parser.get_method().decode()
        body = self._aggregation if self._aggregation is not None else b"".join(self._body)
        self.done.append((method, self._path(), body, self.parser.should_keep_alive()))

    def _path(self) -> str:
        return self._url.decode(errors="replace").split("?")[0]


def _response(status: int, headers: list[tuple[str, str]], payload: bytes) -> bytes:
    reason = http.HTTPStatus(status).phrase
    if not any(name.lower() == "content-type" for name, _ in headers):
        headers = [("Content-Type", "application/json"), *headers]
    head = "".join(f"{name}: {value}\r\n" for name, value in headers)
    return f"HTTP/1.1 {status} {reason}\r\n{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload


async def _serve_connection(stream: trio.abc.Stream, agent: DemoAgent) -> None:
    requests = _Requests(groups=agent.options.aggregate_groups)
    try:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            requests.parser.feed_data(data)
            if requests.expects_continue:
                requests.expects_continue = False
                await stream.send_all(b"HTTP/1.1 100 Continue\r\n\r\n")
            while requests.done:
                method, path, body, keep_alive = requests.done.pop(0)
                answer = await agent.answer(method, path, body)
                if answer == "hang":
                    await trio.sleep_forever()
                if isinstance(answer, str):  # "drop"
                    return
                await stream.send_all(_response(*answer))
                if not keep_alive:
                    return
    except (trio.BrokenResourceError, trio.ClosedResourceError, httptools.HttpParserError, OSError):
        return
    finally:
        await trio.aclose_forcefully(stream)


async def serve(
    agent: DemoAgent,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `agent` on host:port (0 picks a free port) until cancelled; reports the port."""
    listeners = await trio.open_tcp_listeners(port, host=host, backlog=4096)
    bound = listeners[0].socket.getsockname()[1]
    task_status.started(bound)

    async def handle(stream: trio.SocketStream) -> None:
        await _serve_connection(stream, agent)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(agent.run_timers)
        await trio.serve_listeners(handle, listeners)


@contextlib.asynccontextmanager
async def serving(agent: DemoAgent) -> AsyncIterator[str]:
    """`agent` served on a free loopback port while the block runs: its /run URL."""
    async with trio.open_nursery() as nursery:
        port = await nursery.start(functools.partial(serve, agent))
        yield f"http://127.0.0.1:{port}/run"
        nursery.cancel_scope.cancel()
