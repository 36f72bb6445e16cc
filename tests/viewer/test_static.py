import os
import re
from pathlib import Path

from rollfilter.viewer.static import sampled, static_page
from tests.conftest import invoke
from tests.viewer.conftest import catalog_of, result, write_lines


def test_the_page_is_whole_and_runs_nothing(results_file: Path):
    page = static_page(catalog_of(results_file), max_rollouts=100)
    policy = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', page)
    assert policy is not None
    assert "default-src &#x27;none&#x27;" in policy.group(1)
    assert "<script" not in page
    assert 'src="http' not in page
    assert 'href="http' not in page
    assert page.count('<details id="line-') == 6
    assert "get_weather" in page
    assert "&lt;script&gt;" in page
    assert "uniform sample" not in page


def test_past_the_limit_a_sample_of_transcripts_is_kept_and_said(results_file: Path):
    page = static_page(catalog_of(results_file), max_rollouts=4)
    assert page.count('<details id="line-') == 4
    assert "A uniform sample of 4 of the 6 rollouts is kept here" in page


def test_the_sample_is_uniform_and_the_same_each_time():
    assert sampled(5, 10) == [0, 1, 2, 3, 4]
    drawn = sampled(100_000, 1000)
    assert drawn == sampled(100_000, 1000)
    assert drawn == sorted(set(drawn))
    assert len(drawn) == 1000
    assert 40_000 < sum(drawn) / len(drawn) < 60_000


def test_with_a_baseline_the_page_compares(results_file: Path, tmp_path: Path):
    baseline_file = tmp_path / "baseline.jsonl"
    write_lines(baseline_file, [result(0, 0, 0.0), result(0, 1, 0.0), result(1, 0, 1.0), result(1, 1, 1.0)])
    page = static_page(catalog_of(results_file, baseline=catalog_of(baseline_file)), max_rollouts=100)
    assert "Compared with the baseline" in page
    assert "<td>0</td><td>0</td><td>0.5</td><td>+0.5</td>" in page


def test_a_file_name_that_is_not_utf8_is_shown_escaped(results_file: Path, tmp_path: Path):
    named = tmp_path / os.fsdecode(b"run-\xff.jsonl")
    named.write_bytes(results_file.read_bytes())
    report = tmp_path / "report.html"
    done = invoke(["--view", "-r", "2", str(named), "--html", str(report)])
    assert done.returncode == 0, done.stderr
    assert "run-\\udcff.jsonl" in report.read_text()
