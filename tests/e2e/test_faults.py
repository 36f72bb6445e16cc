"""Faults met mid-run: agents killed, signals, bad lines, vanishing inputs; nothing lost or written twice."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollfilter import Config, Failure, rollouts
from rollfilter.engine.routing import UNREACHABLE_AFTER_FAILURES
from rollfilter.errors import ErrorKind
from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    QuietHandler,
    ThreadedHTTPServer,
    closed_port_url,
    lines_of,
    read_jsonl,
    result_lines,
    rows_jsonl,
    run,
    simple_rows,
    start,
    summary_of,
    wait_for,
)

BAD_INPUT_CASES = [
    (b"{not json}", "invalid JSON"),
    (b'\xef\xbb\xbf{"responses_create_params": {"input": "x"}}', "byte order mark"),
    (b'{"responses_create_params": {"input": "\xff\xfe"}}', "invalid UTF-8"),
    (b"[1, 2]", "not a JSON object"),
    (b'"just a string"', "not a JSON object"),
    (b'{"responses_create_params": {"temperature": NaN}}', "NaN and Infinity"),
    (b'{"responses_create_params": {"temperature": Infinity}}', "NaN and Infinity"),
    (b"[" * 100_000 + b"]" * 100_000, "invalid JSON"),
]


def test_chaos_run_loses_and_duplicates_nothing(tmp_path, start_demo):
    server: DemoServer = start_demo(
        "--fail-rate", "0.1", "--hang-rate", "0.03", "--garbage-rate", "0.04", "--drop-rate", "0.05",
        "--seed", "1",
    )  # fmt: skip
    errors = tmp_path / "errors.jsonl"
    retries = 2
    n = 3000
    proc = run(
        ["-u", server.url, "-j", "128", "--timeout", "0.25", "--retries", str(retries), "--errors", str(errors)],
        input=rows_jsonl(simple_rows(n)),
        timeout=120,
    )
    assert proc.returncode == 1, proc.stderr
    results = result_lines(proc.stdout)
    records = read_jsonl(errors)
    seen = Counter(r["_ng_task_index"] for r in results) + Counter(r["_ng_task_index"] for r in records)
    assert sorted(seen) == list(range(n))
    assert set(seen.values()) == {1}  # exactly once each
    kinds = Counter(r["error"]["kind"] for r in records)
    assert set(kinds) <= {"http_status", "timeout", "bad_response", "connect"}
    assert kinds["bad_response"] > 0  # garbage bodies end a row at once, on any attempt
    assert all(1 <= r["attempts"] <= retries + 1 for r in records if r["error"]["kind"] == "bad_response")
    # Every other failure had all its retries, unless the agent's retry budget was spent (22% of requests fail).
    for record in records:
        if record["error"]["kind"] != "bad_response":
            assert record["attempts"] == retries + 1 or "retry budget is spent" in record["error"]["message"]
    withheld = sum("retry budget" in r["error"]["message"] for r in records)
    assert summary_of(proc.stderr)["rollfilter"]["retries_withheld"] == withheld
    for record in records:
        assert record["row"]["id"] == record["_ng_task_index"]  # the row as sent
        assert record["line"] == record["_ng_task_index"] + 1
    stats = server.stats()
    # A request dropped on a kept-alive connection goes once more on a new one: not a retry.
    assert max(stats["by_id"].values()) <= 2 * (retries + 1)
    figures = summary_of(proc.stderr)["rollfilter"]
    assert figures["rows_read"] == n == figures["succeeded"] + figures["failed"] + figures["skipped"]
    assert figures["succeeded"] == len(results)
    assert figures["failed_by_kind"] == dict(kinds)
    assert n + figures["retries"] <= stats["requests"] <= 2 * (n + figures["retries"])
    assert all(isinstance(r["reward"], float) for r in results)


def test_sigkill_then_resume_completes_without_duplicates(tmp_path, demo_server: DemoServer):
    rows = [
        {"id": i, "responses_create_params": {"input": "x" * (i % 3)}, "demo": {"latency": 0.005}} for i in range(400)
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(rows))
    out = tmp_path / "out.jsonl"
    args = ["-u", demo_server.url, "-j", "8", "-r", "2", "-o", str(out), str(data)]
    proc = start(args, stdout=None, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: out.exists() and out.stat().st_size > 20_000)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
    before = out.read_text().splitlines()
    assert 0 < len(before) < 800
    with out.open("a") as file:  # a kill in the middle of a write leaves half a line
        file.write(before[-1][: len(before[-1]) // 2])
    resumed = run([*args, "--resume"])
    assert resumed.returncode == 0, resumed.stderr
    figures = summary_of(resumed.stderr)["rollfilter"]
    assert figures["skipped"] == len(before)
    assert figures["rows_read"] == 800
    complete = read_jsonl(out)  # the torn line was cut off: every line parses
    pairs = Counter((r["_ng_task_index"], r["_ng_rollout_index"]) for r in complete)
    assert sorted(pairs) == [(t, k) for t in range(400) for k in range(2)]
    assert set(pairs.values()) == {1}


@pytest.mark.parametrize(
    ("signum", "status", "stopped"), [(signal.SIGTERM, 143, "terminated"), (signal.SIGHUP, 129, "hung up")]
)
def test_sigterm_and_sighup_cancel_in_flight_and_print_the_summary(
    tmp_path, demo_server: DemoServer, signum: int, status: int, stopped: str
):
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl([{"responses_create_params": {"input": "x"}, "demo": {"latency": 30}}] * 5))
    proc = start(["-u", demo_server.url, str(data)])
    wait_for(lambda: demo_server.stats()["requests"] == 5)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == status
    assert stdout == b""
    figures = summary_of(stderr)["rollfilter"]
    assert figures["cancelled"] == 5
    assert figures["stopped"] == stopped


def test_second_interrupt_during_the_wind_down_prints_the_summary_and_exits_at_once(demo_server: DemoServer, tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(simple_rows(5000)))
    # Nobody reads stdout: once the pipe is full the wind-down cannot finish writing. A second
    # open of the pipe's write end, polled, says when it is full, and shares no flags with the
    # command's.
    read_end, write_end = os.pipe()
    probe = os.open(f"/proc/self/fd/{write_end}", os.O_WRONLY)
    full = select.poll()
    full.register(probe, select.POLLOUT)
    proc = start(["-u", demo_server.url, str(data)], stdout=write_end)
    os.close(write_end)
    try:
        assert proc.stderr is not None
        stderr = lines_of(proc.stderr)
        wait_for(lambda: not full.poll(0))
        proc.send_signal(signal.SIGINT)
        # Its status, asked for after the interrupt, comes once the interrupt has been taken
        # (and keeps the second SIGINT from merging with the first).
        proc.send_signal(signal.SIGUSR1)
        assert stderr.get(timeout=SUBPROCESS_TIMEOUT).startswith(b"rollfilter: status: ")
        assert proc.poll() is None  # stuck writing finished results to a full pipe
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 130
        rest = []
        while (line := stderr.get(timeout=SUBPROCESS_TIMEOUT)) != b"":
            rest.append(line)
        # The wind-down never ended: the summary as it stood, last, after a line saying what is
        # lost. The status block's lines before them are the status's own, however they interleave.
        said = [line for line in rest if not line.startswith(b"rollfilter:   ")]
        assert b"rollfilter: stopped again: results not yet written are dropped" in said[-2], rest
        assert summary_of(rest[-1])["rollfilter"]["stopped"] == "interrupted", rest
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
        for fd in (read_end, probe):
            os.close(fd)
        assert proc.stderr is not None
        proc.stderr.close()


def test_each_bad_input_line_fails_alone_with_its_line_number(tmp_path, demo_server: DemoServer):
    good = b'{"responses_create_params": {"input": "ok"}}'
    lines = [good]
    for bad, _ in BAD_INPUT_CASES:
        lines += [bad, b"", good]  # an empty line between: skipped, not failed
    data = b"\n".join(lines)  # the last line has no newline: still a normal row
    errors = tmp_path / "errors.jsonl"
    proc = run(["-u", demo_server.url, "--errors", str(errors)], input=data)
    assert proc.returncode == 1
    records = read_jsonl(errors)
    assert [r["line"] for r in records] == [2 + 3 * i for i in range(len(BAD_INPUT_CASES))]
    for record, (_, reason) in zip(records, BAD_INPUT_CASES, strict=True):
        assert record["error"]["kind"] == "bad_input"
        assert reason in record["error"]["message"]
        assert record["attempts"] == 0
    assert len(result_lines(proc.stdout)) == len(BAD_INPUT_CASES) + 1
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["failed"]) == (len(BAD_INPUT_CASES) + 1, len(BAD_INPUT_CASES))


def test_a_100_mb_line_is_refused_and_the_run_goes_on(tmp_path, demo_server: DemoServer):
    data = tmp_path / "long.jsonl"
    with data.open("wb") as file:
        file.write(b'{"responses_create_params": {"input": "before"}}\n')
        long_line = b'{"responses_create_params": {"input": "' + b"x" * (100 * 1024 * 1024) + b'"}}'
        file.write(long_line + b"\n")
        file.write(b'{"responses_create_params": {"input": "after"}}\n')
    proc = run(["-u", demo_server.url, str(data)])
    assert proc.returncode == 1
    message = [line for line in proc.stderr.decode().splitlines() if not line.startswith("{")]
    assert len(message) == 1
    assert message[0].startswith(f"rollfilter: {data}:2: bad_input: line is {len(long_line)} bytes")
    assert sorted(r["_ng_task_index"] for r in result_lines(proc.stdout)) == [0, 2]


def test_an_input_that_vanishes_mid_run_is_skipped_as_cat_skips_it(tmp_path, demo_server: DemoServer):
    first, gone, last = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    slow = [{**row, "demo": {"latency": 0.05}} for row in simple_rows(20)]
    first.write_text(rows_jsonl(slow))
    gone.write_text(rows_jsonl(simple_rows(5)))
    last.write_text(rows_jsonl([{**row, "id": 100 + row["id"]} for row in simple_rows(3)]))
    out = tmp_path / "out.jsonl"
    proc = start(["-u", demo_server.url, "-j", "2", "-o", str(out), str(first), str(gone), str(last)], stdout=None)
    try:
        wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") >= 4)
        gone.unlink()
        _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    finally:
        proc.kill()
    assert proc.returncode == 1  # an input was lost, as cat says
    assert f"rollfilter: cannot read {gone}: No such file or directory" in stderr.decode().splitlines()
    ids = sorted(r["_ng_task_index"] for r in read_jsonl(out))
    assert len(ids) == 23  # every row of a.jsonl and c.jsonl, none lost in flight
    assert summary_of(stderr)["rollfilter"]["succeeded"] == 23


def test_a_row_without_a_route_is_told_the_same_from_python_and_the_command_line(demo_server, tmp_path):
    rows = simple_rows(2)  # no agent_ref: only a default agent could take them
    config = Config(endpoints={"demo": demo_server.url})
    failures = [outcome for outcome in rollouts(rows, config) if isinstance(outcome, Failure)]
    assert [failure.kind for failure in failures] == [ErrorKind.NO_ROUTE] * 2
    said = "row has no agent_ref.name, and the run has no default agent or URL for it"
    assert {failure.message for failure in failures} == {said}

    errors = tmp_path / "errors.jsonl"
    proc = run(["-e", f"demo={demo_server.url}", "--errors", str(errors)], input=rows_jsonl(rows))
    assert proc.returncode == 1
    records = [json.loads(line) for line in errors.read_text().splitlines()]
    assert [record["error"]["message"] for record in records] == [said] * 2
    proc = run(["-e", f"demo={demo_server.url}", "-q"], input=rows_jsonl(rows[:1]))
    assert proc.stderr.decode() == f"rollfilter: <stdin>:1: no_route: {said}\n"
    assert demo_server.stats()["requests"] == 0


class _Answers:
    """What the agent says: a 400 quoting a setting, or an answer that reports the agent's failure."""

    status = 400
    body = b"Config.timeout is too low; raise Config.timeout"


class _QuotingAgent(QuietHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_json(_Answers.status, _Answers.body)


@pytest.fixture
def quoting_agent() -> Iterator[str]:
    server = ThreadedHTTPServer(_QuotingAgent)
    yield f"{server.url}/run"
    server.close()


def test_a_server_s_text_is_left_as_it_is_on_the_command_line(quoting_agent: str, tmp_path: Path):
    proc = run(["-u", quoting_agent], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 1
    expected = "HTTP 400 Bad Request: 'Config.timeout is too low; raise Config.timeout'"
    assert proc.stderr.decode().splitlines()[0] == f"rollfilter: <stdin>:1: http_status: {expected}"
    errors = tmp_path / "errors.jsonl"
    run(["-u", quoting_agent, "--errors", str(errors)], input=rows_jsonl(simple_rows(1)))
    assert json.loads(errors.read_text())["error"]["message"] == expected


def test_an_agent_s_failure_reason_is_left_as_it_is_on_the_command_line(
    quoting_agent: str, monkeypatch: pytest.MonkeyPatch
):
    answer = {"_ng_failure_class": "tool_error", "failure_reason": "Config.url answered 500", "reward": 0.0}
    monkeypatch.setattr(_Answers, "status", 200)
    monkeypatch.setattr(_Answers, "body", json.dumps(answer).encode())
    proc = run(["-u", quoting_agent], input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 1
    message = "the agent reported failure class 'tool_error': 'Config.url answered 500'"
    assert proc.stderr.decode().splitlines()[0] == f"rollfilter: <stdin>:1: agent_failure: {message}"


class _AnswersFirst(QuietHandler):
    """Answers the first request it reads, then drops every connection without a reply."""

    answered = 0
    lock = threading.Lock()

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            first = _AnswersFirst.answered == 0
            _AnswersFirst.answered += 1
        if first:
            self.send_json(200, b'{"reward": 1.0}')
            return
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class _DropsAll(QuietHandler):
    """Drops every connection without a reply: an agent that never answers, though it listens."""

    def do_POST(self) -> None:
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def agent_of(request: pytest.FixtureRequest) -> Iterator[str]:
    _AnswersFirst.answered = 0
    server = ThreadedHTTPServer(request.param)
    yield f"{server.url}/run"
    server.close()


@pytest.mark.parametrize("agent_of", [_AnswersFirst], indirect=True)
def test_an_agent_that_answered_then_drops_connections_fails_rows_and_the_run_goes_on(agent_of: str, tmp_path):
    errors = tmp_path / "errors.jsonl"
    proc = run(["-u", agent_of, "-j", "1", "--retries", "0", "--errors", str(errors)], input=rows_jsonl(simple_rows(6)))
    assert proc.returncode == 1, proc.stderr
    assert len(result_lines(proc.stdout)) == 1
    assert [record["error"]["kind"] for record in read_jsonl(errors)] == ["connect"] * 5
    assert proc.stderr.decode().count("\n") == 1  # the summary alone: --errors took the failures
    assert "stopped" not in summary_of(proc.stderr)["rollfilter"]


@pytest.mark.parametrize("agent_of", [_DropsAll], indirect=True)
def test_an_agent_that_drops_every_connection_from_the_start_stops_the_run(agent_of: str, tmp_path):
    errors = tmp_path / "errors.jsonl"
    args = ["-u", agent_of, "-j", "1", "--retries", "2", "--connect-timeout", "0.2", "--errors", str(errors)]
    proc = run(args, input=rows_jsonl(simple_rows(6)))
    assert proc.returncode == 3, proc.stderr
    [record] = read_jsonl(errors)
    assert record["attempts"] >= UNREACHABLE_AFTER_FAILURES
    [line, _] = proc.stderr.decode().splitlines()
    assert line.startswith(f"rollfilter: stopped: the agent at {agent_of} refused or dropped every connection")
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["failed"], figures["succeeded"], figures["stopped"]) == (1, 0, line.removeprefix("rollfilter: "))


def test_a_refused_replica_does_not_stop_a_run_whose_other_replica_is_up(start_demo, tmp_path):
    # The first row goes to the closed port (the first of two replicas, none outstanding) and
    # fails at once; the other replica is up, its first episode still running: the agent answers.
    server = start_demo("--latency", "0.15")
    replicas = f"a={closed_port_url()},{server.url}"
    errors = tmp_path / "errors.jsonl"
    args = ["-e", replicas, "-a", "a", "-j", "2", "--retries", "0", "--errors", str(errors)]
    proc = run(args, input=rows_jsonl(simple_rows(4)))
    figures = summary_of(proc.stderr)["rollfilter"]
    assert "stopped" not in figures, figures["stopped"]
    assert proc.returncode in (0, 1), proc.stderr
    assert figures["succeeded"] + figures["failed"] == 4
    assert len(result_lines(proc.stdout)) == figures["succeeded"] >= 1


def test_repeated_failure_lines_are_folded_and_the_errors_record_keeps_every_row(start_demo, tmp_path):
    server = start_demo("--fail-rate", "1.0")
    rows = rows_jsonl(simple_rows(300))
    proc = run(["-u", server.url, "-j", "8", "--retries", "0"], input=rows)
    assert proc.returncode == 1
    *lines, _ = proc.stderr.decode().splitlines()
    in_full = [line for line in lines if line.startswith("rollfilter: <stdin>:")]
    counts = [re.fullmatch(r"rollfilter: (\d+) more rows? failed so: http_status: HTTP 500 .*", line) for line in lines]
    assert len(in_full) == 3
    assert len(in_full) + sum(int(match.group(1)) for match in counts if match) == 300
    assert len(lines) == len(in_full) + sum(1 for match in counts if match)  # nothing else on stderr
    assert summary_of(proc.stderr)["rollfilter"]["failed"] == 300
    errors = tmp_path / "errors.jsonl"
    proc = run(["-u", server.url, "-j", "8", "--retries", "0", "--errors", str(errors)], input=rows)
    assert len(read_jsonl(errors)) == 300
    assert proc.stderr.decode().count("\n") == 1


@pytest.mark.usefixtures("quick_backoff")
def test_a_retry_withheld_by_the_budget_is_not_also_after_its_attempts(start_demo):
    server = start_demo("--fail-rate", "1.0")
    proc = run(
        ["-u", server.url, "-j", "40", "--retries", "3", "--retry-on", "500"], input=rows_jsonl(simple_rows(120))
    )
    assert proc.returncode == 1
    withheld = [line for line in proc.stderr.decode().splitlines() if "retry budget is spent" in line]
    assert withheld
    for line in withheld:
        assert line.count("attempts") <= 1, line
        assert re.search(
            r"\((not retried|after \d attempts, not retried again): the agent's retry budget is spent\)$", line
        ), line
