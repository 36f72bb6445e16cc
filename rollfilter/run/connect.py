"""How a run reaches its agents and its head server: the request headers and the HTTP
transport its `Config` asks for.

It stands apart from client.py (one row's POST) so that everything that talks HTTP (the
run, the head server, /aggregate_metrics) builds its transport the same way, without
importing the rows' client.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

from rollfilter._version import __version__
from rollfilter.config import Config, ConfigError
from rollfilter.http import AgentTransport, CaFileError, open_transport, tls_context
from rollfilter.redact import printable


def request_headers(config: Config) -> list[tuple[str, str]]:
    """The headers sent with every row: JSON, gzip, our User-Agent, then the user's -H.
    An -H header replaces rollfilter's own of the same name, and an empty one (`-H 'Accept:'`)
    removes it, as curl's do."""
    given = {name.lower() for name, _ in config.headers}
    own = [
        ("Content-Type", "application/json"),
        ("Accept", "application/json"),
        ("Accept-Encoding", "gzip"),
        ("User-Agent", f"rollfilter/{__version__}"),
    ]
    return [
        *(header for header in own if header[0].lower() not in given),
        *(header for header in config.headers if header[1]),
    ]


def tls_context_for(config: Config) -> ssl.SSLContext | None:
    """The TLS context `config.tls` asks for, with its CA file read now; None when it asks for
    nothing but the system's trust store, which the transport loads on its first https URL.

    ConfigError naming `Config.tls.cacert` when that file is no readable PEM file of
    certificates. It reads the file: call it at the edge, once a run, before anything is written."""
    tls = config.tls
    if tls.cacert is None and not tls.insecure:
        return None
    try:
        return tls_context(verify=not tls.insecure, cafile=tls.cacert)
    except CaFileError as exc:
        raise ConfigError("tls.cacert", f"{tls.cacert} {exc.problem}") from None


def transport_for(
    config: Config, *, tls: ssl.SSLContext | None = None, on_warning: Callable[[str], None] | None = None
) -> AgentTransport:
    """The transport a run sends through, as `config` asks (TLS checks, headers, --proxy);
    `on_warning` gets its one-line warnings (a server that sent bytes nobody asked for),
    escaped for a terminal.

    `tls` is the run's context from `tls_context_for(config)`, so that a run reads its CA file
    once; without it, it is made here (ConfigError as there)."""
    if tls is None:
        tls = tls_context_for(config)
    warn = None if on_warning is None else lambda line: on_warning(printable(line))
    return open_transport(
        on_warning=warn,
        tls=tls,
        connect_timeout=config.timeout.connect,
        headers=request_headers(config),
        proxy=config.wire.proxy,
        max_reply_bytes=config.wire.max_reply_bytes,
    )
