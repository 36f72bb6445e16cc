import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import invoke, start
from tests.viewer.conftest import results, write_lines

LINE = re.compile(rb"rollfilter: viewing 6 rollouts at http://127\.0\.0\.1:(\d+)/ \(Ctrl-C to stop\)\n")


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    path = tmp_path / "out.jsonl"
    write_lines(path, results())
    return path


def test_standard_input_is_refused():
    done = invoke(["--view"], input=b"{}\n")
    assert done.returncode == 2
    assert done.stderr == (
        b"rollfilter: --view reads its files again as they grow: give the result files, not standard input\n"
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--listen", "127.0.0.1:0"], b"rollfilter: --listen is for --view\n"),
        (["--view", "--listen", "nowhere"], b"rollfilter: --listen takes HOST:PORT, such as 127.0.0.1:8000, not"),
        (["--view", "--summarize"], b"rollfilter: --view sends nothing and writes no rollout: --summarize is not"),
    ],
)
def test_options_of_the_view_are_checked(results_file: Path, args: list[str], said: bytes):
    done = invoke([*args, str(results_file)])
    assert done.returncode == 2
    assert done.stderr.startswith(said)


def test_html_writes_one_page_and_exits(results_file: Path, tmp_path: Path):
    report = tmp_path / "report.html"
    done = invoke(["--view", "-r", "2", str(results_file), "--html", str(report), "--html-rollouts", "2"])
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")
    page = report.read_text()
    assert "A uniform sample of 2 of the 6 rollouts" in page
    assert "<script" not in page


def test_it_serves_until_ctrl_c_then_exits_130_saying_nothing_more(results_file: Path):
    process = start(["--view", "--errors", os.devnull, str(results_file)], stderr=subprocess.PIPE)
    assert process.stderr is not None
    line = process.stderr.readline()
    assert LINE.fullmatch(line), line
    port = int(LINE.fullmatch(line).group(1))  # type: ignore[union-attr]
    import http.client

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    connection.request("GET", "/")
    assert connection.getresponse().status == 200
    connection.close()
    process.send_signal(signal.SIGINT)
    _, rest = process.communicate(timeout=10)
    assert (process.returncode, rest) == (130, b"")


def test_a_baseline_in_shards_is_given_as_one_quoted_pattern(results_file: Path, tmp_path: Path):
    records = results()
    write_lines(tmp_path / "a-0.jsonl", records[:3])
    write_lines(tmp_path / "a-1.jsonl", records[3:])
    report = tmp_path / "report.html"
    pattern = str(tmp_path / "a-*.jsonl")
    done = invoke(["--view", "-r", "2", str(results_file), "--compare", pattern, "--html", str(report)])
    assert (done.returncode, done.stderr) == (0, b"")
    compared = report.read_text().split("Compared with the baseline")[1]
    assert "<th>tied</th><td>3</td></tr><tr><th>tasks</th><td>3</td>" in compared  # both shards' tasks paired


def test_a_pipe_given_as_a_file_is_refused(tmp_path: Path):
    fifo = tmp_path / "results.fifo"  # as <(...) gives: read once, it cannot be read again
    os.mkfifo(fifo)
    done = invoke(["--view", str(fifo)])
    assert done.returncode == 2
    said = f"rollfilter: --view reads its files again as they grow: {fifo} is a pipe, read once\n"
    assert done.stderr == said.encode()


@pytest.mark.parametrize("given", ["results", "errors", "baseline"])
def test_html_is_not_written_over_a_file_it_shows(results_file: Path, tmp_path: Path, given: str):
    other = tmp_path / "other.jsonl"
    write_lines(other, results()[:2])
    before = other.read_bytes()
    args = {"results": [str(other)], "errors": ["--errors", str(other)], "baseline": ["--compare", str(other)]}[given]
    done = invoke(["--view", str(results_file), *args, "--html", str(other)])
    assert done.returncode == 2
    assert done.stderr == f"rollfilter: --html {other} is also the input {other}: input file is output file\n".encode()
    assert other.read_bytes() == before
