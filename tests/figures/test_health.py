"""The health checks, one result at a time, and the window a rate limit looks at."""

from __future__ import annotations

import copy

import pytest

from rollfilter.figures.health import CHECKS, WINDOW, WINDOW_MINIMUM, RecentShare, failed_checks, verdict_of_line
from tests.servers.health_agent import MESSAGE, OUTAGE_CHECKS, RESPONSES, USAGE


@pytest.mark.parametrize("check", CHECKS)
def test_each_kind_of_answer_fails_its_own_check_alone(check: str):
    assert failed_checks({"response": copy.deepcopy(RESPONSES[check]), "reward": 0.0}) == [check]


@pytest.mark.parametrize("status", ["failed", "cancelled"])
def test_a_response_the_model_server_failed_or_cancelled_is_a_response_error(status: str):
    assert failed_checks({"response": {"output": [MESSAGE], "usage": USAGE, "status": status}}) == ["response_error"]


def test_an_outage_fails_three_checks_in_the_order_of_checks():
    assert failed_checks({"response": RESPONSES["outage"]}) == OUTAGE_CHECKS


@pytest.mark.parametrize(
    "result",
    [
        {"response": {"output": [MESSAGE], "usage": USAGE, "status": "completed", "error": None}},
        {"reward": 1.0},  # no response: nothing to judge
        {"response": "text"},
        {"response": {"output": [MESSAGE]}},  # no usage: not judged by its tokens
        {"response": {"output": [MESSAGE], "usage": {"output_tokens": False}}},
        {"response": {"output": [MESSAGE], "error": False}},  # no error, however it is spelled
        {"response": {"output": [MESSAGE], "error": ""}},
    ],
)
def test_a_healthy_result_or_one_without_a_response_fails_none(result: dict):
    assert failed_checks(result) is None


def test_a_tool_call_is_answered_only_by_an_output_of_its_call_id_after_it():
    call = {"type": "function_call", "call_id": "a"}
    answer = {"type": "function_call_output", "call_id": "a", "output": "x"}
    other = {"type": "function_call_output", "call_id": "b", "output": "x"}
    assert failed_checks({"response": {"output": [call, answer, MESSAGE], "usage": USAGE}}) is None
    assert failed_checks({"response": {"output": [answer, call], "usage": USAGE}}) == ["unanswered_tool_call"]
    assert failed_checks({"response": {"output": [call, other], "usage": USAGE}}) == ["unanswered_tool_call"]


def test_token_metadata_whole_and_of_one_length_is_healthy():
    whole = {**MESSAGE, "prompt_token_ids": [1], "generation_token_ids": [2, 3], "generation_log_probs": [-1, -2]}
    assert failed_checks({"response": {"output": [whole], "usage": USAGE}}) is None
    partial = {**MESSAGE, "generation_token_ids": [2, 3]}
    assert failed_checks({"response": {"output": [partial], "usage": USAGE}}) == ["token_ids_mismatch"]


def test_the_window_judges_nothing_before_its_minimum_then_the_last_rollouts_only():
    recent = RecentShare()
    for _ in range(WINDOW_MINIMUM - 1):
        recent.add(True)
    assert recent.share() is None
    recent.add(True)
    assert recent.share() == 1.0
    for _ in range(WINDOW):
        recent.add(False)
    assert (recent.share(), recent.count, len(recent)) == (0.0, 0, WINDOW)
    for _ in range(30):
        recent.add(True)
    assert recent.share() == 0.3


def test_a_line_read_back_is_judged_by_its_response_else_by_the_verdict_written_on_it():
    outage = {"response": RESPONSES["outage"]}
    assert verdict_of_line(outage) == OUTAGE_CHECKS
    assert verdict_of_line({"response": RESPONSES["healthy"], "_rf_health": ["truncated"]}) is None  # judged again
    assert verdict_of_line({"reward": 0.0, "_rf_health": ["truncated", "not_a_check"]}) == ["truncated"]  # cut by jq
    assert verdict_of_line({"reward": 0.0, "_rf_health": "truncated"}) is None
    assert verdict_of_line({"reward": 0.0}) is None
