"""The viewer served over HTTP: the standard library's `ThreadingHTTPServer`, a thread a request,
answering GET and HEAD only, from the files it was given only.

Safe by default, as Jupyter is: on a loopback address a request must name that address in its
Host header (a page of another site that renamed itself to 127.0.0.1, DNS rebinding, is refused);
on any other address every request gives a token, in the URL the command prints (`?token=`) or in
the cookie set when it did. No page runs script: the Content-Security-Policy forbids all of it."""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
import re
import secrets
import socket
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from rollfilter.viewer.catalog import Catalog
from rollfilter.viewer.page import CONTENT_SECURITY_POLICY, STYLE, document, encoded, text
from rollfilter.viewer.pages import compare_page, compare_task_page, index_page, rollout_page
from rollfilter.viewer.query import Query, QueryError

TOKEN_COOKIE = "rollfilter_token"
SECURITY_HEADERS = (
    ("Content-Security-Policy", CONTENT_SECURITY_POLICY),
    ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "DENY"),
    ("Referrer-Policy", "no-referrer"),
    ("Cache-Control", "no-store"),
)
HTML = "text/html; charset=utf-8"
CLIENT_SECONDS = 30.0  # how long a connection waits on its client, for a request or to take the answer
# A number in a path or a parameter: ASCII digits (str.isdigit takes others int() refuses), and few
# enough of them for int() and the index's 64-bit columns; a longer one makes the path no page's.
NUMBER = "-?[0-9]{1,18}"


@dataclasses.dataclass(frozen=True, slots=True)
class Response:
    status: HTTPStatus
    body: bytes
    content_type: str = HTML
    headers: tuple[tuple[str, str], ...] = ()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Viewer:
    """What answers each request: `respond` maps a request's target and headers to a Response.
    `host` and `port` are where it listens; `token`, None on loopback, is what every request must
    give elsewhere."""

    def __init__(self, catalog: Catalog, *, host: str, port: int, token: str | None) -> None:
        self.catalog = catalog
        self.host, self.port, self.token = host, port, token
        names = {host, "localhost", "127.0.0.1", "[::1]"} if is_loopback(host) else {host}
        # A browser leaves port 80 out of the Host header it sends.
        self._hosts = {f"{name}:{port}" for name in names} | (names if port == 80 else set())

    @property
    def _cookie(self) -> str:
        """The token's cookie, named with the port: a browser sends a host's cookies to each of its
        ports, and two viewers on one host must not replace each other's token."""
        return f"{TOKEN_COOKIE}_{self.port}"

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}/" + (f"?token={self.token}" if self.token else "")

    def respond(self, method: str, target: str, headers: Any) -> Response:
        """The answer to `method` `target`; `headers` is a mapping of the request's headers."""
        refused = self._refused(target, headers)
        if refused is not None:
            return refused
        if method not in ("GET", "HEAD"):
            return _error(HTTPStatus.METHOD_NOT_ALLOWED, "The viewer only reads: GET and HEAD.")
        parts = urlsplit(target)
        params = parse_qs(parts.query)
        response = self._page(parts.path, params)
        if self.token is not None and params.get("token") == [self.token]:
            cookie = f"{self._cookie}={self.token}; HttpOnly; SameSite=Strict; Path=/"
            response = dataclasses.replace(response, headers=(*response.headers, ("Set-Cookie", cookie)))
        return response

    def _refused(self, target: str, headers: Any) -> Response | None:
        if self.token is None:
            if headers.get("Host", "") not in self._hosts:
                return _error(HTTPStatus.FORBIDDEN, "This viewer answers requests for its own address only.")
            return None
        given = parse_qs(urlsplit(target).query).get("token", [""])[-1]
        cookies = dict(pair.strip().partition("=")[::2] for pair in headers.get("Cookie", "").split(";") if "=" in pair)
        # Compared as bytes: compare_digest refuses strings past ASCII, and a request may give any.
        token = self.token.encode()
        if any(hmac.compare_digest(value.encode(), token) for value in (given, cookies.get(self._cookie, "")) if value):
            return None
        return _error(HTTPStatus.FORBIDDEN, "Give the token of the URL the viewer printed.")

    def _page(self, path: str, params: dict[str, list[str]]) -> Response:
        catalog = self.catalog
        if path == "/style.css":
            return Response(HTTPStatus.OK, STYLE.encode(), "text/css; charset=utf-8")
        # One request reads the index at a time: a refresh may replace it or add to its columns.
        with catalog.lock:
            try:
                catalog.refresh()
                return self._indexed_page(path, params)
            except OSError as exc:
                return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"cannot read the files: {exc.strerror or exc}")
            except Exception as exc:  # a line no page foresaw: said on the page, not a dropped connection
                return _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"cannot show this page: {type(exc).__name__}: {exc}")

    def _indexed_page(self, path: str, params: dict[str, list[str]]) -> Response:
        catalog = self.catalog
        if path == "/":
            try:
                query = Query.of(params)
            except QueryError as problem:
                return _error(HTTPStatus.BAD_REQUEST, str(problem))
            return _page(index_page(catalog, query, compare=catalog.baseline is not None))
        if path == "/compare" and catalog.baseline is not None:
            return _page(compare_page(catalog))
        numbers = [int(part) for part in re.findall(f"/({NUMBER})", path)]
        shape = re.sub(f"/{NUMBER}", "/N", path)
        if shape == "/compare/N" and catalog.baseline is not None:
            return _page(compare_task_page(catalog, numbers[0]))
        if shape == "/rollout/N/N":
            return self._rollout(numbers[0], numbers[1], params)
        if shape in ("/line/N", "/raw/N") and 0 <= numbers[0] < len(catalog):
            entry = catalog.entry(numbers[0])
            if shape == "/raw/N":
                return Response(HTTPStatus.OK, catalog.line(entry), "application/json")
            return _page(rollout_page(catalog, entry))
        return _error(HTTPStatus.NOT_FOUND, "No such page.")

    def _rollout(self, task: int, rollout: int, params: dict[str, list[str]]) -> Response:
        entry = self.catalog.find(task, rollout)
        if entry is None:
            return _error(HTTPStatus.NOT_FOUND, f"No rollout {rollout} of task {task}.")
        beside = params.get("beside", [""])[-1]
        other = self.catalog.find(task, int(beside)) if re.fullmatch(NUMBER, beside) else None
        return _page(rollout_page(self.catalog, entry, other))


def _page(html: str) -> Response:
    return Response(HTTPStatus.OK, encoded(html))


def _error(status: HTTPStatus, message: str) -> Response:
    body = document(
        f"{status.value} {status.phrase}", f"<h1>{status.value} {text(status.phrase)}</h1><p>{text(message)}</p>"
    )
    return Response(status, encoded(body))


class _Handler(BaseHTTPRequestHandler):
    viewer: Viewer
    # A client that stops sending its request or reading the answer lets go of its thread: many idle
    # connections (slowloris) would otherwise hold a thread each for as long as they like.
    timeout = CLIENT_SECONDS
    server_version = "rollfilter"
    sys_version = ""

    def _answer(self) -> None:
        response = self.viewer.respond(self.command, self.path, self.headers)
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in response.headers:
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(response.body)

    do_GET = do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _answer

    def end_headers(self) -> None:
        """The security headers on every answer, http.server's own errors (a method it has no
        do_ for, a request line too long, one that is not HTTP) too."""
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged: stderr has the one line the command prints."""


class ViewerServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed (the browser went away) is dropped: stderr has the one line the
        command printed."""


def listening(catalog: Catalog, host: str, port: int) -> tuple[ViewerServer, Viewer]:
    """A server bound to `host`:`port` (0: a free port) that answers as a Viewer of `catalog`,
    with a new token when `host` is not a loopback address. OSError when it cannot bind."""
    handler: type[_Handler] = type("Handler", (_Handler,), {})
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server_class: type[ViewerServer] = type("Server", (ViewerServer,), {"address_family": family})
    server = server_class((host, port), handler)
    token = None if is_loopback(host) else secrets.token_urlsafe(24)
    viewer = Viewer(catalog, host=host, port=server.server_address[1], token=token)
    handler.viewer = viewer
    return server, viewer
