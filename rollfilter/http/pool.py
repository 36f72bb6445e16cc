"""HTTP/1.1 over trio with an O(1) keep-alive stack per origin: `HTTP11Transport`.

Why not httpx's own pool: httpcore scans its connections on every request, so its cost
grows with the pool (at 1,000 in flight, one httpx client ran ~30 rows/s where the ideal was
2,000), and a request cancelled while the pool is full can leak a slot for good (httpcore
#1093). Here each origin keeps a stack of idle connections; taking one or giving it back is
O(1), no request ever waits for a slot (the caller's concurrency bounds the connections),
and a cancelled request closes its connection.

What keeps a reply with its own request:
- an idle connection is checked before every reuse, with one non-blocking poll(): a
  readable one was closed by the server or holds bytes nobody asked for, and is dropped;
- idle connections expire after IDLE_EXPIRY, before common server keep-alive timeouts;
- bytes nobody asked for (after a complete reply, or found by the check before reuse) turn
  keep-alive off for that origin for the rest of the run (`HTTP11Transport` says why);
- a request whose reused connection ends before any byte of its reply is sent once more,
  at once, on a new connection, as curl does: most often the server was closing the
  connection as the request went out (its keep-alive timeout, or a server that closes after
  every reply without saying so). Never once a byte of the reply has come; and a new
  connection lost so is the caller's to retry, counted and bounded;
- a reply that llhttp rejects, or that breaks the protocol, raises `BadReply`: the server
  did answer, so sending again could replay an episode that ran.

Under the open-file limit, a request that cannot have a descriptor waits for one of this
transport's own to be freed (idle connections are closed first) rather than failing.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable, Sequence

import httpx
import trio

from rollfilter.http.bounds import DEFAULT_MAX_REPLY_BYTES
from rollfilter.http.connection import BodyChunks, Connection, Lost, OutOfFiles, open_tcp
from rollfilter.http.errors import CertificateError, reason
from rollfilter.http.framing import Reply, decode_body
from rollfilter.http.headers import RESERVED_HEADERS, authorization_for, header_lines
from rollfilter.http.origin import Origin, origin_of
from rollfilter.http.tls import certificate_failure, tls_context

# Seconds a connection may sit idle before it is closed on this side. Servers close idle
# connections on their own clock (uvicorn after 5 s); closing first avoids the race.
IDLE_EXPIRY = 4.0
MAX_CACHED_HEADS = 1024  # request heads cached per URL (redirects can name new URLs)


class HTTP11Transport:
    """HTTP/1.1 over trio with a keep-alive stack per origin; reads whole bodies.

    `post` is the fast path the client uses: the request head for a URL is built once.
    `request` sends anything else (the head server's GET, /aggregate_metrics) by the same
    rules. Errors are httpx's:
    ConnectError (CertificateError when TLS verification failed), ConnectTimeout,
    ReadError (a new connection was lost before any reply byte), RemoteProtocolError
    (BadReply: the server answered, but not usably). `connect_timeout` bounds TCP connect
    plus the TLS handshake; the caller bounds the whole request. Servers' certificates are
    checked with the context `tls` (see `tls_context`), or the system's trust store.

    `headers` go with every request; one the caller names replaces the transport's own
    (Host). URL user info becomes Basic auth unless `headers` has an Authorization.

    HTTP/1.1 cannot tell a late reply that lands after the next request went out from that
    request's answer. So bytes nobody asked for, once seen on a connection (after a reply in
    the same read, or at the check before reuse), turn keep-alive off for that origin for
    the rest of the run, and `on_warning` gets one line naming the origin and the rows
    (`row` of `post`) answered on that connection after its first reply: their results may
    be other rows'. The line names hosts and rows as they are: it is not escaped for a terminal.
    """

    def __init__(
        self,
        *,
        tls: ssl.SSLContext | None = None,
        connect_timeout: float = 10.0,
        headers: list[tuple[str, str]] | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        self._max_reply_bytes = max_reply_bytes
        self._on_warning = on_warning
        self._keep_alive_off: set[Origin] = set()  # origins that sent bytes nobody asked for
        self._ssl_context = tls  # None: the system's, made on the first https URL (loading CAs is slow)
        self._connect_timeout = connect_timeout
        given = {name.lower(): value for name, value in headers or ()}
        self._host = given.get("host")
        self._authorization = given.get("authorization")
        self._default_headers = header_lines(
            (name, value) for name, value in headers or () if name.lower() not in RESERVED_HEADERS
        )
        self._heads: dict[httpx.URL, tuple[Origin, bytes]] = {}
        self._heads_without_credentials: dict[httpx.URL, tuple[Origin, bytes]] = {}
        self._idle: dict[Origin, list[Connection]] = {}
        self._open = 0  # descriptors taken for connections: idle, in use, or being opened
        self._file_freed = trio.lowlevel.ParkingLot()
        self._waiting_for_files = 0  # requests parked until a descriptor is freed
        self._closed = False

    async def post(
        self,
        url: httpx.URL,
        body: bytes,
        *,
        credentials: bool = True,
        row: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Reply:
        """POST `body` (JSON) to `url` with the transport's headers; the whole reply, its
        body decoded. Without `credentials`, no Authorization header is sent; `headers` go on
        this request only. `row` names what the request is for in a warning."""
        heads = self._heads if credentials else self._heads_without_credentials
        cached = heads.get(url)
        if cached is None:
            if len(heads) >= MAX_CACHED_HEADS:
                heads.clear()
            cached = heads[url] = (origin_of(url), self._head(b"POST", url, credentials=credentials))
        origin, head = cached
        extra = header_lines(headers) if headers else b""
        request = b"%s%sContent-Length: %d\r\n\r\n%s" % (head, extra, len(body), body)
        reply = await self._round_trip(origin, b"POST", request, row)
        if reply.encoding is not None:
            reply.body = decode_body(reply.encoding, reply.body, self._max_reply_bytes)
        return reply

    async def request(
        self, method: bytes, url: httpx.URL, body: BodyChunks | None = None, *, length: int = 0, to_agent: bool = True
    ) -> Reply:
        """Any request, with the headers, credentials, bounds and errors of `post`. `body()`
        gives the body's chunks, `length` bytes in all, afresh each time it is sent. Not
        `to_agent` (the head server), a Host among `headers` is not sent: it names the agents' host."""
        head = self._head(method, url, credentials=True, to_agent=to_agent)
        request = b"%sContent-Length: %d\r\n\r\n" % (head, length)
        reply = await self._round_trip(origin_of(url), method, request, body=body)
        if reply.encoding is not None:
            reply.body = decode_body(reply.encoding, reply.body, self._max_reply_bytes)
        return reply

    def _head(self, method: bytes, url: httpx.URL, *, credentials: bool, to_agent: bool = True) -> bytes:
        authorization = authorization_for(url, self._authorization, credentials=credentials)
        headers = self._default_headers + (header_lines([("Authorization", authorization)]) if authorization else b"")
        host = self._host if to_agent else None
        if host is not None:
            host_bytes = host.encode()
        else:
            host_bytes = url.raw_host
            if b":" in host_bytes:
                host_bytes = b"[" + host_bytes + b"]"
            if url.port is not None:
                host_bytes += b":%d" % url.port
        return b"%s %s HTTP/1.1\r\nHost: %s\r\n%s" % (method, url.raw_path, host_bytes, headers)

    async def _round_trip(
        self, origin: Origin, method: bytes, request: bytes, row: str | None = None, body: BodyChunks | None = None
    ) -> Reply:
        conn = self._take_idle(origin)
        reused = conn is not None
        if conn is None:
            conn = await self._connect(origin)
        while True:
            try:
                reply, reusable = await conn.exchange(method, request, body)
                break
            except Lost as lost:
                self._discard(conn)
                if not reused:
                    raise httpx.ReadError(str(lost)) from None
                # Most often the server was closing the kept-alive connection as the request went
                # out. It may have read the request first (a reset cannot tell), so, as curl does,
                # it is sent again once only, on a new connection.
                reused = False
                conn = await self._connect(origin)
            except BaseException:
                self._discard(conn)
                raise
        conn.answered(row)
        if conn.stray:
            self._stray_seen(origin, conn)
        elif origin in self._keep_alive_off:
            reusable = False
            self._warn(conn, str(origin), "another of its kept-alive connections")
        # Requests waiting for a descriptor (the open-file limit) get this one's.
        if reusable and not self._closed and not self._waiting_for_files:
            conn.idle_since = trio.current_time()
            stack = self._idle.get(origin)
            if stack is None:
                stack = self._idle[origin] = []
            stack.append(conn)
        else:
            self._discard(conn)
        return reply

    def _take_idle(self, origin: Origin) -> Connection | None:
        stack = self._idle.get(origin)
        if not stack:
            return None
        now = trio.current_time()
        while stack:
            conn = stack.pop()
            if now - conn.idle_since > IDLE_EXPIRY:
                # The stack is in order of use: everything under this one is older still.
                self._discard(conn)
                for older in stack:
                    self._discard(older)
                stack.clear()
                return None
            if not conn.is_stale():
                return conn
            self._discard(conn)
            if conn.stray:
                self._stray_seen(origin, conn)
        return None

    def _stray_seen(self, origin: Origin, conn: Connection) -> None:
        # The HTTP/1.1 floor: from now on, no reply from this origin is read on a connection
        # that carried an earlier one, so none can be another request's.
        first = origin not in self._keep_alive_off
        self._keep_alive_off.add(origin)
        where = str(origin)
        if first:
            head = f"{where} sent bytes nobody asked for (a late or duplicated reply): keep-alive is off for it"
            self._warn(conn, head, "that connection", always=True)
        else:
            self._warn(conn, f"{where} sent bytes nobody asked for on another connection", "it")
        stack = self._idle.pop(origin, [])
        for idle in stack:
            self._discard(idle)
            self._warn(idle, where, "another of its kept-alive connections")
        stack.clear()  # _take_idle may be popping from it

    def _warn(self, conn: Connection, head: str, which: str, *, always: bool = False) -> None:
        """One line on the rows answered on `conn` after its first reply, if any (or `always`)."""
        count, named = conn.exposed_count, list(conn.exposed or ())
        conn.exposed_count, conn.exposed = 0, None  # told once
        if self._on_warning is None or not (count or always):
            return
        if count:
            rows = ", ".join(named) if len(named) == count else f"the last {len(named)}: {', '.join(named)}"
            self._on_warning(f"{head}; {count} rows answered on {which} may hold other rows' results ({rows})")
        else:
            self._on_warning(f"{head}; no result read on {which} can be another row's")

    def _discard(self, conn: Connection) -> None:
        conn.socket.close()
        self._descriptor_freed()

    def _descriptor_freed(self) -> None:
        self._open -= 1
        if self._waiting_for_files:
            self._file_freed.unpark_all()

    def _close_idle(self) -> bool:
        """Close every idle connection; whether there was one."""
        closed = False
        for stack in self._idle.values():
            for conn in stack:
                self._discard(conn)
                closed = True
            stack.clear()
        return closed

    async def _connect(self, origin: Origin) -> Connection:
        # The open-file limit is this machine's, not the agent's fault: a request waits
        # for a descriptor (idle connections go first) instead of failing its row.
        while True:
            try:
                return await self._dial(origin)
            except OutOfFiles:
                if self._close_idle():
                    continue
                if self._open == 0:
                    raise httpx.ConnectError("too many open files (raise the open-file limit, RLIMIT_NOFILE)") from None
                self._waiting_for_files += 1
                try:
                    await self._file_freed.park()
                finally:
                    self._waiting_for_files -= 1

    async def _dial(self, origin: Origin) -> Connection:
        # Counted from before its socket exists: a request waiting for a descriptor knows
        # that this one will be freed, or become a connection that will be.
        self._open += 1
        try:
            return await self._dial_counted(origin)
        except BaseException:
            self._descriptor_freed()
            raise

    async def _dial_counted(self, origin: Origin) -> Connection:
        scheme, host, port = origin
        try:
            with trio.fail_after(self._connect_timeout):
                tcp = await open_tcp(host, port)
                stream: trio.abc.Stream = tcp
                if scheme == "https":
                    try:
                        stream = await self._handshake(tcp, host)
                    except BaseException:
                        tcp.socket.close()
                        raise
        except trio.TooSlowError:
            raise httpx.ConnectTimeout(f"connecting took over {self._connect_timeout:g} s") from None
        except (OSError, trio.BrokenResourceError, ssl.SSLError) as exc:
            failed = certificate_failure(exc)
            if failed is not None:
                raise CertificateError(f"certificate verify failed: {failed}") from None
            raise httpx.ConnectError(reason(exc)) from None
        return Connection(stream, tcp.socket, self._max_reply_bytes)

    async def _handshake(self, tcp: trio.SocketStream, host: str) -> trio.SSLStream[trio.SocketStream]:
        if self._ssl_context is None:
            self._ssl_context = tls_context()
        tls = trio.SSLStream(tcp, self._ssl_context, server_hostname=host, https_compatible=True)
        await tls.do_handshake()
        return tls

    async def aclose(self) -> None:
        self._closed = True
        self._close_idle()
        self._idle.clear()
