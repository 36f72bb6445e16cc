"""HTTP/1.1 for rollfilter: an httpx transport with an O(1) keep-alive stack per origin.

Why not httpx's own pool: httpcore scans its connections on every request, so its cost
grows with the pool (at 1,000 in flight, one httpx client ran ~30 rows/s where the ideal was
2,000), and a
request cancelled while the pool is full can leak a slot for good (httpcore #1093). Here
each origin keeps a stack of idle connections; taking one or giving it back is O(1), no
request ever waits for a slot (the run's concurrency bounds the connections), and a
cancelled request closes its connection.

Responses are parsed by llhttp (httptools, the parser under uvicorn): parsing with h11
cost about as much CPU as everything else in a row's life together.

What keeps a reply with its own request:
- an idle connection is checked before every reuse, with one non-blocking poll(): a
  readable one was closed by the server or holds bytes nobody asked for, and is dropped;
- idle connections expire after IDLE_EXPIRY, before common server keep-alive timeouts;
- bytes nobody asked for (after a complete reply, or found by the check before reuse) turn
  keep-alive off for that origin for the rest of the run (`HTTP11Transport` says why);
- a request that provably never reached the server on a reused connection (sending it
  failed, or the server had closed before acknowledging it) is sent again at once on a
  new one; any other loss (a reset after the request went out, say) is left to the
  client's counted retries, since the agent may have read it and started an episode;
- a reply that llhttp rejects, or that breaks the protocol, raises `BadReply`: the server
  did answer, so sending again could replay an episode that ran.

Under the open-file limit, a request that cannot have a descriptor waits for one of this
transport's own to be freed (idle connections are closed first) rather than failing.
"""

from __future__ import annotations

import base64
import collections
import enum
import errno
import fcntl
import ipaddress
import os
import select
import socket
import ssl
import struct
import termios
import zlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Protocol

import httptools
import httpx
import trio

RECEIVE_BYTES = 64 * 1024
MAX_HEAD_BYTES = 64 * 1024  # a reply's status line and headers; more is refused as a bad reply
# Longer than any plausible agent reply: the default bound on a reply's body, as received and as
# decoded, whatever frames it (Content-Length, chunked, the connection's end, gzip).
DEFAULT_MAX_REPLY_BYTES = 256 * 1024 * 1024
# Seconds a connection may sit idle before it is closed on this side. Servers close idle
# connections on their own clock (uvicorn after 5 s); closing first avoids the race.
IDLE_EXPIRY = 4.0
# TCP keepalive on agent connections, as NeMo Gym sets it: an episode can run for an hour
# on a connection that a NAT or a dead peer has silently dropped.
KEEPALIVE_IDLE = 60
KEEPALIVE_INTERVAL = 10
KEEPALIVE_PROBES = 3
# Open files kept for everything but agent connections (standard streams, outputs, trio's
# own descriptors, a head-server connection) when -j is fitted to the open-file limit.
FILES_FOR_OTHER_USES = 64
# Rows named in the warning about a connection that carried bytes nobody asked for.
MAX_NAMED_ROWS = 10
MAX_CACHED_HEADS = 1024  # request heads cached per URL (redirects can name new URLs)
_DEFAULT_PORTS = {"http": 80, "https": 443}
_RESET_ERRNOS = frozenset({errno.ECONNRESET, errno.ECONNABORTED})
_OUT_OF_FILES_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
_HEAD_TOO_LARGE = f"the reply's header block is over {MAX_HEAD_BYTES // 1024} KiB"
_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})  # always the transport's own
_RESERVED_HEADERS = _FRAMING_HEADERS | {"host", "authorization"}
Origin = tuple[str, str, int]
BodyChunks = Callable[[], AsyncIterator[bytes]]  # a request body, read afresh each time it is sent


class BadReply(httpx.RemoteProtocolError):
    """The server answered, but not with an HTTP/1.1 reply rollfilter can use.

    Not worth sending again: the server read the request, and may have run it.
    """


class CertificateError(httpx.ConnectError):
    """The server's TLS certificate could not be verified: trying again cannot help."""


class _Lost(Exception):
    """The connection ended before any byte of the reply; `unread` when the server provably
    never received the whole request (only then may it be sent again for free)."""

    def __init__(self, reason: str, *, unread: bool) -> None:
        super().__init__(reason)
        self.unread = unread


class _Unsolicited(Exception):
    """llhttp began a second reply after the one asked for."""


class _HeadTooLarge(Exception):
    """The reply's headers add up to more than MAX_HEAD_BYTES."""


class _BodyTooLarge(Exception):
    """The reply's body is longer than the transport's max_reply_bytes."""


class _OutOfFiles(Exception):
    """socket() failed for the process's or the system's open-file limit."""


class _NoBody(Exception):
    """The reply to a HEAD has no body, whatever its headers say; llhttp does not know the method."""


class Framing(enum.Enum):
    """How a reply's body is delimited."""

    NONE = "no body"
    LENGTH = "Content-Length"
    CHUNKED = "chunked"
    TO_CLOSE = "the connection's end"


def body_framing(method: bytes, status: int, headers: Iterable[tuple[bytes, bytes]]) -> Framing:
    """A reply's framing, decided once from the request's method, its status and its headers
    (RFC 9112 section 6.3, as h11's `_body_framing` decides it): a reply to HEAD, a 1xx, 204
    and 304 carry no body; Transfer-Encoding wins over Content-Length, and frames the body
    only when chunked is its last coding (else the body runs to the connection's end); then
    Content-Length; then the connection's end."""
    if status < 200 or status == 204 or status == 304 or method == b"HEAD":
        return _NO_BODY
    framing = _TO_CLOSE
    for name, value in headers:
        # Names are compared by length first: lower() on every header of every reply shows.
        size = len(name)
        if size == 17 and name.lower() == b"transfer-encoding":
            return _CHUNKED if value.rstrip().lower().endswith(b"chunked") else _TO_CLOSE
        if size == 14 and name.lower() == b"content-length":
            framing = _LENGTH
    return framing


# Enum members looked up once: attribute access on an Enum class is slow on the per-reply path.
_NO_BODY, _LENGTH, _CHUNKED, _TO_CLOSE = Framing.NONE, Framing.LENGTH, Framing.CHUNKED, Framing.TO_CLOSE


class Reply:
    """One parsed response to a `method` request: status, raw headers, the whole body."""

    __slots__ = (
        "_chunks",
        "_room",
        "body",
        "complete",
        "encoding",
        "framing",
        "head_bytes",
        "headers",
        "keep_alive",
        "max_body_bytes",
        "method",
        "parser",
        "status",
    )

    def __init__(self, method: bytes = b"POST", max_body_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> None:
        self.parser = httptools.HttpResponseParser(self)
        # Transfer-Encoding with Content-Length too: the first wins (the connection is not reused).
        self.parser.set_dangerous_leniencies(lenient_chunked_length=True)
        self.method = method
        self.max_body_bytes = max_body_bytes
        self.reset()

    def reset(self) -> None:
        """Forget what was parsed: a new reply follows (after a 1xx)."""
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self._chunks: list[bytes] = []
        self._room = self.max_body_bytes  # body bytes still allowed
        self.body = b""
        self.complete = False
        self.keep_alive = False
        self.head_bytes = 0
        self.framing = _TO_CLOSE  # decided when the head is complete
        self.encoding: bytes | None = None

    # httptools parser callbacks
    def on_message_begin(self) -> None:
        if self.complete and self.status >= 200:
            raise _Unsolicited  # llhttp parses on past the reply: these bytes answer nothing we sent
        self.reset()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > MAX_HEAD_BYTES:
            raise _HeadTooLarge
        self.headers.append((name, value))
        if name.lower() == b"content-encoding":
            self.encoding = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()  # not 0 from here: the head is done
        self.framing = body_framing(self.method, self.status, self.headers)
        if self.framing is _NO_BODY and self.method == b"HEAD" and self.status >= 200:
            raise _NoBody  # llhttp reads 1xx, 204 and 304 as bodiless itself

    def on_body(self, data: bytes) -> None:
        self._room -= len(data)
        if self._room < 0:
            raise _BodyTooLarge
        self._chunks.append(data)

    def on_message_complete(self) -> None:
        self.body = b"".join(self._chunks)
        self.complete = True
        # llhttp forgets this once feed_data() returns. A reply framed both ways may be a
        # response split in two (RFC 9112 section 6.3): the connection is not used again.
        self.keep_alive = self.parser.should_keep_alive() and not (
            self.framing is _CHUNKED and self.header(b"content-length") is not None
        )

    @classmethod
    def whole(cls, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> Reply:
        """A reply that someone else parsed (httpx, for --proxy)."""
        reply = cls.__new__(cls)
        reply.method = b""
        reply.max_body_bytes = len(body)
        reply.reset()
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


def _tls_holds_bytes(stream: trio.abc.Stream) -> bool:
    """Whether a TLS stream has bytes read off its socket but not yet asked for: a record that
    came in with the last reply's, which poll() on the socket cannot see. trio keeps them in
    its SSLStream (the incoming BIO, and what OpenSSL has decrypted); if those are not where
    this looks, the connection counts as holding bytes, and is not reused."""
    if not isinstance(stream, trio.SSLStream):
        return False
    try:
        return bool(stream._incoming.pending or stream._ssl_object.pending())
    except AttributeError:
        return True


class _Connection:
    __slots__ = (
        "exposed",
        "exposed_count",
        "idle_since",
        "max_reply_bytes",
        "poller",
        "replies",
        "socket",
        "stray",
        "stream",
    )

    def __init__(self, stream: trio.abc.Stream, sock: trio.socket.SocketType, max_reply_bytes: int) -> None:
        self.stream = stream
        self.max_reply_bytes = max_reply_bytes
        self.socket = sock
        self.replies = 0
        # Rows answered on it after its first reply: any of them may have been given a late
        # reply to the request before it. The last MAX_NAMED_ROWS, and how many in all.
        self.exposed: collections.deque[str] | None = None
        self.exposed_count = 0
        self.stray = False  # bytes nobody asked for were seen on it
        # For the check before reuse: poll() works at any descriptor number, where
        # select() fails from 1024 on, and costs one system call.
        self.poller = select.poll()
        self.poller.register(sock.fileno(), select.POLLIN)
        self.idle_since = 0.0

    def is_stale(self) -> bool:
        # An idle keep-alive connection has nothing to read. Readable (or hung up) means
        # the server closed it, or sent bytes nobody asked for (a late reply, an idle 408):
        # either way, a reply read from it could not be trusted to answer our request.
        if _tls_holds_bytes(self.stream):
            self.stray = True
            return True
        if not self.poller.poll(0):
            return False
        # Over TLS the raw bytes may be the server's close_notify: only plain TCP can tell.
        self.stray = not isinstance(self.stream, trio.SSLStream) and _holds_bytes(self.socket.fileno())
        return True

    def answered(self, row: str | None) -> None:
        self.replies += 1
        if self.replies > 1:
            self.exposed_count += 1
            if row is not None:
                if self.exposed is None:
                    self.exposed = collections.deque(maxlen=MAX_NAMED_ROWS)
                self.exposed.append(row)

    def _closed_before_the_request_arrived(self) -> bool:
        # Whether the server provably never received the whole request: it closed (a FIN,
        # which acknowledges all its side had received) and part of the request is still
        # unacknowledged, so it reached the server after the close. A reset proves nothing:
        # a server that read the request and then aborted resets too, and Linux does not
        # take the acknowledgement a reset carries, so the request looks unacknowledged.
        try:
            return _unacknowledged_bytes(self.socket.fileno()) > 0
        except OSError:
            return False

    async def exchange(self, method: bytes, request: bytes, body: BodyChunks | None = None) -> tuple[Reply, bool]:
        """Send one whole request (`request`, then the chunks of `body()` if given); return
        the reply and whether the connection can be reused."""
        reply = Reply(method, self.max_reply_bytes)
        try:
            try:
                await self.stream.send_all(request)
                if body is not None:
                    async for chunk in body():
                        await self.stream.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                return reply, await self._read_early_reply(reply, f"sending failed: {_reason(exc)}")
            return reply, await self._read_reply(reply)
        finally:
            reply.detach()

    async def _read_early_reply(self, reply: Reply, failure: str) -> bool:
        # A server may answer before it has read the whole request (a 413 for a body too
        # large) and close while the body is still going out: what it answered is what
        # happened to the request, as httpcore reads it. With no answer, the request was
        # never received whole.
        try:
            await self._read_reply(reply)
        except _Lost:
            raise _Lost(failure, unread=True) from None
        return False

    async def _read_reply(self, reply: Reply) -> bool:
        parser = reply.parser
        received = 0
        while True:
            try:
                data = await self.stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                if received:
                    raise BadReply(f"the reply was cut short after {received} bytes: {_reason(exc)}") from None
                # EPIPE here is a reset that came after the server's FIN (Linux's word for it in CLOSE_WAIT).
                unread = not _errnos(exc) & _RESET_ERRNOS and self._closed_before_the_request_arrived()
                raise _Lost(f"connection lost: {_reason(exc)}", unread=unread) from None
            if not data:
                if reply.status and reply.framing is _TO_CLOSE:
                    reply.on_message_complete()  # a body delimited by the connection's end
                    return False
                if received:
                    raise BadReply(f"the server closed the connection after {received} bytes of its reply")
                unread = self._closed_before_the_request_arrived()
                raise _Lost("the server closed the connection without a reply", unread=unread)
            received += len(data)
            try:
                parser.feed_data(data)
            except httptools.HttpParserCallbackError as exc:
                if reply.complete and isinstance(exc.__context__, _Unsolicited):
                    self.stray = True
                    return False  # the reply is whole; the bytes after it make the connection unusable
                if isinstance(exc.__context__, _NoBody):
                    reply.on_message_complete()
                    return False  # where llhttp stopped in these bytes is not known
                if isinstance(exc.__context__, _HeadTooLarge):
                    raise BadReply(_HEAD_TOO_LARGE) from None
                if isinstance(exc.__context__, _BodyTooLarge):
                    raise BadReply(_body_too_large(reply.max_body_bytes)) from None
                raise BadReply(f"malformed reply: {exc}") from None
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                if reply.status == 101:
                    raise BadReply("101 Switching Protocols: an upgrade that was not asked for") from None
                raise BadReply(f"malformed reply: {exc}") from None
            if reply.complete:
                if not 100 <= reply.status < 200:
                    return reply.keep_alive
                reply.reset()  # 100 Continue and the like: the answer follows
            if not reply.status and received > MAX_HEAD_BYTES:
                # Checked between reads too: llhttp hands over a header only once it is whole,
                # and httptools gathers a long one by concatenation, in time quadratic in its size.
                raise BadReply(_HEAD_TOO_LARGE)


class HTTP11Transport:
    """HTTP/1.1 over trio with a keep-alive stack per origin; reads whole bodies.

    `post` is the fast path the client uses: the request head for a URL is built once.
    `request` sends anything else (the head server's GET, /aggregate_metrics) by the same
    rules. Errors are httpx's:
    ConnectError (CertificateError when TLS verification failed), ConnectTimeout,
    ReadError (the connection was lost before any reply byte), RemoteProtocolError
    (BadReply: the server answered, but not usably). `connect_timeout` bounds TCP connect
    plus the TLS handshake; the caller bounds the whole request.

    `headers` go with every request; one the caller names replaces the transport's own
    (Host). URL user info becomes Basic auth unless `headers` has an Authorization.

    HTTP/1.1 cannot tell a late reply that lands after the next request went out from that
    request's answer. So bytes nobody asked for, once seen on a connection (after a reply in
    the same read, or at the check before reuse), turn keep-alive off for that origin for
    the rest of the run, and `on_warning` gets one line naming the origin and the rows
    (`row` of `post`) answered on that connection after its first reply: their results may
    be other rows'.
    """

    def __init__(
        self,
        *,
        verify: bool = True,
        cafile: str | None = None,
        connect_timeout: float = 10.0,
        headers: list[tuple[str, str]] | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        self._verify = verify
        self._max_reply_bytes = max_reply_bytes
        self._on_warning = on_warning
        self._keep_alive_off: set[Origin] = set()  # origins that sent bytes nobody asked for
        self._cafile = cafile
        self._ssl_context: ssl.SSLContext | None = None  # made on the first https URL: loading CAs is slow
        self._connect_timeout = connect_timeout
        given = {name.lower(): value for name, value in headers or ()}
        self._host = given.get("host")
        self._authorization = given.get("authorization")
        self._default_headers = _header_lines(
            (name, value) for name, value in headers or () if name.lower() not in _RESERVED_HEADERS
        )
        self._heads: dict[httpx.URL, tuple[Origin, bytes]] = {}
        self._heads_without_credentials: dict[httpx.URL, tuple[Origin, bytes]] = {}
        self._idle: dict[Origin, list[_Connection]] = {}
        self._open = 0  # descriptors taken for connections: idle, in use, or being opened
        self._file_freed = trio.lowlevel.ParkingLot()
        self._waiting_for_files = 0  # requests parked until a descriptor is freed
        self._closed = False

    async def post(self, url: httpx.URL, body: bytes, *, credentials: bool = True, row: str | None = None) -> Reply:
        """POST `body` (JSON) to `url` with the transport's headers; the whole reply, its
        body decoded. Without `credentials`, no Authorization header is sent. `row` names
        what the request is for in a warning."""
        heads = self._heads if credentials else self._heads_without_credentials
        cached = heads.get(url)
        if cached is None:
            if len(heads) >= MAX_CACHED_HEADS:
                heads.clear()
            cached = heads[url] = (_origin_key(url), self._head(b"POST", url, credentials=credentials))
        origin, head = cached
        request = b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
        reply = await self._round_trip(origin, b"POST", request, row)
        if reply.encoding is not None:
            reply.body = decode_body(reply.encoding, reply.body, self._max_reply_bytes)
        return reply

    async def request(
        self, method: bytes, url: httpx.URL, body: BodyChunks | None = None, *, length: int = 0, to_agent: bool = True
    ) -> Reply:
        """Any request, with the headers, credentials, bounds and errors of `post`. `body()`
        gives the body's chunks, `length` bytes in all, afresh each time it is sent. Not
        `to_agent` (the head server), a -H Host is not sent: it names the agents' host."""
        head = self._head(method, url, credentials=True, to_agent=to_agent)
        request = b"%sContent-Length: %d\r\n\r\n" % (head, length)
        reply = await self._round_trip(_origin_key(url), method, request, body=body)
        if reply.encoding is not None:
            reply.body = decode_body(reply.encoding, reply.body, self._max_reply_bytes)
        return reply

    def _head(self, method: bytes, url: httpx.URL, *, credentials: bool, to_agent: bool = True) -> bytes:
        authorization = authorization_for(url, self._authorization, credentials=credentials)
        headers = self._default_headers + (_header_lines([("Authorization", authorization)]) if authorization else b"")
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
            except _Lost as lost:
                self._discard(conn)
                if not (reused and lost.unread):
                    raise httpx.ReadError(str(lost)) from None
                # The request could not be sent on a kept-alive connection, or the server had
                # closed it (its keep-alive timeout) before the request arrived: no episode
                # can have started. Send it again, on a new one. Anything else is the client's
                # to retry, counted and bounded by --retries.
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
            self._warn(conn, printable(_origin_text(origin)), "another of its kept-alive connections")
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

    def _take_idle(self, origin: Origin) -> _Connection | None:
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

    def _stray_seen(self, origin: Origin, conn: _Connection) -> None:
        # The HTTP/1.1 floor: from now on, no reply from this origin is read on a connection
        # that carried an earlier one, so none can be another request's.
        first = origin not in self._keep_alive_off
        self._keep_alive_off.add(origin)
        where = printable(_origin_text(origin))
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

    def _warn(self, conn: _Connection, head: str, which: str, *, always: bool = False) -> None:
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

    def _discard(self, conn: _Connection) -> None:
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

    async def _connect(self, origin: Origin) -> _Connection:
        # The open-file limit is this machine's, not the agent's fault: a request waits
        # for a descriptor (idle connections go first) instead of failing its row.
        while True:
            try:
                return await self._dial(origin)
            except _OutOfFiles:
                if self._close_idle():
                    continue
                if self._open == 0:
                    raise httpx.ConnectError("too many open files (raise the open-file limit, RLIMIT_NOFILE)") from None
                self._waiting_for_files += 1
                try:
                    await self._file_freed.park()
                finally:
                    self._waiting_for_files -= 1

    async def _dial(self, origin: Origin) -> _Connection:
        # Counted from before its socket exists: a request waiting for a descriptor knows
        # that this one will be freed, or become a connection that will be.
        self._open += 1
        try:
            return await self._dial_counted(origin)
        except BaseException:
            self._descriptor_freed()
            raise

    async def _dial_counted(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        try:
            with trio.fail_after(self._connect_timeout):
                tcp = await _open_tcp(host, port)
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
            failed = _certificate_failure(exc)
            if failed is not None:
                raise CertificateError(f"certificate verify failed: {failed}") from None
            raise httpx.ConnectError(_reason(exc)) from None
        return _Connection(stream, tcp.socket, self._max_reply_bytes)

    async def _handshake(self, tcp: trio.SocketStream, host: str) -> trio.SSLStream[trio.SocketStream]:
        if self._ssl_context is None:
            self._ssl_context = tls_context(verify=self._verify, cafile=self._cafile)
        tls = trio.SSLStream(tcp, self._ssl_context, server_hostname=host, https_compatible=True)
        await tls.do_handshake()
        return tls

    async def aclose(self) -> None:
        self._closed = True
        self._close_idle()
        self._idle.clear()


async def _open_tcp(host: str, port: int) -> trio.SocketStream:
    """A TCP stream with keepalive on; an IP address is connected to directly.

    trio.open_tcp_stream's happy-eyeballs machinery (a nursery and a resolver call per
    connection) costs more than the connect itself, for every connection of a first wave
    of thousands. An IP address has nothing to race, so it gets one plain connect().
    Running out of descriptors raises _OutOfFiles.
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            if _errnos(exc) & _OUT_OF_FILES_ERRNOS:
                raise _OutOfFiles from None
            raise
        _keep_alive(stream.socket)
        return stream
    try:
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        if exc.errno in _OUT_OF_FILES_ERRNOS:
            raise _OutOfFiles from None
        raise
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    _keep_alive(sock)
    return trio.SocketStream(sock)


def _unacknowledged_bytes(fd: int) -> int:
    """Bytes sent on socket `fd` that the peer has not acknowledged (Linux's SIOCOUTQ); 0
    where the system cannot tell."""
    if not hasattr(termios, "TIOCOUTQ"):
        return 0
    unacknowledged: int = struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    return unacknowledged


def _holds_bytes(fd: int) -> bool:
    """Whether socket `fd` has bytes to read (not only the server's close), without taking them."""
    peek = socket.socket(fileno=os.dup(fd))
    try:
        return bool(peek.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except OSError:
        return False
    finally:
        peek.close()


def _keep_alive(sock: trio.socket.SocketType) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", KEEPALIVE_IDLE),
        ("TCP_KEEPINTVL", KEEPALIVE_INTERVAL),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
    ):
        if hasattr(socket, option):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


def decode_body(encoding: bytes, body: bytes, max_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> bytes:
    """A body in its Content-Encoding (gzip, identity) decoded; BadReply for any other, for a
    broken one, or for one that would grow past `max_bytes`. An empty body has nothing to
    decode, whatever its encoding says (as httpx and curl read it)."""
    if not body:
        return body
    for coding in reversed(encoding.lower().split(b",")):
        coding = coding.strip()
        if coding in (b"gzip", b"x-gzip"):
            body = _gunzip(body, max_bytes)
        elif coding not in (b"identity", b""):
            raise BadReply(f"a body in Content-Encoding {printable(coding.decode('latin-1'))}, which was not asked for")
    return body


def _gunzip(data: bytes, max_bytes: int) -> bytes:
    # A gzip body may hold several members, one after another (RFC 1952): each is decoded.
    parts: list[bytes] = []
    room = max_bytes
    while True:
        decompressor = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
        try:
            part = decompressor.decompress(data, room + 1)
        except zlib.error as exc:
            raise BadReply(f"a gzip body that does not decode: {exc}") from None
        room -= len(part)
        if room < 0:
            raise BadReply(_body_too_large(max_bytes, "decoded"))
        parts.append(part)
        if not decompressor.eof:
            raise BadReply("a gzip body that is cut short")
        data = decompressor.unused_data
        if not data:
            return b"".join(parts)


def _body_too_large(max_bytes: int, how: str = "") -> str:
    size = f"{max_bytes // 2**20} MiB" if max_bytes % 2**20 == 0 else f"{max_bytes} bytes"
    return f"the reply's body is over {size}{' ' + how if how else ''} (Config.max_reply_bytes)"


def _header_lines(headers: Iterable[tuple[str, str]]) -> bytes:
    # UTF-8, as curl sends what it is given: an -H value never fails to encode.
    return "".join(f"{name}: {value}\r\n" for name, value in headers).encode()


def authorization_for(url: httpx.URL, given: str | None, *, credentials: bool) -> str | None:
    """The Authorization a request to `url` carries: the -H one, else the URL's user info as
    Basic auth (as curl sends it); none without `credentials` (a redirect to another origin)."""
    if not credentials:
        return None
    return given or _basic_auth(url)


def _basic_auth(url: httpx.URL) -> str | None:
    """`Basic ...` from a URL's user info (http://user:password@host), as curl sends it."""
    if not url.userinfo:
        return None
    token = base64.b64encode(f"{url.username}:{url.password}".encode()).decode("ascii")
    return f"Basic {token}"


def origin(url: httpx.URL | str) -> str:
    """scheme://host:port for messages: never the path, query or credentials of a URL."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return "(an invalid URL)"
    port = f":{parsed.port}" if parsed.port else ""
    host = f"[{parsed.host}]" if ":" in parsed.host else parsed.host  # an IPv6 address, as URLs write it
    return printable(f"{parsed.scheme}://{host}{port}")


def shown(url: httpx.URL) -> str:
    """A URL as rollfilter prints it: without user, password or query, which may hold secrets."""
    return printable(str(url.copy_with(username=None, password=None, query=None, fragment=None)))


def printable(text: str) -> str:
    """`text` with control and other unprintable characters escaped, so text from a server
    cannot drive the terminal it is printed on."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def _origin_text(origin: Origin) -> str:
    scheme, host, port = origin
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def _origin_key(url: httpx.URL) -> Origin:
    scheme = url.scheme
    return scheme, url.host, url.port or _DEFAULT_PORTS[scheme]


def _causes(exc: BaseException) -> list[BaseException]:
    chain = [exc]
    while len(chain) < 8 and (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(nxt)
    return chain


def _errnos(exc: BaseException) -> set[int]:
    """The errnos in an exception's causes and, for trio's happy eyeballs, their groups."""
    found: set[int] = set()
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.errno is not None:
            found.add(cause.errno)
        if isinstance(cause, BaseExceptionGroup):
            for member in cause.exceptions:
                found |= _errnos(member)
    return found


def _reason(exc: BaseException) -> str:
    for cause in _causes(exc):
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
    return str(exc) or type(exc).__name__


def _certificate_failure(exc: BaseException) -> str | None:
    for cause in _causes(exc):
        if isinstance(cause, ssl.SSLCertVerificationError):
            return cause.verify_message or str(cause)
    return None


class AgentTransport(Protocol):
    """What every call of a run goes through: a JSON POST (`post`), any other request
    (`request`), whole decoded replies, and closing.

    Errors are httpx's, as `HTTP11Transport` documents them."""

    async def post(self, url: httpx.URL, body: bytes, *, credentials: bool = True, row: str | None = None) -> Reply: ...

    async def request(
        self, method: bytes, url: httpx.URL, body: BodyChunks | None = None, *, length: int = 0, to_agent: bool = True
    ) -> Reply: ...

    async def aclose(self) -> None: ...


class ProxyTransport:
    """Sends through an HTTP proxy (--proxy) with httpx's own transport.

    httpx's pool does work proportional to its size per request, so this path is for
    reaching agents behind a proxy, not for the highest rates.
    """

    def __init__(
        self,
        proxy: str,
        *,
        verify: bool = True,
        cafile: str | None = None,
        connect_timeout: float = 10.0,
        headers: list[tuple[str, str]],
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self._max_reply_bytes = max_reply_bytes
        self._headers = [(name, value) for name, value in headers if name.lower() not in _RESERVED_HEADERS]
        given = {name.lower(): value for name, value in headers}
        self._host = given.get("host")
        self._authorization = given.get("authorization")
        self._timeout = httpx.Timeout(None, connect=connect_timeout)
        self._transport = httpx.AsyncHTTPTransport(
            proxy=proxy,
            verify=tls_context(verify=verify, cafile=cafile),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def post(self, url: httpx.URL, body: bytes, *, credentials: bool = True, row: str | None = None) -> Reply:
        return await self._send("POST", url, body, credentials=credentials, to_agent=True)

    async def request(
        self, method: bytes, url: httpx.URL, body: BodyChunks | None = None, *, length: int = 0, to_agent: bool = True
    ) -> Reply:
        content = body() if body is not None else b""
        extra = [("Content-Length", str(length))] if body is not None else []
        return await self._send(method.decode(), url, content, credentials=True, to_agent=to_agent, extra=extra)

    async def _send(
        self,
        method: str,
        url: httpx.URL,
        content: bytes | AsyncIterator[bytes],
        *,
        credentials: bool,
        to_agent: bool,
        extra: list[tuple[str, str]] | None = None,
    ) -> Reply:
        headers = [*self._headers, *(extra or ())]
        if to_agent and self._host is not None:
            headers.append(("Host", self._host))
        if authorization := authorization_for(url, self._authorization, credentials=credentials):
            headers.append(("Authorization", authorization))
        request = httpx.Request(
            method,
            url.copy_with(username=None, password=None),
            headers=headers,
            content=content,
            extensions={"timeout": self._timeout.as_dict()},
        )
        try:
            response = await self._transport.handle_async_request(request)
            try:
                chunks: list[bytes] = []
                size = 0
                async for chunk in response.aiter_bytes():
                    size += len(chunk)
                    if size > self._max_reply_bytes:
                        raise BadReply(_body_too_large(self._max_reply_bytes))
                    chunks.append(chunk)
            finally:
                await response.aclose()
        except httpx.DecodingError as exc:
            raise BadReply(f"a body that does not decode: {exc}") from None
        except httpx.RemoteProtocolError as exc:
            if isinstance(exc, BadReply):
                raise
            if "without sending a response" in str(exc):  # httpcore's words for a connection lost before a reply
                raise httpx.ReadError(str(exc)) from None
            raise BadReply(str(exc)) from None
        except httpx.ConnectError as exc:
            failed = _certificate_failure(exc)
            if failed is not None:
                raise CertificateError(f"certificate verify failed: {failed}") from None
            raise
        return Reply.whole(response.status_code, list(response.headers.raw), b"".join(chunks))

    async def aclose(self) -> None:
        await self._transport.aclose()


def open_transport(
    *,
    verify: bool,
    connect_timeout: float,
    headers: list[tuple[str, str]],
    proxy: str | None = None,
    cafile: str | None = None,
    max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    on_warning: Callable[[str], None] | None = None,
) -> AgentTransport:
    """The transport for a run: direct HTTP/1.1, or httpx's through --proxy."""
    if proxy is not None:
        return ProxyTransport(
            proxy,
            verify=verify,
            cafile=cafile,
            connect_timeout=connect_timeout,
            headers=headers,
            max_reply_bytes=max_reply_bytes,
        )
    return HTTP11Transport(
        verify=verify,
        cafile=cafile,
        connect_timeout=connect_timeout,
        headers=headers,
        max_reply_bytes=max_reply_bytes,
        on_warning=on_warning,
    )


def tls_context(*, verify: bool, cafile: str | None = None) -> ssl.SSLContext:
    """The system's trust store (SSL_CERT_FILE and SSL_CERT_DIR apply), the CAs in `cafile`
    instead (--cacert, as curl's), or no checks at all."""
    context = ssl.create_default_context(cafile=cafile)
    if not verify:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the soft limit now."""
    try:
        import resource
    except ImportError:  # not a Unix
        return 1 << 20
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return soft
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connections_that_fit(wanted: int, open_file_limit: int, *, files_per_connection: int = 1) -> int:
    """How many of `wanted` connections fit under the open-file limit, beside other uses."""
    room = (open_file_limit - FILES_FOR_OTHER_USES) // files_per_connection
    return max(1, min(wanted, room))
