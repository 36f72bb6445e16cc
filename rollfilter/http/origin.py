"""The origin of a URL: the one notion of "the same server" that the client has."""

from __future__ import annotations

from typing import NamedTuple

import httpx

DEFAULT_PORTS = {"http": 80, "https": 443}


class Origin(NamedTuple):
    """Scheme, host and port, the port always given (RFC 6454's origin).

    It is the key of the connection pool and the boundary of credentials alike, because
    both ask one question: is this the server that was meant? A kept-alive connection is
    reused only for the origin it was opened to, and Authorization is sent on a redirect
    only within its origin (as curl and httpx send it). So `http://host/` and
    `http://host:80/` are one origin (the port is resolved, never left out), and
    `http://host:443/` and `https://host/` are two. The host is httpx's normalized form
    (lower case, IDNA). User info is not part of it: credentials go with a request, not
    with a connection.
    """

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        """The origin as URLs write it: an IPv6 address in brackets, the port only where it
        is not the scheme's default. Not escaped for a terminal."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port == DEFAULT_PORTS.get(self.scheme):
            return f"{self.scheme}://{host}"
        return f"{self.scheme}://{host}:{self.port}"


def origin_of(url: httpx.URL) -> Origin:
    """The origin of an http or https URL; httpx.UnsupportedProtocol for any other scheme."""
    port = url.port or DEFAULT_PORTS.get(url.scheme)
    if port is None:
        raise httpx.UnsupportedProtocol(f"not an http(s) URL: {url.scheme}://")
    return Origin(url.scheme, url.host, port)
