"""rollfilter beside the newest NeMo Gym, on a real stack: the same rows, the same bodies, the same four files.

Opt-in: `python -m pytest -m gym -n 0 tests/e2e/test_gym_head.py`. The stack is NeMo Gym's own source (a head
server, the simple_agent, a resources server and a model server over a deterministic fake LLM, with a proxy that
records every request), started by the scripts in `../shared/gym-stack-head` beside the repository:
their README says how.
NeMo Gym is installed once under the stack's `ROOT` (stack.env says where, default `$TMPDIR/rf-gym-head`); set
`MIRROR` to a git directory of NeMo Gym's repository (github NVIDIA-NeMo/Gym) to have this module install it.
A stack already running under that `ROOT` is used and left running; one started here is stopped at the end.

Each comparison runs NeMo Gym's collector (`gym eval run`, through the stack's `collect.sh`) and rollfilter on the
same rows, with exact duplicates and `-r 2`, and says precisely which file, field and rows differ.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollfilter.errors import ExitStatus
from tests.conftest import ROOT, SUBPROCESS_TIMEOUT, run, start, summary_of, wait_for
from tests.servers.marking_proxy import MarkingProxy

# Installing NeMo Gym takes minutes on a loaded 2-core machine, starting the stack about half a minute, and
# each collection some seconds: one bound for a test and the module fixtures it sets up.
pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]

SCRIPTS = ROOT.parent / "shared" / "gym-stack-head"
INSTALL_TIMEOUT = 900
STACK_TIMEOUT = 300  # start_stack.sh waits up to 240 s for NeMo Gym's servers itself
RUN_TIMEOUT = 300
KILL_MOMENT_TIMEOUT = 120
# Every model call takes this long, so an episode (two calls) lasts long enough for a run to be killed mid-way.
LATENCY_MS = 100
REPEATS = 2
CONCURRENCY = 10
DUPLICATED_LINES = (0, 6, 19)  # lines of weather_50.jsonl appended again: NeMo Gym makes each one task
SETTINGS = ("ROOT", "VENV", "STATE_DIR", "CAPTURE_HEAD_PORT", "CAPTURE_AGENT_PORT", "FAKE_LLM_PORT", "AGENT_NAME")
STACK_PROCESSES = ("fake_llm", "ray", "ng_run", "capture_proxy")
# rollfilter's own fields in a failure row, beside the agent's answer (the rest must be NeMo Gym's row).
ROLLFILTER_FAILURE_FIELDS = {"error", "source", "line", "attempts", "row"}
MISSING = "<missing>"
TOOLS = ("NeMo Gym", "rollfilter")
RESUMED = ("the uninterrupted run", "the resumed run")

Pair = tuple[int, int]


@dataclass(frozen=True)
class Stack:
    root: Path
    head_port: int  # the capture proxy's head side: what both tools are pointed at
    agent_port: int  # the capture proxy's agent side
    agent: str
    env: dict[str, str]

    @property
    def capture_log(self) -> Path:
        return self.root / "capture" / "requests.jsonl"

    def capture_mark(self) -> int:
        """Where the capture proxy's log ends now (it appends one line an exchange, tens of KB each)."""
        try:
            return self.capture_log.stat().st_size
        except FileNotFoundError:
            return 0

    def captured_since(self, mark: int) -> list[dict[str, Any]]:
        """The exchanges recorded after `mark`: whole lines only, as a late one may still be being written."""
        with self.capture_log.open("rb") as log:
            log.seek(mark)
            return [json.loads(line) for line in log.read().split(b"\n")[:-1]]

    def collect_command(
        self, rows: Path, out: Path, *flags: str, head_port: int | None = None, repeats: str = str(REPEATS)
    ) -> tuple[list[str], dict[str, str]]:
        """NeMo Gym's collector as collect.sh runs it, -r 2 -j 10 over every line of `rows`."""
        env = {
            **self.env,
            "LIMIT": str(len(rows.read_bytes().splitlines())),
            "NUM_REPEATS": repeats,
            "PARALLEL": str(CONCURRENCY),
            "VIA_CAPTURE": "1",
            "CAPTURE_HEAD_PORT": str(head_port or self.head_port),
        }
        return ["bash", str(SCRIPTS / "collect.sh"), str(rows), str(out), *flags], env

    def rollfilter_args(
        self, rows: Path | None, out: Path, *flags: str, head_port: int | None = None, repeats: str = str(REPEATS)
    ) -> list[str]:
        """rollfilter as the stack's README runs it, on `rows` (None: standard input)."""
        return [
            "--head-server",
            f"http://127.0.0.1:{head_port or self.head_port}",
            "-a",
            self.agent,
            "-r",
            repeats,
            "-j",
            str(CONCURRENCY),
            "--gym-layout",
            "-o",
            str(out),
            *flags,
            *([str(rows)] if rows else []),
        ]


@dataclass
class Run:
    """One tool's run: its exit status, its files, and what the capture proxy saw it send."""

    out: Path
    returncode: int
    exchanges: list[dict[str, Any]]
    console: str  # what it printed: NeMo Gym's console log, rollfilter's stderr
    summary: dict[str, Any] | None = None

    def file(self, suffix: str) -> Path:
        return self.out.with_name(self.out.stem + suffix)

    @property
    def materialized(self) -> Path:
        return self.file("_materialized_inputs.jsonl")

    @property
    def failures(self) -> Path:
        return self.file("_failures.jsonl")

    @property
    def aggregate(self) -> Path:
        return self.file("_aggregate_metrics.json")

    @property
    def progress(self) -> Path:
        return self.file("_progress")

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [e["req_body"] for e in self.exchanges if e["via"] == "agent" and e["path"] == "/run"]

    @property
    def aggregate_requests(self) -> list[dict[str, Any]]:
        return [e["req_body"] for e in self.exchanges if e["via"] == "agent" and e["path"] == "/aggregate_metrics"]


# --- the stack -------------------------------------------------------------------------------------------------


def script_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ROLLFILTER_")}


def read_settings(env: dict[str, str]) -> dict[str, str]:
    printed = " ".join(f'"${name}"' for name in SETTINGS)
    script = f'source "$1/stack.env" >/dev/null && printf "%s\\n" {printed}'
    proc = subprocess.run(
        ["bash", "-c", script, "bash", str(SCRIPTS)], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    return dict(zip(SETTINGS, proc.stdout.splitlines(), strict=True))


def alive(pid_file: Path) -> bool:
    try:
        os.kill(int(pid_file.read_text()), 0)
    except (OSError, ValueError):
        return False
    return True


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def fake_llm_config(port: int, change: dict[str, Any] | None = None) -> dict[str, Any]:
    data = json.dumps(change).encode() if change is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}/fake/config", data=data)
    with urllib.request.urlopen(request, timeout=30) as response:
        config = json.load(response)
    assert isinstance(config, dict)
    return config


def run_script(name: str, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    """One of the stack's scripts, run to its end (or `timeout`), its output kept."""
    return subprocess.run(
        ["bash", str(SCRIPTS / name)], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def install_nemo_gym(venv: Path, env: dict[str, str]) -> None:
    if (venv / "bin" / "ng_run").exists():
        return
    if not env.get("MIRROR"):
        pytest.skip(f"NeMo Gym is not installed in {venv}: set MIRROR to a git directory of NVIDIA-NeMo/Gym")
    proc = run_script("install.sh", env, INSTALL_TIMEOUT)
    if proc.returncode != 0:
        pytest.skip(f"NeMo Gym could not be installed: {last_line(proc.stdout + proc.stderr)}")


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    if not (SCRIPTS / "stack.env").exists():
        pytest.skip(f"no NeMo Gym stack scripts at {SCRIPTS}")
    env = script_env()
    settings = read_settings(env)
    env["ROOT"] = settings["ROOT"]
    install_nemo_gym(Path(settings["VENV"]), env)
    state_dir = Path(settings["STATE_DIR"])
    started_here = not all(alive(state_dir / f"{name}.pid") for name in STACK_PROCESSES)
    if started_here:
        proc = run_script(
            "start_stack.sh", {**env, "FAKE_LLM_LATENCY_MS": str(LATENCY_MS), "CAPTURE": "1"}, STACK_TIMEOUT
        )
        if proc.returncode != 0:
            reason = last_line(proc.stderr + proc.stdout)
            if "already" not in reason:  # it started something before it failed: not what another run holds
                stop_stack(env)
            pytest.skip(f"the NeMo Gym stack could not be started: {reason}")
    fake_llm_port = int(settings["FAKE_LLM_PORT"])
    latency_before = LATENCY_MS
    try:
        latency_before = fake_llm_config(fake_llm_port)["latency_ms"]
        fake_llm_config(fake_llm_port, {"latency_ms": LATENCY_MS})
        yield Stack(
            root=Path(settings["ROOT"]),
            head_port=int(settings["CAPTURE_HEAD_PORT"]),
            agent_port=int(settings["CAPTURE_AGENT_PORT"]),
            agent=settings["AGENT_NAME"],
            env=env,
        )
    finally:
        if started_here:
            stop_stack(env)
        else:
            fake_llm_config(fake_llm_port, {"latency_ms": latency_before})


def stop_stack(env: dict[str, str]) -> None:
    subprocess.run(
        ["bash", str(SCRIPTS / "stop_stack.sh")], env=env, capture_output=True, timeout=STACK_TIMEOUT, check=False
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Runs started in the background, each leading its own process group; what is left is killed at the end."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            kill_group(proc)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 a run and every process of its group (collect.sh runs NeMo Gym's collector under bash and tee)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=SUBPROCESS_TIMEOUT)
    wait_for(lambda: not group_alive(proc.pid), timeout=SUBPROCESS_TIMEOUT)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


# --- running the two tools ---------------------------------------------------------------------------------


def collect_with_gym(stack: Stack, rows: Path, out: Path, *flags: str, check: bool = True, **options: Any) -> Run:
    """NeMo Gym's collector to its end; unless `check` is false, it must succeed."""
    mark = stack.capture_mark()
    command, env = stack.collect_command(rows, out, *flags, **options)
    proc = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False, start_new_session=True
    )
    assert proc.returncode == 0 or not check, f"NeMo Gym's collector failed: {last_line(proc.stdout)}"
    return Run(out, proc.returncode, stack.captured_since(mark), proc.stdout + proc.stderr)


def collect_with_rollfilter(stack: Stack, rows: Path, out: Path, *flags: str, **options: Any) -> Run:
    mark = stack.capture_mark()
    proc = run(stack.rollfilter_args(rows, out, *flags, **options), timeout=RUN_TIMEOUT)
    summary = summary_of(proc.stderr) if proc.stderr.strip().endswith(b"}") else None
    return Run(out, proc.returncode, stack.captured_since(mark), proc.stderr.decode(), summary)


def start_gym(stack: Stack, rows: Path, out: Path, processes: list[subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    command, env = stack.collect_command(rows, out)
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    processes.append(proc)
    return proc


def start_rollfilter(
    stack: Stack, rows: Path, out: Path, processes: list[subprocess.Popen[bytes]], *, from_stdin: bool = False
) -> subprocess.Popen[bytes]:
    args = stack.rollfilter_args(None if from_stdin else rows, out)
    with rows.open("rb") if from_stdin else open(os.devnull, "rb") as stdin:
        proc = start(args, stdin=stdin, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    processes.append(proc)
    return proc


def kill_at(proc: subprocess.Popen[bytes], out: Path, moment: int) -> str:
    """kill -9 `proc` once `out` holds `moment` results (0: once its materialized file holds a line), and say
    what the files held then."""
    materialized = out.with_name(out.stem + "_materialized_inputs.jsonl")
    watched = out if moment else materialized
    wait_for(lambda: lines_in(watched) >= max(moment, 1) or proc.poll() is not None, timeout=KILL_MOMENT_TIMEOUT)
    assert proc.poll() is None, f"the run ended before {moment} results: raise LATENCY_MS"
    kill_group(proc)
    return f"killed with {lines_in(out)} results and {lines_in(materialized)} materialized bodies"


def lines_in(path: Path) -> int:
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


# --- what is compared ------------------------------------------------------------------------------------------


def planned_pairs(rows: Path) -> list[Pair]:
    """Every (task, rollout) NeMo Gym plans for `rows` with -r 2, numbered as its collector numbers them:
    identical lines share a task index, and the rollouts of a task are counted across its lines."""
    task_of_line: dict[bytes, int] = {}
    rollouts: Counter[int] = Counter()
    pairs = []
    for line in rows.read_bytes().splitlines(keepends=True):
        task = task_of_line.setdefault(line, len(task_of_line))
        for _ in range(REPEATS):
            pairs.append((task, rollouts[task]))
            rollouts[task] += 1
    return pairs


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_bytes().splitlines() if line.strip()]


def pair_of(row: dict[str, Any]) -> Pair:
    return (row["_ng_task_index"], row["_ng_rollout_index"])


def by_pair(rows: list[dict[str, Any]]) -> dict[Pair, dict[str, Any]]:
    """Rows by their (task, rollout); of a pair seen more than once, the last (`repeated` names them)."""
    return {pair_of(row): row for row in rows}


def repeated(rows: list[dict[str, Any]]) -> list[Pair]:
    return sorted(pair for pair, n in Counter(map(pair_of, rows)).items() if n > 1)


def exactly_once(rows: list[dict[str, Any]], planned: list[Pair]) -> list[str]:
    """What keeps `rows` from holding every planned pair exactly once."""
    seen = Counter(map(pair_of, rows))
    problems = []
    missing = sorted(set(planned) - set(seen))
    if missing:
        problems.append(f"{len(missing)} of {len(planned)} pairs missing: {missing[:8]}")
    if repeated(rows):
        problems.append(f"pairs more than once: {repeated(rows)[:8]}")
    unplanned = sorted(set(seen) - set(planned))
    if unplanned:
        problems.append(f"pairs never planned: {unplanned[:8]}")
    return problems


def leaf_differences(a: Any, b: Any, path: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(path, NeMo Gym's value, rollfilter's value) for each leaf where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            yield from leaf_differences(a.get(key, MISSING), b.get(key, MISSING), f"{path}.{key}" if path else key)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            yield from leaf_differences(x, y, f"{path}[{i}]")
    elif a != b or type(a) is not type(b):  # 1 == 1.0 == True, but JSON writes them apart
        yield path, a, b


def short(value: Any) -> str:
    text = value if value is MISSING else json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def row_differences(
    name: str,
    gym: dict[Pair, dict[str, Any]],
    rollfilter: dict[Pair, dict[str, Any]],
    labels: tuple[str, str] = TOOLS,
) -> list[str]:
    """One line per field that differs between the two tools' rows, with the rows it differs in."""
    lines = []
    only_gym, only_rollfilter = sorted(set(gym) - set(rollfilter)), sorted(set(rollfilter) - set(gym))
    if only_gym:
        lines.append(f"{name}: {len(only_gym)} rows only {labels[0]} has: {only_gym[:8]}")
    if only_rollfilter:
        lines.append(f"{name}: {len(only_rollfilter)} rows only {labels[1]} has: {only_rollfilter[:8]}")
    hits: dict[str, list[tuple[Pair, Any, Any]]] = defaultdict(list)
    for pair in sorted(set(gym) & set(rollfilter)):
        for path, a, b in leaf_differences(gym[pair], rollfilter[pair]):
            hits[path].append((pair, a, b))
    for path, found in hits.items():
        pair, a, b = found[0]
        rows = [p for p, _, _ in found]
        how = f"only in {labels[0]}'s" if b is MISSING else f"only in {labels[1]}'s" if a is MISSING else "differs in"
        lines.append(
            f"{name}: {path} {how} {len(found)} rows {rows[:6]}{'...' if len(rows) > 6 else ''}, "
            f"e.g. {pair}: {labels[0]} {short(a)}, {labels[1]} {short(b)}"
        )
    return lines


def report(problems: list[str], limit: int = 20) -> str:
    shown = problems[:limit]
    if len(problems) > limit:
        shown.append(f"... and {len(problems) - limit} more")
    return "\n".join(shown)


def aggregate_differences(gym: Path, rollfilter: Path, labels: tuple[str, str] = TOOLS, limit: int = 6) -> list[str]:
    if not is_whole_json(rollfilter):
        return [f"{rollfilter.name}: not whole JSON ({rollfilter.stat().st_size} bytes)"]
    gym_entries = {e["agent_ref"]["name"]: e for e in json.loads(gym.read_bytes())}
    rollfilter_entries = {e["agent_ref"]["name"]: e for e in json.loads(rollfilter.read_bytes())}
    found = [
        f"{rollfilter.name}: {path}: {labels[0]} {short(a)}, {labels[1]} {short(b)}"
        for path, a, b in leaf_differences(gym_entries, rollfilter_entries)
    ]
    if len(found) > limit:
        found[limit:] = [f"{rollfilter.name}: ... and {len(found) - limit} more figures differ"]
    return found


def materialized_differences(gym: Path, rollfilter: Path, labels: tuple[str, str] = TOOLS) -> list[str]:
    gym_lines, rollfilter_lines = gym.read_bytes().splitlines(), rollfilter.read_bytes().splitlines()
    if gym_lines == rollfilter_lines:
        return []
    problems = [f"{rollfilter.name}: {labels[0]} {len(gym_lines)} lines, {labels[1]} {len(rollfilter_lines)}"]
    if sorted(gym_lines) == sorted(rollfilter_lines):
        problems.append(f"{rollfilter.name}: the same lines in another order")
    for number, (a, b) in enumerate(zip(gym_lines, rollfilter_lines, strict=False), 1):
        if a != b:
            problems.append(f"{rollfilter.name}: line {number} first differs")
            line = f"{rollfilter.name} line {number}"
            problems += row_differences(line, {(0, 0): json.loads(a)}, {(0, 0): json.loads(b)}, labels)
            break
    return problems


def is_whole_json(path: Path) -> bool:
    try:
        json.loads(path.read_bytes())
    except ValueError:
        return False
    return True


def progress_differences(progress: Path, finished: int) -> list[str]:
    """NeMo Gym's progress artifact: a plain integer of finished rollouts (its source at this commit writes none
    yet, so only rollfilter's is checked against the contract)."""
    if not progress.exists():
        return [f"rollfilter wrote no {progress.name}"]
    if progress.read_text().strip() != str(finished):
        return [f"{progress.name} holds {progress.read_text()!r}, the output {finished} rollouts"]
    return []


def summary_differences(summary: dict[str, Any] | None, aggregate: Path) -> list[str]:
    """rollfilter's summary against the agent's own figures over the same output: as many tasks as the aggregate
    groups (duplicate lines are one task), and the same means."""
    assert summary is not None
    (entry,) = json.loads(aggregate.read_bytes())
    problems = []
    tasks = summary["rollfilter"].get("tasks", MISSING)
    if tasks != len(entry["group_level_metrics"]):
        problems.append(f"summary: tasks {tasks}, the aggregate groups {len(entry['group_level_metrics'])} tasks")
    figures = {"reward": (summary.get("reward"), entry["agent_metrics"]["mean/reward"])}
    for tokens in ("input_tokens", "output_tokens", "total_tokens"):
        figures[f"usage.{tokens}"] = (summary["usage"].get(tokens), entry["agent_metrics"][f"mean/{tokens}"])
    for name, (ours, agents) in figures.items():
        if ours != pytest.approx(agents, rel=1e-12):
            problems.append(f"summary: {name} {ours}, the aggregate's mean {agents}")
    return problems


# --- the rows and the base runs ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rows(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """weather_50.jsonl (50 distinct tasks) and three of its lines again: 53 lines, 50 tasks, 106 pairs at -r 2."""
    lines = (stack.root / "data" / "weather_50.jsonl").read_bytes().splitlines(keepends=True)
    path = tmp_path_factory.mktemp("rows") / "weather_53.jsonl"
    path.write_bytes(b"".join(lines + [lines[i] for i in DUPLICATED_LINES]))
    return path


@pytest.fixture(scope="module")
def side_by_side(stack: Stack, rows: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run]:
    folder = tmp_path_factory.mktemp("side_by_side")
    gym = collect_with_gym(stack, rows, folder / "gym" / "OUT.jsonl")
    out = folder / "rollfilter" / "OUT.jsonl"
    rollfilter = collect_with_rollfilter(stack, rows, out, "--per-task", str(out.with_name("OUT_per_task.jsonl")))
    return gym, rollfilter


def test_both_tools_collect_every_pair_once(side_by_side: tuple[Run, Run], rows: Path):
    gym, rollfilter = side_by_side
    assert rollfilter.returncode == 0
    planned = planned_pairs(rows)
    assert len(planned) == 106
    for name, run_ in (("NeMo Gym", gym), ("rollfilter", rollfilter)):
        problems = exactly_once(read_jsonl(run_.out), planned)
        assert not problems, f"{name} OUT.jsonl: " + report(problems)


def test_run_bodies_are_the_same(side_by_side: tuple[Run, Run]):
    gym, rollfilter = side_by_side
    problems = [
        f"{name} sent {pair} more than once"
        for name, run_ in zip(TOOLS, side_by_side, strict=True)
        for pair in repeated(run_.bodies)
    ]
    problems += row_differences("/run body", by_pair(gym.bodies), by_pair(rollfilter.bodies))
    assert not problems, report(problems)


def test_materialized_inputs_are_byte_identical(side_by_side: tuple[Run, Run]):
    gym, rollfilter = side_by_side
    problems = materialized_differences(gym.materialized, rollfilter.materialized)
    assert not problems, report(problems)


def test_results_are_the_same_field_for_field(side_by_side: tuple[Run, Run]):
    gym, rollfilter = side_by_side
    problems = row_differences("OUT.jsonl", by_pair(read_jsonl(gym.out)), by_pair(read_jsonl(rollfilter.out)))
    assert not problems, report(problems)


def test_results_are_the_same_bytes(side_by_side: tuple[Run, Run]):
    """Each result line is written byte for byte as NeMo Gym writes it (key order, number forms), in the order
    they finished."""
    gym, rollfilter = side_by_side
    gym_lines, rollfilter_lines = set(gym.out.read_bytes().splitlines()), set(rollfilter.out.read_bytes().splitlines())
    apart = sorted(pair_of(json.loads(line)) for line in rollfilter_lines - gym_lines)
    assert not apart, f"OUT.jsonl: {len(apart)} lines not byte for byte as NeMo Gym wrote them: {apart[:8]}"


def test_no_failures_in_either_sidecar(side_by_side: tuple[Run, Run]):
    gym, rollfilter = side_by_side
    assert gym.failures.read_bytes() == b""
    assert read_jsonl(rollfilter.failures) == []


def test_aggregate_metrics_files_are_the_same(side_by_side: tuple[Run, Run]):
    gym, rollfilter = side_by_side
    problems = aggregate_differences(gym.aggregate, rollfilter.run.aggregate)
    assert not problems, report(problems)


def test_aggregate_metrics_are_asked_for_alike(side_by_side: tuple[Run, Run]):
    """Each tool sends /aggregate_metrics once, with the same results in the same order: (task, rollout)."""
    gym, rollfilter = side_by_side
    assert len(gym.aggregate_requests) == len(rollfilter.aggregate_requests) == 1
    gym_results = gym.aggregate_requests[0]["verify_responses"]
    rollfilter_results = rollfilter.aggregate_requests[0]["verify_responses"]
    gym_order, rollfilter_order = list(map(pair_of, gym_results)), list(map(pair_of, rollfilter_results))
    assert gym_order == sorted(gym_order)
    assert rollfilter_order == gym_order, (
        f"rollfilter sends its results in another order: first apart at position "
        f"{next(i for i, (a, b) in enumerate(zip(gym_order, rollfilter_order, strict=False)) if a != b)}, "
        f"rollfilter {rollfilter_order[:8]}..., NeMo Gym {gym_order[:8]}..."
    )
    problems = row_differences("/aggregate_metrics entry", by_pair(gym_results), by_pair(rollfilter_results))
    assert not problems, report(problems)


def test_summary_agrees_with_the_aggregate(side_by_side: tuple[Run, Run]):
    """rollfilter's summary counts NeMo Gym's tasks (duplicates are one task) and gives the agent's own means."""
    gym, rollfilter = side_by_side
    problems = summary_differences(rollfilter.summary, gym.aggregate)
    assert not problems, report(problems)


def test_per_task_lines_are_the_aggregates_groups(side_by_side: tuple[Run, Run]):
    """`--per-task` gives one line a task, as the agent's group-level metrics group NeMo Gym's output."""
    gym, rollfilter = side_by_side
    (entry,) = json.loads(gym.aggregate.read_bytes())
    groups = {g["_ng_task_index"]: (g["num_rollouts"], g["mean/reward"]) for g in entry["group_level_metrics"]}
    lines = read_jsonl(rollfilter.file("_per_task.jsonl"))
    problems = [
        f"--per-task: task {t} has {n} lines"
        for t, n in Counter(line["_ng_task_index"] for line in lines).items()
        if n > 1
    ]
    per_task = {line["_ng_task_index"]: (line["n"], line["mean_reward"]) for line in lines}
    problems += [
        f"--per-task: task {task}: rollfilter (n, mean_reward) {per_task.get(task, MISSING)}, the aggregate {group}"
        for task, group in groups.items()
        if per_task.get(task) != group
    ]
    assert not problems, report(problems)


def test_progress_artifact_counts_every_rollout(side_by_side: tuple[Run, Run]):
    _, rollfilter = side_by_side
    problems = progress_differences(rollfilter.progress, len(read_jsonl(rollfilter.out)))
    assert not problems, report(problems)


def test_a_missing_repeat_count_is_refused_alike(stack: Stack, rows: Path, tmp_path: Path):
    """Repeats given for another agent only, with no default: NeMo Gym refuses before sending anything, and so
    does rollfilter, with exit status 2 and a message naming the agent."""
    gym = collect_with_gym(stack, rows, tmp_path / "gym" / "OUT.jsonl", check=False, repeats="{other_agent: 2}")
    rollfilter = collect_with_rollfilter(stack, rows, tmp_path / "rollfilter" / "OUT.jsonl", repeats="other_agent=2")
    assert gym.returncode != 0
    assert "num_repeats dict has no entry for agents" in gym.console
    assert gym.bodies == []
    problems = []
    if rollfilter.returncode != ExitStatus.USAGE:
        problems.append(f"rollfilter exit status {rollfilter.returncode}, NeMo Gym refuses (rollfilter's usage: 2)")
    if rollfilter.bodies:
        problems.append(f"rollfilter sent {len(rollfilter.bodies)} bodies, NeMo Gym none")
    messages = "\n".join(line for line in rollfilter.console.splitlines() if not line.startswith("{"))
    if stack.agent not in messages:
        problems.append(f"rollfilter's messages do not name {stack.agent}: {messages!r}")
    assert not problems, report(problems)


# --- failure rows: a proxy of ours marks some real answers as the agent's failures --------------------------


def marks(body: dict[str, Any]) -> dict[str, Any]:
    """Every first attempt of tasks 1, 7, 13, ... fails, terminally on its odd rollouts; a retry succeeds."""
    if body.get("_ng_attempt_index", 0) or body["_ng_task_index"] % 6 != 1:
        return {}
    if body["_ng_rollout_index"] % 2:
        return {"_ng_failure_class": "MarkedByTestProxy", "_ng_failure_terminal": True}
    return {"_ng_failure_class": "MarkedByTestProxy"}


@pytest.fixture(scope="module")
def marking_proxy(stack: Stack) -> Iterator[MarkingProxy]:
    proxy = MarkingProxy(head_port=stack.head_port, agent_port=stack.agent_port, mark=marks)
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture(scope="module")
def marked_side_by_side(
    stack: Stack, rows: Path, marking_proxy: MarkingProxy, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Run, Run]:
    folder = tmp_path_factory.mktemp("marked")
    port = marking_proxy.head_port
    gym = collect_with_gym(stack, rows, folder / "gym" / "OUT.jsonl", head_port=port)
    rollfilter = collect_with_rollfilter(stack, rows, folder / "rollfilter" / "OUT.jsonl", head_port=port)
    return gym, rollfilter


def marked_pairs(rows: Path) -> set[Pair]:
    return {(task, rollout) for task, rollout in planned_pairs(rows) if task % 6 == 1}


def terminal_pairs(rows: Path) -> set[Pair]:
    return {(task, rollout) for task, rollout in marked_pairs(rows) if rollout % 2}


def test_marked_answers_are_failures_in_both(marked_side_by_side: tuple[Run, Run], rows: Path):
    gym, rollfilter = marked_side_by_side
    assert rollfilter.returncode == 1  # some rollouts failed
    planned, marked = planned_pairs(rows), marked_pairs(rows)
    for name, run_ in (("NeMo Gym", gym), ("rollfilter", rollfilter)):
        problems = [f"{name} _failures.jsonl: {p}" for p in exactly_once(read_jsonl(run_.failures), sorted(marked))]
        unmarked = [p for p in planned if p not in marked]
        problems += [f"{name} OUT.jsonl: {p}" for p in exactly_once(read_jsonl(run_.out), unmarked)]
        assert not problems, report(problems)


def test_failure_rows_are_the_same_field_for_field(marked_side_by_side: tuple[Run, Run]):
    """NeMo Gym's failure row is the agent's answer with the pair's keys; rollfilter's holds the same fields at the
    top level, and its own (error, source, line, attempts, row) beside them."""
    gym, rollfilter = marked_side_by_side
    rollfilter_rows = [
        {k: v for k, v in row.items() if k not in ROLLFILTER_FAILURE_FIELDS} for row in read_jsonl(rollfilter.failures)
    ]
    problems = row_differences("_failures.jsonl", by_pair(read_jsonl(gym.failures)), by_pair(rollfilter_rows))
    assert not problems, report(problems)


def test_marked_runs_aggregate_the_same(marked_side_by_side: tuple[Run, Run]):
    gym, rollfilter = marked_side_by_side
    problems = aggregate_differences(gym.aggregate, rollfilter.run.aggregate)
    problems += row_differences("OUT.jsonl", by_pair(read_jsonl(gym.out)), by_pair(read_jsonl(rollfilter.out)))
    assert not problems, report(problems)


def test_each_tool_retries_the_others_failures_alike(
    stack: Stack, rows: Path, marking_proxy: MarkingProxy, marked_side_by_side: tuple[Run, Run], tmp_path: Path
):
    """Each tool resumes the run the other left with failures: the same non-terminal pairs are sent again, with
    `_ng_attempt_index` 1, and the terminal ones are not; both outputs end with every pair but the terminal ones."""
    gym_started, rollfilter_started = marked_side_by_side
    shutil.copytree(gym_started.out.parent, tmp_path / "gym_then_rollfilter")
    shutil.copytree(rollfilter_started.out.parent, tmp_path / "rollfilter_then_gym")
    port = marking_proxy.head_port
    by_rollfilter = collect_with_rollfilter(
        stack, rows, tmp_path / "gym_then_rollfilter" / "OUT.jsonl", "--resume", head_port=port
    )
    by_gym = collect_with_gym(stack, rows, tmp_path / "rollfilter_then_gym" / "OUT.jsonl", "--resume", head_port=port)
    assert by_rollfilter.returncode == 0
    retried = marked_pairs(rows) - terminal_pairs(rows)
    assert {pair_of(body) for body in by_gym.bodies} == retried
    assert all(body["_ng_attempt_index"] == 1 for body in by_gym.bodies)
    problems = row_differences("resumed /run body", by_pair(by_gym.bodies), by_pair(by_rollfilter.bodies))
    planned = [p for p in planned_pairs(rows) if p not in terminal_pairs(rows)]
    for name, run_ in (("NeMo Gym", by_gym), ("rollfilter", by_rollfilter)):
        problems += [f"{name} OUT.jsonl: {p}" for p in exactly_once(read_jsonl(run_.out), planned)]
    problems += row_differences(
        "resumed OUT.jsonl", by_pair(read_jsonl(by_gym.out)), by_pair(read_jsonl(by_rollfilter.out))
    )
    # The retried attempts all succeed: neither tool adds a line to the other's failures sidecar.
    for name, run_, started in (("NeMo Gym", by_gym, rollfilter_started), ("rollfilter", by_rollfilter, gym_started)):
        if run_.failures.read_bytes() != started.failures.read_bytes():
            problems.append(f"{name} changed the {run_.failures.name} it resumed from")
    assert not problems, report(problems)


# --- resume after kill -9, in both directions ------------------------------------------------------------------

MOMENTS = [0, 25, 70]  # results in OUT.jsonl when the first tool is killed (0: once it has planned a body)


def finished_differences(finished: Run, base: Run, rows: Path) -> list[str]:
    """What keeps the finished output from holding every planned pair exactly once, each result as the uninterrupted
    run has it, with the other files as that run's."""
    results = by_pair(read_jsonl(finished.out))
    uninterrupted = {pair: row for pair, row in by_pair(read_jsonl(base.out)).items() if pair in results}
    problems = [f"{finished.out.name}: {p}" for p in exactly_once(read_jsonl(finished.out), planned_pairs(rows))]
    problems += row_differences(finished.out.name, uninterrupted, results, RESUMED)
    problems += materialized_differences(base.materialized, finished.materialized, RESUMED)
    problems += [f"{finished.failures.name}: {short(row)}" for row in read_jsonl(finished.failures)]
    problems += aggregate_differences(base.aggregate, finished.aggregate, RESUMED)
    return problems


def killed_file_differences(out: Path) -> list[str]:
    """A killed run leaves the files it writes whole (the aggregate metrics, the progress artifact) complete, or
    leaves none."""
    aggregate = out.with_name(out.stem + "_aggregate_metrics.json")
    progress = out.with_name(out.stem + "_progress")
    problems = []
    if aggregate.exists() and not is_whole_json(aggregate):
        problems.append(f"after kill -9: {aggregate.name} left torn or empty ({aggregate.stat().st_size} bytes)")
    if progress.exists() and not progress.read_text().strip().isdigit():
        problems.append(f"after kill -9: {progress.name} left torn or empty: {progress.read_text()!r}")
    return problems


@pytest.mark.parametrize(
    ("moment", "from_stdin"),
    [*((moment, False) for moment in MOMENTS), (0, True), (25, True)],
    ids=[*map(str, MOMENTS), "0-stdin", "25-stdin"],
)
def test_nemo_gym_finishes_a_killed_rollfilter_run(
    stack: Stack,
    rows: Path,
    side_by_side: tuple[Run, Run],
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    moment: int,
    from_stdin: bool,
):
    """rollfilter killed at several moments, reading a file or its standard input; NeMo Gym's --resume finishes."""
    out = tmp_path / "OUT.jsonl"
    killed = kill_at(start_rollfilter(stack, rows, out, processes, from_stdin=from_stdin), out, moment)
    problems = killed_file_differences(out)
    finished = collect_with_gym(stack, rows, out, "--resume")
    problems += finished_differences(finished, side_by_side[0], rows)
    assert not problems, f"rollfilter {killed}, NeMo Gym resumed:\n" + report(problems)


@pytest.mark.parametrize("moment", MOMENTS)
def test_rollfilter_finishes_a_killed_nemo_gym_run(
    stack: Stack,
    rows: Path,
    side_by_side: tuple[Run, Run],
    processes: list[subprocess.Popen[bytes]],
    tmp_path: Path,
    moment: int,
):
    out = tmp_path / "OUT.jsonl"
    killed = kill_at(start_gym(stack, rows, out, processes), out, moment)
    finished = collect_with_rollfilter(stack, rows, out, "--resume")
    assert finished.returncode == 0
    problems = finished_differences(finished, side_by_side[0], rows)
    # The summary covers the whole output, earlier results and new alike, as the aggregate does.
    problems += summary_differences(finished.summary, finished.aggregate)
    problems += progress_differences(finished.progress, len(planned_pairs(rows)))
    assert not problems, f"NeMo Gym {killed}, rollfilter resumed:\n" + report(problems)
