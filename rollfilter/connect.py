"""How a run reaches its agents and its head server: the request headers and the HTTP
transport its `Config` asks for.

It stands apart from client.py (one row's POST) so that everything that talks HTTP (the
run, the head server, /aggregate_metrics) builds its transport the same way, without
importing the rows' client.
"""

from __future__ import annotations

from collections.abc import Callable

from rollfilter import __version__
from rollfilter.config import Config, ConfigError
from rollfilter.http import AgentTransport, ca_file_problem, open_transport
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


def transport_for(config: Config, on_warning: Callable[[str], None] | None = None) -> AgentTransport:
    """The transport a run sends through, as `config` asks (TLS checks, headers, --proxy);
    `on_warning` gets its one-line warnings (a server that sent bytes nobody asked for),
    escaped for a terminal.

    ConfigError when `config.cacert` is no readable PEM file of certificates: the file is read
    here, at the edge where the transport is built, so that a run refuses it before any row."""
    if config.cacert is not None and (problem := ca_file_problem(config.cacert)) is not None:
        raise ConfigError("cacert", f"{config.cacert} {problem}")
    warn = None if on_warning is None else lambda line: on_warning(printable(line))
    return open_transport(
        on_warning=warn,
        verify=not config.insecure,
        cafile=config.cacert,
        connect_timeout=config.timeouts.connect,
        headers=request_headers(config),
        proxy=config.proxy,
        max_reply_bytes=config.max_reply_bytes,
    )
