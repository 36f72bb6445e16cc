"""--mlflow and --wandb against the real things: an MLflow tracking server started here (sqlite, served
artifacts) and W&B offline, each read back with its own library. Opt-in: -m trackers, with the
`test-trackers` extra installed (pip install -e '.[test,test-trackers]'); .ci/run runs them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollfilter.run import tracking
from tests.conftest import SUBPROCESS_TIMEOUT, clean_env, closed_port_url, rows_jsonl, run, start, summary_of
from tests.servers.recording_agent import RecordingAgent

pytestmark = [pytest.mark.trackers, pytest.mark.timeout(600)]

mlflow = pytest.importorskip("mlflow", reason="the tracker tests need: pip install -e '.[test,test-trackers]'")
MlflowClient = pytest.importorskip("mlflow.tracking").MlflowClient

EXAMPLE = str(Path(__file__).parent.parent.parent / "rollfilter" / "examples" / "weather.jsonl")
# A server's first start imports all of MLflow: on a loaded 2-core machine that takes a while.
SERVER_START_S = 240


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """`mlflow server` on 127.0.0.1 at a free port, a sqlite store and served artifacts: its URL."""
    folder = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    log = (folder / "server.log").open("wb")
    command = shutil.which("mlflow", path=os.path.dirname(sys.executable)) or "mlflow"
    server = subprocess.Popen(
        [
            *(command, "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"),
            *("--backend-store-uri", f"sqlite:///{folder}/mlflow.db"),
            *("--serve-artifacts", "--artifacts-destination", str(folder / "artifacts")),
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
        start_new_session=True,
        env=clean_env(),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not _answers(url):
            assert server.poll() is None, (folder / "server.log").read_text()[-2000:]
            if time.monotonic() > deadline:  # a bound on the wait, not a figure of the test
                pytest.fail("the MLflow server did not come up")
            time.sleep(0.5)
        yield url
    finally:
        stop_group(server)
        log.close()


def stop_group(server: subprocess.Popen[bytes]) -> None:
    """The server and what it started (its job runner's consumers outlive a SIGTERM): gone."""
    os.killpg(server.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        server.wait(timeout=SUBPROCESS_TIMEOUT)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(server.pid, signal.SIGKILL)
    server.wait(timeout=SUBPROCESS_TIMEOUT)


def _answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


def runs_of(url: str, experiment: str) -> list[Any]:
    client = MlflowClient(tracking_uri=url)
    found = client.get_experiment_by_name(experiment)
    return [] if found is None else list(client.search_runs([found.experiment_id]))


def artifact(url: str, run_id: str, path: str, folder: Path) -> str:
    local = MlflowClient(tracking_uri=url).download_artifacts(run_id, path, str(folder))
    return Path(local).read_text()


def test_a_run_is_logged_live_and_whole_and_without_secrets(
    mlflow_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(tracking, "LIVE_EVERY_S", 0.01)  # a point as often as the run lets one be taken
    out = tmp_path / "out.jsonl"
    args = ["--demo", "-r", "2", "-o", str(out), "--mlflow", mlflow_server, "--experiment", "whole", EXAMPLE]
    proc = run(
        [*args, "--track-rollouts", "3", "-H", "X-Secret: hunter2", "-p", "temperature=0.5", "--policy-version", "7"]
    )
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stderr)
    (logged,) = runs_of(mlflow_server, "whole")
    ids = json.loads((tmp_path / "out.jsonl.trackers.json").read_text())["ids"]
    assert logged.info.run_id == ids["mlflow"]
    assert (logged.info.status, logged.info.run_name) == ("FINISHED", "out")
    params, metrics = logged.data.params, logged.data.metrics
    assert (params["repeats"], params["params"]) == ("2", '[["temperature", 0.5]]')
    assert "weather.jsonl" in params["inputs"]
    assert "hunter2" not in json.dumps(params)
    assert "X-Secret" not in json.dumps(params)
    assert metrics["rollfilter/succeeded"] == 10
    assert metrics["mean_at_2"] == pytest.approx(summary["mean@2"])
    assert metrics["pass_at_1"] == pytest.approx(summary["pass@1"])
    assert metrics["per_rollout/output_tokens/p90"] == summary["per_rollout"]["output_tokens"]["p90"]
    history = MlflowClient(tracking_uri=mlflow_server).get_metric_history(ids["mlflow"], "rollfilter/succeeded")
    assert [point.step for point in history] == [10]  # the end's step: the rollouts finished
    curve = MlflowClient(tracking_uri=mlflow_server).get_metric_history(ids["mlflow"], "policy/reward_mean")
    assert {point.step for point in curve} == {7}
    assert curve[-1].value == pytest.approx(summary["reward"])
    assert json.loads(artifact(mlflow_server, ids["mlflow"], "summary.json", tmp_path))["rollfilter"]["succeeded"] == 10
    sample = artifact(mlflow_server, ids["mlflow"], "rollouts.jsonl", tmp_path).splitlines()
    results = set(out.read_text().splitlines())
    assert len(sample) == 3
    assert {json.dumps(json.loads(line), sort_keys=True) for line in sample} <= {
        json.dumps(json.loads(line), sort_keys=True) for line in results
    }


def test_a_run_killed_and_resumed_is_one_tracker_run_with_the_whole_files_figures(
    mlflow_server: str, tmp_path: Path, agent: RecordingAgent
):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(rows_jsonl([{"id": i, "reward": float(i % 2)} for i in range(10)]))
    out = tmp_path / "out.jsonl"
    ids_file = tmp_path / "out.jsonl.trackers.json"
    args = ["-u", agent.run_url, "-j", "2", "-o", str(out), "--mlflow", mlflow_server, "--experiment", "resumed"]
    agent.hold_after(4, drop=True)
    proc = start([*args, str(rows)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not (ids_file.exists() and agent.answered.is_set() and len(out.read_text().splitlines()) == 4):
            assert proc.poll() is None
            if time.monotonic() > deadline:  # a bound on the wait, not a figure of the test
                pytest.fail("the run did not start its tracker run")
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
        agent.release.set()
    (killed,) = runs_of(mlflow_server, "resumed")
    assert killed.info.status == "RUNNING"  # a kill -9 ends nothing
    agent.answers_left = None
    resumed = run([*args, "--resume", str(rows)])
    assert resumed.returncode == 0, resumed.stderr
    summary = summary_of(resumed.stderr)
    (logged,) = runs_of(mlflow_server, "resumed")  # the same tracker run, continued
    assert logged.info.run_id == killed.info.run_id == json.loads(ids_file.read_text())["ids"]["mlflow"]
    assert logged.info.status == "FINISHED"
    assert logged.data.metrics["reward"] == summary["reward"] == 0.5  # the whole file's
    history = MlflowClient(tracking_uri=mlflow_server).get_metric_history(logged.info.run_id, "reward")
    assert [point.step for point in history] == [10]  # steps go on from the earlier run's results


def test_a_run_stopped_by_a_signal_ends_its_tracker_run_killed(
    mlflow_server: str, tmp_path: Path, agent: RecordingAgent
):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(rows_jsonl([{"id": i} for i in range(6)]))
    out = tmp_path / "out.jsonl"
    agent.hold_after(2, drop=True)
    args = ["-u", agent.run_url, "-j", "2", "-o", str(out), "--mlflow", mlflow_server, "--experiment", "killed"]
    proc = start([*args, str(rows)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + SERVER_START_S
        while not ((tmp_path / "out.jsonl.trackers.json").exists() and agent.answered.is_set()):
            assert proc.poll() is None
            if time.monotonic() > deadline:  # a bound on the wait, not a figure of the test
                pytest.fail("the run did not start its tracker run")
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
        agent.release.set()
    assert proc.returncode == 143
    assert summary_of(stderr)["rollfilter"]["succeeded"] == 2  # the summary is still the last line
    (logged,) = runs_of(mlflow_server, "killed")
    assert logged.info.status == "KILLED"
    assert logged.data.metrics["rollfilter/succeeded"] == 2


def test_summarizing_the_same_files_again_updates_their_tracker_run(mlflow_server: str, tmp_path: Path):
    out = tmp_path / "out.jsonl"
    assert run(["--demo", "-r", "2", "-o", str(out), EXAMPLE]).returncode == 0
    args = ["--summarize", "-r", "2", "--mlflow", mlflow_server, "--experiment", "summarized", str(out)]
    first = run(args)
    assert first.returncode == 0, first.stderr
    (logged,) = runs_of(mlflow_server, "summarized")
    again = run([*args, "--run-name", "again"])
    assert again.returncode == 0, again.stderr
    (updated,) = runs_of(mlflow_server, "summarized")
    assert updated.info.run_id == logged.info.run_id
    assert updated.info.status == "FINISHED"
    assert updated.data.metrics["mean_at_2"] == json.loads(first.stdout)["mean@2"]
    assert updated.data.params["repeats"] == "2"  # from the file's run record


def test_an_unreachable_tracker_costs_one_line_and_no_result(tmp_path: Path):
    out = tmp_path / "out.jsonl"
    proc = run(["--demo", "-o", str(out), "--mlflow", closed_port_url(), EXAMPLE])
    assert proc.returncode == 0
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("rollfilter: MLflow: cannot start its run (")
    assert lines[0].endswith("); the run goes on without it")
    assert summary_of(proc.stderr)["rollfilter"]["succeeded"] == 5
    assert len(out.read_text().splitlines()) == 5


def test_a_run_is_logged_to_wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("wandb")
    from wandb.proto import wandb_internal_pb2

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "runs"))  # not made yet: W&B says so, unless silenced
    monkeypatch.delenv("WANDB_SILENT", raising=False)
    out = tmp_path / "out.jsonl"
    args = ["--demo", "-r", "2", "-o", str(out), "--wandb", "proj", "--track-rollouts", "4", "--policy-version", "3"]
    proc = run([*args, EXAMPLE], start_new_session=True)  # a process of its own: W&B writes to its stderr
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stderr.decode().splitlines()) == 1, proc.stderr  # the summary alone
    run_id = json.loads((tmp_path / "out.jsonl.trackers.json").read_text())["ids"]["wandb"]
    (folder,) = (tmp_path / "runs" / "wandb").glob(f"offline-run-*-{run_id}")
    history: dict[str, Any] = {}
    config: dict[str, Any] = {}
    exit_code = None
    for data in wandb_records(folder / f"run-{run_id}.wandb"):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.update({item.key or "/".join(item.nested_key): item.value_json for item in record.history.item})
        elif kind == "run":  # the params given to wandb.init, as the run's config
            config.update({item.key: item.value_json for item in record.run.config.update})
        elif kind == "exit":
            exit_code = record.exit.exit_code
    assert exit_code == 0
    assert json.loads(config["repeats"]) == "2"
    assert json.loads(history["rollfilter/succeeded"]) == 10
    assert json.loads(history["mean_at_2"]) == summary_of(proc.stderr)["mean@2"]
    assert json.loads(history["policy/version"]) == 3
    assert json.loads(history["policy/reward_mean"]) == summary_of(proc.stderr)["reward"]
    (table,) = (folder / "files" / "media" / "table").glob("rollouts_*.table.json")
    assert len(json.loads(table.read_text())["data"]) == 4


# W&B's run file: a 7-byte header (":W&B", a magic, a version), then LevelDB's log format: 32 KiB
# blocks of records, each a checksum, a length and a type (whole, or the first, a middle or the
# last piece of one), as W&B's own datastore writes them.
WANDB_HEADER, BLOCK, RECORD_HEADER = 7, 32768, 7


def wandb_records(path: Path) -> Iterator[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B"
    position, pending = WANDB_HEADER, b""
    while position + RECORD_HEADER <= len(data):
        left = BLOCK - position % BLOCK
        if left < RECORD_HEADER:  # a block's tail too short for a header is padding
            position += left
            continue
        length = int.from_bytes(data[position + 4 : position + 6], "little")
        kind = data[position + 6]
        piece = data[position + RECORD_HEADER : position + RECORD_HEADER + length]
        position += RECORD_HEADER + length
        if kind == 1:
            yield piece
        elif kind == 2:
            pending = piece
        elif kind == 3:
            pending += piece
        elif kind == 4:
            yield pending + piece
