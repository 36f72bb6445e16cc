"""Shards past one machine, for real: the README's Slurm and GNU parallel recipes on a single-node Slurm.

Opt-in (`python -m pytest -m slurm -n 0 tests/e2e/test_slurm.py`; `.ci/run` runs it as root). The module installs
`slurm-wlm`, `munge` and `parallel` with apt-get when they are missing, then starts munged, slurmctld
and slurmd on 127.0.0.1 with their own munge socket, ports and state under a temporary folder, and
stops them at the end. The recipes' commands are read from the README, so they are the ones it shows.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    ROOT,
    DemoServer,
    clean_env,
    rollfilter_command,
    rows_jsonl,
    run,
    simple_rows,
    summary_of,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]  # installing the packages may take minutes

PACKAGE_OF = {"munged": "munge", "slurmctld": "slurm-wlm", "slurmd": "slurm-wlm", "sbatch": "slurm-wlm"}
PACKAGE_OF["parallel"] = "parallel"
ROWS = 40
REPEATS = 2  # the recipes' -r
ALL_PAIRS = {(task, rollout) for task in range(ROWS) for rollout in range(REPEATS)}
# A run's own figures, which result files cannot hold: its timings, and the pairs its input held.
RUN_ONLY = ("elapsed_s", "rows_per_s", "tokens_per_s", "latency_s", "expected", "not_started")
DAEMON_WAIT = 60  # seconds for a daemon to come up or go down


def recipe(title: str) -> list[str]:
    """The commands of the `sh` block that starts with `title`, in docs/scale-out.md's section on shards."""
    page = (ROOT / "docs" / "scale-out.md").read_text()
    section = page.split("\n## Past one machine: Slurm and GNU parallel\n")[1].split("\n## ")[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    (block,) = [b for b in blocks if b.startswith(title)]
    return block.splitlines()


SLURM_SUBMIT, SLURM_SUMMARIZE = recipe("sbatch ")
PARALLEL_RUN, PARALLEL_SUMMARIZE = recipe("parallel ")
ARRAY = "--array=0-3"


def install_missing() -> None:
    missing = sorted({package for program, package in PACKAGE_OF.items() if shutil.which(program) is None})
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.fail(f"the Slurm tests need {' '.join(missing)}: run them as root, and they install it with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, timeout=600, env=env, stdout=subprocess.DEVNULL)
    install = ["apt-get", "install", "-y", "-qq", *missing]
    subprocess.run(install, check=True, timeout=600, env=env, stdout=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def installed() -> None:
    install_missing()


def environment(**extra: str) -> dict[str, str]:
    """The tests' environment, with the rollfilter under test first on PATH, as a user's shell has it."""
    path = os.pathsep.join([str(Path(rollfilter_command()[0]).parent), os.environ.get("PATH", "")])
    return clean_env(PATH=path, **extra)


def shell(command: str, cwd: Path | None, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Cluster:
    """munged, slurmctld and slurmd of their own, on 127.0.0.1, everything under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.host = socket.gethostname().split(".")[0]  # slurmctld and slurmd know themselves by it
        self.conf = root / "slurm.conf"
        self.socket = root / "munge" / "munge.socket"

    def env(self, **extra: str) -> dict[str, str]:
        return environment(SLURM_CONF=str(self.conf), **extra)

    def start(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700)
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        self._daemon(
            "munged", "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
            f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'seed'}", f"--log-file={munge / 'log'}",
        )  # fmt: skip
        wait_for(self.socket.exists, DAEMON_WAIT)
        for folder in ("state", "spool"):
            (self.root / folder).mkdir()
        root = self.root
        self.conf.write_text(
            f"""ClusterName=rollfilter
SlurmctldHost={self.host}(127.0.0.1)
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.socket}
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
ReturnToService=2
KillWait=5
# Four array tasks at once on a machine of two cores: the node has the CPUs this file gives it.
SlurmdParameters=config_overrides
NodeName={self.host} NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
        )
        self._daemon("slurmctld", "-D", "-i")
        self._daemon("slurmd", "-D")
        wait_for(lambda: self.sh("sinfo -h -o %T").stdout.strip() == "idle", DAEMON_WAIT)

    def _daemon(self, program: str, *args: str) -> None:
        log = open(self.root / f"{program}.out", "wb")  # noqa: SIM115 - the daemon holds it
        with log:
            self.daemons.append(subprocess.Popen([program, *args], stdout=log, stderr=log, env=self.env()))

    def sh(self, command: str, cwd: Path | None = None, **extra: str) -> subprocess.CompletedProcess[str]:
        """A shell command with the cluster's configuration (and `extra`) in its environment."""
        return shell(command, cwd, self.env(**extra))

    def stop(self) -> None:
        self.sh("scancel --user=root")
        try:
            wait_for(lambda: not self.sh("squeue -h").stdout.strip(), DAEMON_WAIT)
        finally:
            for daemon in reversed(self.daemons):
                daemon.send_signal(signal.SIGTERM)
                try:
                    daemon.wait(timeout=DAEMON_WAIT)
                except subprocess.TimeoutExpired:
                    daemon.kill()
                    daemon.wait(timeout=DAEMON_WAIT)

    def logs(self, folder: Path) -> str:
        """The ends of the daemons' logs and of the jobs' output in `folder`, for a failed assertion."""
        files = [*sorted(self.root.glob("*.log")), *sorted(folder.glob("slurm-*.out"))]
        return "\n".join(f"{p.name}: {p.read_text(errors='replace')[-2000:]}" for p in files)


@pytest.fixture(scope="module")
def cluster(installed: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    started = Cluster(tmp_path_factory.mktemp("slurm"))
    try:
        started.start()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def agent() -> Iterator[DemoServer]:
    server = DemoServer()
    try:
        yield server
    finally:
        server.kill()


@pytest.fixture(scope="module")
def one_process(agent: DemoServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The summary of the whole job run by one process, without the figures only a run has."""
    data = job_folder(tmp_path_factory.mktemp("whole"))
    proc = run(["-u", agent.url, "-r", str(REPEATS), str(data / "data.jsonl")], cwd=data)
    assert proc.returncode == 0, proc.stderr
    summary = summary_of(proc.stderr)
    for figure in RUN_ONLY:
        del summary["rollfilter"][figure]
    return summary


def job_folder(folder: Path, rows: int = ROWS) -> Path:
    (folder / "data.jsonl").write_text(rows_jsonl(simple_rows(rows)))
    return folder


def pairs_in(folder: Path) -> Counter[tuple[int, int]]:
    """How many times each (task, rollout) pair is among the shards' results."""
    found: Counter[tuple[int, int]] = Counter()
    for path in folder.glob("shard-*.jsonl"):
        for line in path.read_text().splitlines():
            result = json.loads(line)
            found[result["_ng_task_index"], result["_ng_rollout_index"]] += 1
    return found


def progress_total(folder: Path) -> int:
    return sum(int(path.read_text()) for path in folder.glob("shard-*_progress"))


def summarized(folder: Path, command: str) -> dict[str, Any]:
    proc = shell(command, folder, environment())
    assert (proc.returncode, proc.stderr) == (0, ""), command
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary


SHARD_BY_ID = "--shard $SLURM_ARRAY_TASK_ID/4"  # the recipe's form


def submit_and_interfere(command: str, folder: Path, env: dict[str, str], interfere: Callable[[str], None]) -> int:
    """`command` (an sbatch --wait) in the background, `interfere(job ID)` meanwhile; its exit status."""
    submitted = subprocess.Popen(
        ["bash", "-c", command], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert submitted.stdout is not None
        interfere(submitted.stdout.readline().decode().split()[-1])  # "Submitted batch job N"
        return submitted.wait(timeout=300)
    finally:
        if submitted.poll() is None:
            submitted.kill()
            submitted.wait(timeout=DAEMON_WAIT)
        for stream in (submitted.stdout, submitted.stderr):
            if stream is not None:
                stream.close()


def test_the_job_array_runs_every_pair_once(
    cluster: Cluster, agent: DemoServer, one_process: dict[str, Any], tmp_path: Path
):
    folder = job_folder(tmp_path)
    proc = cluster.sh(SLURM_SUBMIT, cwd=folder, AGENT_URL=agent.url)
    assert proc.returncode == 0, (proc.stderr, cluster.logs(folder))
    assert sorted(p.name for p in folder.glob("shard-*.jsonl")) == [f"shard-{i}.jsonl" for i in range(4)]
    assert pairs_in(folder) == Counter(ALL_PAIRS)
    assert progress_total(folder) == len(ALL_PAIRS)
    summary = summarized(folder, SLURM_SUMMARIZE)
    assert summary["rollfilter"].pop("shards") == {"of": 4, "present": [0, 1, 2, 3], "missing": []}
    assert summary == one_process


@pytest.mark.parametrize("array", ["--array=0-3", "--array=1-4"])
def test_a_job_array_submitted_whole_with_shard_auto_runs_every_pair_once(
    cluster: Cluster, agent: DemoServer, one_process: dict[str, Any], tmp_path: Path, array: str
):
    folder = job_folder(tmp_path)
    submit = SLURM_SUBMIT.replace(ARRAY, array).replace(SHARD_BY_ID, "--shard auto")
    proc = cluster.sh(submit, cwd=folder, AGENT_URL=agent.url)
    assert proc.returncode == 0, (proc.stderr, cluster.logs(folder))
    first = int(array.split("=")[1].split("-")[0])
    assert sorted(p.name for p in folder.glob("shard-*.jsonl")) == [f"shard-{first + i}.jsonl" for i in range(4)]
    assert pairs_in(folder) == Counter(ALL_PAIRS)
    summary = summarized(folder, SLURM_SUMMARIZE)
    assert summary["rollfilter"].pop("shards") == {"of": 4, "present": [0, 1, 2, 3], "missing": []}
    assert summary == one_process


def test_tasks_cancelled_while_pending_and_submitted_again_finish_every_shard_once(
    cluster: Cluster, start_demo: Any, tmp_path: Path
):
    slow = start_demo("--latency", "3")  # tasks 0 and 1 run for seconds: time to cancel the others
    folder = job_folder(tmp_path)
    env = cluster.env(AGENT_URL=slow.url)
    two_at_a_time = SLURM_SUBMIT.replace(ARRAY, "--array=0-3%2")  # tasks 2 and 3 wait their turn

    def cancel_the_pending(job: str) -> None:
        wait_for(lambda: cluster.sh(f"squeue -h -r -t PD -j {job} -o %K").stdout.split() == ["2", "3"], DAEMON_WAIT)
        assert cluster.sh(f"scancel {job}_2 {job}_3").returncode == 0

    submit_and_interfere(two_at_a_time, folder, env, cancel_the_pending)  # its status: 0, its tasks' that ran
    assert sorted(p.name for p in folder.glob("shard-*.jsonl")) == ["shard-0.jsonl", "shard-1.jsonl"]
    # Submitted again with --shard auto, each sees an array of two, and is refused before sending.
    auto = SLURM_SUBMIT.replace(ARRAY, "--array=2-3").replace(SHARD_BY_ID, "--shard auto")
    sent = slow.stats()["requests"]
    assert cluster.sh(auto, cwd=folder, AGENT_URL=slow.url).returncode != 0
    assert slow.stats()["requests"] == sent
    refusals = " ".join(p.read_text() for p in folder.glob("slurm-*_[23].out"))
    assert refusals.count("--shard auto makes this array task shard") == 2, refusals
    # The recipe's form, submitted again, finishes them.
    proc = cluster.sh(SLURM_SUBMIT.replace(ARRAY, "--array=2-3"), cwd=folder, AGENT_URL=slow.url)
    assert proc.returncode == 0, (proc.stderr, cluster.logs(folder))
    assert pairs_in(folder) == Counter(ALL_PAIRS)
    summary = summarized(folder, SLURM_SUMMARIZE)
    assert summary["rollfilter"]["shards"] == {"of": 4, "present": [0, 1, 2, 3], "missing": []}
    assert summary["rollfilter"]["succeeded"] == len(ALL_PAIRS)


def test_shards_numbered_from_the_task_id_leave_one_out_and_the_summary_names_it(
    cluster: Cluster, agent: DemoServer, tmp_path: Path
):
    # --array=1-4 with the recipe's --shard $SLURM_ARRAY_TASK_ID/4 never runs shard 0: task 4 is
    # a usage error, and the summary names the shard missing.
    folder = job_folder(tmp_path)
    assert cluster.sh(SLURM_SUBMIT.replace(ARRAY, "--array=1-4"), cwd=folder, AGENT_URL=agent.url).returncode != 0
    proc = cluster.sh(SLURM_SUMMARIZE, cwd=folder)
    assert proc.returncode == 1
    assert proc.stderr == "rollfilter: --summarize: shard 0 of 4 is missing (present: 1, 2, 3)\n"


def test_a_cancelled_task_resubmitted_alone_finishes_its_shard(cluster: Cluster, start_demo: Any, tmp_path: Path):
    slow = start_demo("--latency", "2")  # a shard's 100 rollouts take four rounds of -j 32
    rows = 200
    folder = job_folder(tmp_path, rows)
    env = cluster.env(AGENT_URL=slow.url)
    shard = folder / "shard-2.jsonl"

    def cancel_task_2(job: str) -> None:
        wait_for(lambda: shard.exists() and shard.read_bytes().count(b"\n") > 0, DAEMON_WAIT)
        assert cluster.sh(f"scancel {job}_2").returncode == 0

    assert submit_and_interfere(SLURM_SUBMIT, folder, env, cancel_task_2) != 0  # one task was cancelled
    every_pair = {(task, rollout) for task in range(rows) for rollout in range(REPEATS)}
    assert set(pairs_in(folder)) < every_pair  # shard 2 is not finished
    proc = cluster.sh(SLURM_SUBMIT.replace(ARRAY, "--array=2"), cwd=folder, AGENT_URL=slow.url)
    assert proc.returncode == 0, (proc.stderr, cluster.logs(folder))
    assert json.loads((folder / "shard-2.jsonl.run.json").read_text())["shard"] == [2, 4]
    assert pairs_in(folder) == Counter(every_pair)
    assert progress_total(folder) == len(every_pair)
    summary = summarized(folder, SLURM_SUMMARIZE)
    assert summary["rollfilter"]["succeeded"] == len(every_pair)
    assert summary["rollfilter"]["shards"] == {"of": 4, "present": [0, 1, 2, 3], "missing": []}


def test_gnu_parallel_runs_the_shards_on_local_slots(
    installed: None, agent: DemoServer, one_process: dict[str, Any], tmp_path: Path
):
    folder = job_folder(tmp_path)
    proc = shell(PARALLEL_RUN, folder, environment(AGENT_URL=agent.url))
    assert proc.returncode == 0, proc.stderr
    assert pairs_in(folder) == Counter(ALL_PAIRS)
    assert progress_total(folder) == len(ALL_PAIRS)
    summary = summarized(folder, PARALLEL_SUMMARIZE)
    assert summary["rollfilter"].pop("shards") == {"of": 3, "present": [0, 1, 2], "missing": []}
    assert summary == one_process
