"""first_pass.py: a run's rows counted again, and its materialized file's first pass."""

from __future__ import annotations

import os
from pathlib import Path

from rollfilter.config import Config
from rollfilter.formats.source import LineReader
from rollfilter.run.first_pass import RepeatsMissing, Rereadable, count_rollouts
from tests.conftest import rows_jsonl, simple_rows


async def test_rows_in_files_are_counted_again_from_the_start(tmp_path: Path):
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(rows_jsonl(simple_rows(3)))
    second.write_text(rows_jsonl(simple_rows(2)))
    reader = LineReader([str(first), str(second)], max_line_bytes=1 << 20)
    try:
        assert await reader.next_line() is not None  # the run's reader is part-way through
        again = reader.read_again()
        assert isinstance(reader, Rereadable)
        assert again is not None
        assert await count_rollouts(again, Config(url="http://127.0.0.1:1/run", repeats=3)) == 15
    finally:
        reader.close()


def test_standard_input_and_pipes_cannot_be_read_again(tmp_path: Path):
    read_end, write_end = os.pipe()
    try:
        assert LineReader(["-"], max_line_bytes=1 << 20, stdin_fd=read_end).read_again() is None
        assert LineReader([f"/dev/fd/{read_end}"], max_line_bytes=1 << 20).read_again() is None
        assert LineReader([str(tmp_path / "gone.jsonl")], max_line_bytes=1 << 20).read_again() is None
    finally:
        os.close(read_end)
        os.close(write_end)


def test_rows_without_a_repeat_count_are_refused_naming_no_option():
    """The library says it plainly; the command line says it with its -r (tests/e2e/test_gym_files.py)."""
    missing = RepeatsMissing(frozenset({"beta", None, "alpha"}))
    assert missing.agents == [None, "alpha", "beta"]
    assert (
        str(missing)
        == "no repeat count for rows naming no agent, 'alpha', 'beta', and no default one; nothing was sent"
    )
