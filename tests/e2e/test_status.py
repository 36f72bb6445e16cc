"""kill -USR1: the status block on stderr, and nothing else changed."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.conftest import SUBPROCESS_TIMEOUT, lines_of, result_lines, start, summary_of
from tests.servers.recording_agent import RecordingAgent


def test_sigusr1_prints_a_status_block_and_changes_nothing_else(tmp_path: Path, agent: RecordingAgent):
    data = tmp_path / "in.jsonl"
    data.write_text("".join(json.dumps({"id": i, "responses_create_params": {"input": "q"}}) + "\n" for i in range(8)))
    agent.hold_after(2, waiting=6)  # two answered, the other six wait in flight
    proc = start(["-u", agent.run_url, "-a", "agent", "-j", "6", "-r", "1", str(data)])
    assert proc.stderr is not None
    stderr = lines_of(proc.stderr)
    try:
        assert agent.answered.wait(SUBPROCESS_TIMEOUT)
        proc.send_signal(signal.SIGUSR1)
        head = stderr.get(timeout=SUBPROCESS_TIMEOUT).decode()
        assert head.startswith("rollfilter: status: 2 done, 0 failed, 6 in flight, ")
        block = [stderr.get(timeout=SUBPROCESS_TIMEOUT).decode() for _ in range(5)]  # the oldest 5 of 6
    finally:
        agent.release.set()
    assert proc.stdout is not None
    stdout = proc.stdout.read()  # stderr is the reader thread's
    proc.wait(timeout=SUBPROCESS_TIMEOUT)
    rest = b""
    while (line := stderr.get(timeout=SUBPROCESS_TIMEOUT)) != b"":
        rest += line
    proc.stdout.close()
    proc.stderr.close()
    assert proc.returncode == 0  # the run went on as before
    assert len(result_lines(stdout)) == 8
    assert summary_of(rest)["rollfilter"]["succeeded"] == 8
    for line in block:
        assert line.startswith("rollfilter:   in flight ")
        assert f"{data}:" in line
        assert " agent agent attempt 1" in line
    lines_named = [int(line.split(f"{data}:")[1].split()[0]) for line in block]
    assert len(set(lines_named)) == 5
    # Oldest first: four of the first six rows sent, then one of the two sent when two slots freed.
    assert set(lines_named[:4]) <= set(range(1, 7))
    assert lines_named[4] in (7, 8)
    ages = [float(line.split("in flight ")[1].split(" s:")[0].replace(",", "")) for line in block]
    assert ages == sorted(ages, reverse=True)
    answered = {json.loads(body)["id"] + 1 for body in agent.raw_bodies[:2]}  # their line numbers
    assert not set(lines_named) & answered  # the held rows only
