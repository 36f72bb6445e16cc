"""A raw HTTP/1.1 server on 127.0.0.1 that misbehaves on command, for the wire conformance suite.

Each accepted connection runs in its own thread and hands every whole request it reads to
`script(request, conn)`, which writes whatever bytes the case calls for (`conn.send`) and may
close the connection. The server records what it saw: connections, requests (with their
headers and bodies), and TLS handshakes when it serves TLS.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import socket
import ssl
import struct
import threading
from collections.abc import Callable
from typing import Any

JOIN_SECONDS = 10


@dataclasses.dataclass(frozen=True)
class Request:
    method: str
    path: str
    headers: list[tuple[str, str]]
    body: bytes
    connection: int  # which connection, counted from 0
    index: int  # which request on that connection, counted from 0

    def header(self, name: str) -> str | None:
        values = self.headers_named(name)
        return values[0] if values else None

    def headers_named(self, name: str) -> list[str]:
        return [value for key, value in self.headers if key.lower() == name.lower()]

    def json(self) -> Any:
        return json.loads(self.body)


class Conn:
    """The server's side of one connection, as a script sees it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.closed = False

    def send(self, data: bytes) -> None:
        if not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                self.close()

    def close(self) -> None:
        """Close as servers do: a request already received but not read is answered by a reset."""
        if not self.closed:
            self.closed = True
            self.sock.close()

    def reset(self) -> None:
        """Abort the connection with a reset (SO_LINGER 0), as a crashing server or a load balancer does."""
        if not self.closed:
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.close()

    def abort(self) -> None:
        """End the connection from another thread (the server is shutting down)."""
        if not self.closed:
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            self.close()


Script = Callable[[Request, Conn], None]


def reply(status: int = 200, body: bytes = b"{}", *headers: str, reason: str = "OK", length: bool = True) -> bytes:
    """One response: status line, the given header lines, Content-Length (unless not wanted), body."""
    lines = [f"HTTP/1.1 {status} {reason}", *headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def echo(request: Request, **extra: Any) -> bytes:
    """The usual good answer: the row's id echoed back, so a result shows which request it answers."""
    payload = json.dumps({"echo": request.json().get("id"), "path": request.path, "reward": 1.0, **extra})
    return reply(200, payload.encode(), "Content-Type: application/json")


def gzipped_echo(request: Request) -> bytes:
    payload = json.dumps({"echo": request.json().get("id"), "reward": 1.0}).encode()
    return reply(200, gzip.compress(payload), "Content-Type: application/json", "Content-Encoding: gzip")


def answer_each(request: Request, conn: Conn) -> None:
    conn.send(echo(request))


class WireServer:
    """Serves `script` on 127.0.0.1 (TLS when `tls` is a server context) until closed. With
    `on_head`, the script gets each request as soon as its head is read, with no body."""

    def __init__(
        self, script: Script = answer_each, *, tls: ssl.SSLContext | None = None, on_head: bool = False
    ) -> None:
        self.script = script
        self.tls = tls
        self.on_head = on_head
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=512)
        self.port = self.listener.getsockname()[1]
        scheme = "https" if tls else "http"
        self.base = f"{scheme}://127.0.0.1:{self.port}"
        self.url = self.base + "/run"
        self.requests: list[Request] = []
        self.connections = 0
        self.handshakes = 0
        self._lock = threading.Lock()
        self._conns: list[Conn] = []
        self._threads: list[threading.Thread] = []
        self._closing = False
        self._acceptor = threading.Thread(target=self._accept, daemon=True)
        self._acceptor.start()

    def __enter__(self) -> WireServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closing:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                number = self.connections
                self.connections += 1
            thread = threading.Thread(target=self._serve, args=(sock, number), daemon=True)
            with self._lock:
                self._threads.append(thread)
            thread.start()

    def _serve(self, sock: socket.socket, number: int) -> None:
        if self.tls is not None:
            with self._lock:
                self.handshakes += 1
            try:
                sock = self.tls.wrap_socket(sock, server_side=True)
            except (OSError, ssl.SSLError):
                sock.close()
                return
        conn = Conn(sock)
        with self._lock:
            self._conns.append(conn)
        buffer = b""
        index = 0
        try:
            while not conn.closed:
                request, buffer = _read_request(sock, buffer, number, index, on_head=self.on_head)
                if request is None:
                    break
                with self._lock:
                    self.requests.append(request)
                index += 1
                self.script(request, conn)
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._closing = True
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self._acceptor.join(JOIN_SECONDS)
        with self._lock:
            conns, threads = list(self._conns), list(self._threads)
        for conn in conns:
            conn.abort()
        for thread in threads:
            thread.join(JOIN_SECONDS)


def _read_request(
    sock: socket.socket, buffer: bytes, connection: int, index: int, *, on_head: bool = False
) -> tuple[Request | None, bytes]:
    while b"\r\n\r\n" not in buffer:
        data = sock.recv(65536)
        if not data:
            return None, b""
        buffer += data
    head, _, rest = buffer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, path, _ = lines[0].split(" ", 2)
    headers = [(name.strip(), value.strip()) for name, _, value in (line.partition(":") for line in lines[1:])]
    length = int(next((value for name, value in headers if name.lower() == "content-length"), "0"))
    if on_head:
        return Request(method, path, headers, b"", connection, index), rest
    while len(rest) < length:
        data = sock.recv(65536)
        if not data:
            return None, b""
        rest += data
    request = Request(method, path, headers, rest[:length], connection, index)
    return request, rest[length:]


# A small ASGI agent for uvicorn, the real server of the suite: POST answers the row's id
# back, GET /stats tells how many POSTs it answered (one uvicorn worker: one counter).
_answered = 0


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    global _answered
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["method"] == "GET":
        payload = json.dumps({"requests": _answered}).encode()
    else:
        _answered += 1
        payload = json.dumps({"echo": json.loads(body).get("id"), "reward": 1.0}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": payload})


def padded(request: Request, size: int = 5000) -> bytes:
    """A good answer, of `size` bytes or more."""
    return json.dumps({"echo": request.json().get("id"), "reward": 1.0, "pad": "x" * size}).encode()
