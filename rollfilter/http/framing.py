"""A reply, parsed: its framing decided once, its body read whole and bounded, then decoded.

Responses are parsed by llhttp (httptools, the parser under uvicorn): parsing with h11
cost about as much CPU as everything else in a row's life together.
"""

from __future__ import annotations

import enum
import zlib
from collections.abc import Iterable

import httptools

from rollfilter.http.bounds import DEFAULT_MAX_REPLY_BYTES
from rollfilter.http.errors import BadReply

MAX_HEAD_BYTES = 64 * 1024  # a reply's status line and headers; more is refused as a bad reply
HEAD_TOO_LARGE = f"the reply's header block is over {MAX_HEAD_BYTES // 1024} KiB"


# Raised in llhttp's callbacks: llhttp raises its own error in turn, and the connection reading
# the reply tells by that error's __context__ which of these it was.
class Unsolicited(Exception):
    """llhttp began a second reply after the one asked for."""


class HeadTooLarge(Exception):
    """The reply's headers add up to more than MAX_HEAD_BYTES."""


class BodyTooLarge(Exception):
    """The reply's body is longer than the transport's max_reply_bytes."""


class NoBody(Exception):
    """The reply to a HEAD has no body, whatever its headers say; llhttp does not know the method."""


class Framing(enum.Enum):
    """How a reply's body is delimited."""

    NONE = "no body"
    LENGTH = "Content-Length"
    CHUNKED = "chunked"
    TO_CLOSE = "the connection's end"


class UnsupportedCoding(Exception):
    """The reply's Transfer-Encoding is other than chunked alone; its codings are the argument."""


def body_framing(method: bytes, status: int, headers: Iterable[tuple[bytes, bytes]]) -> Framing:
    """A reply's framing, decided once from the request's method, its status and its headers
    (RFC 9112 section 6.3), as h11's `_body_framing` decides it: a reply to HEAD, a 1xx, 204
    and 304 carry no body; then Transfer-Encoding wins over Content-Length, its codings read
    over all its lines together: chunked, last, frames the body; identity alone codes nothing,
    and the body runs to the connection's end, as RFC 9112 reads it (h11 refuses it); any
    other coding is refused (UnsupportedCoding), as h11 refuses it: a gzip body would reach
    the JSON decoder still coded. Then Content-Length; then the connection's end."""
    if status < 200 or status == 204 or status == 304 or method == b"HEAD":
        return _NO_BODY
    framing = _TO_CLOSE
    codings = None
    for name, value in headers:
        # Names are compared by length first: lower() on every header of every reply shows.
        size = len(name)
        if size == 17 and name.lower() == b"transfer-encoding":
            codings = value if codings is None else codings + b"," + value
        elif size == 14 and name.lower() == b"content-length":
            framing = _LENGTH
    if codings is None:
        return framing
    if codings.strip(b" \t").lower() == b"chunked":  # the common case, without a split
        return _CHUNKED
    listed = [coding for coding in (part.strip(b" \t").lower() for part in codings.split(b",")) if coding]
    coded = [coding for coding in listed if coding != b"identity"]
    if not coded:
        return _TO_CLOSE
    if coded == [b"chunked"] and listed[-1] == b"chunked":
        return _CHUNKED
    raise UnsupportedCoding(codings)


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
            raise Unsolicited  # llhttp parses on past the reply: these bytes answer nothing we sent
        self.reset()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.head_bytes += len(name) + len(value)
        if self.head_bytes > MAX_HEAD_BYTES:
            raise HeadTooLarge
        self.headers.append((name, value))
        if name.lower() == b"content-encoding":
            self.encoding = value

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()  # not 0 from here: the head is done
        self.framing = body_framing(self.method, self.status, self.headers)
        if self.framing is _NO_BODY and self.method == b"HEAD" and self.status >= 200:
            raise NoBody  # llhttp reads 1xx, 204 and 304 as bodiless itself

    def on_body(self, data: bytes) -> None:
        self._room -= len(data)
        if self._room < 0:
            raise BodyTooLarge
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
        """A reply that someone else parsed (httpx, for the proxy client)."""
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


def decode_body(encoding: bytes, body: bytes, max_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> bytes:
    """A body in its Content-Encoding (gzip, identity) decoded; BadReply for any other, for a
    broken one, or for one that would grow past `max_bytes`. An empty body has nothing to
    decode, whatever its encoding says (as httpx and curl read it). The message quotes an
    unknown coding as the server sent it: escape it before printing it."""
    if not body:
        return body
    for coding in reversed(encoding.lower().split(b",")):
        coding = coding.strip()
        if coding in (b"gzip", b"x-gzip"):
            body = _gunzip(body, max_bytes)
        elif coding not in (b"identity", b""):
            raise BadReply(f"a body in Content-Encoding {coding.decode('latin-1')}, which was not asked for")
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
            raise BadReply(body_too_large(max_bytes, "decoded"))
        parts.append(part)
        if not decompressor.eof:
            raise BadReply("a gzip body that is cut short")
        data = decompressor.unused_data
        if not data:
            return b"".join(parts)


def body_too_large(max_bytes: int, how: str = "") -> str:
    """The message for a body longer than `max_bytes` (`how`: "decoded", or as received)."""
    size = f"{max_bytes // 2**20} MiB" if max_bytes % 2**20 == 0 else f"{max_bytes} bytes"
    return f"the reply's body is over {size}{' ' + how if how else ''} (the limit on replies)"
