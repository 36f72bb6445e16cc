"""The headers every request carries: the caller's, and Authorization from a URL's user info."""

from __future__ import annotations

import base64
from collections.abc import Iterable

import httpx

_FRAMING_HEADERS = frozenset({"content-length", "transfer-encoding"})  # always the transport's own
# Never sent as given in the caller's list: framing is the transport's, and Host and
# Authorization are sent only where they belong (the agents' host; the URL's own origin).
RESERVED_HEADERS = _FRAMING_HEADERS | {"host", "authorization"}


def header_lines(headers: Iterable[tuple[str, str]]) -> bytes:
    """`Name: value` lines, each ended by CRLF. UTF-8, as curl sends what it is given: a
    value never fails to encode."""
    return "".join(f"{name}: {value}\r\n" for name, value in headers).encode()


def authorization_for(url: httpx.URL, given: str | None, *, credentials: bool) -> str | None:
    """The Authorization a request to `url` carries: `given` (the caller's own), else the URL's user info as
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
