"""The demo agent's answers: what a small NeMo Gym agent server makes of each request.

The reward is a function of the row, so a test can predict it: 1.0 when the text of
`responses_create_params.input` (a string, or the message contents joined with no
separator) has an even number of characters, else 0.0. A row may steer its own episode
with a `demo` object (agents ignore unknown keys): `{"reward": 0.5}`, `{"reward_p": 0.3}` (1.0 with
that probability, else 0.0: rollouts of one task then differ, as pass@k needs), `{"latency": 1.5}`,
`{"fault": "500" | "429" | "hang" | "garbage" | "drop" | "422"}`, and
`{"fault_first": N}` (the fault applies to the first N requests for that row only). Each rollout
of a row may be steered apart, by its `_ng_rollout_index` i: `{"rewards": [1, 0, 0.5]}` gives
rollout i the reward at i modulo the list's length (null: a result without a reward),
`{"latencies": [0.1, 2.5]}` its episode's length, and `{"faults": [null, "422"]}` its fault, on
its first attempt only (a resumed run's retry, which carries `_ng_attempt_index`, succeeds).
`{"fields": [{"mask_sample": true}, {}]}` adds the object at i to rollout i's result (what a
verifier says besides the reward: `mask_sample`, `reward_components`).

It is a resources server too, for `--reverify`: `POST /verify` answers the request with the same
reward, and `GET /reverify_mode` says `stateless`.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import random
from collections import Counter
from typing import Any

import msgspec
import trio

FAULTS = ("500", "429", "hang", "garbage", "drop", "422")
_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


@dataclasses.dataclass(frozen=True, slots=True)
class DemoOptions:
    """How the demo agent behaves: latency, and the rate of each injected fault (0..1)."""

    latency: float = 0.0
    jitter: float = 0.0
    fail_rate: float = 0.0  # 500 Internal Server Error
    throttle_rate: float = 0.0  # 429 with Retry-After
    retry_after: float = 1.0
    hang_rate: float = 0.0  # never answer
    garbage_rate: float = 0.0  # 200 with a body that is not JSON
    drop_rate: float = 0.0  # close the connection without an answer
    seed: int | None = None
    aggregate_groups: bool = True  # /aggregate_metrics answers per-task groups (memory grows with the tasks)
    capacity: int | None = None  # episodes at once; more are answered 429 with Retry-After at once
    slots: int | None = None  # episodes at once; more wait their turn in a queue, as a model server's do
    thrash: float = 0.0  # with slots: each episode slows by this share per `slots` in the system past twice them
    record_arrivals: bool = False  # /stats lists when each /run arrived (seconds after the first)
    # (seconds after the first /run, episodes at once from then on): --slots, or --capacity, as time goes
    schedule: tuple[tuple[float, int], ...] = ()


def input_text(row: dict[str, Any]) -> str:
    """The text of a row's `responses_create_params.input`: a string, or message contents joined."""
    params = row.get("responses_create_params")
    value = params.get("input") if isinstance(params, dict) else None
    if isinstance(value, str):
        return value
    parts: list[str] = []
    for item in value if isinstance(value, list) else []:
        content = item.get("content") if isinstance(item, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return "".join(parts)


def demo_reward(row: dict[str, Any], rng: random.Random | None = None) -> float | None:
    """The demo agent's reward for a row (see the module docstring); None: no reward at all."""
    steer = row.get("demo")
    by_rollout = _by_rollout(row, "rewards")
    if by_rollout is not _UNSTEERED:
        return None if by_rollout is None else float(by_rollout)
    if isinstance(steer, dict) and isinstance(steer.get("reward"), (int, float)):
        return float(steer["reward"])
    if isinstance(steer, dict) and isinstance(steer.get("reward_p"), (int, float)):
        return 1.0 if (rng or random).random() < steer["reward_p"] else 0.0
    return 1.0 if len(input_text(row)) % 2 == 0 else 0.0


_UNSTEERED = object()


def _by_rollout(row: dict[str, Any], key: str) -> Any:
    """The entry of the row's `demo[key]` list for its rollout index (see the module docstring),
    or _UNSTEERED."""
    steer = row.get("demo")
    values = steer.get(key) if isinstance(steer, dict) else None
    if not isinstance(values, list) or not values:
        return _UNSTEERED
    rollout = row.get("_ng_rollout_index")
    return values[(rollout if isinstance(rollout, int) else 0) % len(values)]


class _FixedDelay:
    """Waits of one fixed length, released in order by one timer task.

    With thousands of requests waiting at once, a trio.sleep() each (a cancel scope and a
    deadline apiece) was most of the demo agent's CPU; waits of equal length end in the
    order they began, so one task sleeping until the oldest is due can release them all.
    """

    def __init__(self) -> None:
        self._queue: collections.deque[tuple[float, trio.Event]] = collections.deque()
        self._kick = trio.Event()

    async def wait(self, seconds: float) -> None:
        done = trio.Event()
        self._queue.append((trio.current_time() + seconds, done))
        self._kick.set()
        await done.wait()

    async def serve(self) -> None:
        while True:
            if not self._queue:
                await self._kick.wait()
                self._kick = trio.Event()
                continue
            due = self._queue[0][0]
            if due > trio.current_time():
                await trio.sleep_until(due)
            now = trio.current_time()
            while self._queue and self._queue[0][0] <= now:
                self._queue.popleft()[1].set()


class DemoAgent:
    """The agent's behaviour, apart from HTTP: decides each answer, counts requests."""

    def __init__(self, options: DemoOptions = DemoOptions()) -> None:
        self.options = options
        self._rng = random.Random(options.seed)
        self.requests = 0
        self.throttled = 0  # answered 429 for being over --capacity
        self.running = 0  # episodes under way
        self.by_id: Counter[str] = Counter()
        self._seen: Counter[bytes] = Counter()
        self._next_id = 0
        self._fixed_delay = _FixedDelay()
        self.arrivals: list[float] = []  # with record_arrivals
        self.in_system = 0  # with slots: episodes running or queued
        self._slots = trio.CapacityLimiter(options.slots) if options.slots is not None else None
        self._first_run = trio.Event()  # the schedule's clock starts at the first /run
        self._first_run_at = 0.0
        self._last_answer_at = 0.0  # /stats' busy_s: from the first /run to the last answer

    def _fault(self, row: dict[str, Any], body: bytes) -> str | None:
        by_rollout = _by_rollout(row, "faults")
        if by_rollout in FAULTS and not row.get("_ng_attempt_index"):
            return str(by_rollout)
        steer = row.get("demo")
        if isinstance(steer, dict) and steer.get("fault") in FAULTS:
            first = steer.get("fault_first")
            if isinstance(first, int):
                key = hashlib.blake2b(body, digest_size=16).digest()
                self._seen[key] += 1
                return steer["fault"] if self._seen[key] <= first else None
            return str(steer["fault"])
        o = self.options
        draw = self._rng.random()
        for fault, rate in (
            ("500", o.fail_rate),
            ("429", o.throttle_rate),
            ("hang", o.hang_rate),
            ("garbage", o.garbage_rate),
            ("drop", o.drop_rate),
        ):
            if draw < rate:
                return fault
            draw -= rate
        return None

    async def answer(
        self, method: str, path: str, body: bytes | Aggregation
    ) -> tuple[int, list[tuple[str, str]], bytes] | str:
        """(status, headers, body) to send, or "drop" / "hang"."""
        if method == "GET" and path == "/stats":
            busy = self._last_answer_at - self._first_run_at if self._first_run.is_set() else 0.0
            stats = {"requests": self.requests, "throttled": self.throttled, "by_id": dict(self.by_id), "busy_s": busy}
            if self.options.record_arrivals:
                stats["arrivals"] = [at - self.arrivals[0] for at in self.arrivals]
            return 200, [], _encode(stats)
        if isinstance(body, Aggregation):
            return 200, [], _encode(body.answer())
        assert isinstance(body, bytes)
        if path == "/reverify_mode" and method == "GET":
            return 200, [], _encode("stateless")  # its reward is a function of the row alone
        if path == "/verify" and method == "POST":
            return self._verify(body)
        if path != "/run":
            return 404, [], _encode({"detail": "Not Found"})
        if method != "POST":
            return 405, [], _encode({"detail": "Method Not Allowed"})
        self.requests += 1
        if self.options.record_arrivals:
            self.arrivals.append(trio.current_time())
        try:
            return await self._answer_run(body)
        finally:
            self._last_answer_at = trio.current_time()

    def _verify(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        """A resources server's /verify: the request back, with the row's reward (as for /run)."""
        row = _row_of(body)
        if not isinstance(row, dict):
            return row
        reward = demo_reward(row, self._rng)
        return 200, [], _encode({**row, "reward": reward} if reward is not None else row)

    async def _answer_run(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes] | str:
        if not self._first_run.is_set():
            self._first_run.set()
            self._first_run_at = trio.current_time()
        if self.options.capacity is not None and self.running >= self._capacity_now():
            self.throttled += 1
            return 429, [("Retry-After", f"{self.options.retry_after:g}")], _encode({"detail": "over capacity"})
        if self._slots is None:
            self.running += 1
            try:
                return await self._run(body)
            finally:
                self.running -= 1
        self.in_system += 1
        self._capacity_now()
        try:
            async with self._slots:
                self.running += 1
                try:
                    return await self._run(body, self._slowdown())
                finally:
                    self.running -= 1
                    self._capacity_now()
        finally:
            self.in_system -= 1

    def _capacity_now(self) -> int:
        """Episodes at once by the schedule (slots or capacity), kept in the slots' limiter."""
        now = trio.current_time()
        capacity = self.options.slots if self.options.slots is not None else self.options.capacity or 0
        for after, episodes in self.options.schedule:
            if now - self._first_run_at >= after:
                capacity = episodes
        if self._slots is not None and self._slots.total_tokens != capacity:
            self._slots.total_tokens = capacity
        return capacity

    def _slowdown(self) -> float:
        """How much longer an episode starting now takes: past twice the slots in the system, a model
        server preempts and recomputes (its KV cache is full), and every running episode slows."""
        assert self._slots is not None
        slots = int(self._slots.total_tokens)
        return 1.0 + self.options.thrash * max(0, self.in_system - 2 * slots) / slots

    async def run_timers(self) -> None:
        """The timers beside `answer`, until cancelled: the end of episodes of the fixed --latency,
        and the schedule's changes."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._fixed_delay.serve)
            await self._first_run.wait()
            started = trio.current_time()
            for after, _ in self.options.schedule:
                await trio.sleep_until(started + after)
                self._capacity_now()

    async def _run(self, body: bytes, slowdown: float = 1.0) -> tuple[int, list[tuple[str, str]], bytes] | str:
        row = _row_of(body)
        if not isinstance(row, dict):
            return row
        if "id" in row:
            self.by_id[str(row["id"])] += 1
        steer = row["demo"] if isinstance(row.get("demo"), dict) else {}
        latency = self.options.latency + self._rng.uniform(0, self.options.jitter)
        if isinstance(steer.get("latency"), (int, float)):
            latency = float(steer["latency"])
        by_rollout = _by_rollout(row, "latencies")
        if isinstance(by_rollout, (int, float)):
            latency = float(by_rollout)
        latency *= slowdown
        if latency > 0:
            if latency == self.options.latency:
                await self._fixed_delay.wait(latency)
            else:
                await trio.sleep(latency)
        fault = self._fault(row, body)
        if fault in ("hang", "drop"):
            return fault
        if fault == "500":
            return 500, [], _encode({"detail": "model call failed (injected)"})
        if fault == "422":
            return 422, [], _encode({"detail": "bad input (injected)"})
        if fault == "429":
            return 429, [("Retry-After", f"{self.options.retry_after:g}")], _encode({"detail": "slow down"})
        if fault == "garbage":
            return 200, [("Content-Type", "text/html")], b"<html>502 Bad Gateway</html>"
        return 200, [], _encode(self._result(row))

    def _result(self, row: dict[str, Any]) -> dict[str, Any]:
        self._next_id += 1
        reward = demo_reward(row, self._rng)
        text = input_text(row)
        result = {
            "responses_create_params": row["responses_create_params"],
            "response": {
                "id": f"resp_demo_{self._next_id}",
                "object": "response",
                "model": "demo",
                "output": [
                    {
                        "type": "message",
                        "role": "assistant",
                        "status": "completed",
                        "content": [{"type": "output_text", "text": f"demo answer to {len(text)} characters"}],
                    }
                ],
                "usage": {"input_tokens": len(text) // 4, "output_tokens": 5, "total_tokens": len(text) // 4 + 5},
            },
            "reward": reward,
            "accuracy": reward is not None and reward >= 1.0,
        }
        if reward is None:
            del result["reward"]
        fields = _by_rollout(row, "fields")
        if isinstance(fields, dict):
            result.update(fields)
        return result


class Aggregation:
    """NeMo Gym's /aggregate_metrics over a body read as it streams in, never held whole.

    rollfilter sends one verify response a line, so each line is decoded as it completes;
    another client's body on one line is decoded whole at the end. Figures: count, mean, min,
    max and std of reward and of the usage token counts, and per-task mean reward groups.
    """

    def __init__(self, *, groups: bool) -> None:
        self._pending = b""
        self._whole: list[bytes] | None = None
        self._lines = 0
        self.count = 0
        self._sums: dict[str, float] = {}
        self._squares: dict[str, float] = {}
        self._min: dict[str, float] = {}
        self._max: dict[str, float] = {}
        self._groups: dict[Any, list[float]] | None = {} if groups else None

    def feed(self, data: bytes) -> None:
        if self._whole is not None:
            self._whole.append(data)
            return
        *lines, self._pending = (self._pending + data).split(b"\n")
        for line in lines:
            self._line(line)

    def _line(self, line: bytes) -> None:
        self._lines += 1
        line = line.strip().rstrip(b",")
        if self._lines == 1:
            if line != b'{"verify_responses":[':
                self._whole = [line]
            return
        if line and line != b"]}":
            self.add(_decode_entry(line))

    def add(self, entry: dict[str, Any]) -> None:
        self.count += 1
        response = entry.get("response")
        usage = response.get("usage") if isinstance(response, dict) else None
        usage = usage if isinstance(usage, dict) else {}
        figures = {"reward": entry.get("reward"), **{k: v for k, v in usage.items() if k.endswith("tokens")}}
        for key, value in figures.items():
            if isinstance(value, (int, float)):
                self._sums[key] = self._sums.get(key, 0.0) + value
                self._squares[key] = self._squares.get(key, 0.0) + value * value
                self._min[key] = min(self._min.get(key, value), value)
                self._max[key] = max(self._max.get(key, value), value)
        if self._groups is not None and isinstance(entry.get("reward"), (int, float)):
            self._groups.setdefault(entry.get("_ng_task_index"), []).append(entry["reward"])

    def answer(self) -> dict[str, Any]:
        if self._whole is not None:
            self._whole.append(self._pending)
            whole = _decode_entry(b"\n".join(self._whole))
            for entry in whole.get("verify_responses", []) if isinstance(whole.get("verify_responses"), list) else []:
                self.add(entry if isinstance(entry, dict) else {})
        elif self._pending:
            self._line(self._pending)
        agent_metrics: dict[str, Any] = {}
        for key, total in self._sums.items():
            mean = total / self.count
            agent_metrics[f"mean/{key}"] = mean
            agent_metrics[f"min/{key}"] = self._min[key]
            agent_metrics[f"max/{key}"] = self._max[key]
            agent_metrics[f"std/{key}"] = max(0.0, self._squares[key] / self.count - mean * mean) ** 0.5
        agent_metrics["count"] = self.count
        groups = [
            {"_ng_task_index": task, "mean/reward": sum(rewards) / len(rewards), "count": len(rewards)}
            for task, rewards in (self._groups or {}).items()
        ]
        return {
            "agent_metrics": agent_metrics,
            "key_metrics": {k: v for k, v in agent_metrics.items() if k.startswith("mean/")},
            "group_level_metrics": groups,
        }


def _decode_entry(data: bytes) -> dict[str, Any]:
    """A JSON object, or {} for anything else (the demo agent answers; it does not judge)."""
    try:
        value = _decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _row_of(body: bytes) -> dict[str, Any] | tuple[int, list[tuple[str, str]], bytes]:
    """The row a /run or /verify body holds, or the 422 answer when it holds none."""
    try:
        row = _decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return 422, [], _encode({"detail": "body is not JSON"})
    if not isinstance(row, dict) or not isinstance(row.get("responses_create_params"), dict):
        return 422, [], _encode({"detail": "responses_create_params is required"})
    return row
