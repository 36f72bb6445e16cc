"""A transport for tests that answers from a function instead of a socket, as httpx's
`MockTransport` does.

    async def agent(request: ScriptedRequest) -> Reply:
        await trio.sleep(2.0)                  # an episode's length: on trio's MockClock, no wait
        return scripted_reply(200, {"reward": 1.0})

    run = Run(config, source=rows, sink=outcomes, transport=ScriptedTransport(agent))

The function gets each request as it would go out (method, URL, body, the caller's headers) and
returns the reply, or raises one of httpx's errors (`httpx.ConnectError`, `httpx.ReadTimeout`,
...) as the real transport does when the wire fails; it may be a plain function or a coroutine
function. Every request is kept, in the order made, in `requests`. Nothing here opens a socket
or reads the clock, so a run over it is deterministic on trio's `MockClock`.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import httpx

from rollfilter.http.connection import BodyChunks
from rollfilter.http.framing import Reply


@dataclasses.dataclass(frozen=True, slots=True)
class ScriptedRequest:
    """One request a run made: what would have been written on the wire, less the transport's
    own headers (Host, Content-Length, the connection's)."""

    method: bytes
    url: httpx.URL
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()

    def json(self) -> Any:
        """The body, decoded as JSON (a row POSTed to /run is a JSON object)."""
        return json.loads(self.body)


Handler = Callable[[ScriptedRequest], Reply | Awaitable[Reply]]


def scripted_reply(
    status: int = 200, json_body: Any = None, *, body: bytes = b"", headers: Sequence[tuple[str, str]] = ()
) -> Reply:
    """A whole reply: `json_body` encoded as JSON when given (with its Content-Type), else `body`."""
    pairs = [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]
    if json_body is not None:
        body = json.dumps(json_body).encode()
        pairs.append((b"content-type", b"application/json"))
    return Reply.whole(status, pairs, body)


class ScriptedTransport:
    """An `AgentTransport` whose replies come from `handler` (see the module's docstring)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.requests: list[ScriptedRequest] = []
        self.closed = False

    async def post(
        self,
        url: httpx.URL,
        body: bytes,
        *,
        credentials: bool = True,
        row: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Reply:
        return await self._answer(ScriptedRequest(b"POST", url, body, tuple(headers)))

    async def request(
        self, method: bytes, url: httpx.URL, body: BodyChunks | None = None, *, length: int = 0, to_agent: bool = True
    ) -> Reply:
        data = b"".join([chunk async for chunk in body()]) if body is not None else b""
        return await self._answer(ScriptedRequest(method, url, data))

    async def _answer(self, request: ScriptedRequest) -> Reply:
        if self.closed:
            raise RuntimeError("the transport was closed")
        self.requests.append(request)
        reply = self.handler(request)
        return await reply if inspect.isawaitable(reply) else reply

    async def aclose(self) -> None:
        self.closed = True
