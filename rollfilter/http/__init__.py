"""The HTTP/1.1 client of rollfilter: a leaf that imports nothing else of rollfilter.

    framing.py          a reply: its framing decided once (`body_framing`), parsed by llhttp, decoded
    connection.py       one connection: a request and its reply, and the check before reuse
    pool.py             `HTTP11Transport`: a keep-alive stack per origin, and why replies stay with requests
    proxy.py            `ProxyTransport`: the same rules through an HTTP proxy, over httpx
    agent_transport.py  the `AgentTransport` interface both implement, and `open_transport`
    origin.py           `Origin`: the pool's key and the boundary of credentials
    headers.py          the headers every request carries, and Basic auth from a URL
    tls.py              the TLS context (a CA file loaded once), and what a failed certificate check says
    bounds.py           the open-file limit and the connections that fit under it; the bound on replies
    errors.py           the errors raised: httpx's, with `BadReply` and `CertificateError`; `CaFileError`
    testing.py          `ScriptedTransport`: replies from a function of a test's, no socket (httpx's MockTransport)

Text in its errors and warnings (a server's words, a URL's host) is as it came: the caller
escapes it before printing it.

Names are imported on first use: the command's options take the reply bound from `bounds`
before it knows whether it will run, and that loads neither httpx nor the parser.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollfilter.http.agent_transport import AgentTransport, open_transport
    from rollfilter.http.bounds import DEFAULT_MAX_REPLY_BYTES, connections_that_fit, raise_open_file_limit
    from rollfilter.http.connection import BodyChunks
    from rollfilter.http.errors import BadReply, CaFileError, CertificateError
    from rollfilter.http.framing import Framing, Reply, body_framing
    from rollfilter.http.origin import Origin, origin_of
    from rollfilter.http.pool import HTTP11Transport
    from rollfilter.http.proxy import ProxyTransport
    from rollfilter.http.tls import tls_context

_EXPORTS = {
    "AgentTransport": "rollfilter.http.agent_transport",
    "open_transport": "rollfilter.http.agent_transport",
    "BodyChunks": "rollfilter.http.connection",
    "BadReply": "rollfilter.http.errors",
    "CaFileError": "rollfilter.http.errors",
    "CertificateError": "rollfilter.http.errors",
    "DEFAULT_MAX_REPLY_BYTES": "rollfilter.http.bounds",
    "Framing": "rollfilter.http.framing",
    "Reply": "rollfilter.http.framing",
    "body_framing": "rollfilter.http.framing",
    "connections_that_fit": "rollfilter.http.bounds",
    "raise_open_file_limit": "rollfilter.http.bounds",
    "Origin": "rollfilter.http.origin",
    "origin_of": "rollfilter.http.origin",
    "HTTP11Transport": "rollfilter.http.pool",
    "ProxyTransport": "rollfilter.http.proxy",
    "tls_context": "rollfilter.http.tls",
}
__all__ = [
    "DEFAULT_MAX_REPLY_BYTES",
    "AgentTransport",
    "BadReply",
    "BodyChunks",
    "CaFileError",
    "CertificateError",
    "Framing",
    "HTTP11Transport",
    "Origin",
    "ProxyTransport",
    "Reply",
    "body_framing",
    "connections_that_fit",
    "open_transport",
    "origin_of",
    "raise_open_file_limit",
    "tls_context",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'rollfilter.http' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})  # the names imported on first use too
