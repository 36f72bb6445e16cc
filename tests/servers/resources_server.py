"""A NeMo Gym resources server stand-in on 127.0.0.1: `/verify` scores a response by a known function.

`POST /verify` answers the request's `responses_create_params` and `response` (as NeMo Gym's
`BaseVerifyResponse` gives them back; its other keys are dropped) and `reward = verify_reward(body)`:
1.0 when the response's output text holds the body's `expected`, else 0.0. A body whose `expected`
is listed in `failing` is answered 500; one in `judge_failing` is answered 200 with
`_ng_failure_class: judge_failed`. Each answer waits `latency` s. `GET /reverify_mode` answers
`mode` as a JSON string (or `mode_body`, as it is), or with `mode_status` that status (404: a server
older than the endpoint). Under `prefix` (`/prefix`), both are there and nothing is at the root.
Every /verify body is recorded.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from typing import Any

from tests.conftest import QuietHandler, ThreadedHTTPServer


def output_text(response: Any) -> str:
    """The text of a Responses object's message items, joined."""
    items = response.get("output", []) if isinstance(response, dict) else []
    parts = [part for item in items if isinstance(item, dict) for part in item.get("content", [])]
    return "".join(part["text"] for part in parts if isinstance(part, dict) and isinstance(part.get("text"), str))


def verify_reward(body: dict[str, Any]) -> float:
    return 1.0 if str(body.get("expected")) in output_text(body.get("response")) else 0.0


class ResourcesServer(ThreadedHTTPServer):
    def __init__(self, *, mode: str = "stateless", mode_status: int = 200, prefix: str = "") -> None:
        self.mode = mode
        self.mode_status = mode_status
        self.prefix = prefix
        self.bodies: list[dict[str, Any]] = []
        self.mode_asked = 0
        self.mode_body: bytes | None = None  # /reverify_mode's answer as given, in place of `mode` as JSON
        self.failing: set[str] = set()
        self.judge_failing: set[str] = set()
        self.latency = 0.0
        self._lock = threading.Lock()
        server = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:
                if self.path == server.prefix + "/reverify_mode":
                    with server._lock:
                        server.mode_asked += 1
                    if server.mode_status != 200:
                        self.send_json(server.mode_status, b'{"detail": "no mode here"}')
                        return
                    self.send_json(200, server.mode_body or json.dumps(server.mode).encode())
                else:
                    self.send_json(404, b'{"detail": "Not Found"}')

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                if self.path != server.prefix + "/verify":
                    self.send_json(404, b'{"detail": "Not Found"}')
                    return
                with server._lock:
                    server.bodies.append(body)
                time.sleep(server.latency)
                if str(body.get("expected")) in server.failing:
                    self.send_json(500, b'{"detail": "judge unreachable"}')
                    return
                # As NeMo Gym's BaseVerifyResponse (pydantic, unknown fields ignored) serializes it.
                answer = {key: body[key] for key in ("responses_create_params", "response") if key in body}
                answer["reward"] = verify_reward(body)
                if str(body.get("expected")) in server.judge_failing:
                    answer["_ng_failure_class"] = "judge_failed"
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client killed mid-way
                    self.send_json(200, json.dumps(answer).encode())

        super().__init__(Handler)
