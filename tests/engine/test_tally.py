"""tally.py: a rollout counted once, the same way, wherever it ended."""

from __future__ import annotations

from typing import Any

from rollfilter.engine.metrics import Metrics
from rollfilter.engine.plan import Job
from rollfilter.engine.tally import Tally
from rollfilter.errors import ErrorKind
from rollfilter.figures.passk import TaskStats
from rollfilter.outcomes import AttemptFailure

RESULTS = [
    {"_ng_task_index": task, "_ng_rollout_index": rollout, "reward": float(rollout), "agent_ref": {"name": "a"}}
    for task in range(3)
    for rollout in range(2)
]


def job(result: dict[str, Any]) -> Job:
    task, rollout = result["_ng_task_index"], result["_ng_rollout_index"]
    return Job(
        seq=0, source="-", line=task + 1, task_index=task, rollout_index=rollout, row={}, body=b"{}", agent_name="a"
    )


def tally() -> Tally:
    return Tally(Metrics(), TaskStats(2, 1.0), repeats_for=lambda agent: 2)


def test_a_result_read_back_from_a_file_counts_as_the_engine_counted_it():
    sent, read_back = tally(), tally()
    for result in RESULTS:
        sent.started()
        sent.result(job(result), result, None)
        read_back.written_result(result)
    assert sent.tasks is not None
    assert read_back.tasks is not None
    assert (
        (read_back.metrics.taken, read_back.metrics.succeeded) == (sent.metrics.taken, sent.metrics.succeeded) == (6, 6)
    )
    assert read_back.metrics.by_agent["a"].means() == sent.metrics.by_agent["a"].means()
    assert read_back.tasks.summary_fields() == sent.tasks.summary_fields()
    assert read_back.tasks.figures() == sent.tasks.figures()


def test_a_failure_read_back_counts_as_the_engine_counted_it_and_an_earlier_result_is_no_count_of_this_run():
    sent, read_back = tally(), tally()
    failure = AttemptFailure(ErrorKind.TIMEOUT, "slow")
    sent.started()
    sent.failure(job(RESULTS[0]), failure)
    read_back.written_failure(failure, {**RESULTS[0], "error": {"kind": "timeout"}})
    assert dict(read_back.metrics.failed_by_kind) == dict(sent.metrics.failed_by_kind) == {"timeout": 1}
    assert read_back.metrics.taken == sent.metrics.taken == 1
    sent.earlier(RESULTS[1])
    assert (sent.metrics.succeeded, sent.metrics.figures_by_agent()["a"].succeeded) == (0, 1)


def test_an_unhealthy_result_counts_alike_sent_or_read_back_and_masked_from_earlier_runs_too():
    """The client marks a result it receives (`_rf_health`); a line read back is judged again."""
    outage = {"output": [], "usage": {"output_tokens": 0}}
    lines = [{**result, "response": outage} if result["_ng_task_index"] == 0 else result for result in RESULTS]
    sent, read_back = Tally(Metrics(), mask_unhealthy=True), Tally(Metrics(), mask_unhealthy=True)
    for line in lines:
        marked = {**line, "_rf_health": ["empty_output", "no_output_tokens"]} if "response" in line else line
        sent.result(job(line), marked, None)
        read_back.written_result(line)
    for counted in (sent, read_back):
        assert (counted.metrics.unhealthy, counted.metrics.masked) == (2, 2)
        assert counted.metrics.unhealthy_by_check == {"empty_output": 2, "no_output_tokens": 2}
    resumed = Tally(Metrics(), TaskStats(2, 1.0), mask_unhealthy=True)
    for line in lines:
        resumed.earlier(line)
    assert resumed.tasks is not None
    resumed.tasks.finish()
    assert (resumed.metrics.unhealthy, resumed.tasks.all_unhealthy) == (0, 1)  # an earlier run's: figures only
    assert resumed.metrics.earlier_by_agent["a"].masked == 2


def test_a_failure_of_kind_unhealthy_counts_the_checks_its_answer_failed():
    counted = tally()
    answer = {"response": {"output": []}, "_rf_health": ["empty_output"]}
    counted.failure(job(RESULTS[0]), AttemptFailure(ErrorKind.UNHEALTHY, "unhealthy", answer=answer))
    counted.failure(job(RESULTS[1]), AttemptFailure(ErrorKind.HTTP_STATUS, "HTTP 500", 500))
    assert (counted.metrics.failed, counted.metrics.unhealthy) == (2, 1)
    assert counted.tasks is not None
    counted.tasks.finish()
    assert counted.tasks.all_unhealthy == 0  # its other rollout failed otherwise
