"""plan.py: lines to jobs, numbered as NeMo Gym numbers them, however the input is chunked."""

from __future__ import annotations

import collections
import itertools
from typing import Any

import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from rollfilter.config import Config
from rollfilter.engine.plan import Planner, TaskNumbering
from rollfilter.formats.source import LineReader
from rollfilter.rows import parse_row


class ChunkedReads:
    """Stands in for os.read: hands out predetermined chunks, then EOF."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = list(chunks)

    def __call__(self, fd: int, size: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


LINES = st.lists(
    st.one_of(
        st.just(b'{"responses_create_params": {"input": "x"}}'),
        st.just(b""),
        st.just(b"   "),
        st.just(b"{bad"),
        st.just(b"{bad\0"),  # the same text with a NUL: another line, with a newline or without
        st.just(b"[1]"),
        st.just(b'{"a": "\xff"}'),
        st.just(b'{"responses_create_params": {"input": "' + b"y" * 80 + b'"}}'),  # over the limit
        st.binary(max_size=30).filter(lambda b: b"\n" not in b),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(lines=LINES, cuts=st.lists(st.integers(min_value=0, max_value=2000), max_size=20), newline_at_end=st.booleans())
def test_any_chunking_gives_the_same_jobs_and_line_numbers(lines: list[bytes], cuts: list[int], newline_at_end: bool):
    data = b"\n".join(lines) + (b"\n" if newline_at_end and lines else b"")
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    chunks = [data[a:b] for a, b in itertools.pairwise(points) if b > a]

    async def plan() -> list[tuple[int, int, bool]]:
        reader = LineReader(["-"], max_line_bytes=64, read=ChunkedReads(chunks))
        planner = Planner(reader, Config(url="http://h/run", repeats=2))
        jobs = []
        while (job := await planner.next_job()) is not None:
            jobs.append((job.line, job.task_index, job.rollout_index, job.failure is None))
        return jobs

    jobs = trio.run(plan)
    expected = []
    tasks: dict[bytes, int] = {}  # NeMo Gym's numbering: identical lines share a task...
    next_task = 0
    next_rollout: dict[int, int] = {}  # ...and its rollouts count on
    for number, line in enumerate(data.split(b"\n") if data else [], start=1):
        if not line.strip() or (number == len(data.split(b"\n")) and not line):
            continue
        ok = len(line) <= 64 and isinstance(parse_row(line.strip()), dict)
        # A line too long to keep gets an index of its own; NeMo Gym reads each line with its
        # newline, so a last line without one is not the same text as a line with one.
        text = line + b"\n" if number < len(data.split(b"\n")) else line
        task = next_task if len(line) > 64 else tasks.setdefault(text, next_task)
        next_task += task == next_task
        first = next_rollout.get(task, 0)
        next_rollout[task] = first + 2
        expected += [(number, task, first, ok), (number, task, first + 1, ok)]
    assert jobs == expected


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.one_of(st.none(), st.integers(0, 5), st.just("t"))),
        max_size=25,
    ),
    repeats=st.integers(1, 3),
)
def test_task_numbering_matches_nemo_gyms_dicts(rows: list[tuple[bytes, Any]], repeats: int):
    """NeMo Gym numbers with two plain dicts; the compact numbering must agree on every row."""
    numbering = TaskNumbering()
    row_to_task: dict[bytes, int] = {}
    next_rollout: collections.Counter[Any] = collections.Counter()
    for text, own in rows:
        expected_task = own if own is not None else row_to_task.setdefault(text, len(row_to_task))
        task = own if own is not None else numbering.task_for_line(text)
        assert task == expected_task
        assert numbering.take_rollouts(task, repeats) == next_rollout[task]
        next_rollout[task] += repeats


def test_a_last_line_without_a_newline_is_not_the_line_with_one():
    async def tasks(data: bytes) -> list[tuple[int, int]]:
        planner = Planner(LineReader(["-"], max_line_bytes=1024, read=ChunkedReads([data])), Config(url="http://h/run"))
        jobs = []
        while (job := await planner.next_job()) is not None:
            jobs.append((job.task_index, job.rollout_index))
        return jobs

    a, b = b'{"q": "a"}', b'{"q": "b"}'
    assert trio.run(tasks, a + b"\n" + b + b"\n" + a) == [(0, 0), (1, 0), (2, 0)]  # as NeMo Gym numbers them
    assert trio.run(tasks, a + b"\n" + b + b"\n" + a + b"\n") == [(0, 0), (1, 0), (0, 1)]
    assert trio.run(tasks, a + b"\0\n" + a) == [(0, 0), (1, 0)]  # a trailing NUL is text, not a mark
    assert trio.run(tasks, a + b"\n" + a + b"\0") == [(0, 0), (1, 0)]
