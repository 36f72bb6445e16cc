"""--prometheus HOST:PORT and --prometheus-file FILE: a run's figures for Prometheus while it goes.

The address is bound before anything is sent (`listen`), so that one that cannot be used is a
usage error. The endpoint is served from the run's own trio loop, not from a thread: a scrape
reads the figures between two steps of the engine, never while one changes them, and the engine
does no work for it between scrapes (`rollfilter.api.prometheus` reads the figures at each one).
Each connection gets one answer, then is closed; it has no authentication, so it binds only the
address it is given. It serves at most MAX_CONNECTIONS at once, each for at most REQUEST_SECONDS:
a flood of connections that send nothing waits in the system's listen backlog (and past it is
refused there), and never takes the descriptors the run needs, nor prints on the stderr the
summary shares (trio's own `serve_listeners` logs a traceback for each accept that finds no
descriptor free). This module imports prometheus_client: the command imports it only for a
run that exports.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import math
import socket
import threading
import time
from collections.abc import Callable

import trio
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import CollectorRegistry

from rollfilter.api.in_trio import LiveFigures
from rollfilter.api.prometheus import PrometheusCollector, exposition
from rollfilter.errors import UsageError
from rollfilter.formats.writers import OutputClosed, OutputFailed, WholeFile
from rollfilter.run.run import Run

FILE_SECONDS = 5.0  # how often --prometheus-file is replaced: node_exporter reads it when scraped
REUSE_FACTOR = 10  # see Scrapes
REQUEST_SECONDS = 5.0  # how long a scraper has to send its request and take the answer
MAX_REQUEST_BYTES = 16 * 1024  # a request's head, at most: a scrape sends a few hundred bytes
LISTEN_BACKLOG = 16
# Connections served at once: a handful of Prometheus servers scrape a run; the descriptors beyond
# them are the run's (FILES_FOR_OTHER_USES in rollfilter.http.bounds keeps room for these).
MAX_CONNECTIONS = 16
ACCEPT_PAUSE_SECONDS = 0.1  # after an accept that found no descriptor (or memory) free
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
PATH = b"/metrics"


def listen(host: str, port: int) -> list[socket.socket]:
    """Sockets listening at `host`'s addresses (each of a name's), port `port`; UsageError naming
    --prometheus when one cannot be bound (taken, not this machine's address, not a name)."""
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise UsageError(f"--prometheus {where}: cannot listen there: {getattr(exc, 'strerror', exc)}") from None
    sockets: list[socket.socket] = []
    try:
        for family, kind, protocol, _, address in dict.fromkeys(found):
            sock = socket.socket(family, kind, protocol)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # not a port in use: one in TIME_WAIT
            if family == socket.AF_INET6:  # [::] alone, beside an IPv4 socket of the same name
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        for sock in sockets:
            sock.close()
        raise UsageError(f"--prometheus {where}: cannot listen there: {exc.strerror or exc}") from None
    return sockets


class Exporter:
    """A run's figures for Prometheus: served on `sockets` (already bound) and written to `file`
    (replaced whole) every FILE_SECONDS and once more at the end."""

    def __init__(self, run: Run, sockets: list[socket.socket], file: WholeFile | None) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        # Made in the run's trio loop, whose thread owns the figures: scrapes are read there.
        self.registry.register(
            PrometheusCollector(LiveFigures(run, trio.lowlevel.current_trio_token(), threading.get_ident()))
        )
        self.sockets, self.file = sockets, file

    def start(self, services: trio.Nursery, say: Callable[[str], None]) -> None:
        """Serve and publish in `services` until it is cancelled."""
        if self.sockets:
            services.start_soon(serve, self.sockets, Scrapes(self.registry))
        if self.file is not None:
            services.start_soon(functools.partial(publish, seconds=FILE_SECONDS), self.file, self.registry, say)

    def finish(self) -> None:
        """The file's last content: the figures as the run ended (best effort, as while running)."""
        if self.file is not None:
            with contextlib.suppress(OutputClosed, OutputFailed):
                self.file.replace(exposition(self.registry))


async def serve(sockets: list[socket.socket], scrapes: Scrapes, *, slots: trio.Semaphore | None = None) -> None:
    """Answer GET /metrics on `sockets` until cancelled, on at most `slots` connections at once
    (default MAX_CONNECTIONS): the next is accepted only once one has ended."""
    slots = slots if slots is not None else trio.Semaphore(MAX_CONNECTIONS)
    async with trio.open_nursery() as nursery:
        for sock in sockets:
            listener = trio.SocketListener(trio.socket.from_stdlib_socket(sock))
            nursery.start_soon(accept, listener, slots, scrapes, nursery)


async def accept(
    listener: trio.abc.Listener[trio.SocketStream], slots: trio.Semaphore, scrapes: Scrapes, nursery: trio.Nursery
) -> None:
    """Accept connections on `listener` while a slot is free, each answered in `nursery`. An
    accept that finds no descriptor free is tried again a little later, without a word: the run
    is what needs them."""
    async with listener:
        while True:
            await slots.acquire()
            try:
                stream = await listener.accept()
            except OSError as exc:
                slots.release()
                if exc.errno not in OUT_OF_DESCRIPTORS:
                    raise
                await trio.sleep(ACCEPT_PAUSE_SECONDS)
                continue
            nursery.start_soon(_answer_in_slot, stream, slots, scrapes)


async def _answer_in_slot(stream: trio.SocketStream, slots: trio.Semaphore, scrapes: Scrapes) -> None:
    try:
        await answer(stream, scrapes=scrapes)
    finally:
        slots.release()


async def answer(stream: trio.SocketStream, *, scrapes: Scrapes) -> None:
    """One request on `stream`, one reply, then the connection is closed. A scraper that goes away
    or takes too long costs nothing but its own answer."""
    async with stream:
        with trio.move_on_after(REQUEST_SECONDS):
            try:
                head = b""
                while b"\r\n\r\n" not in head and b"\n\n" not in head:
                    if len(head) > MAX_REQUEST_BYTES:
                        await stream.send_all(_reply(431, b"Request Header Fields Too Large", b"request too long\n"))
                        return
                    data = await stream.receive_some(4096)
                    if not data:
                        return
                    head += data
                await stream.send_all(reply(head, scrapes))
            except (trio.BrokenResourceError, trio.ClosedResourceError):  # the scraper went away
                return


class Scrapes:
    """The text each scrape gets, made in the run's loop, which does nothing else meanwhile: made
    again unless the last was made within REUSE_FACTOR times what making it took. Whatever the
    number of scrapers, and however many agents the figures cover (a run of 5,000 takes a third
    of a second a scrape), they take at most about a tenth of the loop; a run's usual figures take
    a millisecond, and are reused for ten at most."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._text = b""
        self._made = -math.inf
        self._took = 0.0

    def text(self) -> bytes:
        started = time.perf_counter()
        if started - self._made >= REUSE_FACTOR * self._took:
            self._text = exposition(self.registry)
            self._made, self._took = started, time.perf_counter() - started
        return self._text


def reply(head: bytes, scrapes: Scrapes) -> bytes:
    """The whole reply to a request whose head is `head`."""
    words = head.split(b"\n", 1)[0].split()
    if len(words) != 3 or not words[2].startswith(b"HTTP/"):
        return _reply(400, b"Bad Request", b"not an HTTP request\n")
    method, target = words[0], words[1]
    if target.split(b"?", 1)[0] != PATH:
        return _reply(404, b"Not Found", b"the metrics are at /metrics\n")
    if method not in (b"GET", b"HEAD"):
        return _reply(405, b"Method Not Allowed", b"GET /metrics\n", extra=b"Allow: GET, HEAD\r\n")
    body = scrapes.text()
    return _reply(200, b"OK", body, content_type=CONTENT_TYPE_PLAIN_0_0_4.encode(), head_only=method == b"HEAD")


def _reply(
    status: int,
    reason: bytes,
    body: bytes,
    *,
    content_type: bytes = b"text/plain; charset=utf-8",
    extra: bytes = b"",
    head_only: bool = False,
) -> bytes:
    head = b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n%s\r\n" % (
        status,
        reason,
        content_type,
        len(body),
        extra,
    )
    return head if head_only else head + body


async def publish(
    file: WholeFile, registry: CollectorRegistry, say: Callable[[str], None], *, seconds: float = FILE_SECONDS
) -> None:
    """Keep `file` holding the figures, replaced whole every `seconds`. Best effort: a write that
    fails is reported once and the run goes on without it."""
    while True:
        try:
            file.replace(exposition(registry))
        except (OutputClosed, OutputFailed) as failure:
            say(f"{failure}; the run goes on without it")
            return
        await trio.sleep(seconds)
