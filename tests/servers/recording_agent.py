"""A NeMo Gym agent stand-in on 127.0.0.1 that records what it is sent and answers as each row asks.

`POST /run` answers 200 with a result whose reward is the row's `"reward"` (default 1.0) and whose
`response.usage` counts the row's text. A row may carry `"answer": {...}`: those keys are merged into
the result (e.g. `{"_ng_failure_class": "x", "_ng_failure_terminal": true}` or `{"_ng_no_persist": true}`),
for the first `"answer_times"` requests of its (task, rollout) pair only when that is given.
`POST /aggregate_metrics` records the payload and answers NeMo Gym's shape with figures computed from it,
or the status given by `aggregate_status`.
"""

from __future__ import annotations

import collections
import json
import statistics
import threading
from typing import Any

from tests.conftest import QuietHandler, ThreadedHTTPServer


class RecordingAgent(ThreadedHTTPServer):
    def __init__(self, *, name: str | None = "agent", aggregate_status: int = 200) -> None:
        self.name = name
        self.bodies: list[dict[str, Any]] = []  # every /run body, in the order received
        self.raw_bodies: list[bytes] = []
        self.aggregate_payloads: list[dict[str, Any]] = []
        self.aggregate_answers: list[dict[str, Any]] = []
        self.aggregate_status = aggregate_status
        self._lock = threading.Lock()
        self._seen: collections.Counter[str] = collections.Counter()
        # A gate on the answers: `answers_left` /run requests are answered at once (None: all of
        # them); the others wait for `release`. `answered` is set once that many have been answered.
        self.answers_left: int | None = None
        self.answered = threading.Event()
        self.release = threading.Event()
        self.drop_waiting = False
        self.waiting = 0  # requests waiting for `release`
        self.hold_target = 1  # `answered` is set once this many wait
        agent = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.path == "/run":
                    with agent._lock:
                        wait = agent.answers_left is not None and agent.answers_left <= 0
                        if agent.answers_left is not None and not wait:
                            agent.answers_left -= 1
                        if not (wait and agent.drop_waiting):
                            agent.raw_bodies.append(body)
                    if wait:
                        with agent._lock:
                            agent.waiting += 1
                            if agent.waiting >= agent.hold_target:
                                agent.answered.set()
                        agent.release.wait(timeout=60)
                        if agent.drop_waiting:  # its client is gone: answer nothing, record nothing
                            self.close_connection = True
                            return
                    self.send_json(200, json.dumps(agent.run(json.loads(body))).encode())
                elif self.path == "/aggregate_metrics":
                    status, answer = agent.aggregate(json.loads(body))
                    self.send_json(status, json.dumps(answer).encode())
                else:
                    self.send_json(404, b'{"detail": "Not Found"}')

        super().__init__(Handler)
        self.run_url = self.url + "/run"

    def hold_after(self, answers: int, *, drop: bool = False, waiting: int = 1) -> None:
        """Answer `answers` /run requests, then hold every other until `release` is set (and
        then answer it, or with `drop` close its connection unanswered and unrecorded);
        `answered` is set once `waiting` requests wait."""
        self.answers_left = answers
        self.drop_waiting = drop
        self.waiting = 0
        self.hold_target = waiting
        self.answered.clear()
        self.release.clear()

    def close(self) -> None:
        self.release.set()
        super().close()

    def run(self, row: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            self.bodies.append(row)
            pair = json.dumps([row.get("_ng_task_index"), row.get("_ng_rollout_index")])
            self._seen[pair] += 1
            seen = self._seen[pair]
        text = json.dumps(row.get("responses_create_params", {}))
        result: dict[str, Any] = {
            "responses_create_params": row.get("responses_create_params", {}),
            "response": {
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "ok"}]}],
                "usage": {"input_tokens": len(text), "output_tokens": 2, "total_tokens": len(text) + 2},
            },
            "reward": row.get("reward", 1.0),
        }
        if self.name is not None:  # an agent that names itself in its results (not every one does)
            result["agent_ref"] = {"type": "responses_api_agents", "name": f"{self.name}-own-name"}
        times = row.get("answer_times")
        if isinstance(row.get("answer"), dict) and (times is None or seen <= times):
            result.update(row["answer"])
        return result

    def aggregate(self, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            self.aggregate_payloads.append(payload)
        if self.aggregate_status != 200:
            return self.aggregate_status, {"detail": "aggregation failed"}
        entries = payload["verify_responses"]
        rewards = [e["reward"] for e in entries]
        by_task: dict[Any, list[float]] = collections.defaultdict(list)
        for entry in entries:
            by_task[entry["_ng_task_index"]].append(entry["reward"])
        agent_metrics = {
            "mean/reward": statistics.fmean(rewards),
            "max/reward": max(rewards),
            "mean/output_tokens": statistics.fmean(e["response"]["usage"]["output_tokens"] for e in entries),
            "count": len(entries),
        }
        answer = {
            "agent_metrics": agent_metrics,
            "key_metrics": {k: v for k, v in agent_metrics.items() if k.startswith("mean/")},
            "group_level_metrics": [
                {"_ng_task_index": task, "mean/reward": statistics.fmean(values)}
                for task, values in sorted(by_task.items())
            ],
        }
        with self._lock:
            self.aggregate_answers.append(answer)
        return 200, answer
