"""--demo: the built-in agent, alone or refused beside another."""

from __future__ import annotations

import json
import os
import pty

import pytest

from tests.conftest import (
    CLOSED_PORT_URL,
    SUBPROCESS_TIMEOUT,
    WEATHER,
    clean_env,
    closed_port_url,
    expected_reward,
    result_lines,
    rows_jsonl,
    run,
    simple_rows,
    start,
    summary_of,
    with_closed_port,
)


def test_demo_runs_the_weather_example():
    proc = run(["--demo", str(WEATHER)])
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in WEATHER.read_text().splitlines()]
    results = sorted(result_lines(proc.stdout), key=lambda r: r["_ng_task_index"])
    assert [r["_ng_task_index"] for r in results] == list(range(len(rows)))
    for row, result in zip(rows, results, strict=True):
        assert result["reward"] == expected_reward(row)
        assert result["responses_create_params"] == row["responses_create_params"]
        assert result["_ng_rollout_index"] == 0
    summary = summary_of(proc.stderr)
    assert summary["reward"] == sum(r["reward"] for r in results) / len(results)
    assert summary["rollfilter"]["succeeded"] == 5
    assert summary["rollfilter"]["failed"] == 0


def test_demo_alone_at_a_terminal_runs_the_example_rows():
    controller, terminal = pty.openpty()
    proc = start(["--demo"], stdin=terminal)
    os.close(terminal)
    stdout, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    os.close(controller)
    assert proc.returncode == 0, stderr
    assert len(result_lines(stdout)) == 5
    assert b"example rows" in stderr.splitlines()[0]
    assert summary_of(stderr)["rollfilter"]["succeeded"] == 5


@pytest.mark.parametrize(
    "agent", [["-u", CLOSED_PORT_URL], ["-e", f"a={CLOSED_PORT_URL}"], ["--head-server", CLOSED_PORT_URL]]
)
def test_demo_beside_an_agent_is_a_usage_error(agent: list[str]):
    proc = run(["--demo", *with_closed_port(agent)], input=rows_jsonl(simple_rows(2)))
    assert proc.returncode == 2
    assert proc.stdout == b""
    assert proc.stderr.decode() == f"rollfilter: --demo starts its own agent: it cannot be combined with {agent[0]}\n"


def test_demo_replaces_agent_defaults_from_the_environment():
    env = clean_env(ROLLFILTER_URL=closed_port_url(), ROLLFILTER_HEAD_SERVER=closed_port_url())
    proc = run(["--demo"], input=rows_jsonl(simple_rows(3)), env=env)
    assert proc.returncode == 0, proc.stderr
    assert sorted(r["_ng_task_index"] for r in result_lines(proc.stdout)) == [0, 1, 2]
