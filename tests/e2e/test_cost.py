"""--price, --prices and --max-cost: the spend in the summary and the stop it makes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import QuietHandler, ThreadedHTTPServer, closed_port_url, result_lines, run, summary_of
from tests.servers.recording_agent import RecordingAgent


@pytest.fixture
def agent() -> Iterator[RecordingAgent]:
    server = RecordingAgent(name=None)
    try:
        yield server
    finally:
        server.close()


def rows(n: int, agent: str, **extra: Any) -> str:
    return "".join(
        json.dumps({"id": i, "responses_create_params": {"input": "q" * i}, "agent_ref": {"name": agent}, **extra})
        + "\n"
        for i in range(n)
    )


def spent(results: list[dict[str, Any]], price_in: float, price_out: float) -> float:
    usage = [r["response"]["usage"] for r in results]
    return sum(u["input_tokens"] * price_in + u["output_tokens"] * price_out for u in usage) / 1e6


def test_cost_is_tokens_times_prices_by_agent(tmp_path: Path, agent: RecordingAgent):
    prices = tmp_path / "prices.yaml"
    prices.write_text("alpha: [3.0, 15.0]\n_default: {input: 1.0, output: 2.0}\n")
    data = rows(5, "alpha") + rows(4, "beta") + rows(1, "beta", answer={"_ng_failure_class": "model_error"})
    data += rows(1, "beta", answer={"response": {}})  # an answer without usage: it costs nothing
    endpoints = ["-e", f"alpha={agent.url}", "-e", f"beta={agent.url}"]
    proc = run([*endpoints, "--prices", str(prices), "--price", "alpha=3,15,0.3"], input=data)
    assert proc.returncode == 1  # the agent-reported failure
    results = result_lines(proc.stdout)
    alpha = [r for r in results if r["agent_ref"]["name"] == "alpha"]
    beta = [r for r in results if r["agent_ref"]["name"] == "beta" and r["response"].get("usage")]
    failed_usage = (len(json.dumps({"input": ""})) * 1.0 + 2 * 2.0) / 1e6  # the failed rollout's tokens count
    figures = summary_of(proc.stderr)["rollfilter"]
    assert figures["cost_usd_by_agent"]["alpha"] == pytest.approx(spent(alpha, 3.0, 15.0), abs=1e-6)
    assert figures["cost_usd_by_agent"]["beta"] == pytest.approx(spent(beta, 1.0, 2.0) + failed_usage, abs=1e-6)
    assert figures["cost_usd"] == pytest.approx(sum(figures["cost_usd_by_agent"].values()), abs=1e-6)
    assert figures["rollouts_without_usage"] == 1


@pytest.mark.parametrize("text", ["a: [true, 2]", "a: ['1', 2]", "a: {input: 1}", "a: 3", "[1, 2]"])
def test_a_bad_prices_file_is_refused_in_one_line(tmp_path: Path, text: str):
    prices = tmp_path / "prices.yaml"
    prices.write_text(text + "\n")
    proc = run(["-u", closed_port_url() + "/run", "--prices", str(prices)])  # refused before sending
    assert proc.returncode == 2
    (line,) = proc.stderr.decode().splitlines()
    assert line.startswith(f"rollfilter: --prices {prices}: ")


def test_max_cost_stops_within_one_window_of_in_flight_rows(agent: RecordingAgent):
    # Each row costs (its input tokens + 2 output) dollars at a price of 1e6 USD per million.
    proc = run(
        ["-u", agent.run_url, "-a", "x", "-j", "4", "--price", "1e6,1e6", "--max-cost", "200"], input=rows(300, "x")
    )
    assert proc.returncode == 1
    results = result_lines(proc.stdout)
    costs = sorted(r["response"]["usage"]["total_tokens"] for r in results)
    assert sum(costs) >= 200
    assert sum(costs[:-4]) < 200  # the budget was reached by the rows of the last window at most
    assert len(results) < 300
    figures = summary_of(proc.stderr)["rollfilter"]
    spent_then, _, budget = figures["stopped"].removeprefix("stopped after spending $").partition(" of a ")
    assert budget == "$200 budget"
    assert 200 <= float(spent_then) <= figures["cost_usd"]  # answers already in when it stopped count too


def test_max_cost_needs_prices(agent: RecordingAgent):
    proc = run(["-u", agent.run_url, "--max-cost", "5"], input=rows(1, "x"))
    assert proc.returncode == 2
    assert agent.bodies == []
    assert "max-cost" in proc.stderr.decode()


def test_an_answer_whose_usage_no_cost_can_hold_is_kept_and_counted_without_usage(
    tmp_path: Path, agent: RecordingAgent
):
    huge = {"response": {"usage": {"input_tokens": 10**340, "output_tokens": 1}}}
    data = rows(2, "x") + rows(1, "x", answer=huge) + rows(1, "x", answer={**huge, "_ng_failure_class": "model_error"})
    errors = tmp_path / "errors.jsonl"
    proc = run(["-u", agent.run_url, "--price", "3,15", "--errors", str(errors)], input=data)
    assert proc.returncode == 1  # the agent's own failure, and nothing else
    results = result_lines(proc.stdout)
    assert len(results) == 3
    assert [r["response"]["usage"]["input_tokens"] for r in results].count(10**340) == 1  # kept whole
    (failure,) = [json.loads(line) for line in errors.read_text().splitlines()]
    assert failure["error"]["kind"] == "agent_failure"
    assert failure["response"]["usage"]["input_tokens"] == 10**340  # the answer, with its usage
    figures = summary_of(proc.stderr)["rollfilter"]
    assert figures["rollouts_without_usage"] == 2
    assert figures["failed_by_kind"] == {"agent_failure": 1}
    ordinary = [r for r in results if r["response"]["usage"]["input_tokens"] < 10**9]
    assert len(ordinary) == 2
    assert figures["cost_usd"] == pytest.approx(spent(ordinary, 3, 15), abs=1e-6)


def test_a_prices_file_with_a_price_past_the_float_range_is_refused_before_sending(
    tmp_path: Path, agent: RecordingAgent
):
    prices = tmp_path / "prices.yaml"
    prices.write_text(f"alpha: [1, 2]\nbeta: [{10**400}, 2]\n")
    proc = run(["-u", agent.run_url, "--prices", str(prices)], input=rows(2, "alpha"))
    assert proc.returncode == 2
    assert proc.stderr.decode() == (
        f"rollfilter: --prices {prices}: the price of 'beta': the input price must be a finite number of USD,"
        " 0 or more, got a number of 401 digits\n"
    )
    assert agent.bodies == []


class _RawAnswers(QuietHandler):
    """Answers each /run with the body of its row's "answer", as bytes: JSON that Python's json
    could not write (a float past its range, an integer of 5,000 digits)."""

    def do_POST(self) -> None:
        row = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_json(200, row["answer"].encode())


def test_an_answer_with_numbers_no_float_holds_is_kept_exactly(tmp_path: Path):
    huge = "9" * 5000
    answers = [
        f'{{"reward": 1.0, "response": {{"usage": {{"input_tokens": {huge}, "output_tokens": 1}}}}}}',
        '{"reward": 1e400, "response": {"usage": {"input_tokens": 1e400, "output_tokens": 1}}}',
        '{"reward": 0.0, "response": {"usage": {"input_tokens": 1000000, "output_tokens": 0}}}',
    ]
    server = ThreadedHTTPServer(_RawAnswers)
    try:
        data = "".join(json.dumps({"responses_create_params": {"input": "x"}, "answer": a}) + "\n" for a in answers)
        proc = run(["-u", server.url + "/run", "-k", "--price", "3,15"], input=data)
    finally:
        server.close()
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert len(lines) == 3
    assert f'"input_tokens":{huge}'.encode() in lines[0]  # written back as it came
    assert b'"reward":1E+400' in lines[1]
    figures = summary_of(proc.stderr)["rollfilter"]
    assert figures["rollouts_without_usage"] == 2
    assert figures["cost_usd"] == pytest.approx(3.0)
    assert summary_of(proc.stderr)["reward"] == 0.5  # the reward no float holds is no figure of the mean
