"""api.py: the Python API, sync and async, over the demo agent."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rollfilter
from rollfilter import Config, Failure, Group, Groups, Rollout, Tls, open_rollouts, rollouts
from rollfilter.config import ConfigError
from rollfilter.demo import DemoAgent, serve
from rollfilter.errors import ErrorKind, ServiceError, UsageError
from rollfilter.http.bounds import FILES_FOR_OTHER_USES
from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    WEATHER,
    DemoProcess,
    DemoServer,
    Holdings,
    QuietHandler,
    ThreadedHTTPServer,
    clean_env,
    closed_port_url,
    expected_reward,
    result_lines,
    run,
    simple_rows,
    summary_of,
)
from tests.e2e.test_groups import K, group_rows, reward, uniform
from tests.servers.recording_agent import RecordingAgent


def weather_rows() -> list[dict]:
    return [json.loads(line) for line in WEATHER.read_text().splitlines()]


# Any text, with lone surrogates (json.loads gives one for "\\ud800") as likely as the rest.
ANY_TEXT = st.text(st.characters(), max_size=4) | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF))


JSON_LIKE = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(ANY_TEXT, inner, max_size=3),
    max_leaves=6,
)


ANY_ROW = st.one_of(
    JSON_LIKE.map(lambda value: {"responses_create_params": {"input": "x"}, "extra": value}),
    JSON_LIKE,
    JSON_LIKE.map(lambda v: json.dumps({"responses_create_params": {"input": "x"}, "v": v}, ensure_ascii=False)),
    st.binary(max_size=20),
    st.builds(object),
)


def is_blank(row: Any) -> bool:
    """A blank line is not a row, from a file or from the API."""
    return isinstance(row, str | bytes) and not (row.encode(errors="replace") if isinstance(row, str) else row).strip()


class RefusesFirstAgent(ThreadedHTTPServer):
    """Answers each distinct body 503 the first time, then 200 with the row's `answer` keys merged in."""

    def __init__(self) -> None:
        seen: set[bytes] = set()
        lock = threading.Lock()

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    first = body not in seen
                    seen.add(body)
                if first:
                    self.send_response(503)
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_json(200, json.dumps({"reward": 1.0, **json.loads(body)["answer"]}).encode())

        super().__init__(Handler)


async def test_async_api_from_trio():
    agent = DemoAgent()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve(agent, task_status=task_status))
        config = Config(url=f"http://127.0.0.1:{port}", repeats=2)
        async with open_rollouts(weather_rows(), config) as run_:
            outcomes = [outcome async for outcome in run_]
        nursery.cancel_scope.cancel()
    assert all(isinstance(o, Rollout) for o in outcomes)
    assert sorted((o.task_index, o.rollout_index) for o in outcomes) == [(t, k) for t in range(5) for k in range(2)]
    for outcome in outcomes:
        assert isinstance(outcome, Rollout)
        assert outcome.result["reward"] == expected_reward(outcome.row)
        assert outcome.result["_ng_task_index"] == outcome.task_index
    assert run_.summary is not None
    assert run_.summary["rollfilter"]["succeeded"] == 10
    assert run_.summary["reward"] == sum(o.result["reward"] for o in outcomes if isinstance(o, Rollout)) / 10
    assert agent.requests == 10


async def test_async_api_takes_rows_only_as_capacity_frees():
    agent = DemoAgent()
    taken = 0

    async def endless() -> AsyncIterator[dict]:
        nonlocal taken
        for i in itertools.count():
            taken += 1
            yield {"responses_create_params": {"input": str(i)}}

    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve(agent, task_status=task_status))
        consumed = 0
        async with open_rollouts(endless(), Config(url=f"http://127.0.0.1:{port}", concurrency=4)) as run_:
            async for _ in run_:
                consumed += 1
                await trio.sleep(0.01)  # a slow consumer
                if consumed == 20:
                    break
        assert taken <= consumed + 4 + 1
        assert run_.summary is not None
        assert run_.summary["rollfilter"]["stopped"] == "stopped early by the caller"
        nursery.cancel_scope.cancel()


def test_sync_api_from_plain_code(demo_server: DemoServer):
    rows = [*weather_rows(), {"responses_create_params": {"input": "x"}, "demo": {"fault": "422"}}, "{not json"]
    with rollouts(rows, Config(url=demo_server.url)) as outcomes:
        collected = list(outcomes)
    failures = [o for o in collected if isinstance(o, Failure)]
    assert len(collected) == 7
    assert sorted((f.number, f.kind) for f in failures) == [(6, ErrorKind.HTTP_STATUS), (7, ErrorKind.BAD_INPUT)]
    by_number = {f.number: f for f in failures}
    assert by_number[6].row == {**rows[5], "_ng_task_index": 5, "_ng_rollout_index": 0}  # the row as sent
    assert by_number[7].row is None  # not a JSON object
    assert outcomes.summary is not None
    assert outcomes.summary["rollfilter"]["failed"] == 2


def test_sync_api_inside_a_running_asyncio_loop(demo_server: DemoServer):
    async def training_loop() -> list[rollfilter.api.rollouts.Outcome]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(None, lambda: list(rollouts(simple_rows(50), Config(url=demo_server.url))))

    outcomes = asyncio.run(training_loop())
    assert len(outcomes) == 50
    assert all(o.ok for o in outcomes)


def test_sync_api_early_exit_cancels_and_leaves_nothing_behind(demo_process: DemoProcess):
    demo_server = demo_process  # in a process of its own: this one's descriptors are counted
    holdings = Holdings()
    concurrency = 8

    def endless() -> Iterator[dict]:
        for i in itertools.count():
            yield {"responses_create_params": {"input": str(i)}, "demo": {"latency": 0.01}}

    seen = 0
    for _outcome in rollouts(endless(), Config(url=demo_server.url, concurrency=concurrency)):
        seen += 1
        if seen == 5:
            break  # the generator's close() stops the run
    assert holdings.left_behind() == (set(), set())
    assert demo_server.stats()["requests"] <= seen + concurrency + 1


def test_sync_api_raises_misconfiguration_before_sending():
    with pytest.raises(UsageError, match="no agent"):
        list(rollouts(simple_rows(2), Config()))
    with pytest.raises(ServiceError, match="head server"):
        list(rollouts(simple_rows(2), Config(head_server=closed_port_url())))
    with pytest.raises(UsageError):
        Config(url="not a url")


def test_a_cacert_file_is_read_by_the_run_not_the_config_and_refused_before_any_row(demo_server: DemoServer, tmp_path):
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    for path, problem in ((tmp_path / "missing.pem", "cannot be read: "), (not_pem, "holds no PEM certificates")):
        config = Config(url=demo_server.url, tls=Tls(cacert=str(path)))  # builds: a Config reads no file
        with pytest.raises(ConfigError) as refused:
            list(rollouts(simple_rows(2), config))
        assert refused.value.field == "tls.cacert"
        assert str(refused.value).startswith(f"Config.tls.cacert: {path} {problem}")
    assert demo_server.stats()["requests"] == 0


def test_api_and_cli_agree(demo_server: DemoServer):
    rows = [{"responses_create_params": {"input": "x" * i}} for i in range(40)]
    rows[7] = {"responses_create_params": {"input": "x"}, "demo": {"fault": "422"}}
    cli = run(["-u", demo_server.url, "-r", "2"], input="".join(json.dumps(r) + "\n" for r in rows))
    with rollouts(rows, Config(url=demo_server.url, repeats=2)) as api:
        outcomes = list(api)
    key = lambda r: (r["_ng_task_index"], r["_ng_rollout_index"], r["reward"])  # noqa: E731
    assert sorted(key(o.result) for o in outcomes if isinstance(o, Rollout)) == sorted(
        map(key, result_lines(cli.stdout))
    )
    cli_summary, api_summary = summary_of(cli.stderr), api.summary
    assert api_summary is not None
    for field in ("reward", "accuracy", "mean@2", "pass@1", "pass@2"):
        assert api_summary[field] == cli_summary[field]
    for field in ("rows_read", "succeeded", "failed", "failed_by_kind", "tasks"):
        assert api_summary["rollfilter"][field] == cli_summary["rollfilter"][field]
    for block in ("stderr", "ci95", "sample_size", "per_rollout"):  # the error bars, clustered by task
        assert api_summary[block] == cli_summary[block]
    assert api_summary["sample_size"]["reward"] == {"tasks": 39, "rollouts": 78}


def test_an_exception_from_the_callers_rows_reaches_the_caller(demo_server: DemoServer):
    def broken_rows() -> Iterator[dict]:
        yield {"responses_create_params": {"input": "x"}}
        raise ValueError("the dataset is broken")

    holdings = Holdings()
    with pytest.RaisesGroup(pytest.RaisesExc(ValueError, match="dataset is broken"), flatten_subgroups=True):
        for _ in rollouts(broken_rows(), Config(url=demo_server.url)):
            pass
    assert holdings.left_behind()[0] == set()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(ANY_ROW, max_size=6))
def test_any_row_ends_as_exactly_one_outcome_and_never_raises(demo_server: DemoServer, rows: list[Any]):
    with rollouts(rows, Config(url=demo_server.url, concurrency=4)) as run_:
        outcomes = list(run_)
    numbered = [number for number, row in enumerate(rows, start=1) if not is_blank(row)]
    assert len(outcomes) == len(numbered)
    failed_lines = [o.number for o in outcomes if isinstance(o, Failure)]
    assert len(set(failed_lines)) == len(failed_lines)
    assert set(failed_lines) <= set(numbered)
    assert run_.summary is not None
    figures = run_.summary["rollfilter"]
    assert figures["rows_read"] == figures["succeeded"] + figures["failed"] == len(numbered)


@pytest.mark.usefixtures("quick_backoff")
def test_a_rollout_that_ends_after_a_retry_counts_both_attempts():
    agent = RefusesFirstAgent()
    rows = [
        {"responses_create_params": {"input": "a"}, "answer": {"_ng_failure_class": "bad_tool"}},
        {"responses_create_params": {"input": "b"}, "answer": {"_ng_no_persist": True}},
        {"responses_create_params": {"input": "c"}, "answer": {}},
    ]
    try:
        outcomes = list(rollouts(rows, Config(url=agent.url, retries=1)))
    finally:
        agent.close()
    failures = {o.kind: o for o in outcomes if isinstance(o, Failure)}
    assert failures.keys() == {ErrorKind.AGENT_FAILURE, ErrorKind.NOT_PERSISTED}
    assert [failure.attempts for failure in failures.values()] == [2, 2]
    assert [o.row["responses_create_params"]["input"] for o in outcomes if isinstance(o, Rollout)] == ["c"]


async def test_the_python_api_gives_the_same_status(agent: RecordingAgent):
    agent.hold_after(1, waiting=3)
    rows = [{"id": i, "responses_create_params": {"input": "q"}} for i in range(4)]
    async with open_rollouts(rows, Config(url=agent.run_url, agent="agent", concurrency=4)) as run:
        first = await run.__anext__()
        assert first.ok
        assert agent.answered.wait(SUBPROCESS_TIMEOUT)
        status = run.status()
        assert (status.ended, status.in_flight) == (1, 3)
        assert len({r.task_index for r in status.oldest} | {first.task_index}) == 4
        assert all(r.attempt == 1 and r.age_s >= 0 and r.agent == "agent" for r in status.oldest)
        agent.release.set()
        rest = [outcome async for outcome in run]
    assert len(rest) == 3
    assert run.status().in_flight == 0


API_UNDER_A_LOW_LIMIT = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from rollfilter import Config, rollouts
rows = [{"id": i, "responses_create_params": {"input": "x"}} for i in range(1200)]
with rollouts(rows, Config(url=sys.argv[1], concurrency=600, retries=0)) as run:
    each = iter(run)
    outcomes = [next(each)]
    run.set_concurrency(10**6)
    concurrency = run.statistics().steering.concurrency
    outcomes += each
failed = [o.message for o in outcomes if not o.ok]
print(json.dumps([len(outcomes), failed[:1], concurrency, run.warnings]))
"""


def test_the_api_fits_its_concurrency_to_the_open_file_limit_as_the_command_does(demo_server: DemoServer):
    """As the command fits -j, said once however often a concurrency over the limit is asked for
    (the transport would wait for a descriptor: no row fails either way)."""
    proc = subprocess.run(
        [sys.executable, "-c", API_UNDER_A_LOW_LIMIT, demo_server.url],
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT * 2,
        env=clean_env(),
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    fitted = 256 - FILES_FOR_OTHER_USES
    assert json.loads(proc.stdout) == [
        1200,
        [],
        fitted,
        [
            "Config.concurrency: 600 needs more open files than this process may have (256, see RLIMIT_NOFILE):"
            f" running {fitted} rows at a time"
        ],
    ]


# Config(groups=...): whole groups, under trio, asyncio and threads alike (rewards: tests/e2e/test_groups.py).

N = 24


def grouped(url: str, **groups: Any) -> Config:
    return Config(url=url, repeats=K, concurrency=16, groups=Groups(drop_uniform=True, **groups))


def check_kept(groups: list[Group]) -> None:
    assert sorted(group.task_index for group in groups) == [task for task in range(N) if not uniform(task)]
    for group in groups:
        assert group.ok
        assert group.fate == "kept"
        assert all(isinstance(rollout, Rollout) for rollout in group.rollouts)
        assert [rollout.rollout_index for rollout in group.rollouts] == list(range(K))
        assert group.rewards == [reward(group.task_index, rollout) for rollout in range(K)]


def test_groups_from_threads(demo_server: DemoServer):
    run = rollouts(group_rows(N), grouped(demo_server.url))
    check_kept(list(run.groups()))
    assert run.summary is not None
    groups = run.summary["rollfilter"]["groups"]
    assert groups["kept"] + groups["dropped_uniform"] == N


def test_groups_from_trio(demo_server: DemoServer):
    async def main() -> list[Group]:
        async with open_rollouts(group_rows(N), grouped(demo_server.url)) as run:
            return [group async for group in run.groups()]

    check_kept(trio.run(main))


def test_groups_from_asyncio(demo_server: DemoServer):
    async def main() -> list[Group]:
        async with open_rollouts(group_rows(N), grouped(demo_server.url)) as run:
            return [group async for group in run.groups()]

    check_kept(asyncio.run(main()))


def test_iterating_the_run_gives_every_group_with_its_fate_and_failures(demo_server: DemoServer):
    rows = group_rows(N)
    rows[1]["demo"]["faults"] = [None, None, "422", None]
    outcomes = list(rollouts(rows, grouped(demo_server.url)))
    assert all(isinstance(outcome, Group) for outcome in outcomes)  # failures come in their group
    fates = {outcome.task_index: outcome.fate for outcome in outcomes if isinstance(outcome, Group)}
    assert fates == {task: "incomplete" if task == 1 else "uniform" if uniform(task) else "kept" for task in range(N)}
    (incomplete,) = [o for o in outcomes if isinstance(o, Group) and o.fate == "incomplete"]
    assert [failure.rollout_index for failure in incomplete.failures] == [2]
    assert [rollout.rollout_index for rollout in incomplete.rollouts] == [0, 1, 3]
    assert not incomplete.ok


def test_keep_incomplete_hands_out_the_finished_rollouts(demo_server: DemoServer):
    rows = group_rows(3)
    rows[0]["demo"]["faults"] = ["422", None, None, None]
    groups = list(rollouts(rows, Config(url=demo_server.url, repeats=K, groups=Groups(keep_incomplete=True))).groups())
    assert sorted((g.task_index, g.fate, len(g.rollouts)) for g in groups) == [
        (0, "incomplete", 3),
        (1, "kept", 4),
        (2, "kept", 4),
    ]


def test_target_groups_ends_the_run_after_that_many(demo_server: DemoServer):
    run = rollouts(group_rows(N), grouped(demo_server.url, target=2))
    assert len(list(run.groups())) == 2
    assert run.summary is not None
    assert run.summary["rollfilter"]["groups"]["kept"] == 2


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"groups": True}, "Config.groups"),  # repeats of 1
        ({"repeats": 4, "groups": {"target": 0}}, "Config.groups.target"),
        ({"repeats": 4, "groups": {"drop_uniform": True, "field": "response"}}, "Config.groups.field"),
        ({"repeats": 4, "groups": {"max_staleness": 1}}, "Config.groups.max_staleness"),
    ],
)
def test_group_settings_that_cannot_work_are_refused(settings: dict[str, Any], field: str):
    groups = settings.pop("groups")
    with pytest.raises(ConfigError, match=rf"^{re.escape(field)}: "):
        Config(url="http://127.0.0.1:9", groups=Groups(**groups) if isinstance(groups, dict) else groups, **settings)


def test_a_run_in_threads_is_steered_from_the_iterating_thread(demo_server: DemoServer):
    # The two sent first are out when the first outcome comes back; the rest are quick.
    latencies = (0.1, 0.1, 0.01, 0.01, 0.01, 0.01)
    rows = [{"responses_create_params": {"input": "hi"}, "demo": {"latency": latency}} for latency in latencies]
    run = rollouts(rows, Config(url=demo_server.url, concurrency=2, policy_version=7))
    with pytest.raises(RuntimeError, match="not started"):
        run.pause()
    outcomes = []
    for outcome in run:
        outcomes.append(outcome)
        if len(outcomes) == 1:
            assert run.drain(30)  # blocks this thread until nothing is in flight
            sent = demo_server.stats()["requests"]
            stats = run.statistics().steering
            assert (stats.paused, stats.requests_out, stats.policy_version) == (True, 0, 7)
            with pytest.raises(rollfilter.SteeringError, match="cannot go back"):
                run.set_policy_version(6)
            run.set_rate(rpm=6000)
            run.set_policy_version(8)
            run.resume()
    assert len(outcomes) == 6
    versions = [outcome.result["_rf_policy_version"]["sent"] for outcome in outcomes if isinstance(outcome, Rollout)]
    assert versions == [7] * sent + [8] * (6 - sent)
    with pytest.raises(RuntimeError, match="has ended"):
        run.pause()


def test_saved_rollouts_are_re_scored_from_python(tmp_path):
    from tests.e2e.test_reverify import expected_reward, materialized_row, rollout_line, write_jsonl
    from tests.servers.resources_server import ResourcesServer

    pairs = [(t, r) for t in range(3) for r in range(2)]
    materialized = write_jsonl(tmp_path / "m.jsonl", [materialized_row(*pair) for pair in pairs])
    server = ResourcesServer()
    try:
        config = Config(url=server.url, reverify=rollfilter.Reverify(materialized))
        outcomes = list(rollouts([rollout_line(*pair) for pair in pairs], config))
    finally:
        server.close()
    assert all(isinstance(outcome, Rollout) for outcome in outcomes)
    got = {(o.task_index, o.rollout_index): o.result["reward"] for o in outcomes if isinstance(o, Rollout)}
    assert got == {pair: expected_reward(*pair) for pair in pairs}
