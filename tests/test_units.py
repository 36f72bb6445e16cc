"""Fast unit tests of the pure parts: parsing, planning, metrics, backoff, reordering."""

from __future__ import annotations

import collections
import fractions
import itertools
import json
import math
import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from typing import Any

import httpx
import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from rollfilter.client import backoff_delay, parse_retry_after
from rollfilter.config import (
    CommandConfig,
    Config,
    ConfigError,
    FailureLimit,
    agent_url,
    parse_endpoints,
    parse_failure_limit,
    parse_header,
    parse_param,
    parse_statuses,
)
from rollfilter.errors import ErrorKind, UsageError
from rollfilter.keytable import KeyTable
from rollfilter.metrics import LatencyHistogram, Metrics
from rollfilter.outcomes import AttemptFailure
from rollfilter.plan import Planner, TaskNumbering
from rollfilter.resume import ResumeState, drop_torn_tail
from rollfilter.routing import Router
from rollfilter.rows import apply_params, parse_row
from rollfilter.sinks import Reorderer
from rollfilter.source import LineReader
from tests.conftest import run


def test_parse_param_takes_json_else_string():
    assert parse_param("temperature=0.7") == ("temperature", 0.7)
    assert parse_param("model=my-model") == ("model", "my-model")
    assert parse_param("tools=[]") == ("tools", [])
    assert parse_param("x=") == ("x", "")
    assert parse_param("stop=null") == ("stop", None)
    for bad in ("novalue", "=3", "a..b=1"):
        with pytest.raises(UsageError):
            parse_param(bad)


def test_agent_url_appends_run_only_without_a_path():
    assert agent_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/run"
    assert agent_url("http://127.0.0.1:8000/") == "http://127.0.0.1:8000/run"
    assert agent_url("https://h/agents/x/run") == "https://h/agents/x/run"
    for bad in ("127.0.0.1:8000", "ftp://h/", "http://h:99999/"):
        with pytest.raises(UsageError):
            agent_url(bad)


def test_endpoints_collect_replicas():
    endpoints = parse_endpoints(["a=http://h:1", "a=http://h:2,http://h:3", "b=http://h:4/x"])
    assert endpoints == {"a": ("http://h:1/run", "http://h:2/run", "http://h:3/run"), "b": ("http://h:4/x",)}
    with pytest.raises(UsageError):
        parse_endpoints(["nourl"])


def test_header_parsing_never_echoes_the_value():
    assert parse_header("Authorization: Bearer abc") == ("Authorization", "Bearer abc")
    for bad in ("Bad Name: secret-value", "X-Token: secret-value\r\nInjected: 1"):
        with pytest.raises(UsageError) as info:
            parse_header(bad)
        assert "secret-value" not in str(info.value)


def test_statuses_and_failure_limits():
    assert parse_statuses("429, 503") == {429, 503}
    assert parse_statuses("") == frozenset()
    with pytest.raises(UsageError):
        parse_statuses("abc")
    assert parse_failure_limit("5") == FailureLimit(count=5)
    assert parse_failure_limit("2.5%") == FailureLimit(fraction=0.025)
    for bad in ("0", "-1", "101%", "x%", "nan%"):
        with pytest.raises(UsageError):
            parse_failure_limit(bad)
    rate = FailureLimit(fraction=0.1)
    assert not rate.is_reached(failed=5, ended=10)  # too few ended rows to judge a rate
    assert rate.is_reached(failed=3, ended=20)
    assert not rate.is_reached(failed=1, ended=20)


def test_config_refuses_resume_without_output():
    with pytest.raises(UsageError, match=r"^CommandConfig\.resume needs CommandConfig\.output"):
        CommandConfig(Config(url="http://h/run"), resume=True)


def test_config_errors_name_the_field_and_the_command_line_names_the_option():
    with pytest.raises(ConfigError, match=r"^Config\.concurrency must be at least 1$") as caught:
        Config(url="http://h/run", concurrency=0)
    assert caught.value.field == "concurrency"
    proc = run(["-u", "http://127.0.0.1:9", "-j", "1", "--shard", "3/2"])
    assert proc.stderr.decode() == "rollfilter: --shard I/N wants 0 <= I < N\n"


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"{", "invalid JSON"),
        (b"\xef\xbb\xbf{}", "byte order mark"),
        (b'{"a": "\xff"}', "invalid UTF-8"),
        (b"[]", "a JSON array"),
        (b"3", "a JSON number"),
        (b"null", "a JSON null"),
        (b'{"a": NaN}', "NaN and Infinity"),
        (b'{"a": 1e400}', "invalid JSON"),
        (b"[" * 50_000, "invalid JSON"),
    ],
)
def test_parse_row_reasons(line: bytes, reason: str):
    parsed = parse_row(line)
    assert isinstance(parsed, str)
    assert reason in parsed


def test_parse_row_keeps_big_integers_and_key_order():
    assert parse_row(b'{"b": 1, "a": 123456789012345678901234567890}') == {
        "b": 1,
        "a": 123456789012345678901234567890,
    }


def test_apply_params_dotted_and_conflicts():
    row: dict[str, Any] = {"responses_create_params": {"input": "x", "reasoning": "flat"}}
    assert apply_params(row, [("temperature", 0.5), ("text.format", "json")]) is None
    assert row["responses_create_params"]["text"] == {"format": "json"}
    assert apply_params(row, [("reasoning.effort", "high")]) is not None


def test_latency_percentiles_within_one_percent():
    histogram = LatencyHistogram()
    values = [i / 1000 for i in range(1, 1001)]
    random.Random(1).shuffle(values)
    for value in values:
        histogram.add(value)
    for p, exact in ((50, 0.5), (90, 0.9), (99, 0.99)):
        assert abs(histogram.percentile(p) - exact) <= exact * 0.011
    assert histogram.max == 1.0


def test_metrics_means_skip_non_numbers_and_count_booleans():
    metrics = Metrics()
    metrics.add_result({"reward": 1.0, "accuracy": True, "note": "x", "score": float("nan")}, 0.1)
    metrics.add_result({"reward": 0, "accuracy": False, "score": 3}, 0.2)
    metrics.add_result({"accuracy": True}, 0.3)
    metrics.add_failure(AttemptFailure(ErrorKind.TIMEOUT, "slow"))
    summary = metrics.summary()
    assert summary["reward"] == 0.5
    assert summary["accuracy"] == 2 / 3
    assert summary["score"] == 3.0
    assert "note" not in summary
    assert summary["rollfilter"]["failed_by_kind"] == {"timeout": 1}
    assert list(summary)[-1] == "rollfilter"
    assert Metrics().summary()["reward"] is None  # no result: no mean, rather than a mean of 0


def test_retry_after_seconds_and_dates():
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    now = datetime(2026, 1, 1, tzinfo=UTC)
    date = format_datetime(now + timedelta(seconds=30), usegmt=True)
    assert parse_retry_after(date, now=now.timestamp()) == pytest.approx(30)


def test_backoff_is_jittered_capped_and_never_under_retry_after():
    rng = random.Random(0)
    delays = [backoff_delay(1, rng) for _ in range(200)]
    assert all(0 <= d <= 0.5 for d in delays)
    assert len(set(delays)) > 100
    assert all(backoff_delay(30, rng) <= 30 for _ in range(50))
    assert backoff_delay(1, rng, retry_after=2.0) >= 2.0


def test_router_prefers_named_endpoint_then_url():
    config = Config(url="http://d/run", endpoints={"a": ("http://a/run",)})
    router = Router(config)
    route = router.route("a")
    assert not isinstance(route, AttemptFailure)
    assert route.replicas[0].url == httpx.URL("http://a/run")
    route = router.route("other")
    assert not isinstance(route, AttemptFailure)
    assert route.name is None
    assert isinstance(Router(Config(endpoints={"a": ("http://a/run",)})).route(None), AttemptFailure)


def test_reorderer_emits_in_sequence():
    out: list[int] = []
    reorderer = Reorderer()
    for seq in (2, 0, 3, 1, 5):
        reorderer.emit(seq, lambda s=seq: out.append(s))
    assert out == [0, 1, 2, 3]  # 5 is held behind the 4 that never came
    reorderer.flush()
    assert out == [0, 1, 2, 3, 5]


def test_resume_index_and_torn_tail(tmp_path):
    path = tmp_path / "out.jsonl"
    lines = [json.dumps({"_ng_task_index": t, "_ng_rollout_index": k}) for t in (0, 5, 9) for k in (0, 1)]
    path.write_text("\n".join(lines) + "\n" + '{"_ng_task_index": 7, "_ng_rol')
    assert drop_torn_tail(str(path)) == len('{"_ng_task_index": 7, "_ng_rol')
    state = ResumeState.from_files(str(path), None)
    assert state.done_pairs == 6
    assert state.decide(5, 1) == ResumeState.DONE
    assert state.decide(7, 0) == 0  # the torn line's pair runs again
    assert state.decide(9, 2) == 0
    state.add_done("odd-index", 0)
    assert state.decide("odd-index", 0) == ResumeState.DONE
    assert state.decide("odd-index", 1) == 0


class ChunkedReads:
    """Stands in for os.read: hands out predetermined chunks, then EOF."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    def __call__(self, fd: int, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


LINES = st.lists(
    st.one_of(
        st.just(b'{"responses_create_params": {"input": "x"}}'),
        st.just(b""),
        st.just(b"   "),
        st.just(b"{bad"),
        st.just(b"{bad\0"),  # the same text with a NUL: another line, with a newline or without
        st.just(b"[1]"),
        st.just(b'{"a": "\xff"}'),
        st.just(b'{"responses_create_params": {"input": "' + b"y" * 80 + b'"}}'),  # over the limit
        st.binary(max_size=30).filter(lambda b: b"\n" not in b),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(lines=LINES, cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=20), newline_at_end=st.booleans())
def test_any_chunking_gives_the_same_jobs_and_line_numbers(lines: list[bytes], cuts: list[int], newline_at_end: bool):
    data = b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points) if b > a]

    async def plan() -> list[tuple[int, int, bool]]:
        reader = LineReader(["-"], max_line_bytes=64, read=ChunkedReads(chunks))
        planner = Planner(reader, Config(url="http://h/run", repeats=2))
        jobs = []
        while (job := await planner.next_job()) is not None:
            jobs.append((job.line, job.task_index, job.rollout_index, job.failure is None))
        return jobs

    jobs = trio.run(plan)
    expected = []
    tasks: dict[bytes, int] = {}  # NeMo Gym's numbering: identical lines share a task...
    next_task = 0
    next_rollout: dict[int, int] = {}  # ...and its rollouts count on
    for number, line in enumerate(data.split(b"\n") if data else [], start=1):
        if not line.strip() or (number == len(data.split(b"\n")) and not line):
            continue
        ok = len(line) <= 64 and isinstance(parse_row(line.strip()), dict)
        # A line too long to keep gets an index of its own; NeMo Gym reads each line with its
        # newline, so a last line without one is not the same text as a line with one.
        text = line + b"\n" if number < len(data.split(b"\n")) else line
        task = next_task if len(line) > 64 else tasks.setdefault(text, next_task)
        next_task += task == next_task
        first = next_rollout.get(task, 0)
        next_rollout[task] = first + 2
        expected += [(number, task, first, ok), (number, task, first + 1, ok)]
    assert jobs == expected


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.one_of(st.none(), st.integers(0, 5), st.just("t"))),
        max_size=25,
    ),
    repeats=st.integers(1, 3),
)
def test_task_numbering_matches_nemo_gyms_dicts(rows: list[tuple[bytes, Any]], repeats: int):
    """NeMo Gym numbers with two plain dicts; the compact numbering must agree on every row."""
    numbering = TaskNumbering()
    row_to_task: dict[bytes, int] = {}
    next_rollout: collections.Counter[Any] = collections.Counter()
    for text, own in rows:
        expected_task = own if own is not None else row_to_task.setdefault(text, len(row_to_task))
        task = own if own is not None else numbering.task_for_line(text)
        assert task == expected_task
        assert numbering.take_rollouts(task, repeats) == next_rollout[task]
        next_rollout[task] += repeats


def test_key_table_keeps_values_per_key_and_knows_what_it_lacks():
    table = KeyTable(("Q", "B"))
    handles = {}
    for i in range(20_000):
        handle, new = table.add(b"key %d" % i)
        assert new
        table.set_value(handle, i * 7)
        table.set_value(handle, i % 2, 1)
        handles[i] = handle
    assert table.count == 20_000
    assert table.add(b"key 123") == (handles[123], False)
    assert table.value(table.find(b"key 19999")) == 19999 * 7
    assert table.value(table.find(b"key 3"), 1) == 1
    assert table.find(b"key 20000") == -1
    assert b"" not in table


def test_means_count_numbers_only_and_usage_one_level_down():
    from rollfilter.metrics import Means

    means = Means()
    usage = {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 4}, "note": "n"}
    odd = {"huge": 10**400, "nan": float("nan"), "_ng_task_index": 3, "text": "x"}
    means.add({"reward": 1.0, "ok": True, **odd, "response": {"usage": usage}})
    means.add({"reward": 0, "ok": False, "response": {"usage": {"input_tokens": 20}}})
    assert means.means() == {"reward": 0.5, "ok": 0.5}
    assert means.usage() == {"input_tokens": 15.0, "input_tokens_details.cached_tokens": 4.0}
    assert means.tokens() == 30.0


FINITE = st.floats(allow_nan=False, allow_infinity=False) | st.sampled_from([1e308, -1e308, 1.7976931348623157e308])


def exact_mean(values: list[float]) -> float:
    return float(sum(map(fractions.Fraction, values)) / len(values))


@settings(max_examples=300, deadline=None)
@given(values=st.lists(FINITE, min_size=1, max_size=12))
def test_means_stay_finite_and_exact_near_the_float_limits(values: list[float]):
    from rollfilter.metrics import Means
    from rollfilter.sums import EXACT_FROM

    means = Means()
    for value in values:
        means.add({"reward": value, "response": {"usage": {"total_tokens": value}}})
    small = [abs(v) for v in values if abs(v) < EXACT_FROM]
    # Values past EXACT_FROM are summed exactly; the float sum of the others is off by at most
    # a few units in the last place of the largest of them.
    bound = len(values) * 2**-52 * max(small, default=0.0)
    for mean in (means.mean("reward"), means.means()["reward"], means.usage()["total_tokens"]):
        assert math.isfinite(mean)
        assert abs(mean - exact_mean(values)) <= bound or mean == exact_mean(values)


def test_the_mean_of_rewards_and_usage_near_the_float_limits():
    from rollfilter.metrics import Means

    means = Means()
    for _ in range(2):  # the float sum of these two is infinite
        means.add({"reward": 1e308, "tokens": 10**308, "response": {"usage": {"input_tokens": 10**308}}})
    assert means.means() == {"reward": 1e308, "tokens": 1e308}
    assert means.usage() == {"input_tokens": 1e308}


PARAMS = st.recursive(
    st.integers() | st.text(max_size=2), lambda inner: st.dictionaries(st.sampled_from("ab"), inner, max_size=2)
)


@given(params=PARAMS, key=st.lists(st.sampled_from("ab"), min_size=1, max_size=4).map(".".join))
def test_a_param_that_cannot_be_set_names_the_value_in_its_way(params: Any, key: str):
    row = {"responses_create_params": params}
    reason = apply_params(row, [(key, "set")])
    if reason is None:
        value: Any = row["responses_create_params"]
        for part in key.split("."):
            value = value[part]
        assert value == "set"
        return
    where = reason.removeprefix(f"cannot set Config.params {key}: ").removesuffix(" is not an object").split(".")
    assert where[0] == "responses_create_params"
    assert key.split(".")[: len(where) - 1] == where[1:]  # a parent on the key's own path...
    value = row
    for part in where:
        assert isinstance(value, dict)
        value = value[part]
    assert not isinstance(value, dict)  # ...which is not an object


def test_a_param_on_a_row_whose_params_are_a_string_names_them():
    row = {"responses_create_params": "hello"}
    assert apply_params(row, [("temperature", 0.5)]) == (
        "cannot set Config.params temperature: responses_create_params is not an object"
    )


def test_a_last_line_without_a_newline_is_not_the_line_with_one():
    async def tasks(data: bytes) -> list[tuple[int, int]]:
        planner = Planner(LineReader(["-"], max_line_bytes=1024, read=ChunkedReads([data])), Config(url="http://h/run"))
        jobs = []
        while (job := await planner.next_job()) is not None:
            jobs.append((job.task_index, job.rollout_index))
        return jobs

    a, b = b'{"q": "a"}', b'{"q": "b"}'
    assert trio.run(tasks, a + b"\n" + b + b"\n" + a) == [(0, 0), (1, 0), (2, 0)]  # as NeMo Gym numbers them
    assert trio.run(tasks, a + b"\n" + b + b"\n" + a + b"\n") == [(0, 0), (1, 0), (0, 1)]
    assert trio.run(tasks, a + b"\0\n" + a) == [(0, 0), (1, 0)]  # a trailing NUL is text, not a mark
    assert trio.run(tasks, a + b"\n" + a + b"\0") == [(0, 0), (1, 0)]


async def test_the_aggregate_spool_hands_out_results_sorted_by_task_and_rollout_from_many_runs():
    from rollfilter.aggregate import ResultSpool

    pairs = [(task, rollout) for task in [*range(40), "a", "b"] for rollout in range(3)]
    random.Random(3).shuffle(pairs)
    spool = ResultSpool(run_bytes=300)  # a sorted run every few results: many runs to merge
    try:
        for task, rollout in pairs:
            spool.add("agent", {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": 1.0, "response": {}})
        body = b"".join([chunk async for chunk in spool.body("agent")])
        assert len(body) == spool.body_size("agent")
        sent = json.loads(body)["verify_responses"]
    finally:
        spool.close()
    expected = [(task, rollout) for task in [*range(40), "a", "b"] for rollout in range(3)]
    assert [(e["_ng_task_index"], e["_ng_rollout_index"]) for e in sent] == expected


def test_a_tasks_mean_reward_stays_finite_near_the_float_limit():
    from rollfilter.passk import TaskStats

    records: list[dict[str, Any]] = []
    tasks = TaskStats(2, 1.0, records.append)
    for reward in (1e308, 1e308, 1.0, 0.0):
        tasks.rollout_ended(0 if reward > 1 else 1, reward)
    tasks.finish()
    assert [r["mean_reward"] for r in records] == [1e308, 0.5]
    assert tasks.summary_fields()["mean@2"] == pytest.approx(5e307)
