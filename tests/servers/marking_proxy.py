"""A proxy on 127.0.0.1 in front of a real NeMo Gym deployment that turns some real answers into agent failures.

It has two listeners. `head` forwards to a head server, and in the config that `GET /global_config_dict_yaml`
answers it points the agent found at the upstream agent port at its own `agent` listener instead. `agent`
forwards every request to the upstream agent; a `/run` answer whose body `mark(body)` gives keys for
(`_ng_failure_class`, and `_ng_failure_terminal` on some) comes back with those keys added, so a client sees
a real episode reported as a failure by its agent, as an agent that failed would report it.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Callable
from typing import Any

import yaml

from tests.conftest import QuietHandler, ThreadedHTTPServer

UPSTREAM_TIMEOUT = 300  # seconds: one episode through the real stack, bounded
Marks = Callable[[dict[str, Any]], dict[str, Any]]


def forward(port: int, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=UPSTREAM_TIMEOUT)
    try:
        connection.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


class MarkingProxy:
    def __init__(self, *, head_port: int, agent_port: int, mark: Marks) -> None:
        self.marked: list[dict[str, Any]] = []  # every /run body whose answer was marked, in order
        self._lock = threading.Lock()
        proxy = self

        class AgentHandler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                status, answer = forward(agent_port, "POST", self.path, body)
                if self.path == "/run" and status == 200:
                    answer = proxy.marked_answer(json.loads(body), answer)
                self.send_json(status, answer)

        class HeadHandler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                status, answer = forward(head_port, "GET", self.path, None)
                if self.path == "/global_config_dict_yaml" and status == 200:
                    answer = proxy.config_through_proxy(answer, agent_port)
                self.send_json(status, answer)

        self.agent = ThreadedHTTPServer(AgentHandler)
        self.head = ThreadedHTTPServer(HeadHandler)
        self.head_port = self.head.server.server_address[1]
        self.mark = mark

    def marked_answer(self, body: dict[str, Any], answer: bytes) -> bytes:
        keys = self.mark(body)
        if not keys:
            return answer
        with self._lock:
            self.marked.append(body)
        return json.dumps({**json.loads(answer), **keys}).encode()

    def config_through_proxy(self, answer: bytes, agent_port: int) -> bytes:
        # The head answers a JSON string whose content is the YAML of the whole deployment.
        config = yaml.safe_load(json.loads(answer))
        own_port = self.agent.server.server_address[1]
        for server in config.values():
            agents = server.get("responses_api_agents") if isinstance(server, dict) else None
            for instance in (agents or {}).values():
                if isinstance(instance, dict) and int(instance.get("port") or -1) == agent_port:
                    instance["host"], instance["port"] = "127.0.0.1", own_port
        return json.dumps(yaml.safe_dump(config, sort_keys=False)).encode()

    def close(self) -> None:
        self.head.close()
        self.agent.close()
