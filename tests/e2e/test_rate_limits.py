"""--rpm and --tpm: an agent's requests and tokens a minute, against stand-ins that log arrivals."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.conftest import DemoServer, QuietHandler, ThreadedHTTPServer, rows_jsonl, run, summary_of
from tests.engine.test_rate_limits import most_in_a_window


class ArrivalLog(ThreadedHTTPServer):
    """An agent whose episodes take `seconds` (none: it answers at once), 1,000 tokens each; it logs
    when each /run arrived, and counts the most it held at once."""

    def __init__(self, seconds: float = 0.0) -> None:
        self.arrivals: list[float] = []
        self.in_flight = self.most = 0
        lock = threading.Lock()
        log = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with lock:
                    log.arrivals.append(time.monotonic())
                    log.in_flight += 1
                    log.most = max(log.most, log.in_flight)
                if seconds:
                    time.sleep(seconds)
                with lock:
                    log.in_flight -= 1
                usage = {"input_tokens": 900, "output_tokens": 100, "total_tokens": 1000}
                self.send_json(200, json.dumps({"reward": 1.0, "response": {"usage": usage}}).encode())

        super().__init__(Handler)


def rows(n: int, agent: str | None = None) -> str:
    extra = {"agent_ref": {"name": agent}} if agent else {}
    return rows_jsonl([{"responses_create_params": {"input": f"row {i}"}, **extra} for i in range(n)])


def test_one_agents_limit_paces_it_alone():
    limited, free = ArrivalLog(), ArrivalLog()
    try:
        endpoints = ["-e", f"a={limited.url}/run", "-e", f"b={free.url}/run", "-j", "32"]
        proc = run([*endpoints, "--rpm", "a=1200"], input=rows(16, "a") + rows(16, "b"))
    finally:
        limited.close()
        free.close()
    assert proc.returncode == 0, proc.stderr
    assert len(limited.arrivals) == len(free.arrivals) == 16
    assert most_in_a_window(limited.arrivals, 0.5) <= 14  # 20 a second: 10 in half a second and a burst of 4
    limits = summary_of(proc.stderr)["rollfilter"]["limits"]
    assert set(limits) == {"a"}  # b has no limit: nothing waits for it
    assert limits["a"]["rpm"] == 1200
    assert limits["a"]["waited_s"] > 0


def test_a_token_limit_paces_by_the_replies_usage():
    log = ArrivalLog()
    try:
        proc = run(["-u", log.url + "/run", "-j", "32", "--tpm", "240000"], input=rows(6))  # 4 rows a second
    finally:
        log.close()
    assert proc.returncode == 0, proc.stderr
    assert most_in_a_window(log.arrivals, 1.0) <= 5  # the first alone, then four a second
    figures = summary_of(proc.stderr)["rollfilter"]["limits"]["(no name)"]
    assert figures["tokens_a_reply"] == 1000
    assert figures["replies_without_usage"] == 0


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--rpm", "0"], "--rpm wants N or NAME=N"),
        (["--rpm", "x"], "--rpm wants N or NAME=N"),
        (["--tpm", "-5"], "--tpm wants N or NAME=N"),
        (["--rpm", "inf"], "--rpm wants N or NAME=N"),
        (["--rpm", "nobody=60"], "--rpm NAME=N names no agent of the run: 'nobody'"),
        (["--tpm", "a=60", "--tpm", "b=6"], "--tpm NAME=N names no agent of the run: 'a', 'b'"),
    ],
)
def test_limits_that_cannot_work_exit_2_in_one_line_and_send_nothing(
    demo_server: DemoServer, args: list[str], said: str
):
    proc = run(["-u", demo_server.url, *args], input=rows(2))
    assert proc.returncode == 2
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1
    assert said in lines[0]
    assert demo_server.stats()["requests"] == 0


async def test_the_status_says_rows_wait_on_a_limit_and_the_api_takes_the_limits():
    from rollfilter import Config, Rates, open_rollouts
    from rollfilter.cli.signals import status_lines

    log = ArrivalLog()
    try:
        config = Config(url=log.url + "/run", concurrency=8, rates=Rates(rpm=480))  # 8 a second: the rest wait
        async with open_rollouts([{"responses_create_params": {"input": str(i)}} for i in range(5)], config) as run_:
            await run_.__anext__()
            status = run_.status()
            rest = [outcome async for outcome in run_]
    finally:
        log.close()
    assert status.waiting_on_rate_limits >= 1
    assert "waiting on rate limits" in status_lines(status)[0]
    assert any(rollout.waiting for rollout in status.oldest)
    assert any(line.endswith(" (not sent yet: --rpm/--tpm)") for line in status_lines(status)[1:])
    assert len(rest) == 4
    assert run_.summary is not None
    assert run_.summary["rollfilter"]["limits"]["(no name)"]["rpm"] == 480


def test_rows_waiting_on_one_agents_limit_do_not_hold_up_another_agents():
    limited, free = ArrivalLog(), ArrivalLog()
    try:
        mixed = "".join(rows(1, "a") + rows(1, "b") for _ in range(6))  # a b a b ...: -j 2 holds two of a
        endpoints = ["-e", f"a={limited.url}/run", "-e", f"b={free.url}/run", "-j", "2"]
        proc = run([*endpoints, "--rpm", "a=480"], input=mixed)  # eight a second
    finally:
        limited.close()
        free.close()
    assert proc.returncode == 0, proc.stderr
    assert len(limited.arrivals) == len(free.arrivals) == 6
    assert max(free.arrivals) < limited.arrivals[4]  # b's rows went while a's waited their turns


def test_rows_waiting_on_a_limit_never_put_more_than_j_in_flight():
    # The waiting rows lend their slots to the run; each takes one back before it is sent.
    log = ArrivalLog(0.1)
    try:
        proc = run(["-u", log.url + "/run", "-j", "4", "--rpm", "3600"], input=rows(16))  # 60 a second, 6 at once
    finally:
        log.close()
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 16
    assert log.most == 4  # the limit would let 6 episodes of 0.1 s be out: -j holds them to 4


async def test_the_wait_on_a_limit_is_no_part_of_a_rollouts_latency():
    from rollfilter import Config, Rates, open_rollouts

    log = ArrivalLog()
    try:
        config = Config(url=log.url + "/run", concurrency=8, rates=Rates(rpm=240))  # 4 a second: the third waits 0.5 s
        async with open_rollouts([{"responses_create_params": {"input": str(i)}} for i in range(3)], config) as run_:
            outcomes = [outcome async for outcome in run_]
    finally:
        log.close()
    assert len(outcomes) == 3
    assert run_.summary is not None
    figures = run_.summary["rollfilter"]
    assert figures["limits"]["(no name)"]["waited_s"] >= 0.6  # 0.25 s and 0.5 s, less the burst's share
    assert figures["latency_s"]["max"] < 0.4  # an instant agent: the waits are not the agent's
