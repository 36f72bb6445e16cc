"""`rollfilter --reverify` beside NeMo Gym's own `gym eval reverify`, on a real stack: the same lines.

Opt-in: `python -m pytest -m gym -n 0 tests/e2e/test_gym_reverify.py`. The stack and its install are
test_gym_head.py's (`../shared/gym-stack-head`, NeMo Gym under its `ROOT`). rollfilter collects a few rollouts
and re-scores them against the running stack; then the stack is stopped and NeMo Gym's reverify, which starts its
own servers on the head server's port, runs as the stack's README says: the fake LLM alone on `FAKE_LLM_PORT`,
Ray on loopback, and `start_stack.sh`'s overrides. The two outputs are compared line by line by (task, rollout).
The example resources server says its `/reverify_mode` is `unknown`, so both run with `--force`: NeMo Gym then
names its output `unsafe_R2.jsonl` (documented in docs/nemo-gym.md); the order of the lines is each tool's
order of completion and is not compared.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.conftest import SUBPROCESS_TIMEOUT, run, wait_for
from tests.e2e.test_gym_head import (
    RUN_TIMEOUT,
    SCRIPTS,
    STACK_PROCESSES,
    STACK_TIMEOUT,
    alive,
    by_pair,
    exactly_once,
    group_alive,
    install_nemo_gym,
    last_line,
    planned_pairs,
    read_jsonl,
    read_settings,
    report,
    row_differences,
    run_script,
    script_env,
    stop_stack,
)

pytestmark = [pytest.mark.gym, pytest.mark.timeout(1800)]

ROWS = 10  # lines of weather_50.jsonl, each its own task; -r 2 makes 20 rollouts

# What NeMo Gym's reverify needs beside it once the stack is stopped: the fake LLM, and a Ray head on loopback,
# as start_stack.sh starts them.
FAKE_LLM = 'FAKE_LLM_HOST=127.0.0.1 FAKE_LLM_PORT="$FAKE_LLM_PORT" exec "$VENV/bin/python" "$HERE/fake_llm.py"'
RAY_HEAD = (
    'mkdir -p "$RAY_TMPDIR" && exec "$VENV/bin/ray" start --head --block --disable-usage-stats'
    ' --node-ip-address=127.0.0.1 --port="$RAY_GCS_PORT" --include-dashboard=false --num-cpus=2'
    ' --temp-dir="$RAY_TMPDIR" --ray-client-server-port="$RAY_CLIENT_PORT"'
    ' --node-manager-port="$RAY_NODE_MANAGER_PORT" --object-manager-port="$RAY_OBJECT_MANAGER_PORT"'
    ' --dashboard-agent-listen-port="$RAY_AGENT_LISTEN_PORT" --dashboard-agent-grpc-port="$RAY_AGENT_GRPC_PORT"'
    ' --runtime-env-agent-port="$RAY_RUNTIME_ENV_PORT" --metrics-export-port="$RAY_METRICS_PORT"'
    ' --min-worker-port="$RAY_MIN_WORKER_PORT" --max-worker-port="$RAY_MAX_WORKER_PORT"'
)
# `gym eval reverify --inputs M --rollouts R --output O --force` with the overrides start_stack.sh gives ng_run.
GYM_REVERIFY = (
    'cd "$ROOT/src" && PATH="$VENV/bin:$PATH" exec "$VENV/bin/gym" eval reverify'
    ' --inputs "$1" --rollouts "$2" --output "$3" --force'
    ' "+config_paths=[responses_api_models/openai_model/configs/openai_model.yaml,'
    'resources_servers/example_single_tool_call/configs/example_single_tool_call.yaml]"'
    ' "+default_host=127.0.0.1" "+head_server={host: 127.0.0.1, port: $HEAD_PORT}"'
    ' "+policy_base_url=http://127.0.0.1:$FAKE_LLM_PORT/v1" "+policy_api_key=dummy-key" "+policy_model_name=fake-llm"'
    ' "++policy_model.responses_api_models.openai_model.port=$MODEL_PORT"'
    ' "++example_single_tool_call.resources_servers.example_single_tool_call.port=$RESOURCES_PORT"'
    ' "++example_single_tool_call_simple_agent.responses_api_agents.simple_agent.port=$AGENT_PORT"'
    ' "+skip_venv_if_present=true" "+uv_venv_dir=$ROOT/server_venvs"'
    ' "+ray_head_node_address=127.0.0.1:$RAY_GCS_PORT"'
    ' "+port_range_low=$PORT_RANGE_LOW" "+port_range_high=$PORT_RANGE_HIGH" "+nemo_gym_log_dir=$LOG_DIR/servers"'
)


def with_stack_env(script: str, *args: str) -> list[str]:
    """bash running `script` with stack.env's settings ($HERE: the scripts' folder) and `args` as $1..."""
    prelude = f'HERE={SCRIPTS}; source "$HERE/stack.env" >/dev/null && '
    return ["bash", "-c", prelude + script, "bash", *args]


def end_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM a process we started and its group, then SIGKILL what is left of the group (NeMo Gym's reverify
    leaves its servers running behind it, and Ray's --block leaves its raylet)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
        wait_for(lambda: not group_alive(proc.pid), timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=SUBPROCESS_TIMEOUT)
    wait_for(lambda: not group_alive(proc.pid), timeout=SUBPROCESS_TIMEOUT)


def test_rollfilter_reverify_writes_the_lines_gym_eval_reverify_writes(tmp_path: Path) -> None:
    if not (SCRIPTS / "stack.env").exists():
        pytest.skip(f"no NeMo Gym stack scripts at {SCRIPTS}")
    env = script_env()
    settings = read_settings(env)
    env["ROOT"] = settings["ROOT"]
    install_nemo_gym(Path(settings["VENV"]), env)
    state_dir = Path(settings["STATE_DIR"])
    if any(alive(state_dir / f"{name}.pid") for name in STACK_PROCESSES):
        pytest.skip("a NeMo Gym stack is running under ROOT: this test stops its own and cannot share one")
    root = Path(settings["ROOT"])
    rows = tmp_path / "weather_10.jsonl"
    rows.write_bytes(b"".join((root / "data" / "weather_50.jsonl").read_bytes().splitlines(keepends=True)[:ROWS]))
    out = tmp_path / "OUT.jsonl"
    materialized = tmp_path / "OUT_materialized_inputs.jsonl"
    head = f"http://127.0.0.1:{settings['CAPTURE_HEAD_PORT']}"
    started: list[subprocess.Popen[bytes]] = []
    try:
        proc = run_script("start_stack.sh", env, STACK_TIMEOUT)
        if proc.returncode != 0:
            pytest.skip(f"the NeMo Gym stack could not be started: {last_line(proc.stderr + proc.stdout)}")
        collected = run(
            ["--head-server", head, "-a", settings["AGENT_NAME"], "-r", "2", "--gym-layout", "-o", str(out), str(rows)],
            timeout=RUN_TIMEOUT,
        )
        assert collected.returncode == 0, collected.stderr.decode()[-2000:]
        rescored = run(
            ["--reverify", str(materialized), "--force", "--head-server", head, str(out)], timeout=RUN_TIMEOUT
        )
        assert rescored.returncode == 0, rescored.stderr.decode()[-2000:]
        (tmp_path / "R1.jsonl").write_bytes(rescored.stdout)
        stop_stack(env)

        for script in (FAKE_LLM, RAY_HEAD):
            with (tmp_path / f"{len(started)}.log").open("wb") as log:
                started.append(
                    subprocess.Popen(
                        with_stack_env(script),
                        env=env,
                        stdout=log,
                        stderr=log,
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )
                )
        ray_log = tmp_path / "1.log"
        wait_for(lambda: b"Ray runtime started" in ray_log.read_bytes(), timeout=120)
        with (tmp_path / "gym.log").open("wb") as gym_log:
            gym = subprocess.Popen(
                with_stack_env(GYM_REVERIFY, str(materialized), str(out), str(tmp_path / "R2.jsonl")),
                env=env,
                stdout=gym_log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        started.append(gym)
        assert gym.wait(timeout=STACK_TIMEOUT) == 0, last_line((tmp_path / "gym.log").read_text())
    finally:
        for proc_ in reversed(started):
            end_group(proc_)
        stop_stack(env)

    ours, theirs = read_jsonl(tmp_path / "R1.jsonl"), read_jsonl(tmp_path / "unsafe_R2.jsonl")
    problems = [f"rollfilter: {p}" for p in exactly_once(ours, planned_pairs(rows))]
    problems += [f"NeMo Gym: {p}" for p in exactly_once(theirs, planned_pairs(rows))]
    problems += row_differences("re-scored line", by_pair(theirs), by_pair(ours))
    assert not problems, report(problems)
    assert len(ours) == ROWS * 2
