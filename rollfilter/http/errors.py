"""The errors the HTTP client raises: httpx's own, and two of its kind that say more.

    httpx.TransportError
      httpx.ConnectError        connecting failed (TCP, TLS, the open-file limit)
        CertificateError        the server's certificate could not be verified
      httpx.ConnectTimeout      connecting took longer than the connect timeout
      httpx.ReadError           a new connection was lost before any byte of the reply
      httpx.RemoteProtocolError
        BadReply                the server answered, but not with a reply that can be used
    CaFileError                 a CA file that cannot serve: raised by `tls_context`, before any request

Nothing here names anything of the program that uses it: its caller decides what an
error means for a row.
"""

from __future__ import annotations

import httpx


class BadReply(httpx.RemoteProtocolError):
    """The server answered, but not with an HTTP/1.1 reply rollfilter can use.

    Not worth sending again: the server read the request, and may have run it.
    """


class CertificateError(httpx.ConnectError):
    """The server's TLS certificate could not be verified: trying again cannot help."""


class CaFileError(Exception):
    """A file of CA certificates that cannot serve; `problem` says why ("holds no PEM
    certificates", "cannot be read: No such file or directory")."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem


def causes(exc: BaseException) -> list[BaseException]:
    """`exc` and the exceptions it was raised from or during, at most 8."""
    chain = [exc]
    while len(chain) < 8 and (nxt := chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(nxt)
    return chain


def errnos(exc: BaseException) -> set[int]:
    """The errnos in an exception's causes and, for trio's happy eyeballs, their groups."""
    found: set[int] = set()
    for cause in causes(exc):
        if isinstance(cause, OSError) and cause.errno is not None:
            found.add(cause.errno)
        if isinstance(cause, BaseExceptionGroup):
            for member in cause.exceptions:
                found |= errnos(member)
    return found


def reason(exc: BaseException) -> str:
    """The system's words for a failure (its strerror), else the exception's own."""
    for cause in causes(exc):
        if isinstance(cause, OSError) and cause.strerror:
            return cause.strerror
    return str(exc) or type(exc).__name__
