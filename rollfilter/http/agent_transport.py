"""What a run's HTTP goes through: the `AgentTransport` interface, and `open_transport`,
which chooses the client that implements it (direct, or through a proxy)."""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence
from typing import Protocol

import httpx

from rollfilter.http.bounds import DEFAULT_MAX_REPLY_BYTES
from rollfilter.http.connection import BodyChunks
from rollfilter.http.framing import Reply
from rollfilter.http.pool import HTTP11Transport
from rollfilter.http.proxy import ProxyTransport


class AgentTransport(Protocol):
    """What every call of a run goes through: a JSON POST (`post`), any other request
    (`request`), whole decoded replies, and closing.

    Errors are httpx's, as `HTTP11Transport` documents them."""

    async def post(
        self,
        url: httpx.URL,
        body: bytes,
        *,
        credentials: bool = True,
        row: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Reply: ...

    async def request(
        self, method: bytes, url: httpx.URL, body: BodyChunks | None = None, *, length: int = 0, to_agent: bool = True
    ) -> Reply: ...

    async def aclose(self) -> None: ...


def open_transport(
    *,
    connect_timeout: float,
    headers: list[tuple[str, str]],
    proxy: str | None = None,
    tls: ssl.SSLContext | None = None,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    on_warning: Callable[[str], None] | None = None,
) -> AgentTransport:
    """The transport for a run: direct HTTP/1.1, or httpx's through the HTTP proxy at `proxy`.
    Servers' certificates are checked with `tls` (see `tls_context`), or the system's trust store."""
    if proxy is not None:
        return ProxyTransport(
            proxy,
            tls=tls,
            connect_timeout=connect_timeout,
            headers=headers,
            max_reply_bytes=max_reply_bytes,
        )
    return HTTP11Transport(
        tls=tls,
        connect_timeout=connect_timeout,
        headers=headers,
        max_reply_bytes=max_reply_bytes,
        on_warning=on_warning,
    )
