import json
import os
import tracemalloc
from pathlib import Path

import pytest

from rollfilter.viewer.catalog import numbered_lines
from tests.conftest import invoke
from tests.viewer.conftest import catalog_of, result, write_lines


def test_the_figures_are_the_summary_summarize_gives(results_file: Path):
    summarized = invoke(["--summarize", "-r", "2", str(results_file)])
    assert json.loads(summarized.stdout) == catalog_of(results_file).summary


def test_each_line_is_indexed_with_its_fields(results_file: Path):
    catalog = catalog_of(results_file)
    entries = list(catalog.entries())
    assert [(e.task, e.rollout) for e in entries] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert [e.tool_calls for e in entries] == [1, 0, 0, 0, 0, 0]
    assert [e.failed for e in entries] == [False] * 4 + [True, False]
    assert [e.unhealthy for e in entries] == [False, False, True, False, False, False]
    assert catalog.record(entries[3])["_ng_rollout_index"] == 1


def test_a_growing_file_is_indexed_on_from_where_it_stopped(results_file: Path):
    catalog = catalog_of(results_file)
    first = catalog.entry(0)
    with results_file.open("a") as file:
        file.write(json.dumps(result(3, 0, 1.0)) + "\n" + '{"_ng_task_index": 3, "_ng_roll')  # a line half written
    catalog.refresh()
    assert len(catalog) == 7
    assert catalog.entry(0) == first
    assert catalog.summary["rollfilter"]["succeeded"] == 6
    with results_file.open("a") as file:
        file.write('out_index": 1, "reward": 0.0}\n')
    catalog.refresh()
    assert [(e.task, e.rollout) for e in catalog.entries()][-2:] == [(3, 0), (3, 1)]
    assert catalog.summary["rollfilter"]["succeeded"] == 7


def test_a_truncated_file_is_read_again(results_file: Path):
    catalog = catalog_of(results_file)
    write_lines(results_file, [result(9, 0, 0.25)])
    catalog.refresh()
    assert [(e.task, e.reward) for e in catalog.entries()] == [(9, 0.25)]
    assert catalog.summary["rollfilter"]["succeeded"] == 1


def test_a_drawing_is_made_again_only_when_the_files_changed(results_file: Path):
    catalog = catalog_of(results_file)
    drawn: list[int] = []

    def draw() -> str:
        drawn.append(len(catalog))
        return f"{len(catalog)} rollouts"

    assert [catalog.drawing("count", draw) for _ in range(2)] == ["6 rollouts"] * 2
    catalog.refresh()
    assert drawn == [6]
    write_lines(results_file, [result(3, 0, 1.0)], mode="a")
    catalog.refresh()
    assert catalog.drawing("count", draw) == "7 rollouts"
    assert drawn == [6, 7]


def test_a_baseline_that_grew_changes_the_comparison(results_file: Path, tmp_path: Path):
    baseline_file = tmp_path / "baseline.jsonl"
    write_lines(baseline_file, [result(0, 0, 0.0), result(0, 1, 0.0)])
    catalog = catalog_of(results_file, baseline=catalog_of(baseline_file))
    assert catalog.summary["compare"]["reward"]["tasks"] == 1
    write_lines(baseline_file, [result(1, 0, 0.0), result(1, 1, 0.0)], mode="a")
    catalog.refresh()
    assert catalog.summary["compare"]["reward"]["tasks"] == 2


def test_a_file_written_again_past_its_old_end_is_read_again(results_file: Path):
    catalog = catalog_of(results_file)
    size = results_file.stat().st_size
    with results_file.open("r+") as file:  # emptied and written again in place, longer than before
        file.truncate(0)
        file.write(json.dumps(result(8, 0, 0.75, "x" * size)) + "\n")
    catalog.refresh()
    assert [(e.task, e.reward) for e in catalog.entries()] == [(8, 0.75)]


def test_integers_past_64_bits_are_indexed_as_absent(tmp_path: Path):
    path = tmp_path / "huge.jsonl"
    huge = 1 << 70
    record = result(huge, huge, 1.0, _rf_policy_version={"sent": huge})
    record["response"]["usage"]["output_tokens"] = -huge
    write_lines(path, [result(0, 0, 1.0), record])
    entries = list(catalog_of(path).entries())
    assert [(e.task, e.rollout, e.tokens, e.version) for e in entries[1:]] == [(-1, -1, 0, -1)]


def test_a_line_past_the_limit_is_not_held(tmp_path: Path):
    path = tmp_path / "long.jsonl"
    path.write_bytes(json.dumps(result(0, 0, 1.0)).encode() + b"\n" + b"x" * (12 << 20) + b"\n{}\n")
    tracemalloc.start()
    try:
        lines = [(offset, length, line.data is None) for offset, length, line in numbered_lines(str(path), 0, 1000)]
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    first = lines[0][1]
    assert lines == [(0, first, False), (first, (12 << 20) + 1, True), (first + (12 << 20) + 1, 3, False)]
    assert peak < 6 << 20  # a few chunks, not the line


@pytest.mark.parametrize("more", [0, 1])  # as long as before (a line had the same length), or longer
def test_a_file_written_again_in_place_is_indexed_again(tmp_path: Path, more: int):
    path = tmp_path / "out.jsonl"
    write_lines(path, [result(task, 0, 1.0) for task in range(3)])
    catalog = catalog_of(path)
    with path.open("r+") as file:  # truncated and written again, as `>` does: the same file
        file.truncate(0)
        file.writelines(json.dumps(result(task, 0, 0.0)) + "\n" for task in range(5, 8 + more))
    written = path.stat().st_mtime_ns + 10_000_000  # a later write, past the clock's tick in a fast test
    os.utime(path, ns=(written, written))
    catalog.refresh()
    assert [(e.task, e.reward) for e in catalog.entries()] == [(task, 0.0) for task in range(5, 8 + more)]
    assert catalog.find(0, 0) is None
    assert catalog.summary["reward"] == 0.0


@pytest.mark.parametrize("output", [True, 3, "text", {"type": "function_call"}])
def test_an_output_that_is_not_a_list_is_indexed_with_no_tool_call(tmp_path: Path, output: object):
    path = tmp_path / "odd.jsonl"
    record = result(0, 0, 1.0)
    record["response"]["output"] = output
    write_lines(path, [record])
    assert [e.tool_calls for e in catalog_of(path).entries()] == [0]
