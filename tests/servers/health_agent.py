"""An agent stand-in on 127.0.0.1 whose answers are healthy or look like an outage, as each row asks.

A row's `"health"` names the kind of answer: one of the health checks (its result fails that check
alone), `"outage"` (what an agent answers when its model server is down: no output, no tokens, a
failed response; three checks), or none for a healthy one. With `"health_times": N`, only the
first N requests of its (task, rollout) pair are answered so; later ones are healthy. Everything
else is as `RecordingAgent`'s (it records the bodies; `"reward"`, `"answer"`).
"""

from __future__ import annotations

import json
from typing import Any

from tests.servers.recording_agent import RecordingAgent

MESSAGE = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}
USAGE = {"input_tokens": 4, "output_tokens": 2, "total_tokens": 6}

# Each kind's response: each fails its own check and no other.
RESPONSES: dict[str, dict[str, Any]] = {
    "empty_output": {"output": [], "usage": USAGE},
    "no_output_tokens": {"output": [MESSAGE], "usage": {**USAGE, "output_tokens": 0}},
    "truncated": {
        "output": [MESSAGE],
        "usage": USAGE,
        "status": "incomplete",
        "incomplete_details": {"reason": "max_output_tokens"},
    },
    "response_error": {
        "output": [MESSAGE],
        "usage": USAGE,
        "status": "failed",
        "error": {"code": "server_error", "message": "the model server is down"},
    },
    "unanswered_tool_call": {
        "output": [{"type": "function_call", "call_id": "call_1", "name": "search", "arguments": "{}"}],
        "usage": USAGE,
    },
    "token_ids_mismatch": {
        "output": [
            {**MESSAGE, "prompt_token_ids": [1, 2], "generation_token_ids": [3, 4], "generation_log_probs": [-0.5]}
        ],
        "usage": USAGE,
    },
    "healthy": {"output": [MESSAGE], "usage": USAGE},
    "outage": {
        "output": [],
        "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0},
        "status": "failed",
        "error": {"code": "server_error", "message": "connection refused"},
    },
}
OUTAGE_CHECKS = ["empty_output", "no_output_tokens", "response_error"]


class HealthAgent(RecordingAgent):
    def run(self, row: dict[str, Any]) -> dict[str, Any]:
        result = super().run(row)
        kind = row.get("health")
        if kind is None:
            return result
        pair = json.dumps([row.get("_ng_task_index"), row.get("_ng_rollout_index")])
        with self._lock:
            seen = self._seen[pair]
        times = row.get("health_times")
        if times is None or seen <= times:
            result["response"] = RESPONSES[kind]
            result["reward"] = 0.0
        return result
