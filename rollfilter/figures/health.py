"""A rollout's health: whether its result looks like an outage behind the agent rather than the
model's own answer.

When the model server behind an agent fails, most agents still answer `/run` with a 200: an empty
output, no tokens, a response that says it failed, and a reward of 0, which reads as the model's
honest zero. `failed_checks` judges a result as it is received, in one pass over its
`response.output`, by six checks whose names are part of the interface (a result line carries
those it failed under `_rf_health`, see `rollfilter.rows.HEALTH`):

- `empty_output`: `response.output` has no item;
- `no_output_tokens`: `response.usage.output_tokens` is 0;
- `truncated`: `response.status` is `incomplete` (a generation cut at its token bound);
- `response_error`: `response.status` is `failed` or `cancelled`, or `response.error` is set (not
  null, false or empty);
- `unanswered_tool_call`: a `function_call` item with no `function_call_output` of its `call_id`
  after it;
- `token_ids_mismatch`: an output item carries some but not all of `prompt_token_ids`,
  `generation_token_ids` and `generation_log_probs`, or the last two differ in length (NeMo Gym
  holds that token metadata comes whole).

A result without a `response` object is judged by none of them: there is nothing to judge.
`RecentShare` is the window that a rate limit on unhealthy or masked rollouts looks at.
"""

from __future__ import annotations

import collections
from typing import Any

from rollfilter.rows import HEALTH

EMPTY_OUTPUT = "empty_output"
NO_OUTPUT_TOKENS = "no_output_tokens"
TRUNCATED = "truncated"
RESPONSE_ERROR = "response_error"
UNANSWERED_TOOL_CALL = "unanswered_tool_call"
TOKEN_IDS_MISMATCH = "token_ids_mismatch"
CHECKS = (EMPTY_OUTPUT, NO_OUTPUT_TOKENS, TRUNCATED, RESPONSE_ERROR, UNANSWERED_TOOL_CALL, TOKEN_IDS_MISMATCH)

PROMPT_TOKEN_IDS = "prompt_token_ids"
GENERATION_TOKEN_IDS = "generation_token_ids"
GENERATION_LOG_PROBS = "generation_log_probs"

# A rate limit looks at the last this many ended rollouts: an outage after a long healthy run is
# caught within about this many, where a rate over the whole run would take ages to move.
WINDOW = 100
# ... and judges nothing before this many have ended, as NeMo Gym's guard on masked samples waits
# for enough of them: three bad rollouts of the first five are no outage.
WINDOW_MINIMUM = 50


def failed_checks(result: dict[str, Any]) -> list[str] | None:
    """The checks `result` fails, in the order of CHECKS; None when it is healthy (or has no
    `response` to judge)."""
    # On the path of every result: the output items are scanned here, not in a helper.
    response = result.get("response")
    if type(response) is not dict:
        return None
    failed: list[str] | None = None
    output = response.get("output")
    if not output:
        failed = [EMPTY_OUTPUT]
    usage = response.get("usage")
    if type(usage) is dict and "output_tokens" in usage:
        tokens = usage["output_tokens"]
        if tokens == 0 and tokens is not False:
            failed = _with(failed, NO_OUTPUT_TOKENS)
    status = response.get("status")
    status_failed = False
    if status is not None:  # a comparison of None with a string costs more than this test
        if status == "incomplete":
            failed = _with(failed, TRUNCATED)
        status_failed = status == "failed" or status == "cancelled"  # a generation the server gave up
    if status_failed or response.get("error"):  # null, false or "": no error
        failed = _with(failed, RESPONSE_ERROR)
    if type(output) is not list:
        return failed
    calls: set[Any] | None = None
    mismatch = False
    for item in output:
        if type(item) is not dict:
            continue
        kind = item.get("type")
        if kind == "function_call":
            if calls is None:
                calls = set()
            calls.add(_hashable(item.get("call_id")))
        elif calls and kind == "function_call_output":
            calls.discard(_hashable(item.get("call_id")))
        if not mismatch and (PROMPT_TOKEN_IDS in item or GENERATION_TOKEN_IDS in item or GENERATION_LOG_PROBS in item):
            mismatch = _token_ids_mismatch(item)
    if calls:
        failed = _with(failed, UNANSWERED_TOOL_CALL)
    if mismatch:
        failed = _with(failed, TOKEN_IDS_MISMATCH)
    return failed


def verdict_of_line(line: dict[str, Any]) -> list[str] | None:
    """The checks a result line read back fails: judged again from its `response`, or, when the
    line has none (cut by a jq filter, say), the `_rf_health` the run that wrote it gave it."""
    if type(line.get("response")) is dict:
        return failed_checks(line)
    written = line.get(HEALTH)
    if type(written) is not list:
        return None
    return [check for check in CHECKS if check in written] or None


def _with(failed: list[str] | None, check: str) -> list[str]:
    if failed is None:
        return [check]
    failed.append(check)
    return failed


def _hashable(value: Any) -> Any:
    return value if value is None or type(value) in (str, int, float, bool) else repr(value)


def _token_ids_mismatch(item: dict[str, Any]) -> bool:
    if not (PROMPT_TOKEN_IDS in item and GENERATION_TOKEN_IDS in item and GENERATION_LOG_PROBS in item):
        return True
    generated, log_probs = item[GENERATION_TOKEN_IDS], item[GENERATION_LOG_PROBS]
    if type(generated) is list and type(log_probs) is list:
        return len(generated) != len(log_probs)
    return False


class RecentShare:
    """The share of the last WINDOW ended rollouts that were of a kind (unhealthy, masked), for a
    limit given as a rate; None until WINDOW_MINIMUM have ended."""

    __slots__ = ("_flags", "count")

    def __init__(self) -> None:
        self._flags: collections.deque[bool] = collections.deque(maxlen=WINDOW)
        self.count = 0  # of the kind, in the window

    def add(self, flag: bool) -> None:
        flags = self._flags
        if len(flags) == WINDOW and flags[0]:
            self.count -= 1
        flags.append(flag)
        self.count += flag

    def share(self) -> float | None:
        ended = len(self._flags)
        return self.count / ended if ended >= WINDOW_MINIMUM else None

    def __len__(self) -> int:
        return len(self._flags)
