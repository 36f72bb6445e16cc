"""The command against misbehaving HTTP servers (tests/servers/wire_server.py): each reply read as itself."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import itertools
import json
import random
import re
import resource
import socket
import ssl
import subprocess
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from rollfilter import redact
from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    clean_env,
    closed_port_url,
    rollfilter_command,
    rows_jsonl,
    run,
    summary_of,
)
from tests.servers.wire_server import JOIN_SECONDS, Conn, Request, WireServer, echo, gzipped_echo, padded, reply

ROWS = 3  # enough for every connection to be reused at -j 1


_runs = itertools.count()


def rows_for(n: int) -> list[dict[str, Any]]:
    return [{"id": i, "responses_create_params": {"input": "x"}} for i in range(n)]


@dataclasses.dataclass
class Outcome:
    """What a rollfilter run did with its rows: results and error records by task index."""

    proc: subprocess.CompletedProcess[bytes]
    results: dict[int, dict[str, Any]]
    failures: dict[int, dict[str, Any]]

    def kinds(self, n: int) -> list[str]:
        return [
            "ok" if i in self.results else self.failures[i]["error"]["kind"] if i in self.failures else "lost"
            for i in range(n)
        ]

    @property
    def stderr(self) -> str:
        return self.proc.stderr.decode(errors="replace")


def rollfilter(url: str, n: int, tmp_path: Path, *args: str, rows: list[dict] | None = None) -> Outcome:
    """The command (in this process, as conftest's `run` runs it) over `n` rows, one at a time,
    failures into an errors record."""
    errors = tmp_path / f"errors-{next(_runs)}.jsonl"
    proc = run(["-u", url, "-j", "1", "--errors", str(errors), *args], input=rows_jsonl(rows or rows_for(n)))
    results = {r["_ng_task_index"]: r for r in map(json.loads, proc.stdout.splitlines())}
    records = [json.loads(line) for line in errors.read_text().splitlines()] if errors.exists() else []
    failures = {r["_ng_task_index"]: r for r in records}
    assert len(results) + len(failures) == len(results) + len(records)  # no row twice
    assert "Traceback" not in proc.stderr.decode(errors="replace")
    assert "rollfilter" in summary_of(proc.stderr)  # the summary is always printed
    return Outcome(proc, results, failures)


def httpx_kinds(url: str, n: int) -> list[str]:
    """The oracle: what httpx makes of the same rows, as rollfilter's kinds."""
    kinds = []
    with httpx.Client(trust_env=False, follow_redirects=True, timeout=30) as client:
        for row in rows_for(n):
            try:
                response = client.post(url, json=row)
            except (httpx.RemoteProtocolError, httpx.DecodingError):
                kinds.append("bad_response")
                continue
            except httpx.TransportError:
                kinds.append("connect")
                continue
            if response.status_code != 200:
                kinds.append("http_status")
                continue
            try:
                kinds.append("ok" if isinstance(response.json(), dict) else "bad_response")
            except ValueError:
                kinds.append("bad_response")
    return kinds


# One way to misbehave per script.
def stray_reply_after_each_answer(request: Request, conn: Conn) -> None:
    # In the same write: an idle 408 nobody asked for follows the answer.
    conn.send(echo(request) + reply(408, b"", "Connection: close", reason="Request Timeout"))


def close_after_each_answer(request: Request, conn: Conn) -> None:
    conn.send(echo(request))  # keep-alive by HTTP/1.1's default, and then closed anyway
    conn.close()


def switching_protocols(request: Request, conn: Conn) -> None:
    conn.send(reply(101, b"", "Upgrade: websocket", "Connection: Upgrade", reason="Switching Protocols", length=False))


def conflicting_lengths(request: Request, conn: Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}")


def bad_chunk_size(request: Request, conn: Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n")


def short_body(request: Request, conn: Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n{}")
    conn.close()


def chunked_cut_short(request: Request, conn: Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n{}")
    conn.close()


def huge_header(request: Request, conn: Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nX-Huge: " + b"h" * 200_000 + b"\r\nContent-Length: 2\r\n\r\n{}")


def large_header(request: Request, conn: Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\nX-Large: " + b"h" * 100_000 + b"\r\nContent-Length: 2\r\n\r\n{}")


def retry_after_not_ascii(request: Request, conn: Conn) -> None:
    conn.send(reply(503, b"busy", "Retry-After: \u00b2", reason="Service Unavailable"))  # "²".isdigit() is true


def retry_after_a_day(request: Request, conn: Conn) -> None:
    conn.send(reply(429, b"slow down", "Retry-After: 86400", reason="Too Many Requests"))


# Replies with no body but a Content-Encoding: nothing to decode, as httpx and curl read them.
def empty_gzip_redirect(request: Request, conn: Conn) -> None:
    moved = reply(307, b"", "Location: /run/", "Content-Encoding: gzip", reason="Temporary Redirect")
    conn.send(moved if request.path == "/run" else echo(request))


def empty_gzip_busy(request: Request, conn: Conn) -> None:
    conn.send(reply(503, b"", "Retry-After: 0", "Content-Encoding: gzip", reason="Service Unavailable"))


def temporary_redirect(request: Request, conn: Conn) -> None:
    moved = reply(307, b"", "Location: /run/", reason="Temporary Redirect")
    conn.send(moved if request.path == "/run" else echo(request))


def permanent_redirect(request: Request, conn: Conn) -> None:
    moved = reply(308, b"", f"Location: http://127.0.0.1:{request.header('Host').split(':')[1]}/v2/run")
    conn.send(moved if request.path == "/run" else echo(request))


def found_redirect(request: Request, conn: Conn) -> None:
    conn.send(reply(302, b"", "Location: /elsewhere", reason="Found"))


def gzip_when_asked(request: Request, conn: Conn) -> None:
    conn.send(gzipped_echo(request) if "gzip" in (request.header("Accept-Encoding") or "") else echo(request))


def broken_gzip(request: Request, conn: Conn) -> None:
    conn.send(reply(200, b"this is not gzip", "Content-Encoding: gzip"))


def identity_transfer_encoding(request: Request, conn: Conn) -> None:
    _, _, body = echo(request).partition(b"\r\n\r\n")
    conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: identity\r\n\r\n" + body)  # ends with the connection
    conn.close()


def body_ended_by_close(request: Request, conn: Conn) -> None:
    _, _, body = echo(request).partition(b"\r\n\r\n")
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + body)
    conn.close()


def not_json(request: Request, conn: Conn) -> None:
    conn.send(reply(200, b"<html>oops</html>"))


def long_body(request: Request, conn: Conn) -> None:
    conn.send(reply(200, padded(request)))


def long_chunked_body(request: Request, conn: Conn) -> None:
    body = padded(request)
    pieces = [body[i : i + 1000] for i in range(0, len(body), 1000)]
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces)
    conn.send(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")


def long_body_ended_by_close(request: Request, conn: Conn) -> None:
    conn.send(b"HTTP/1.1 200 OK\r\n\r\n" + padded(request))
    conn.close()


def long_gzip_body(request: Request, conn: Conn) -> None:
    conn.send(reply(200, gzip.compress(padded(request)), "Content-Encoding: gzip"))  # about 100 bytes on the wire


def endless_body(request: Request, conn: Conn) -> None:
    # Ended only by the connection's close: without a bound on a reply, only --timeout would stop it.
    conn.send(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n")
    chunk = b" " * 65536
    for _ in range(1024):  # 64 MiB at most, then the server gives up
        conn.send(chunk)
        if conn.closed:
            return
    conn.close()


def gzip_members(request: Request, conn: Conn) -> None:
    # Two gzip members, one after the other, decode to their texts joined (RFC 1952).
    body = padded(request, 100)
    members = gzip.compress(body[:40]) + gzip.compress(body[40:])
    conn.send(reply(200, members, "Content-Type: application/json", "Content-Encoding: gzip"))


@dataclasses.dataclass(frozen=True)
class Case:
    script: Any
    kind: str  # "ok", or the failure kind of every row
    requests_per_row: int = 1  # requests the server sees for each row
    args: tuple[str, ...] = ()
    message: str = ""  # in every failure's message
    httpx_agrees: bool = True  # False where httpx is not the oracle (said why beside the case)


CASES = {
    # httpx reads the stray 408 as the next request's answer: rollfilter must not.
    "stray reply on a kept-alive connection": Case(stray_reply_after_each_answer, "ok", httpx_agrees=False),
    # httpx sometimes sends on a connection the server is closing, and loses the row.
    "close after each reply, no Connection: close": Case(close_after_each_answer, "ok", httpx_agrees=False),
    "101 Switching Protocols": Case(switching_protocols, "bad_response", message="101 Switching Protocols"),
    "conflicting Content-Length": Case(conflicting_lengths, "bad_response", message="malformed reply"),
    "bad chunk size": Case(bad_chunk_size, "bad_response", message="malformed reply"),
    "short body": Case(short_body, "bad_response", message="closed the connection after"),
    "chunked body cut short": Case(chunked_cut_short, "bad_response", message="closed the connection after"),
    "header block over 64 KiB": Case(huge_header, "bad_response", message="header block is over 64 KiB"),
    # httpx allows 100 KiB.
    "header block of 100,000 bytes": Case(
        large_header, "bad_response", message="header block is over 64 KiB", httpx_agrees=False
    ),
    "non-ASCII Retry-After": Case(retry_after_not_ascii, "http_status", 2, ("--retries", "1"), "HTTP 503"),
    "Retry-After of a day, with --timeout": Case(
        retry_after_a_day, "http_status", 2, ("--retries", "1", "--timeout", "0.2"), "HTTP 429"
    ),
    "307 followed with the same body": Case(temporary_redirect, "ok", 2),
    "308 followed with the same body": Case(permanent_redirect, "ok", 2),
    # httpx follows a 302 with a GET and no body: a /run that is not a /run.
    "302 is not followed": Case(found_redirect, "http_status", message="Location: /elsewhere", httpx_agrees=False),
    "gzip": Case(gzip_when_asked, "ok"),
    "307 with an empty gzip body": Case(empty_gzip_redirect, "ok", 2),
    "503 with an empty gzip body, retried": Case(empty_gzip_busy, "http_status", 2, ("--retries", "1"), "HTTP 503"),
    "broken gzip": Case(broken_gzip, "bad_response", message="gzip"),
    # h11 refuses any Transfer-Encoding but chunked; RFC 9112 reads identity to the connection's end.
    "Transfer-Encoding: identity": Case(identity_transfer_encoding, "ok", httpx_agrees=False),
    "body ended by the connection's close": Case(body_ended_by_close, "ok"),
    "200 that is not JSON": Case(not_json, "bad_response", message="not JSON"),
    # httpx has no bound on a reply's body.
    **{
        f"body over --max-reply-bytes: {name}": Case(
            script, "bad_response", args=("--max-reply-bytes", "1000"), message=message, httpx_agrees=False
        )
        for name, script, message in (
            ("Content-Length", long_body, "body is over 1000 bytes"),
            ("chunked", long_chunked_body, "body is over 1000 bytes"),
            ("to the connection's end", long_body_ended_by_close, "body is over 1000 bytes"),
            ("gzip, decoded", long_gzip_body, "body is over 1000 bytes decoded"),
            ("endless, ended by close", endless_body, "body is over 1000 bytes"),
        )
    },
    # httpx decodes the first member alone, and finds a JSON text cut short.
    "gzip body of two members": Case(gzip_members, "ok", httpx_agrees=False),
}


def limit_open_files(soft: int, hard: int) -> Any:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return limit


def read_then_reset_on_reuse(request: Request, conn: Conn) -> None:
    if request.index == 0:
        conn.send(echo(request))
    else:
        conn.reset()  # the request was read: for all the client knows, an episode started


def too_large_at_once(request: Request, conn: Conn) -> None:
    # Answered from the head alone, and closed with the body still coming: the close is a reset.
    conn.send(reply(413, b"too large", "Connection: close", reason="Content Too Large"))
    conn.close()


class LateDuplicates:
    """A server script that answers each request, then writes the same answer again 1-5 ms
    later: a duplicated reply that may land after the next request went out."""

    def __init__(self) -> None:
        self.random = random.Random(20)
        self.timers: list[threading.Timer] = []

    def __call__(self, request: Request, conn: Conn) -> None:
        answer = echo(request)
        conn.send(answer)
        timer = threading.Timer(self.random.uniform(0.001, 0.005), conn.send, (answer,))
        self.timers.append(timer)
        timer.start()

    def join(self) -> None:
        for timer in self.timers:
            timer.join(JOIN_SECONDS)


class StrayAfterTheSecondAnswer:
    """A server script whose second answer on a connection comes with a reply nobody asked for."""

    def __init__(self) -> None:
        self.answered: dict[Conn, int] = {}

    def __call__(self, request: Request, conn: Conn) -> None:
        self.answered[conn] = self.answered.get(conn, 0) + 1
        stray = reply(408, b"", "Connection: close", reason="Request Timeout") if self.answered[conn] == 2 else b""
        conn.send(echo(request) + stray)


def long_config_and_long_aggregate(request: Request, conn: Conn) -> None:
    if request.method == "GET":  # the head server: a config that is one long string
        conn.send(reply(200, json.dumps("x" * 5000).encode()))
    elif request.path == "/aggregate_metrics":
        conn.send(reply(200, json.dumps({"key_metrics": {"pad": "x" * 5000}}).encode()))
    else:
        conn.send(echo(request))


@pytest.mark.usefixtures("quick_backoff")
@pytest.mark.parametrize("name", CASES)
def test_conformance(name: str, tmp_path):
    case = CASES[name]
    with WireServer(case.script) as server:
        outcome = rollfilter(server.url, ROWS, tmp_path, "--retries", "3", *case.args)
        requests = list(server.requests)
    assert outcome.kinds(ROWS) == [case.kind] * ROWS, (outcome.failures, outcome.stderr)
    assert outcome.proc.returncode == (0 if case.kind == "ok" else 1)
    assert len(requests) == case.requests_per_row * ROWS  # nothing resent that should not be
    if case.kind == "ok":
        assert [outcome.results[i]["echo"] for i in range(ROWS)] == list(range(ROWS))  # each row its own answer
    for failure in outcome.failures.values():
        assert case.message in failure["error"]["message"]
        assert failure["attempts"] == case.requests_per_row
    if case.requests_per_row == 2 and case.kind == "ok":  # a redirect: the same body again
        assert [r.body for r in requests[0::2]] == [r.body for r in requests[1::2]]
    if case.httpx_agrees:
        with WireServer(case.script) as server:
            assert httpx_kinds(server.url, ROWS) == [case.kind] * ROWS


def test_gzip_is_asked_for_and_decoded(tmp_path):
    with WireServer(gzip_when_asked) as server:
        outcome = rollfilter(server.url, ROWS, tmp_path)
        assert all(r.header("Accept-Encoding") == "gzip" for r in server.requests)
    assert outcome.results[2]["echo"] == 2


def test_closing_after_every_reply_costs_no_rows_even_without_retries(tmp_path):
    """A server that closes after every reply without `Connection: close`: a request that races
    the close on a kept-alive connection goes once more on a new one (as curl sends it), which
    is no retry, so --retries 0 loses no row."""
    n = 600
    with WireServer(close_after_each_answer) as server:
        outcome = rollfilter(server.url, n, tmp_path, "-j", "16", "--retries", "0")
        assert outcome.failures == {}, outcome.stderr
        assert sorted(outcome.results) == list(range(n))
        assert summary_of(outcome.proc.stderr)["rollfilter"]["retries"] == 0
        assert len(server.requests) <= 2 * n  # each row sent at most once more


def test_uvicorn_closing_after_every_reply_costs_no_rows(uvicorn_server, tmp_path):
    server = uvicorn_server("--timeout-keep-alive", "0")
    n = 1000  # enough that requests race uvicorn's close many times in every run
    outcome = rollfilter(server.url, n, tmp_path, "-j", "32", "--retries", "0")
    assert outcome.failures == {}, outcome.stderr
    assert n <= server.requests() <= 2 * n


def test_h_headers_replace_our_own_and_are_sent_once(tmp_path):
    given = {
        "Host": "agent.example",
        "User-Agent": "mine/1.0",
        "Content-Type": "application/json; charset=utf-8",
        "Accept": "*/*",
        "X-Api-Key": "k3y",
    }
    args = [arg for name, value in given.items() for arg in ("-H", f"{name}: {value}")]
    args += ["-H", "Content-Length: 999", "-H", "Transfer-Encoding: chunked"]  # framing stays rollfilter's own
    with WireServer() as server:
        outcome = rollfilter(server.url, 2, tmp_path, *args)
        requests = list(server.requests)
    assert outcome.proc.returncode == 0
    for request in requests:
        for name, value in given.items():
            assert request.headers_named(name) == [value]
        assert request.headers_named("Content-Length") == [str(len(request.body))]
        assert request.headers_named("Transfer-Encoding") == []
    with WireServer() as server, httpx.Client(trust_env=False, headers=given) as client:
        client.post(server.url, json=rows_for(1)[0])
        assert {name: server.requests[0].headers_named(name) for name in given} == {
            name: [value] for name, value in given.items()
        }


def test_url_credentials_become_basic_auth_and_are_never_printed(tmp_path):
    with WireServer(lambda request, conn: conn.send(reply(500, b"no"))) as server:
        url = server.url.replace("http://", "http://us3r:pa55%40word@")
        outcome = rollfilter(url, 2, tmp_path, "--retries", "0", "-v")
        with httpx.Client(trust_env=False) as client:
            client.post(url, json={})
        sent = [r.header("Authorization") for r in server.requests]
    expected = "Basic " + base64.b64encode(b"us3r:pa55@word").decode()
    assert sent == [expected, expected, expected]  # the last one is httpx's: the same header
    printed = outcome.stderr + outcome.proc.stdout.decode()
    assert "127.0.0.1" in printed
    for secret in ("us3r", "pa55"):
        assert secret not in printed
    with WireServer() as server:
        explicit = rollfilter(
            server.url.replace("http://", "http://us3r:pa55@"), 1, tmp_path, "-H", "Authorization: Bearer t0ken"
        )
        assert explicit.proc.returncode == 0
        assert server.requests[-1].headers_named("Authorization") == ["Bearer t0ken"]  # -H wins, sent once


def test_redirect_to_another_origin_only_when_asked_and_without_credentials(tmp_path):
    with WireServer() as target:

        def elsewhere(request: Request, conn: Conn) -> None:
            conn.send(reply(307, b"", f"Location: {target.url}", reason="Temporary Redirect"))

        with WireServer(elsewhere) as origin:
            url = origin.url.replace("http://", "http://u:p@")
            refused = rollfilter(url, 1, tmp_path, "-H", "X-Other: kept")
            assert origin.requests[-1].header("Authorization") == "Basic " + base64.b64encode(b"u:p").decode()
            assert refused.kinds(1) == ["http_status"]
            assert "(cross-origin redirects are not followed)" in refused.failures[0]["error"]["message"]
            assert target.requests == []
            for given in ((url,), (origin.url, "-H", "Authorization: Bearer t0ken")):
                followed = rollfilter(
                    given[0], 1, tmp_path, "--cross-origin-redirects", "-H", "X-Other: kept", *given[1:]
                )
                assert followed.kinds(1) == ["ok"]
                assert origin.requests[-1].header("Authorization") is not None
                assert target.requests[-1].header("Authorization") is None  # credentials stay with their origin
                assert target.requests[-1].header("X-Other") == "kept"
                assert target.requests[-1].body == origin.requests[-1].body


def test_server_text_cannot_drive_the_terminal(tmp_path):
    def hostile(request: Request, conn: Conn) -> None:
        conn.send(reply(500, b"\x1b[2J\x1b]0;owned\x07 oops"))

    with WireServer(hostile) as server:
        proc = run(["-u", server.url, "--retries", "0"], input=rows_jsonl(rows_for(1)))
    assert proc.returncode == 1
    assert b"\x1b" not in proc.stderr
    assert b"\x07" not in proc.stderr
    assert b"\\x1b[2J" in proc.stderr


def test_a_failed_certificate_check_is_not_retried_and_says_how_to_trust_the_ca(certificate, tmp_path):
    cert, key = certificate
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    with WireServer(tls=context) as server:
        untrusted = rollfilter(server.url, 2, tmp_path, "--retries", "3")
        assert untrusted.kinds(2) == ["connect", "connect"]
        assert server.handshakes == 2  # one per row: trying again cannot help
        message = untrusted.failures[0]["error"]["message"]
        assert "certificate verify failed" in message
        assert "its CA is not trusted: give its CA certificates in a file" in message
        assert "SSL_CERT_FILE" in message
        trusted = rollfilter(server.url, ROWS, tmp_path, "--cacert", str(cert))
        assert trusted.kinds(ROWS) == ["ok"] * ROWS
        assert server.connections == 3  # the trusted run kept its one connection alive
        by_variable = run(["-u", server.url], input=rows_jsonl(rows_for(1)), env=clean_env(SSL_CERT_FILE=str(cert)))
        assert by_variable.returncode == 0, by_variable.stderr
        not_pem = tmp_path / "not.pem"
        not_pem.write_text("hello\n")
        output = tmp_path / "refused.jsonl"
        connections = server.connections
        for path in (not_pem, tmp_path / "missing.pem"):
            refused = run(["-u", server.url, "--cacert", str(path), "-o", str(output)], input=rows_jsonl(rows_for(1)))
            assert refused.returncode == 2
            assert refused.stderr.decode().splitlines() == [refused.stderr.decode().strip()]  # one line
            assert refused.stderr.decode().startswith(f"rollfilter: --cacert {path} ")
            assert not output.exists()  # refused before the run wrote anything
        assert server.connections == connections  # and before anything was sent


def run_at_open_file_limits(where: list[str], *, soft: int, hard: int) -> subprocess.CompletedProcess[bytes]:
    """3,000 rows at -j 1500, in a process whose open-file limits are `soft` and `hard`."""
    return subprocess.run(
        [*rollfilter_command(), *where, "-j", "1500"],
        input=rows_jsonl(rows_for(3000)).encode(),
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT * 2,
        env=clean_env(),
        preexec_fn=limit_open_files(soft, hard),
    )


@pytest.mark.parametrize(("args", "fitted"), [((), 512 - 64), (("--demo",), (512 - 64) // 2)])
def test_a_low_open_file_limit_makes_rows_wait_not_fail(args: tuple[str, ...], fitted: int, demo_server: DemoServer):
    proc = run_at_open_file_limits(list(args) or ["-u", demo_server.url], soft=512, hard=512)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.splitlines()) == 3000
    notes = [line for line in proc.stderr.decode().splitlines() if not line.startswith("{")]
    assert notes == [
        "rollfilter: -j 1500 needs more open files than this process may have (512, see ulimit -n):"
        f" running {fitted} rows at a time"
    ]


def test_the_soft_open_file_limit_is_raised_to_the_hard_one(demo_server: DemoServer):
    proc = run_at_open_file_limits(["-u", demo_server.url], soft=512, hard=4096)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(proc.stdout.splitlines()) == 3000
    assert [line for line in proc.stderr.decode().splitlines() if not line.startswith("{")] == []


@pytest.mark.parametrize("retries", [0, 3])
def test_a_request_reset_on_a_reused_connection_goes_once_more_and_is_no_retry(retries: int, tmp_path):
    """The agent reads each request on a reused connection and resets it, as a server closing on
    its keep-alive clock does: each goes once more, on a new connection, as curl sends it, and
    is answered there. The agent saw it twice; no retry is counted, whatever --retries allows."""
    n = 10
    with WireServer(read_then_reset_on_reuse) as server:
        outcome = rollfilter(server.url, n, tmp_path, "--retries", str(retries))
        seen = [(request.connection, request.index) for request in server.requests]
    assert summary_of(outcome.proc.stderr)["rollfilter"]["retries"] == 0
    assert outcome.kinds(n) == ["ok"] * n
    assert seen == [(0, 0)] + [(row - 1, 1) if step == 0 else (row, 0) for row in range(1, n) for step in (0, 1)]


def test_a_reply_bound_under_one_byte_is_refused_before_anything_is_sent():
    from rollfilter.config import Config, ConfigError, Wire

    with pytest.raises(ConfigError, match=r"^Config\.wire\.max_reply_bytes: expected `int` >= 1$"):
        Config(url=closed_port_url() + "/run", wire=Wire(max_reply_bytes=0))
    proc = run(["-u", closed_port_url() + "/run", "--max-reply-bytes", "0"], input=rows_jsonl(rows_for(1)))
    assert proc.returncode == 2
    assert "--max-reply-bytes" in proc.stderr.decode()


def test_a_reply_that_comes_while_the_request_is_still_being_sent_is_reported_as_itself(tmp_path):
    rows = [{"id": i, "responses_create_params": {"input": "x" * (8 << 20)}} for i in range(2)]
    with WireServer(too_large_at_once, on_head=True) as server:
        outcome = rollfilter(server.url, 2, tmp_path, "--retries", "3", rows=rows)
        assert len(server.requests) == 2  # a 413 is not retried
        with httpx.Client(trust_env=False) as client:
            assert client.post(server.url, json=rows[0]).status_code == 413  # httpx reads it too
    assert outcome.kinds(2) == ["http_status", "http_status"], outcome.stderr
    assert {failure["error"]["status"] for failure in outcome.failures.values()} == {413}
    assert "HTTP 413" in outcome.failures[0]["error"]["message"]


def test_a_204_says_204(tmp_path):
    with WireServer(lambda request, conn: conn.send(reply(204, b"", reason="No Content"))) as server:
        outcome = rollfilter(server.url, 1, tmp_path)
    assert outcome.kinds(1) == ["bad_response"]
    assert outcome.failures[0]["error"]["status"] == 204
    message = outcome.failures[0]["error"]["message"]
    assert message == "HTTP 204 No Content: a reply with no body, where a result was due"


@pytest.mark.parametrize("concurrency", [1, 4])
def test_late_duplicate_replies_turn_keep_alive_off_and_every_result_at_risk_is_named(concurrency: int, tmp_path):
    """The HTTP/1.1 floor, measured: a reply that lands after the next request went out is
    read as its answer, by rollfilter as by httpx and curl. What rollfilter promises is that
    once bytes nobody asked for are seen, no result from that origin can be another row's,
    and that every row whose result may be is named."""
    n = 200
    script = LateDuplicates()
    try:
        with WireServer(script) as server:
            outcome = rollfilter(server.url, n, tmp_path, "-j", str(concurrency))
    finally:
        script.join()
    assert outcome.kinds(n) == ["ok"] * n
    misattributed = {i for i, result in outcome.results.items() if result["echo"] != i}
    warnings = [line for line in outcome.stderr.splitlines() if not line.startswith("{")]
    assert 1 <= len(warnings) <= concurrency, outcome.stderr
    assert all(line.startswith(f"rollfilter: {server.base}") for line in warnings)
    assert "keep-alive is off" in warnings[0]
    named = {int(line) - 1 for line in re.findall(r"<stdin>:(\d+)", "\n".join(warnings))}
    exposed = sum(int(count) for count in re.findall(r"; (\d+) rows answered", "\n".join(warnings)))
    # The exposure: rows answered on a reused connection before its stray bytes were seen.
    assert misattributed <= named, (sorted(misattributed), sorted(named), exposed)
    assert len(named) <= exposed <= n


def test_the_keep_alive_warning_is_escaped_for_the_terminal(tmp_path):
    """The warning names the rows at risk by their file: a file name, like a server's text,
    cannot drive the terminal it is printed on."""
    rows = tmp_path / "rows\x1b]0;owned\x07.jsonl"
    rows.write_text(rows_jsonl(rows_for(2)))
    with WireServer(StrayAfterTheSecondAnswer()) as server:
        proc = run(["-u", server.url, "-j", "1", "-q", str(rows)])
    assert proc.returncode == 0, proc.stderr
    (warning,) = proc.stderr.decode().splitlines()
    assert warning.startswith(f"rollfilter: {server.base} sent bytes nobody asked for")
    assert warning.endswith("\\x1b]0;owned\\x07.jsonl:2)")  # escaped, and named


def test_the_head_server_and_aggregate_metrics_have_the_bounds_of_run(tmp_path):
    with WireServer(long_config_and_long_aggregate) as server:
        head = run(["--head-server", server.base, "--max-reply-bytes", "1000"], input=rows_jsonl(rows_for(1)))
        aggregate = tmp_path / "agg.json"
        args = ["-a", "demo", "--aggregate", str(aggregate), "--max-reply-bytes", "1000"]
        outcome = rollfilter(server.url, 2, tmp_path, *args)
    assert head.returncode == 3
    assert head.stderr.decode().splitlines()[:-1] == [  # the summary last
        f"rollfilter: the head server at {server.base} answered badly: the reply's body is over 1000 bytes"
        " (the limit on replies)"
    ]
    assert outcome.kinds(2) == ["ok", "ok"]
    assert outcome.proc.returncode == 1  # the aggregate asked for is not whole
    problems = [line for line in outcome.stderr.splitlines() if "aggregate_metrics" in line]
    assert len(problems) == 1
    assert "/aggregate_metrics failed: " in problems[0]
    assert "body is over 1000 bytes" in problems[0]


@pytest.mark.parametrize(
    ("header", "problem"),
    [
        (("X-Key", "s3cret\r\nInjected: 1"), "X-Key: the value holds CR, LF or NUL"),
        (("X-Key", "s3cret\nInjected: 1"), "X-Key: the value holds CR, LF or NUL"),
        (("X-Key", "s3cret\0"), "X-Key: the value holds CR, LF or NUL"),
        (("X-Key\r\nInjected", "s3cret"), "holds a name that is empty"),
        (("X Key", "s3cret"), "holds a name that is empty"),
        (("", "s3cret"), "holds a name that is empty"),
    ],
)
def test_config_refuses_the_headers_that_h_refuses(header: tuple[str, str], problem: str):
    from rollfilter.config import Config, ConfigError

    with pytest.raises(ConfigError) as refused:
        Config(url=closed_port_url() + "/run", headers=(header,))
    assert refused.value.field == "headers[0]"
    assert problem in str(refused.value)
    assert "s3cret" not in str(refused.value)
    if "\0" not in header[1]:  # an argument cannot hold a NUL
        given = f"{header[0]}: {header[1]}"
        proc = run(["-u", closed_port_url() + "/run", "-H", given], input=rows_jsonl(rows_for(1)))
        assert proc.returncode == 2  # as -H refuses it
        assert b"s3cret" not in proc.stderr


@pytest.mark.parametrize("port", ["\u00b2", 99999, 0, "8000x"])
def test_a_head_server_port_that_cannot_be_used_is_exit_3_naming_the_server_and_the_field(port: Any):
    config = {"simple_agent": {"responses_api_agents": {"simple_agent": {"host": "127.0.0.1", "port": port}}}}
    answer = reply(200, json.dumps(yaml.safe_dump(config)).encode())
    with WireServer(lambda request, conn: conn.send(answer)) as server:
        proc = run(["--head-server", server.base, "-a", "simple_agent"], input=rows_jsonl(rows_for(1)))
    assert proc.returncode == 3
    message = (
        f"the head server at {server.base} gives simple_agent.responses_api_agents.simple_agent.port,"
        " which is not a TCP port (an integer from 1 to 65535)"
    )
    assert proc.stderr.decode().splitlines()[:-1] == [f"rollfilter: {message}"]
    assert summary_of(proc.stderr)["rollfilter"]["stopped"] == message  # the summary last


def test_ipv6_origins_are_printed_in_brackets(tmp_path):
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))
        port = probe.getsockname()[1]
    # Nothing listens there now: each row fails to connect, and its message names the origin.
    outcome = rollfilter(f"http://[::1]:{port}/run", 1, tmp_path, "--retries", "0", "--connect-timeout", "0.2")
    assert outcome.kinds(1) == ["connect"]
    assert outcome.failures[0]["error"]["message"].startswith(f"cannot connect to http://[::1]:{port}: ")
    assert redact.origin(f"http://[::1]:{port}/run?key=s3cret") == f"http://[::1]:{port}"
