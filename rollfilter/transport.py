"""An httpx transport that keeps plain h11 connections on trio, one per request in flight.

httpx's default pool (httpcore) scans its connections on every request, so its cost
grows with the pool: at 1,000 rows in flight it served ~30 rows/s where aiohttp served
~900 (shared/field-notes.md). Here each origin keeps a stack of idle connections:
taking one or giving it back is O(1), a request never waits for a pool slot (there
is no cap; the run's concurrency bounds the connections), and a request cancelled
mid-flight closes its connection instead of leaking a slot (httpcore #1093).
"""

from __future__ import annotations

import select
import ssl
from typing import Any

import h11
import httpx
import trio

RECEIVE_BYTES = 64 * 1024
MAX_HEADER_BYTES = 1024 * 1024  # h11's 16 KiB default refuses some proxies' headers
_DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]


class _Connection:
    __slots__ = ("h11", "socket", "stream")

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType) -> None:
        self.stream = stream
        self.socket = socket
        self.h11 = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)

    def is_stale(self) -> bool:
        # An idle keep-alive connection has nothing to read; readable means the server
        # closed it (or sent junk). One zero-timeout select() beats a failed request.
        try:
            readable, _, _ = select.select([self.socket.fileno()], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    async def exchange(
        self, method: bytes, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes
    ) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        conn = self.h11
        out = conn.send(h11.Request(method=method, target=target, headers=headers))
        assert out is not None
        data = conn.send(h11.Data(data=body)) if body else b""
        end = conn.send(h11.EndOfMessage())
        await self.stream.send_all(b"".join((out, data or b"", end or b"")))
        status = 0
        response_headers: list[tuple[bytes, bytes]] = []
        chunks: list[bytes] = []
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(bytes(await self.stream.receive_some(RECEIVE_BYTES)))
            elif isinstance(event, h11.Response):
                status = event.status_code
                response_headers = list(event.headers)
            elif isinstance(event, h11.Data):
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return status, response_headers, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed):
                raise h11.RemoteProtocolError("server closed the connection without a full response")
            # InformationalResponse (100 Continue and the like): keep reading.

    def reusable(self) -> bool:
        if self.h11.our_state is h11.DONE and self.h11.their_state is h11.DONE:
            self.h11.start_next_cycle()
            return True
        return False


class H11Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over trio for httpx requests, with an O(1) keep-alive stack per origin.

    The whole response body is read before returning (agent results are one JSON
    object). Errors are httpx's: ConnectError, ConnectTimeout, ReadError, WriteError,
    RemoteProtocolError. `connect_timeout` bounds TCP connect plus the TLS handshake;
    the caller bounds the whole request with a trio cancel scope.
    """

    def __init__(self, *, ssl_context: ssl.SSLContext | None = None, connect_timeout: float = 10.0) -> None:
        self._ssl_context = ssl_context
        self._connect_timeout = connect_timeout
        self._idle: dict[Origin, list[_Connection]] = {}
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        scheme = url.scheme
        origin = (scheme, url.host, url.port or _DEFAULT_PORTS[scheme])
        conn = self._take_idle(origin) or await self._connect(origin)
        body = request.content
        try:
            status, headers, content = await conn.exchange(
                request.method.encode(), url.raw_path, request.headers.raw, body
            )
        except BaseException as exc:
            await trio.aclose_forcefully(conn.stream)
            translated = _as_httpx_error(exc, request)
            if translated is exc:
                raise
            raise translated from exc
        if conn.reusable() and not self._closed:
            self._idle.setdefault(origin, []).append(conn)
        else:
            await trio.aclose_forcefully(conn.stream)
        return httpx.Response(status, headers=headers, content=content, request=request)

    def _take_idle(self, origin: Origin) -> _Connection | None:
        stack = self._idle.get(origin)
        while stack:
            conn = stack.pop()
            if not conn.is_stale():
                return conn
            conn.socket.close()
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        try:
            with trio.fail_after(self._connect_timeout):
                tcp = await trio.open_tcp_stream(host, port)
                stream: trio.abc.Stream = tcp
                if scheme == "https":
                    context = self._ssl_context or ssl.create_default_context()
                    tls = trio.SSLStream(tcp, context, server_hostname=host, https_compatible=True)
                    try:
                        await tls.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(tcp)
                        raise
                    stream = tls
        except trio.TooSlowError:
            raise httpx.ConnectTimeout(f"connecting took over {self._connect_timeout:g} s") from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise httpx.ConnectError(_reason(exc)) from exc
        return _Connection(stream, tcp.socket)

    async def aclose(self) -> None:
        self._closed = True
        for stack in self._idle.values():
            for conn in stack:
                conn.socket.close()
        self._idle.clear()


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    cause = exc.__cause__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(exc) or type(exc).__name__


def _as_httpx_error(exc: BaseException, request: httpx.Request) -> BaseException:
    """Translate what a connection can raise into httpx's exceptions; let the rest through."""
    if isinstance(exc, h11.RemoteProtocolError):
        return httpx.RemoteProtocolError(str(exc) or "protocol error", request=request)
    if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
        return httpx.ReadError(f"connection lost: {_reason(exc)}", request=request)
    return exc


def transport_for(*, verify: bool, connect_timeout: float, **_: Any) -> H11Transport:
    """The transport rollfilter sends through, with TLS verification as asked."""
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return H11Transport(ssl_context=context, connect_timeout=connect_timeout)
