import json

import trio

from rollfilter.config import Config
from rollfilter.formats.source import InputLine
from rollfilter.run.recount import ResultCounter
from rollfilter.run.run import Run


def counted(*lines: bytes) -> tuple[dict, ResultCounter]:
    async def count() -> tuple[dict, ResultCounter]:
        run = Run(Config())
        await run.connect(send=False)
        counter = ResultCounter(run)
        for number, data in enumerate(lines, 1):
            counter.line(InputLine("results.jsonl", number, data))
        counter.finish()
        return run.summary(), counter

    return trio.run(count)


def line(**record: object) -> bytes:
    return json.dumps(record).encode()


def test_a_pair_that_failed_then_succeeded_counts_once_as_succeeded():
    failed = line(_ng_task_index=0, _ng_rollout_index=0, error={"kind": "timeout"})
    summary, _ = counted(failed, line(_ng_task_index=0, _ng_rollout_index=0, reward=1.0), failed)
    assert (summary["rollfilter"]["succeeded"], summary["rollfilter"]["failed"]) == (1, 0)


def test_a_repeated_pair_and_a_line_that_is_not_json_are_said():
    result = line(_ng_task_index=0, _ng_rollout_index=0, reward=1.0)
    summary, counter = counted(result, b"not json", result, b"  ")
    assert (summary["rollfilter"]["succeeded"], summary["rollfilter"]["failed_by_kind"]) == (1, {"bad_input": 1})
    assert counter.unusable.problems() == [
        "1 line is not a result, counted as failed (bad_input); the first: results.jsonl:2: invalid JSON: JSON is"
        " malformed: invalid character (byte 4)",
        "1 result repeats a (task, rollout) pair counted already, counted once; the first: results.jsonl:3",
    ]
