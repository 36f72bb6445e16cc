"""A NeMo Gym agent stand-in on 127.0.0.1 that logs when each /run arrives and how many were in
flight then, and answers after the row's `"latency"` seconds (default 0.3) with reward 1.0.

Requests wait at `gate` before their episode starts while it is closed (clear); it is open at
first, and `close()` opens it. `in_flight` drops just before a reply is sent, so that it never
counts more than the client has out; a reply it no longer counts may still be on its way, so a
test that needs to know what the client has received asks the client (its --control status).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time

from tests.conftest import SUBPROCESS_TIMEOUT, QuietHandler, ThreadedHTTPServer


@dataclasses.dataclass(frozen=True)
class Arrival:
    time: float  # time.monotonic() when the request had been read whole
    in_flight: int  # requests the agent was handling then, this one included


class ArrivalsAgent(ThreadedHTTPServer):
    def __init__(self) -> None:
        self.arrivals: list[Arrival] = []
        self.in_flight = 0
        self.gate = threading.Event()
        self.gate.set()
        self._lock = threading.Lock()
        agent = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                row = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))))
                with agent._lock:
                    agent.in_flight += 1
                    agent.arrivals.append(Arrival(time.monotonic(), agent.in_flight))
                try:
                    agent.gate.wait(timeout=SUBPROCESS_TIMEOUT)
                    time.sleep(float(row.get("latency", 0.3)))
                finally:
                    with agent._lock:
                        agent.in_flight -= 1
                self.send_json(200, json.dumps({"reward": 1.0, "id": row.get("id")}).encode())

        super().__init__(Handler)
        self.run_url = self.url + "/run"

    def close(self) -> None:
        self.gate.set()
        super().close()

    def arrived_after(self, moment: float) -> list[Arrival]:
        with self._lock:
            return [arrival for arrival in self.arrivals if arrival.time > moment]
