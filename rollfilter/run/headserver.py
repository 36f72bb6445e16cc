"""A run's one request to a NeMo Gym head server: `GET /global_config_dict_yaml`, through the
run's transport, bounded in time; the agents' addresses read from its answer
(`rollfilter.formats.headserver`) under the run's own `-e` endpoints."""

from __future__ import annotations

from typing import Any

import httpx
import trio

from rollfilter.config import Config, endpoint_beside
from rollfilter.errors import ServiceError, UsageError
from rollfilter.formats.headserver import HeadServerAgents, agents_from_config, config_from_answer
from rollfilter.http import AgentTransport
from rollfilter.redact import origin, printable

HEAD_SERVER_TIMEOUT = 30.0  # seconds for the one config fetch, connecting included


async def fetch_agents(base_url: str, transport: AgentTransport) -> HeadServerAgents:
    """Fetch and parse the head server's config once; ServiceError when it cannot be had.
    The caller bounds the wait (a trio cancel scope)."""
    where = f"the head server at {origin(base_url)}"
    return agents_from_config(await fetch_config(base_url, transport), where)


async def fetch_config(base_url: str, transport: AgentTransport) -> dict[str, Any]:
    """The head server's whole config (never to be printed: it may hold secrets); ServiceError
    when it cannot be had. The caller bounds the wait (a trio cancel scope)."""
    where = f"the head server at {origin(base_url)}"
    try:
        url = endpoint_beside(base_url, "/global_config_dict_yaml", replacing=())  # the query kept
        reply = await transport.request(b"GET", httpx.URL(url), to_agent=False)
    except httpx.RemoteProtocolError as exc:
        raise ServiceError(f"{where} answered badly: {printable(str(exc))}") from None
    except httpx.TransportError as exc:
        raise ServiceError(f"cannot reach {where}: {printable(str(exc))}") from None
    except httpx.InvalidURL:
        raise ServiceError(f"cannot reach {where}: not a URL") from None
    if reply.status != 200:
        raise ServiceError(f"{where} answered HTTP {reply.status} for /global_config_dict_yaml")
    return config_from_answer(reply.body, where)


async def resolve_endpoints(
    config: Config, transport: AgentTransport
) -> tuple[dict[str, tuple[str, ...]], HeadServerAgents | None]:
    """-e endpoints, over the head server's agents when there is one (explicit -e wins).
    The head server is asked through `transport`, the run's: --proxy, the TLS options, the -H
    headers (but Host) and the bounds apply to it too."""
    if config.head_server is None:
        return dict(config.endpoints), None
    with trio.move_on_after(HEAD_SERVER_TIMEOUT) as scope:
        head = await fetch_agents(config.head_server, transport)
    if scope.cancelled_caught:
        raise ServiceError(
            f"the head server at {origin(config.head_server)} did not answer in {HEAD_SERVER_TIMEOUT:g} s"
        )
    endpoints: dict[str, tuple[str, ...]] = {name: (url,) for name, url in head.urls.items()}
    endpoints.update(config.endpoints)
    if config.agent is not None and config.agent not in endpoints and config.url is None:
        if config.agent in head.incomplete:
            raise UsageError(f"agent {config.agent!r} has no host and port in the head server's config")
        raise UsageError(f"agent {config.agent!r} is not known to the head server (it knows: {head.describe_known()})")
    return endpoints, head
