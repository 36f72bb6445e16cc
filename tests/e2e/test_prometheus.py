"""--prometheus and --prometheus-file: scraped while the run goes, and the file agreeing with the summary."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import SUBPROCESS_TIMEOUT, result_lines, run, start, summary_of, wait_for
from tests.servers.recording_agent import RecordingAgent


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Each sample by its name and labels, as prometheus_client's own parser reads the text."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def outcome(figures: dict[Any, float], agent: str, name: str) -> float:
    return figures["rollfilter_rollouts_total", (("agent", agent), ("outcome", name))]


def by_outcome(figures: dict[Any, float]) -> dict[str, float]:
    """rollfilter_rollouts_total by outcome, over every agent (a line that is no row names none)."""
    ended: dict[str, float] = {}
    for (name, labels), value in figures.items():
        if name == "rollfilter_rollouts_total":
            kind = dict(labels)["outcome"]
            ended[kind] = ended.get(kind, 0) + value
    return ended


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=SUBPROCESS_TIMEOUT) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return str(reply.read().decode())


def test_scraped_mid_run_the_counts_agree_with_the_results_written(tmp_path: Path, agent: RecordingAgent):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": i, "responses_create_params": {"input": "q"}}) + "\n" for i in range(8)))
    agent.hold_after(2, waiting=6)  # two answered, the other six wait in flight
    port = free_port()
    out = tmp_path / "out.jsonl"
    proc = start(
        ["-u", agent.run_url, "-a", "agent", "-j", "6", "-o", str(out), "--prometheus", f"127.0.0.1:{port}", str(data)]
    )
    try:
        assert agent.answered.wait(SUBPROCESS_TIMEOUT)
        figures = {}
        for _ in range(200):  # the two answers are counted a moment after the agent sent them
            figures = samples(scrape(port))
            if outcome(figures, "agent", "succeeded") == 2:
                break
    finally:
        agent.release.set()
    _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0
    assert outcome(figures, "agent", "succeeded") == 2
    assert len(result_lines(out.read_bytes())) == 8
    assert figures["rollfilter_rollouts_in_flight", (("agent", "agent"),)] == 6
    assert figures["rollfilter_rollouts_started_total", ()] == 8
    assert figures["rollfilter_rollout_duration_seconds_count", ()] == 2
    assert figures["rollfilter_reward_mean", (("agent", "agent"),)] == 1.0
    assert figures["rollfilter_tokens_total", (("agent", "agent"),)] > 0
    assert summary_of(stderr)["rollfilter"]["succeeded"] == 8
    with pytest.raises(urllib.error.URLError):  # the run has ended: so has the endpoint
        scrape(port)


def test_with_groups_finished_members_of_an_open_group_are_not_counted_cancelled(tmp_path: Path, agent: RecordingAgent):
    """A group's finished members wait for its last one: scraped meanwhile, they are neither ended
    nor cancelled, so that the cancelled counter never goes down when the group closes."""
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"responses_create_params": {"input": "q"}}) + "\n")
    agent.hold_after(2, waiting=2)  # two members answered, the other two wait in flight
    port = free_port()
    args = ["-u", agent.run_url, "-a", "agent", "-r", "4", "--groups", "--prometheus", f"127.0.0.1:{port}"]
    proc = start([*args, str(data)])
    try:
        assert agent.answered.wait(SUBPROCESS_TIMEOUT)
        figures = {}
        for _ in range(200):  # the two answers are held a moment after the agent sent them
            figures = samples(scrape(port))
            if figures.get(("rollfilter_rollouts_in_flight", (("agent", "agent"),))) == 2:
                break
    finally:
        agent.release.set()
    _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    assert proc.returncode == 0, stderr
    assert figures["rollfilter_rollouts_in_flight", (("agent", "agent"),)] == 2
    assert figures["rollfilter_rollouts_started_total", ()] == 4
    assert figures["rollfilter_rollouts_cancelled_total", ()] == 0
    assert summary_of(stderr)["rollfilter"]["cancelled"] == 0


def demo_rows() -> str:
    def row(demo: dict[str, Any]) -> str:
        return json.dumps({"responses_create_params": {"input": "q"}, "demo": {"latency": 0.01, **demo}}) + "\n"

    rows = [row({}) for _ in range(6)]
    rows += [row({"fault": "429", "fault_first": 1})]  # throttled once, then answered
    rows += [row({"fault": "500"})]  # retried, then failed: http_status
    rows += [row({"fault": "422"})]  # not retried: http_status
    rows += ["not json\n"]  # bad_input
    return "".join(rows)


def test_the_file_at_the_end_agrees_exactly_with_the_summary(tmp_path: Path, start_demo, quick_backoff):
    prom = tmp_path / "textfile" / "rollfilter.prom"
    agent = start_demo("--retry-after", "0.01")  # the figures count the retries, not their waits
    args = ["-u", agent.url, "--retries", "1", "-a", "weather", "--prometheus-file", str(prom)]
    result = run(args, input=demo_rows())
    assert result.returncode == 1
    figures = samples(prom.read_text())
    summary = summary_of(result.stderr)["rollfilter"]
    assert summary["failed_by_kind"] == {"http_status": 2, "bad_input": 1}
    ended = {kind: count for kind, count in by_outcome(figures).items() if count}
    assert ended == {"succeeded": summary["succeeded"], **summary["failed_by_kind"]}
    assert outcome(figures, "weather", "succeeded") == 7
    assert outcome(figures, "(no name)", "bad_input") == 1  # a line that is no row names no agent
    assert figures["rollfilter_retries_total", (("agent", "weather"),)] == summary["retries"] == 2
    assert figures["rollfilter_retries_withheld_total", (("agent", "(no name)"),)] == summary["retries_withheld"]
    assert figures["rollfilter_throttled_replies_total", (("agent", "weather"),)] == 1
    assert figures["rollfilter_rollouts_in_flight", (("agent", "weather"),)] == 0
    assert figures["rollfilter_rollout_duration_seconds_count", ()] == summary["succeeded"]
    assert figures["rollfilter_rollout_duration_seconds_bucket", (("le", "+Inf"),)] == summary["succeeded"]
    assert figures["rollfilter_reward_mean", (("agent", "weather"),)] == summary_of(result.stderr)["reward"]
    assert not [path.name for path in prom.parent.iterdir() if path != prom]  # no temporary file left


@pytest.mark.parametrize(
    ("address", "message"),
    [
        ("127.0.0.1:99999", "the port must be a number from 1 to 65535"),
        ("127.0.0.1:0", "the port must be a number from 1 to 65535"),
        ("127.0.0.1", "give HOST:PORT"),
        ("::1:9464", "an IPv6 address goes in brackets"),
        ("no-such-host.invalid:9464", "cannot listen there"),
        ("192.0.2.1:9464", "cannot listen there: Cannot assign requested address"),  # not this machine's
        ("TAKEN", "cannot listen there: Address already in use"),
    ],
)
def test_an_address_that_cannot_be_bound_is_a_usage_error_and_nothing_is_sent(
    tmp_path: Path, agent: RecordingAgent, address: str, message: str
):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = address.replace("TAKEN", f"127.0.0.1:{taken.getsockname()[1]}")
        out = tmp_path / "out.jsonl"
        row = json.dumps({"responses_create_params": {"input": "q"}}) + "\n"
        result = run(["-u", agent.run_url, "-o", str(out), "--prometheus", address], input=row)
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"rollfilter: --prometheus {address}: ")
    assert message in lines[0]
    assert agent.raw_bodies == []
    assert not out.exists()  # nothing is left of the refused run


def test_the_prometheus_file_is_checked_against_the_other_outputs(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    result = run(["--demo", "-o", str(out), "--prometheus-file", str(out)], input="")
    assert result.returncode == 2
    assert b"--prometheus-file" in result.stderr
    assert b"cannot be one file" in result.stderr


def test_an_empty_prometheus_file_name_is_a_usage_error(agent: RecordingAgent):
    row = json.dumps({"responses_create_params": {"input": "q"}}) + "\n"
    result = run(["-u", agent.run_url, "--prometheus-file", ""], input=row)
    assert (result.returncode, result.stderr) == (2, b"rollfilter: --prometheus-file wants the path of a file\n")
    assert agent.raw_bodies == []


def test_summarize_refuses_the_prometheus_options(tmp_path: Path):
    result = run(["--summarize", "--prometheus-file", str(tmp_path / "m.prom")], input="")
    assert result.returncode == 2
    assert b"--prometheus-file" in result.stderr
    assert not (tmp_path / "m.prom").exists()


def test_a_flood_of_connections_that_send_nothing_leaves_the_run_its_descriptors_and_stderr_clean():
    port = free_port()
    flood: list[socket.socket] = []

    def connect() -> None:
        sock = socket.socket()
        sock.settimeout(0.1)  # past the backlog, a connect waits this long to be given up
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:  # past the exporter's cap and the listen backlog: not taken
            sock.close()
            return
        flood.append(sock)

    proc = start(
        ["--demo", "--prometheus", f"127.0.0.1:{port}"],
        stdin=subprocess.PIPE,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (128, 128)),
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    threads = [threading.Thread(target=connect) for _ in range(200)]
    try:
        proc.stdin.write(b'{"responses_create_params": {"input": "a"}}\n')
        proc.stdin.flush()
        assert proc.stdout.readline()  # the run is going
        for thread in threads:
            thread.start()
        wait_for(lambda: len(flood) >= 16)  # the exporter's connections at least
        proc.stdin.write(b'{"responses_create_params": {"input": "b"}}\n')
        proc.stdin.flush()
        assert proc.stdout.readline()  # a descriptor for its connection was there
        for thread in threads:
            thread.join(timeout=SUBPROCESS_TIMEOUT)
        for sock in flood:
            sock.close()
        assert "rollfilter_rollouts_total" in scrape(port)  # the flood gone, scrapes are answered
        proc.stdin.close()
        assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == 0
        stderr = proc.stderr.read().decode()
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
        proc.stdout.close()
        proc.stderr.close()
    assert "Traceback" not in stderr
    assert "EMFILE" not in stderr
    assert summary_of(stderr.encode())["rollfilter"]["succeeded"] == 2
