"""One HTTP/1.1 connection: the socket, one request and its reply at a time, and what the
pool must know before it uses the connection again."""

from __future__ import annotations

import collections
import errno
import ipaddress
import os
import select
import socket
from collections.abc import AsyncIterator, Callable

import httptools
import trio

from rollfilter.http.errors import BadReply, errnos, reason
from rollfilter.http.framing import (
    HEAD_TOO_LARGE,
    MAX_HEAD_BYTES,
    BodyTooLarge,
    Framing,
    HeadTooLarge,
    NoBody,
    Reply,
    Unsolicited,
    UnsupportedCoding,
    body_too_large,
)

RECEIVE_BYTES = 64 * 1024
# TCP keepalive on agent connections, as NeMo Gym sets it: an episode can run for an hour
# on a connection that a NAT or a dead peer has silently dropped.
KEEPALIVE_IDLE = 60
KEEPALIVE_INTERVAL = 10
KEEPALIVE_PROBES = 3
# Rows named in the warning about a connection that carried bytes nobody asked for.
MAX_NAMED_ROWS = 10
_OUT_OF_FILES_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE})
BodyChunks = Callable[[], AsyncIterator[bytes]]  # a request body, read afresh each time it is sent
_TO_CLOSE = Framing.TO_CLOSE  # looked up once: attribute access on an Enum class is slow per reply


class Lost(Exception):
    """The connection ended before any byte of the reply."""


class OutOfFiles(Exception):
    """socket() failed for the process's or the system's open-file limit."""


def tls_holds_bytes(stream: trio.abc.Stream) -> bool:
    """Whether a TLS stream has bytes read off its socket but not yet asked for: a record that
    came in with the last reply's, which poll() on the socket cannot see. What OpenSSL has
    decrypted, SSLStream's public `pending()` tells; the records not yet decrypted sit in its
    incoming BIO, which trio keeps private (`_incoming`): the one private attribute read here,
    and tests/http/test_connection.py fails when trio moves it. Should it be missing, the
    connection counts as holding bytes, and is not reused."""
    if not isinstance(stream, trio.SSLStream):
        return False
    try:
        return bool(stream.pending() or stream._incoming.pending)
    except AttributeError:
        return True


class Connection:
    """A connection to one origin: one request and its whole reply at a time (`exchange`), and
    what the pool needs to know before it is used again."""

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
        if tls_holds_bytes(self.stream):
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
                return reply, await self._read_early_reply(reply, f"sending failed: {reason(exc)}")
            return reply, await self._read_reply(reply)
        finally:
            reply.detach()

    async def _read_early_reply(self, reply: Reply, failure: str) -> bool:
        # A server may answer before it has read the whole request (a 413 for a body too
        # large) and close while the body is still going out: what it answered is what
        # happened to the request, as httpcore reads it.
        try:
            await self._read_reply(reply)
        except Lost:
            raise Lost(failure) from None
        return False

    async def _read_reply(self, reply: Reply) -> bool:
        parser = reply.parser
        received = 0
        while True:
            try:
                data = await self.stream.receive_some(RECEIVE_BYTES)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                if received:
                    raise BadReply(f"the reply was cut short after {received} bytes: {reason(exc)}") from None
                raise Lost(f"connection lost: {reason(exc)}") from None
            if not data:
                if reply.status and reply.framing is _TO_CLOSE:
                    reply.on_message_complete()  # a body delimited by the connection's end
                    return False
                if received:
                    raise BadReply(f"the server closed the connection after {received} bytes of its reply")
                raise Lost("the server closed the connection without a reply")
            received += len(data)
            try:
                parser.feed_data(data)
            except httptools.HttpParserCallbackError as exc:
                if reply.complete and isinstance(exc.__context__, Unsolicited):
                    self.stray = True
                    return False  # the reply is whole; the bytes after it make the connection unusable
                if isinstance(exc.__context__, NoBody):
                    reply.on_message_complete()
                    return False  # where llhttp stopped in these bytes is not known
                if isinstance(exc.__context__, HeadTooLarge):
                    raise BadReply(HEAD_TOO_LARGE) from None
                if isinstance(exc.__context__, UnsupportedCoding):
                    codings = exc.__context__.args[0].decode("latin-1")
                    raise BadReply(f"a body in Transfer-Encoding {codings!r}: only chunked is decoded") from None
                if isinstance(exc.__context__, BodyTooLarge):
                    raise BadReply(body_too_large(reply.max_body_bytes)) from None
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
                raise BadReply(HEAD_TOO_LARGE)


async def open_tcp(host: str, port: int) -> trio.SocketStream:
    """A TCP stream with keepalive on; an IP address is connected to directly.

    trio.open_tcp_stream's happy-eyeballs machinery (a nursery and a resolver call per
    connection) costs more than the connect itself, for every connection of a first wave
    of thousands. An IP address has nothing to race, so it gets one plain connect().
    Running out of descriptors raises OutOfFiles.
    """
    try:
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    except ValueError:
        try:
            stream = await trio.open_tcp_stream(host, port)
        except OSError as exc:
            if errnos(exc) & _OUT_OF_FILES_ERRNOS:
                raise OutOfFiles from None
            raise
        _keep_alive(stream.socket)
        return stream
    try:
        sock = trio.socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        if exc.errno in _OUT_OF_FILES_ERRNOS:
            raise OutOfFiles from None
        raise
    try:
        await sock.connect((host, port))
    except BaseException:
        sock.close()
        raise
    _keep_alive(sock)
    return trio.SocketStream(sock)


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
