"""HTTP through a proxy, with httpx's own transport, under the rules of the direct one."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Sequence

import httpx

from rollfilter.http.bounds import DEFAULT_MAX_REPLY_BYTES
from rollfilter.http.connection import BodyChunks
from rollfilter.http.errors import BadReply, CertificateError
from rollfilter.http.framing import Reply, body_too_large
from rollfilter.http.headers import RESERVED_HEADERS, authorization_for
from rollfilter.http.tls import certificate_failure, tls_context


class ProxyTransport:
    """Sends through the HTTP proxy at `proxy` with httpx's own transport.

    httpx's pool does work proportional to its size per request, so this path is for
    reaching agents behind a proxy, not for the highest rates.
    """

    def __init__(
        self,
        proxy: str,
        *,
        tls: ssl.SSLContext | None = None,
        connect_timeout: float = 10.0,
        headers: list[tuple[str, str]],
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        self._max_reply_bytes = max_reply_bytes
        self._headers = [(name, value) for name, value in headers if name.lower() not in RESERVED_HEADERS]
        given = {name.lower(): value for name, value in headers}
        self._host = given.get("host")
        self._authorization = given.get("authorization")
        self._timeout = httpx.Timeout(None, connect=connect_timeout)
        self._transport = httpx.AsyncHTTPTransport(
            proxy=proxy,
            verify=tls if tls is not None else tls_context(),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def post(
        self,
        url: httpx.URL,
        body: bytes,
        *,
        credentials: bool = True,
        row: str | None = None,
        headers: Sequence[tuple[str, str]] = (),
    ) -> Reply:
        return await self._send("POST", url, body, credentials=credentials, to_agent=True, extra=list(headers))

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
            # As header_lines sends them without a proxy: UTF-8, where httpx would fail on a non-ASCII str.
            headers=[(name.encode(), value.encode()) for name, value in headers],
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
                        raise BadReply(body_too_large(self._max_reply_bytes))
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
            failed = certificate_failure(exc)
            if failed is not None:
                raise CertificateError(f"certificate verify failed: {failed}") from None
            raise
        return Reply.whole(response.status_code, list(response.headers.raw), b"".join(chunks))

    async def aclose(self) -> None:
        await self._transport.aclose()
