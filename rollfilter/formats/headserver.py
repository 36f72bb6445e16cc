"""Agent names in a NeMo Gym head server's config, the answer to `GET /global_config_dict_yaml`
(`rollfilter.run.headserver` asks for it).

The answer is a JSON string holding YAML: the whole deployment config, API keys included.
It is parsed with yaml.safe_load and never printed; messages name agents, never values.
An agent NAME is found at config[NAME]["responses_api_agents"][<implementation>], whose
`host` and `port` give its base URL.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from typing import Any

import msgspec

from rollfilter.config import is_decimal
from rollfilter.errors import ServiceError
from rollfilter.redact import printable

AGENT_SERVER_TYPE = "responses_api_agents"
_INTERPOLATION = re.compile(r"^\$\{([^}]+)\}$")
# A host name or an IPv4 address (letters, digits, '-', '.', '_'), or an IPv6 address: what
# can stand between http:// and :port.
_HOST = re.compile(r"^(?:[A-Za-z0-9_.-]+|[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*)\Z")


@dataclasses.dataclass(frozen=True, slots=True)
class HeadServerAgents:
    """The agents a head server knows: name -> /run URL, and names lacking host or port."""

    urls: dict[str, str]
    incomplete: frozenset[str]

    def describe_known(self, at_most: int = 20) -> str:
        names = sorted(self.urls)
        shown = ", ".join(names[:at_most]) + (f", ... ({len(names)} in all)" if len(names) > at_most else "")
        return shown or "none"


def _resolve(value: Any, config: dict[str, Any]) -> Any:
    """A `${key}` or `${a.b}` value looked up in the config's top level (OmegaConf style)."""
    match = _INTERPOLATION.match(value) if isinstance(value, str) else None
    if match is None:
        return value
    node: Any = config
    for part in match.group(1).split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


def agents_from_config(config: Any, where: str = "the head server") -> HeadServerAgents:
    """Every responses_api_agents entry of a NeMo Gym config, by its top-level name.

    An entry without a host or a port is incomplete (its agent cannot be used). One whose
    host or port cannot make an agent URL (a port out of range or not an integer, a host
    that is not a host name) is a ServiceError naming `where` and the field, never its value
    (the config may hold secrets)."""
    urls: dict[str, str] = {}
    incomplete: set[str] = set()
    if not isinstance(config, dict):
        return HeadServerAgents(urls, frozenset())
    for name, url in _first_complete_servers(config, AGENT_SERVER_TYPE, where, "/run"):
        if url is None:
            incomplete.add(name)
        else:
            urls[name] = url
    return HeadServerAgents(urls, frozenset(incomplete - set(urls)))


def server_urls(config: dict[str, Any], server_type: str, where: str, *, path: str) -> dict[str, str]:
    """The first complete server of `server_type` of each top-level name in a NeMo Gym config, as
    `http://host:port` and `path`; names with no host or port are left out. ServiceError as
    `agents_from_config` raises it."""
    return {name: url for name, url in _first_complete_servers(config, server_type, where, path) if url is not None}


def _first_complete_servers(
    config: dict[str, Any], server_type: str, where: str, path: str
) -> Iterator[tuple[str, str | None]]:
    """Each top-level name that has servers of `server_type`, with the URL of its first one that
    gives a host and a port (None when none does); ServiceError for a host or port that cannot be used."""
    for name, entry in config.items():
        servers = entry.get(server_type) if isinstance(entry, dict) else None
        if not isinstance(servers, dict):
            continue
        for implementation, server in servers.items():
            if not isinstance(server, dict):
                continue
            host, port = _resolve(server.get("host"), config), _resolve(server.get("port"), config)
            if host is None or port is None or host == "":
                continue
            field = f"{printable(str(name))}.{server_type}.{printable(str(implementation))}"
            yield str(name), _agent_url(host, port, f"{where} gives {field}", path)
            break
        else:
            yield str(name), None


def _agent_url(host: Any, port: Any, where: str, path: str = "/run") -> str:
    """http://host:port/run (or `path`) from a config entry's values, or ServiceError naming the field."""
    if type(port) is str and is_decimal(port):
        port = int(port)
    if type(port) is not int or not 0 < port < 65536:
        raise ServiceError(f"{where}.port, which is not a TCP port (an integer from 1 to 65535)")
    if not isinstance(host, str) or not _HOST.match(host):
        raise ServiceError(f"{where}.host, which is not a host name or IP address")
    host = host.lower()  # a host name is case-insensitive: written as -u's URL would be (httpx lowers it)
    bracketed = f"[{host}]" if ":" in host else host
    return f"http://{bracketed}:{port}{path}"


def agents_from_answer(body: bytes, where: str) -> HeadServerAgents:
    """The agents in a head server's answer to /global_config_dict_yaml (a JSON string of
    YAML); ServiceError, naming `where`, for anything else it may answer."""
    return agents_from_config(config_from_answer(body, where), where)


def config_from_answer(body: bytes, where: str) -> dict[str, Any]:
    """The config in a head server's answer to /global_config_dict_yaml (a JSON string of YAML);
    ServiceError, naming `where`, for anything else it may answer."""
    import yaml  # only a run with a head server pays for importing it

    try:
        text = msgspec.json.decode(body)
        config = yaml.safe_load(text) if isinstance(text, str) else text
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError, ValueError, yaml.YAMLError):
        raise ServiceError(f"{where} answered something that is not its config (JSON string of YAML)") from None
    if not isinstance(config, dict):
        raise ServiceError(f"{where} answered a config that is not a mapping")
    return config
