"""The HTTP path: framing the transport must handle, TLS, and --proxy, over real sockets."""

from __future__ import annotations

import ast
import functools
import ssl
import subprocess
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import pytest
import trio

import rollfilter.http
from rollfilter import Config, Failure, Rollout, open_rollouts
from rollfilter.demo import DemoAgent
from rollfilter.demo.server import _serve_connection
from rollfilter.http import HTTP11Transport, origin_of
from tests.conftest import (
    DemoServer,
    QuietHandler,
    ThreadedHTTPServer,
    require_tool,
    result_lines,
    rows_jsonl,
    run,
    simple_rows,
)

Handler = Callable[[trio.SocketStream], Awaitable[None]]


async def serve_raw(nursery: trio.Nursery, handler: Handler) -> httpx.URL:
    listeners = await nursery.start(functools.partial(trio.serve_tcp, handler, 0, host="127.0.0.1"))
    port = listeners[0].socket.getsockname()[1]
    return httpx.URL(f"http://127.0.0.1:{port}/run")


async def read_request(stream: trio.SocketStream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(
        next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    )
    while len(body) < length:
        body += await stream.receive_some(65536)
    return head


@pytest.mark.parametrize(
    ("response", "body", "reusable"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", b"{}", True),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\n{\r\n1\r\n}\r\n0\r\n\r\n", b"{}", True),
        (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}", b"{}", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}", b"{}", False),
        (b"HTTP/1.0 200 OK\r\n\r\n{}", b"{}", False),  # the body ends with the connection
    ],
)
async def test_response_framing(response: bytes, body: bytes, reusable: bool):
    connections = 0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        while True:
            try:
                await read_request(stream)
            except (trio.BrokenResourceError, StopIteration, ValueError):
                return
            await stream.send_all(response)
            if not reusable:
                await stream.aclose()
                return

    async with trio.open_nursery() as nursery:
        url = await serve_raw(nursery, handler)
        transport = HTTP11Transport()
        for _ in range(2):
            with trio.fail_after(10):
                reply = await transport.post(url, b'{"a": 1}')
            assert (reply.status, reply.body) == (200, body)
        assert connections == (1 if reusable else 2)
        await transport.aclose()
        nursery.cancel_scope.cancel()


async def test_a_connection_closed_while_idle_is_not_reused():
    connections = 0

    async def handler(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
        await stream.aclose()  # without saying so: a keep-alive timeout on the server

    async with trio.open_nursery() as nursery:
        url = await serve_raw(nursery, handler)
        transport = HTTP11Transport()
        await transport.post(url, b"{}")
        await trio.sleep(0.6)  # the server's close has arrived: the check before reuse sees it
        reply = await transport.post(url, b"{}")
        assert reply.status == 200
        assert connections == 2
        await transport.aclose()
        nursery.cancel_scope.cancel()


async def test_truncated_response_is_a_protocol_error():
    async def handler(stream: trio.SocketStream) -> None:
        await read_request(stream)
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        url = await serve_raw(nursery, handler)
        transport = HTTP11Transport()
        with pytest.raises(httpx.RemoteProtocolError):
            await transport.post(url, b"{}")
        await transport.aclose()
        nursery.cancel_scope.cancel()


@pytest.fixture(scope="module")
def certificate(tmp_path_factory) -> tuple[Path, Path]:
    require_tool("openssl")
    path = tmp_path_factory.mktemp("tls")
    cert, key = path / "cert.pem", path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


async def test_tls_is_verified_unless_insecure(certificate: tuple[Path, Path], monkeypatch):
    cert, key = certificate
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)
    agent = DemoAgent()

    async def handler(stream: trio.SSLStream[trio.SocketStream]) -> None:
        await _serve_connection(stream, agent)

    async with trio.open_nursery() as nursery:
        serve = functools.partial(trio.serve_ssl_over_tcp, handler, 0, server_context, host="127.0.0.1")
        listeners = await nursery.start(serve)
        port = listeners[0].transport_listener.socket.getsockname()[1]
        rows = simple_rows(3)
        url = f"https://127.0.0.1:{port}"
        async with open_rollouts(rows, Config(url=url, retries=0)) as run_:
            untrusted = [o async for o in run_]
        assert all(isinstance(o, Failure) and o.kind == "connect" for o in untrusted)
        assert "certificate" in untrusted[0].message.lower()  # type: ignore[union-attr]
        async with open_rollouts(rows, Config(url=url, insecure=True)) as run_:
            insecure = [o async for o in run_]
        assert all(isinstance(o, Rollout) for o in insecure)
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))
        async with open_rollouts(rows, Config(url=url)) as run_:
            trusted = [o async for o in run_]
        assert all(isinstance(o, Rollout) for o in trusted)
        assert agent.requests == 6
        nursery.cancel_scope.cancel()


class ForwardProxy(ThreadedHTTPServer):
    """A plain-HTTP forward proxy on 127.0.0.1 that counts what passes through it."""

    def __init__(self) -> None:
        self.requests = 0
        proxy = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                proxy.requests += 1
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = urllib.request.Request(self.path, data=body, headers={"Content-Type": "application/json"})
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                with opener.open(request, timeout=30) as response:
                    self.send_json(response.status, response.read())

        super().__init__(Handler)


def test_proxy_option_sends_through_the_proxy(demo_server: DemoServer):
    proxy = ForwardProxy()
    try:
        proc = run(["-u", demo_server.url, "--proxy", proxy.url, "-j", "4"], input=rows_jsonl(simple_rows(12)))
    finally:
        proxy.close()
    assert proc.returncode == 0, proc.stderr
    assert len(result_lines(proc.stdout)) == 12
    assert proxy.requests == 12
    assert demo_server.stats()["requests"] == 12


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("http://127.0.0.1/run", "http://127.0.0.1:80/other"),
        ("https://127.0.0.1/run", "https://127.0.0.1:443/run"),
        ("http://LOCALHOST:8000/run", "http://localhost:8000/v2"),
        ("http://us3r:pa55@127.0.0.1:8000/run", "http://127.0.0.1:8000/run?key=s3cret"),
    ],
)
def test_urls_written_differently_have_one_origin(one: str, other: str):
    assert origin_of(httpx.URL(one)) == origin_of(httpx.URL(other))


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("http://127.0.0.1:443/run", "https://127.0.0.1/run"),  # the same port number, another scheme
        ("http://127.0.0.1:8000/run", "http://127.0.0.1:8001/run"),
        ("http://127.0.0.1:8000/run", "http://127.0.0.2:8000/run"),
    ],
)
def test_another_scheme_host_or_port_is_another_origin(one: str, other: str):
    assert origin_of(httpx.URL(one)) != origin_of(httpx.URL(other))


def test_an_origin_always_has_its_port_and_only_http_and_https_have_one():
    assert origin_of(httpx.URL("https://127.0.0.1/run")) == ("https", "127.0.0.1", 443)
    with pytest.raises(httpx.UnsupportedProtocol):
        origin_of(httpx.URL("ftp://127.0.0.1/file"))


def test_the_http_package_imports_nothing_else_of_rollfilter():
    """rollfilter/http is a leaf: the rest of rollfilter is built on it, never under it."""
    package = Path(rollfilter.http.__file__).parent
    outside = []
    for module in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = ["." * node.level + (node.module or "")]
            else:
                continue
            outside += [f"{module.name}: {name}" for name in names if _is_rollfilter_outside_http(name)]
    assert outside == []


def _is_rollfilter_outside_http(name: str) -> bool:
    if name.startswith(".."):  # a relative import from above the package
        return True
    return (name == "rollfilter" or name.startswith("rollfilter.")) and not (
        name == "rollfilter.http" or name.startswith("rollfilter.http.")
    )
