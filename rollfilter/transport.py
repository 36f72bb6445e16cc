"""HTTP/1.1 for rollfilter: an httpx transport with an O(1) keep-alive stack per origin.

Why not httpx's own pool: httpcore scans its connections on every request, so its cost
grows with the pool (at 1,000 rows in flight it served ~30 rows/s where aiohttp served
~900, shared/field-notes.md), and a request cancelled while the pool is full can leak a
slot for good (httpcore #1093). Here each origin keeps a stack of idle connections;
taking one or giving it back is O(1), no request ever waits for a slot (the run's
concurrency bounds the connections), and a cancelled request closes its connection.

Responses are parsed by llhttp (httptools, the parser under uvicorn): parsing with h11
cost about as much CPU as everything else in a row's life together.
"""

from __future__ import annotations

import ipaddress
import select
import socket
import ssl
from typing import Protocol

import httptools
import httpx
import trio

RECEIVE_BYTES = 64 * 1024
FRESH_SECONDS = 0.5
_DEFAULT_PORTS = {"http": 80, "https": 443}
Origin = tuple[str, str, int]


class Reply:
    """One parsed response: status, raw headers, the whole body."""

    __slots__ = ("_chunks", "body", "complete", "framed", "headers", "keep_alive", "parser", "status")

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.on_message_begin()

    # httptools parser callbacks
    def on_message_begin(self) -> None:
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self.body = b""
        self.complete = False
        self.keep_alive = False
        self.framed = False  # Content-Length or chunked: the end is known without EOF

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))
        lower = name.lower()
        if lower in (b"content-length", b"transfer-encoding"):
            self.framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()

    def on_body(self, data: bytes) -> None:
        self._chunks.append(data)

    def on_message_complete(self) -> None:
        self.body = b"".join(self._chunks)
        self.complete = True
        # llhttp forgets this once feed_data() returns.
        self.keep_alive = self.parser.should_keep_alive()

    @classmethod
    def whole(cls, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> Reply:
        """A reply that someone else parsed (httpx, for --proxy)."""
        reply = cls.__new__(cls)
        reply.on_message_begin()
        reply.status, reply.headers, reply.body, reply.complete = status, headers, body, True
        return reply

    def detach(self) -> None:
        """Drop the parser once parsing is over. The parser holds this reply for its callbacks,
        and that cycle is freed only by the cyclic GC: at a million rows, replies promoted
        to its oldest generation held 400 MB before a full collection came round."""
        del self.parser

    def header(self, name: bytes) -> bytes | None:
        for key, value in self.headers:
            if key.lower() == name:
                return value
        return None


class _Connection:
    __slots__ = ("idle_since", "socket", "stream")

    def __init__(self, stream: trio.abc.Stream, socket: trio.socket.SocketType) -> None:
        self.stream = stream
        self.socket = socket
        self.idle_since = 0.0

    def is_stale(self, now: float) -> bool:
        # An idle keep-alive connection has nothing to read; readable means the server
        # closed it (or sent junk). One zero-timeout select() beats a failed request,
        # but servers close idle connections after seconds, not milliseconds: a
        # connection idle for less than FRESH_SECONDS is not worth the system call.
        if now - self.idle_since < FRESH_SECONDS:
            return False
        try:
            readable, _, _ = select.select([self.socket.fileno()], [], [], 0)
        except (OSError, ValueError):
            return True
        return bool(readable)

    async def exchange(self, request: bytes) -> tuple[Reply, bool]:
        """Send one whole request; return the reply and whether the connection can be reused."""
        await self.stream.send_all(request)
        reply = Reply()
        try:
            return reply, await self._read_reply(reply)
        finally:
            reply.detach()

    async def _read_reply(self, reply: Reply) -> bool:
        parser = reply.parser
        while True:
            data = await self.stream.receive_some(RECEIVE_BYTES)
            if not data:
                if reply.status and not reply.framed and not reply.complete:
                    reply.on_message_complete()  # a body delimited by the connection's end
                    return False
                raise httpx.RemoteProtocolError("server closed the connection without a full response")
            try:
                parser.feed_data(data)
            except httptools.HttpParserError as exc:
                raise httpx.RemoteProtocolError(f"malformed response: {exc}") from None
            if reply.complete:
                if 100 <= reply.status < 200:  # 100 Continue and the like: the answer follows
                    reply.on_message_begin()
                    continue
                return reply.keep_alive


class HTTP11Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over trio with a keep-alive stack per origin; reads whole bodies.

    `post` is the fast path the client uses: the request head for a URL is built once.
    `handle_async_request` serves any httpx request the same way. Errors are httpx's:
    ConnectError, ConnectTimeout, ReadError, RemoteProtocolError. `connect_timeout`
    bounds TCP connect plus the TLS handshake; the caller bounds the whole request.
    """

    def __init__(
        self,
        *,
        verify: bool = True,
        connect_timeout: float = 10.0,
        headers: list[tuple[str, str]] | None = None,
    ) -> None:
        self._verify = verify
        self._ssl_context: ssl.SSLContext | None = None  # made on the first https URL: loading CAs takes 20 ms
        self._connect_timeout = connect_timeout
        self._default_headers = "".join(f"{name}: {value}\r\n" for name, value in headers or ()).encode("latin-1")
        self._heads: dict[httpx.URL, tuple[Origin, bytes]] = {}
        self._idle: dict[Origin, list[_Connection]] = {}
        self._closed = False

    async def post(self, url: httpx.URL, body: bytes) -> Reply:
        """POST `body` (JSON) to `url` with the transport's headers; the whole reply."""
        cached = self._heads.get(url)
        if cached is None:
            cached = self._heads[url] = (_origin_key(url), self._head(b"POST", url, self._default_headers))
        origin, head = cached
        request = b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
        return await self._round_trip(origin, request)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        body = await request.aread()
        extra = "".join(
            f"{name.decode('latin-1')}: {value.decode('latin-1')}\r\n"
            for name, value in request.headers.raw
            if name.lower() not in (b"host", b"content-length", b"transfer-encoding")
        ).encode("latin-1")
        head = self._head(request.method.encode(), url, extra)
        reply = await self._round_trip(_origin_key(url), b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
        return httpx.Response(reply.status, headers=reply.headers, content=reply.body, request=request)

    @staticmethod
    def _head(method: bytes, url: httpx.URL, headers: bytes) -> bytes:
        host = url.host.encode("idna") if not url.host.isascii() else url.host.encode()
        if ":" in url.host:
            host = b"[" + host + b"]"
        if url.port is not None:
            host += b":%d" % url.port
        return b"%s %s HTTP/1.1\r\nHost: %s\r\n%s" % (method, url.raw_path, host, headers)

    async def _round_trip(self, origin: Origin, request: bytes) -> Reply:
        conn = self._take_idle(origin) or await self._connect(origin)
        try:
            reply, reusable = await conn.exchange(request)
        except BaseException as exc:
            await trio.aclose_forcefully(conn.stream)
            if isinstance(exc, (trio.BrokenResourceError, trio.ClosedResourceError, OSError)):
                raise httpx.ReadError(f"connection lost: {_reason(exc)}") from None
            raise
        if reusable and not self._closed:
            conn.idle_since = trio.current_time()
            self._idle.setdefault(origin, []).append(conn)
        else:
            await trio.aclose_forcefully(conn.stream)
        return reply

    def _take_idle(self, origin: Origin) -> _Connection | None:
        stack = self._idle.get(origin)
        now = trio.current_time() if stack else 0.0
        while stack:
            conn = stack.pop()
            if not conn.is_stale(now):
                return conn
            conn.socket.close()
        return None

    async def _connect(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        try:
            with trio.fail_after(self._connect_timeout):
                tcp = await _open_tcp(host, port)
                stream: trio.abc.Stream = tcp
                if scheme == "https":
                    if self._ssl_context is None:
                        self._ssl_context = tls_context(verify=self._verify)
                    tls = trio.SSLStream(tcp, self._ssl_context, server_hostname=host, https_compatible=True)
                    try:
                        await tls.do_handshake()
                    except BaseException:
                        await trio.aclose_forcefully(tcp)
                        raise
                    stream = tls
        except trio.TooSlowError:
            raise httpx.ConnectTimeout(f"connecting took over {self._connect_timeout:g} s") from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            raise httpx.ConnectError(_reason(exc)) from None
        return _Connection(stream, tcp.socket)

    async def aclose(self) -> None:
        self._closed = True
        for stack in self._idle.values():
            for conn in stack:
                conn.socket.close()
        self._idle.clear()


async def _open_tcp(host: str, port: int) -> trio.SocketStream:
    """A TCP stream; an IP address is connected to directly.

    trio.open_tcp_stream's happy-eyeballs machinery (a nursery and a resolver call per
    connection) cost ~0.3 ms per connection: a third of a second for the first wave
    of -j 2000. An IP address has nothing to race, so it gets one plain connect().
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        return await trio.open_tcp_stream(host, port)
    sock = trio.socket.socket(family, socket.SOCK_STREAM)
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    return trio.SocketStream(sock)


def origin(url: httpx.URL | str) -> str:
    """scheme://host:port for messages: never the path, query or credentials of a URL."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "(an invalid URL)"
    port = f":{parsed.port}" if parsed.port else ""
    return f"{parsed.scheme}://{parsed.host}{port}"


def shown(url: httpx.URL) -> str:
    """A URL as rollfilter prints it: without user, password or query, which may hold secrets."""
    return str(url.copy_with(username=None, password=None, query=None))


def _origin_key(url: httpx.URL) -> Origin:
    scheme = url.scheme
    return scheme, url.host, url.port or _DEFAULT_PORTS[scheme]


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    cause = exc.__cause__ or exc.__context__
    if isinstance(cause, OSError) and cause.strerror:
        return cause.strerror
    return str(exc) or type(exc).__name__


class AgentTransport(Protocol):
    """What the client sends through: a JSON POST, whole replies, and closing."""

    async def post(self, url: httpx.URL, body: bytes) -> Reply: ...

    async def aclose(self) -> None: ...


class ProxyTransport:
    """Sends through an HTTP proxy (--proxy) with httpx's own transport.

    httpx's pool does work proportional to its size per request, so this path is for
    reaching agents behind a proxy, not for the highest rates.
    """

    def __init__(
        self, proxy: str, *, verify: bool = True, connect_timeout: float = 10.0, headers: list[tuple[str, str]]
    ) -> None:
        self._headers = headers
        self._timeout = httpx.Timeout(None, connect=connect_timeout)
        self._transport = httpx.AsyncHTTPTransport(
            proxy=proxy,
            verify=tls_context(verify=verify),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def post(self, url: httpx.URL, body: bytes) -> Reply:
        request = httpx.Request(
            "POST", url, headers=self._headers, content=body, extensions={"timeout": self._timeout.as_dict()}
        )
        response = await self._transport.handle_async_request(request)
        body = await response.aread()
        await response.aclose()
        return Reply.whole(response.status_code, list(response.headers.raw), body)

    async def aclose(self) -> None:
        await self._transport.aclose()


def open_transport(
    *, verify: bool, connect_timeout: float, headers: list[tuple[str, str]], proxy: str | None = None
) -> AgentTransport:
    """The transport for a run: direct HTTP/1.1, or httpx's through --proxy."""
    if proxy is not None:
        return ProxyTransport(proxy, verify=verify, connect_timeout=connect_timeout, headers=headers)
    return HTTP11Transport(verify=verify, connect_timeout=connect_timeout, headers=headers)


def tls_context(*, verify: bool) -> ssl.SSLContext:
    """The system's trust store (SSL_CERT_FILE and SSL_CERT_DIR apply), or no checks at all."""
    context = ssl.create_default_context()
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context
