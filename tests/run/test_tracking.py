"""run/tracking.py: the run's snapshot and summary rendered for its trackers, from Python too."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import pytest
import trio

from rollfilter import Config, Trackers, open_rollouts
from rollfilter.config import ConfigError
from rollfilter.demo import DemoAgent, serve
from rollfilter.run import tracking
from rollfilter.run.run import Run
from rollfilter.run.tracking import identity_of, params_of
from tests.api.test_rollouts import weather_rows
from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    HeadServer,
    clean_env,
    invoke,
    lines_of,
    read_terminal,
    rows_jsonl,
    serving,
    simple_rows,
)
from tests.trackers.hanging import WAITING
from tests.trackers.test_log import Recording


def test_params_are_the_record_by_path_with_the_version():
    record = {"inputs": [{"name": "in.jsonl", "sha256": "ab"}], "repeats": 4, "repeats_by_agent": {"math": 8}}
    params = params_of({**record, "agent": None, "groups": False, "shard": [0, 2]})
    assert params == {
        "rollfilter_version": params["rollfilter_version"],
        "inputs": '[{"name": "in.jsonl", "sha256": "ab"}]',
        "repeats": "4",
        "repeats_by_agent.math": "8",
        "agent": "null",
        "groups": "false",
        "shard": "[0, 2]",
    }


def test_a_runs_identity_from_python_carries_no_credential_query_or_header():
    config = Config(
        url="http://user:pw@127.0.0.1:8000/run?key=k1",
        endpoints={"math": "https://u:p2@math.example/run?token=t2"},
        head_server="http://h:p3@127.0.0.1:11000/?sig=s3",
        headers=(("Authorization", "Bearer h4"),),
        params=(("temperature", 0.5),),
        repeats=2,
    )
    text = json.dumps(params_of(identity_of(config)))
    assert "127.0.0.1:8000/run" in text
    assert "math.example/run" in text
    assert '"params": "[[\\"temperature\\", 0.5]]"' in text
    for secret in ("user", "pw", "k1", "p2", "t2", "p3", "s3", "Bearer", "h4", "key=", "token", "sig"):
        assert secret not in text, secret


def test_a_tracker_whose_client_is_missing_is_refused_with_the_pip_command(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(
        ConfigError, match=r"^Config.trackers.mlflow: needs its client: pip install 'rollfilter\[mlflow\]'$"
    ):
        Run(Config(trackers=Trackers(mlflow="http://127.0.0.1:5000")))


@pytest.mark.usefixtures("tracker_clients")
async def test_a_python_run_logs_its_points_and_every_figure_at_the_end(monkeypatch: pytest.MonkeyPatch, tmp_path):
    recording = Recording()
    monkeypatch.setattr(tracking, "_wandb", lambda project, run_name: recording)
    monkeypatch.setattr(tracking, "LIVE_EVERY_S", 0.001)
    ids_file = str(tmp_path / "ids.json")
    trackers = Trackers(wandb="project", rollouts=3, ids_file=ids_file)
    agent = DemoAgent()
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve(agent, task_status=task_status))
        config = Config(url=f"http://127.0.0.1:{port}", repeats=2, trackers=trackers, policy_version=7)
        async with open_rollouts(weather_rows(), config) as run_:
            outcomes = [outcome async for outcome in run_]
        nursery.cancel_scope.cancel()
    assert len(outcomes) == 10
    assert recording.started_with is not None
    params, run_id = recording.started_with
    assert (params["url"], params["repeats"], run_id) == (f"http://127.0.0.1:{port}/run", "2", None)
    assert json.loads((tmp_path / "ids.json").read_text())["ids"] == {"wandb": "new-id"}
    steps = [step for _, step in recording.points]
    assert steps == sorted(steps)  # stepped by the rollouts finished
    final = recording.ended
    assert final is not None
    assert (final.status, final.step) == ("FINISHED", 10)
    assert final.metrics["rollfilter/succeeded"] == 10
    assert final.metrics["mean_at_2"] == run_.summary["mean@2"]
    logged = json.loads(final.summary)
    assert (logged["mean@2"], logged["rollfilter"]["succeeded"]) == (run_.summary["mean@2"], 10)
    assert final.versions == {7: run_.summary["reward"]}  # every rollout was sent under version 7
    assert len(final.rollouts) == 3
    assert all(json.loads(line)["_ng_task_index"] in range(5) for line in final.rollouts)


class Quoting(Recording):
    """A tracker whose client quotes the query of its URI, away from the rest, as MLflow's does."""

    def start(self, params: Mapping[str, str], run_id: str | None) -> str:
        raise ConnectionError("Max retries exceeded with url: /?token=t0k3n/api/2.0/mlflow/runs (refused)")


@pytest.mark.usefixtures("tracker_clients")
def test_a_warning_never_quotes_a_secret_of_the_trackers_uri(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(tracking, "_mlflow", lambda uri, experiment, run_name: Quoting())
    uri = "http://me:pa55w0rd@127.0.0.1:5000/?token=t0k3n"
    result = invoke(["--demo", "--mlflow", uri], input=rows_jsonl(simple_rows(2)))
    assert result.returncode == 0, result.stderr
    warning, _summary = result.stderr.decode().splitlines()  # the summary last
    assert warning.startswith("rollfilter: Recording: cannot start its run (ConnectionError: ")
    for secret in ("me:", "pa55w0rd", "token", "t0k3n"):
        assert secret not in warning, secret


@pytest.mark.usefixtures("tracker_clients")
def test_a_run_refused_after_its_trackers_started_ends_their_runs_failed(monkeypatch: pytest.MonkeyPatch):
    recording = Recording()
    monkeypatch.setattr(tracking, "_mlflow", lambda uri, experiment, run_name: recording)
    with serving(HeadServer(port=9)) as head:
        args = ["--head-server", head.url, "-a", "nosuch", "--mlflow", "http://127.0.0.1:5000"]
        result = invoke(args, input=rows_jsonl(simple_rows(2)))
    assert result.returncode == 2
    assert b"not known to the head server" in result.stderr
    assert recording.ended is not None
    assert recording.ended.status == "FAILED"


@pytest.mark.usefixtures("tracker_clients")
async def test_a_python_run_left_before_its_end_ends_its_tracker_run_killed(monkeypatch: pytest.MonkeyPatch):
    recording = Recording()
    monkeypatch.setattr(tracking, "_wandb", lambda project, run_name: recording)
    async with trio.open_nursery() as nursery:
        port = await nursery.start(lambda task_status: serve(DemoAgent(), task_status=task_status))
        config = Config(url=f"http://127.0.0.1:{port}", repeats=2, concurrency=1, trackers=Trackers(wandb="p"))
        async with open_rollouts(weather_rows(), config) as run_:
            async for _ in run_:
                break  # one of ten: the run has not ended
        nursery.cancel_scope.cancel()
    assert recording.ended is not None
    assert recording.ended.status == "KILLED"
    assert recording.ended.step < 10


@pytest.mark.usefixtures("tracker_clients")
def test_the_same_files_summarized_in_another_order_update_the_same_tracker_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path
):
    first, again = Recording(), Recording()
    made = iter([first, again])
    monkeypatch.setattr(tracking, "_mlflow", lambda uri, experiment, run_name: next(made))
    files = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    for index, file in enumerate(files):
        file.write_text(json.dumps({"reward": 1.0, "_ng_task_index": index, "_ng_rollout_index": 0}) + "\n")
    args = ["--summarize", "--mlflow", "http://127.0.0.1:5000"]
    assert invoke([*args, *map(str, files)]).returncode == 0
    assert invoke([*args, *map(str, reversed(files))]).returncode == 0
    assert first.started_with is not None
    assert again.started_with is not None
    assert (first.started_with[1], again.started_with[1]) == (None, "new-id")  # continued


@pytest.mark.usefixtures("tracker_clients")
def test_summarized_shards_log_as_params_what_their_records_share(monkeypatch: pytest.MonkeyPatch, tmp_path):
    """Each shard's record names its shard: the files together are no one shard, so the params
    are the fields every record holds alike."""
    recording = Recording()
    monkeypatch.setattr(tracking, "_mlflow", lambda uri, experiment, run_name: recording)
    rows = tmp_path / "rows.jsonl"
    rows.write_text(rows_jsonl(simple_rows(4)))
    outputs = [tmp_path / f"out-{index}.jsonl" for index in range(2)]
    for index, output in enumerate(outputs):
        made = invoke(["--demo", "-r", "2", "--shard", f"{index}/2", "-o", str(output), str(rows)])
        assert made.returncode == 0, made.stderr
    summarized = invoke(["--summarize", "-r", "2", "--mlflow", "http://127.0.0.1:5000", *map(str, outputs)])
    assert summarized.returncode == 0, summarized.stderr
    assert recording.started_with is not None
    params, _ = recording.started_with
    assert params["repeats"] == "2"
    assert "rows.jsonl" in params["inputs"]  # the input the shards were cut from, theirs alike
    assert "shard" not in params


@pytest.mark.usefixtures("tracker_clients")
def test_a_resumed_run_given_another_experiment_is_refused_naming_the_one_it_would_go_on_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path
):
    """--resume continues the earlier run's tracker run, which stays in its experiment: a resume
    that names another is refused (exit 2) before anything is logged, rather than going on elsewhere."""
    first, resumed = Recording(), Recording()
    made = iter([first, resumed])
    monkeypatch.setattr(tracking, "_mlflow", lambda uri, experiment, run_name: next(made))
    rows, output = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    rows.write_text(rows_jsonl(simple_rows(2)))
    args = ["--demo", "-o", str(output), "--mlflow", "http://127.0.0.1:5000", str(rows)]
    assert invoke([*args, "--experiment", "a"]).returncode == 0
    refused = invoke([*args, "--experiment", "b", "--resume"])
    assert refused.returncode == 2
    assert refused.stderr.decode().splitlines() == [
        f"rollfilter: --experiment 'b' is not the experiment of the MLflow run this run continues ('a', as"
        f" {output}.trackers.json keeps it): give 'a', or remove that file to start another"
    ]
    assert resumed.started_with is None
    assert invoke([*args, "--experiment", "a", "--resume"]).returncode == 0
    assert resumed.started_with is not None
    assert resumed.started_with[1] == "new-id"  # continued


@pytest.mark.usefixtures("tracker_clients")
def test_a_resumed_run_given_another_mlflow_server_is_refused_its_secrets_never_kept(
    monkeypatch: pytest.MonkeyPatch, tmp_path
):
    """The MLflow run a resume continues is on the server the first run named: a resume naming
    another is refused (exit 2), where its run id would name no run. The server is kept and
    compared without its credentials and query: another token for the same server is no other server."""
    made = iter([Recording(), Recording(), Recording()])
    monkeypatch.setattr(tracking, "_mlflow", lambda uri, experiment, run_name: next(made))
    rows, output = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    rows.write_text(rows_jsonl(simple_rows(2)))
    args = ["--demo", "-o", str(output), str(rows)]
    assert invoke([*args, "--mlflow", "http://user:pw-1@127.0.0.1:5000/?token=tk-1"]).returncode == 0
    refused = invoke([*args, "--mlflow", "http://127.0.0.1:5001", "--resume"])
    assert refused.returncode == 2
    assert refused.stderr.decode().splitlines() == [
        "rollfilter: --mlflow 'http://127.0.0.1:5001' is not the server of the MLflow run this run continues"
        f" ('http://127.0.0.1:5000/', as {output}.trackers.json keeps it): give 'http://127.0.0.1:5000/', or"
        " remove that file to start another"
    ]
    assert invoke([*args, "--mlflow", "http://127.0.0.1:5000/?token=tk-2", "--resume"]).returncode == 0
    kept = (tmp_path / "out.jsonl.trackers.json").read_text()
    assert "127.0.0.1:5000" in kept
    assert not any(secret in kept for secret in ("pw-1", "tk-1", "tk-2", "user"))


@pytest.mark.usefixtures("tracker_clients")
@pytest.mark.parametrize(
    ("first", "resumed"),
    [
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000/"),
        ("http://localhost:5000/", "HTTP://LOCALHOST:5000"),
        ("http://localhost", "http://localhost:80"),
    ],
)
def test_a_resumed_run_given_its_mlflow_server_spelled_otherwise_goes_on(
    monkeypatch: pytest.MonkeyPatch, tmp_path, first: str, resumed: str
):
    """A trailing slash, the host's case, the scheme's default port: one server, as the client
    sees it, and the tracker run goes on there."""
    made = iter([Recording(), Recording()])
    monkeypatch.setattr(tracking, "_mlflow", lambda uri, experiment, run_name: next(made))
    rows, output = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    rows.write_text(rows_jsonl(simple_rows(2)))
    args = ["--demo", "-o", str(output), str(rows)]
    assert invoke([*args, "--mlflow", first]).returncode == 0
    again = invoke([*args, "--mlflow", resumed, "--resume"])
    assert again.returncode == 0, again.stderr.decode()


def interrupt_once_waiting(proc: subprocess.Popen[bytes], stderr: queue.Queue[bytes]) -> list[bytes]:
    """Ctrl-C once the hanging tracker says the end waits for it: the command exits 130. The
    lines it said before."""
    said = []
    while (line := stderr.get(timeout=SUBPROCESS_TIMEOUT)) != WAITING:
        assert line, b"".join(said)
        said.append(line)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == 130
    return said


@pytest.mark.parametrize("stopped", [False, True])
def test_a_signal_while_the_end_waits_for_a_hanging_tracker_is_taken(stopped: bool):
    """The end waits a few seconds for the trackers' final figures: a stop signal meanwhile is
    taken. A run that had finished leaves its trackers at the first, and says so; one that a
    first signal stopped leaves at the second, as a second stop does. The summary comes last."""
    command = [sys.executable, "-m", "tests.trackers.hanging", "--demo", "--mlflow", "http://127.0.0.1:9"]
    root = Path(__file__).parent.parent.parent
    pipes = dict.fromkeys(("stdin", "stdout", "stderr"), subprocess.PIPE)
    proc = subprocess.Popen(command, cwd=root, env=clean_env(), **pipes)  # type: ignore[call-overload]
    assert proc.stdin is not None
    stdout, stderr = lines_of(proc.stdout), lines_of(proc.stderr)
    try:
        proc.stdin.write(rows_jsonl(simple_rows(2)).encode())
        proc.stdin.flush()
        if stopped:  # stopped while it reads: the rows given are answered, more may come
            assert [stdout.get(timeout=SUBPROCESS_TIMEOUT) != b"" for _ in range(2)] == [True, True]
            proc.send_signal(signal.SIGINT)
        else:
            proc.stdin.close()
        said = interrupt_once_waiting(proc, stderr)
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
        while stdout.get(timeout=SUBPROCESS_TIMEOUT):  # to the end, where its reader stops
            pass
    while line := stderr.get(timeout=SUBPROCESS_TIMEOUT):
        said.append(line)
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        pipe.close()
    left = (
        b"stopped again: the trackers are left as they are"
        if stopped
        else b"trackers: stopped before done logging; left as they are"
    )
    assert [line for line in said if b"tracker" in line] == [b"rollfilter: " + left + b"\n"]
    assert json.loads(said[-1])["rollfilter"]["succeeded"] == 2  # the summary, last


def test_a_finished_run_interrupted_while_it_waits_for_a_tracker_offers_no_resume():
    """Every row had ended when the signal came during the trackers' wait: the summary is the
    finished run's, and at a terminal no line offers to go on with --resume (nothing is left to
    run); the exit status is the signal's, as for any interrupted command."""
    import pty

    with tempfile.TemporaryDirectory() as folder:
        rows, output = Path(folder, "rows.jsonl"), Path(folder, "out.jsonl")
        rows.write_text(rows_jsonl(simple_rows(2)))
        args = ["--demo", "--mlflow", "http://127.0.0.1:9", "-o", str(output), str(rows)]
        controller, terminal = pty.openpty()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.trackers.hanging", *args],
                cwd=Path(__file__).parent.parent.parent,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=terminal,
                env=clean_env(TERM="xterm", COLUMNS="120"),
            )
            os.close(terminal)
            terminal = -1
            shown = b""
            while WAITING.rstrip() not in shown:
                chunk = os.read(controller, 65536)
                assert chunk, shown
                shown += chunk
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == 130
            said = (shown.decode() + read_terminal(controller)).replace("\r\n", "\n")
        finally:
            if terminal >= 0:
                os.close(terminal)
            os.close(controller)
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=SUBPROCESS_TIMEOUT)
    assert "rollfilter: trackers: stopped before done logging; left as they are\n" in said
    assert "2 of 2 rollouts: 2 succeeded, 0 failed" in said
    assert "--resume" not in said


def test_summarize_interrupted_while_it_waits_for_a_tracker_has_written_its_summary(tmp_path: Path):
    """--summarize's output is its summary: a signal during the trackers' wait ends the wait and
    the command (exit 130), the summary on standard output already."""
    rows, output = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    rows.write_text(rows_jsonl(simple_rows(2)))
    assert invoke(["--demo", "-o", str(output), str(rows)]).returncode == 0
    command = [sys.executable, "-m", "tests.trackers.hanging", "--summarize", "--mlflow", "http://127.0.0.1:9"]
    root = Path(__file__).parent.parent.parent
    pipes = dict.fromkeys(("stdout", "stderr"), subprocess.PIPE)
    proc = subprocess.Popen([*command, str(output)], cwd=root, env=clean_env(), stdin=subprocess.DEVNULL, **pipes)  # type: ignore[call-overload]
    stdout, stderr = lines_of(proc.stdout), lines_of(proc.stderr)
    try:
        said = interrupt_once_waiting(proc, stderr)
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
    written = []
    while line := stdout.get(timeout=SUBPROCESS_TIMEOUT):
        written.append(line)
    while line := stderr.get(timeout=SUBPROCESS_TIMEOUT):
        said.append(line)
    for pipe in (proc.stdout, proc.stderr):
        pipe.close()
    assert [json.loads(line)["rollfilter"]["succeeded"] for line in written] == [2]
    assert b"rollfilter: trackers: stopped before done logging; left as they are\n" in said
