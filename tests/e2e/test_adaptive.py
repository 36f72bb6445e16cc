"""--adaptive end to end: the command against the demo agent's slots, queue and refusals."""

from __future__ import annotations


def test_the_command_finds_the_agents_capacity(start_demo):
    """End to end: a demo agent that throttles above 10 episodes at once; the window is seen in -v and the summary."""
    from tests.conftest import result_lines, rows_jsonl, run, simple_rows, summary_of

    agent = start_demo("--capacity", "10", "--latency", "0.05", "--retry-after", "0.2")
    proc = run(["-u", agent.url, "-j", "100", "--adaptive", "-v"], input=rows_jsonl(simple_rows(250)), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(result_lines(proc.stdout)) == 250
    stats = agent.stats()
    assert stats["throttled"] <= 0.1 * stats["requests"]
    windows = summary_of(proc.stderr)["rollfilter"]["windows"]
    assert set(windows) == {"(no name)"}
    # Slow start goes to at most twice what has come back before the first refusal: 16-20
    # here, a little more on a starved machine (22 once in a full run under coverage beside
    # a benchmark, when 11 came back), never the -j 100 a runaway probe would reach.
    assert windows["(no name)"]["max"] <= 3 * 10
    assert 5 <= windows["(no name)"]["final"] <= 15
    changes = [line for line in proc.stderr.decode().splitlines() if ": window " in line]
    assert changes
    assert changes[0].startswith("rollfilter: agent (no name): window 8 -> ")


def test_the_command_holds_a_queueing_agent_near_its_slots(start_demo):
    """End to end over HTTP: 10 slots and a queue; -j 200 would put 200 in the system."""
    from tests.conftest import result_lines, rows_jsonl, run, simple_rows, summary_of

    agent = start_demo("--slots", "10", "--thrash", "0.2", "--latency", "0.05")
    proc = run(["-u", agent.url, "-j", "200", "--adaptive"], input=rows_jsonl(simple_rows(300)), timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert len(result_lines(proc.stdout)) == 300
    window = summary_of(proc.stderr)["rollfilter"]["windows"]["(no name)"]
    assert window["max"] <= 60  # never near -j 200 (how far under 60 depends on the machine's load)
    assert window["final"] <= 30


def test_without_adaptive_the_same_agent_throttles_most_requests(start_demo):
    from tests.conftest import rows_jsonl, run, simple_rows

    agent = start_demo("--capacity", "10", "--latency", "0.05", "--retry-after", "0.2")
    run(["-u", agent.url, "-j", "100", "--retries", "1"], input=rows_jsonl(simple_rows(250)), timeout=120)
    stats = agent.stats()
    assert stats["throttled"] > 0.3 * stats["requests"]
