"""The command as a Unix filter: stdin to stdout, pipes, files, descriptors and Ctrl-C."""

from __future__ import annotations

import json
import os
import pty
import random
import select
import signal
import subprocess
from pathlib import Path

from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoServer,
    clean_env,
    expected_reward,
    read_terminal,
    result_lines,
    rollfilter_command,
    rows_jsonl,
    run,
    simple_rows,
    start,
    stderr_at_a_terminal,
    summary_of,
    wait_for,
)


def test_results_and_summary_over_a_separate_agent(demo_server: DemoServer):
    rows = simple_rows(300)
    proc = run(["-u", demo_server.base, "-j", "16"], input=rows_jsonl(rows))
    assert proc.returncode == 0, proc.stderr
    results = result_lines(proc.stdout)
    assert len(results) == 300
    by_task = {r["_ng_task_index"]: r for r in results}
    assert sorted(by_task) == list(range(300))
    for row in rows:
        assert by_task[row["id"]]["reward"] == expected_reward(row)
    summary = summary_of(proc.stderr)
    assert summary["reward"] == sum(r["reward"] for r in results) / 300
    assert summary["accuracy"] == sum(r["accuracy"] for r in results) / 300  # booleans count as 0/1
    figures = summary["rollfilter"]
    assert (figures["rows_read"], figures["succeeded"], figures["failed"]) == (300, 300, 0)
    assert 0 < figures["latency_s"]["p50"] <= figures["latency_s"]["p99"] <= figures["latency_s"]["max"]
    assert demo_server.stats()["requests"] == 300


def test_repeats_and_limit_number_the_rollouts(demo_server: DemoServer):
    proc = run(["-u", demo_server.url, "-n", "4", "-r", "3"], input=rows_jsonl(simple_rows(10)))
    assert proc.returncode == 0, proc.stderr
    pairs = sorted((r["_ng_task_index"], r["_ng_rollout_index"]) for r in result_lines(proc.stdout))
    assert pairs == [(t, k) for t in range(4) for k in range(3)]
    assert demo_server.stats()["requests"] == 12


def test_row_keeps_its_own_task_index(demo_server: DemoServer):
    rows = [{"_ng_task_index": 40 + i, "responses_create_params": {"input": "x"}} for i in range(3)]
    proc = run(["-u", demo_server.url], input=rows_jsonl(rows))
    assert sorted(r["_ng_task_index"] for r in result_lines(proc.stdout)) == [40, 41, 42]


def test_param_overrides_reach_the_agent(demo_server: DemoServer):
    proc = run(
        ["-u", demo_server.url, "-p", "temperature=0.7", "-p", "model=my-model", "-p", "reasoning.effort=high"],
        input=rows_jsonl(simple_rows(2)),
    )
    assert proc.returncode == 0, proc.stderr
    for result in result_lines(proc.stdout):
        params = result["responses_create_params"]
        assert params["temperature"] == 0.7
        assert params["model"] == "my-model"
        assert params["reasoning"] == {"effort": "high"}


def test_ordered_output_follows_input_order_under_random_latency(demo_server: DemoServer):
    rng = random.Random(7)
    rows = [
        {"id": i, "responses_create_params": {"input": "x"}, "demo": {"latency": rng.uniform(0, 0.1)}}
        for i in range(60)
    ]
    unordered = run(["-u", demo_server.url, "-j", "20"], input=rows_jsonl(rows))
    ordered = run(["-u", demo_server.url, "-j", "20", "--ordered"], input=rows_jsonl(rows))
    assert ordered.returncode == 0, ordered.stderr
    assert [r["_ng_task_index"] for r in result_lines(ordered.stdout)] == list(range(60))
    # The same latencies without --ordered finish out of order, so the test above could fail.
    assert [r["_ng_task_index"] for r in result_lines(unordered.stdout)] != list(range(60))


def test_first_result_arrives_before_the_second_row_is_written(demo_server: DemoServer):
    proc = start(["-u", demo_server.url], stdin=subprocess.PIPE)
    assert proc.stdin
    assert proc.stdout
    try:
        proc.stdin.write(rows_jsonl(simple_rows(1)).encode())
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 20)
        assert ready, "no result while the producer waits with its second row"
        first = json.loads(proc.stdout.readline())
        assert first["_ng_task_index"] == 0
        proc.stdin.write(rows_jsonl(simple_rows(3)[1:]).encode())
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == 0
        assert len(rest.splitlines()) == 2
    finally:
        proc.kill()
        proc.wait(timeout=SUBPROCESS_TIMEOUT)
        for stream in (proc.stdout, proc.stderr):
            if stream:
                stream.close()


def test_closed_stdout_exits_141_quietly(tmp_path, demo_server: DemoServer):
    big = tmp_path / "big.jsonl"
    big.write_text(rows_jsonl(simple_rows(20_000)))
    proc = start(["-u", demo_server.url, str(big)])
    assert proc.stdout
    assert proc.stderr
    first = proc.stdout.readline()
    proc.stdout.close()  # what `| head -n 1` does after its line
    assert json.loads(first)["_ng_rollout_index"] == 0
    assert proc.wait(timeout=SUBPROCESS_TIMEOUT) == 141
    stderr = proc.stderr.read().decode()
    proc.stderr.close()
    assert "Traceback" not in stderr
    assert [line for line in stderr.splitlines() if not line.startswith("{")] == []
    assert summary_of(stderr.encode())["rollfilter"]["succeeded"] < 20_000
    assert demo_server.stats()["requests"] < 20_000


def test_head_in_a_shell_pipeline(demo_server: DemoServer):
    proc = subprocess.run(
        [
            "bash",
            "-c",
            f'set -o pipefail; seq 100000 | sed \'s/.*/{{"responses_create_params":{{"input":"&"}}}}/\' '
            f"| {rollfilter_command()[0]} -q -u {demo_server.url} | head -n 3",
        ],
        capture_output=True,
        timeout=SUBPROCESS_TIMEOUT,
        env=clean_env(),
    )
    assert proc.returncode == 141
    assert len(proc.stdout.splitlines()) == 3
    assert proc.stderr == b""


def test_ctrl_c_keeps_finished_results_and_prints_summary(demo_server: DemoServer):
    rows = [
        {"id": i, "responses_create_params": {"input": "x"}, "demo": {"latency": 0.05 if i < 20 else 30}}
        for i in range(40)
    ]
    proc = start(["-u", demo_server.url, "-j", "40"], stdin=subprocess.PIPE)
    assert proc.stdin
    assert proc.stdout
    assert proc.stderr
    proc.stdin.write(rows_jsonl(rows).encode())
    proc.stdin.close()
    lines = [proc.stdout.readline() for _ in range(20)]  # the 20 quick rows are done
    proc.send_signal(signal.SIGINT)
    lines += proc.stdout.read().splitlines(keepends=True)
    status = proc.wait(timeout=SUBPROCESS_TIMEOUT)
    stderr = proc.stderr.read()
    proc.stdout.close()
    proc.stderr.close()
    assert status == 130
    assert sorted(json.loads(line)["_ng_task_index"] for line in lines) == list(range(20))
    summary = summary_of(stderr)["rollfilter"]
    assert summary["succeeded"] == 20
    assert summary["cancelled"] == 20  # the 30 s rows were cancelled, not waited for
    assert b"Traceback" not in stderr


def test_bad_line_and_unroutable_row_fail_alone(demo_server: DemoServer):
    text = (
        '{"responses_create_params": {"input": "ok"}, "agent_ref": {"name": "known"}}\n'
        "{not json\n"
        '{"responses_create_params": {"input": "ok"}, "agent_ref": {"name": "nowhere"}}\n'
        '{"responses_create_params": {"input": "fine"}, "agent_ref": {"name": "known"}}\n'
    )
    proc = run(["-e", f"known={demo_server.base}"], input=text)
    assert proc.returncode == 1
    messages = [line for line in proc.stderr.decode().splitlines() if not line.startswith("{")]
    assert len(messages) == 2
    assert messages[0].startswith("rollfilter: <stdin>:2: bad_input: ")
    assert messages[1].startswith("rollfilter: <stdin>:3: no_route: ")
    assert "nowhere" in messages[1]
    results = result_lines(proc.stdout)
    assert sorted(r["_ng_task_index"] for r in results) == [0, 3]
    assert all(r["agent_ref"]["name"] == "known" for r in results)
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["failed"]) == (2, 2)
    assert figures["failed_by_kind"] == {"bad_input": 1, "no_route": 1}
    assert demo_server.stats()["requests"] == 2


def test_output_file_is_never_mixed_into_unasked_and_metrics_file(tmp_path, demo_server: DemoServer):
    out, metrics = tmp_path / "new" / "folder" / "out.jsonl", tmp_path / "metrics.json"
    out.parent.mkdir(parents=True)
    out.write_text('{"previous": true}\n')
    refused = run(["-u", demo_server.url, "-o", str(out)], input=rows_jsonl(simple_rows(5)))
    assert refused.returncode == 2
    assert refused.stderr.decode().count("\n") == 1
    assert "--resume" in refused.stderr.decode()
    assert "--append" in refused.stderr.decode()
    assert demo_server.stats()["requests"] == 0
    args = ["-u", demo_server.url, "-o", str(out), "--append", "--metrics", str(metrics)]
    proc = run(args, input=rows_jsonl(simple_rows(5)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b""
    lines = out.read_text().splitlines()
    assert json.loads(lines[0]) == {"previous": True}
    assert len(lines) == 6
    assert json.loads(metrics.read_text()) == summary_of(proc.stderr)


def test_usage_errors_exit_2_before_sending(tmp_path, demo_server: DemoServer):
    rows = rows_jsonl(simple_rows(2))
    not_a_folder = tmp_path / "file.txt"
    not_a_folder.write_text("")
    holds_lines = tmp_path / "errors.jsonl"
    holds_lines.write_text("{}\n")
    cases = [
        ["-u", demo_server.url, "-p", "novalue"],
        ["-u", demo_server.url, str(tmp_path / "missing.jsonl")],
        ["-u", demo_server.url, "-o", str(not_a_folder / "out.jsonl")],
        ["-u", demo_server.url, "--errors", str(holds_lines)],
        ["-u", demo_server.url, "--resume"],
        ["-u", "ftp://example.invalid/"],
        ["-u", demo_server.url, "-j", "abc"],
        ["-u", demo_server.url, "--no-such-option"],
        [],
    ]
    for args in cases:
        proc = run(args, input=rows)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stdout == b""
        assert b"Traceback" not in proc.stderr
        assert len(proc.stderr.decode().strip().splitlines()) == 1, proc.stderr
    assert demo_server.stats()["requests"] == 0


def test_version_and_module_entry_point():
    import sys

    proc = subprocess.run(
        [sys.executable, "-m", "rollfilter", "--version"], capture_output=True, timeout=SUBPROCESS_TIMEOUT
    )
    assert proc.returncode == 0
    assert proc.stdout.decode().startswith("rollfilter ")


def test_parallel_appends_to_one_file_never_tear_a_line(tmp_path, demo_server: DemoServer):
    out = tmp_path / "out.jsonl"
    data = tmp_path / "rows.jsonl"
    data.write_text(rows_jsonl(simple_rows(2000)))
    procs = [
        start(["-q", "-u", demo_server.url, "-o", str(out), "--append", str(data)], stdout=None, stderr=None)
        for _ in range(3)
    ]
    assert [p.wait(timeout=SUBPROCESS_TIMEOUT) for p in procs] == [0, 0, 0]
    lines = out.read_bytes().splitlines()
    assert len(lines) == 6000
    assert all(json.loads(line)["_ng_rollout_index"] == 0 for line in lines)  # each line whole


def test_a_terminal_on_stdin_gets_a_hint(demo_server: DemoServer):
    controller, terminal = pty.openpty()
    proc = start(["-u", demo_server.url], stdin=terminal)
    os.close(terminal)
    assert proc.stderr is not None
    hint = proc.stderr.readline().decode()
    os.write(controller, b"\x04")  # Ctrl-D: the end of the input
    stdout, _ = proc.communicate(timeout=SUBPROCESS_TIMEOUT)
    os.close(controller)
    assert hint.startswith("rollfilter: reading rows from the terminal")
    assert proc.returncode == 0
    assert stdout == b""


async def test_a_run_reads_and_writes_the_descriptors_it_is_given(tmp_path, demo_server: DemoServer):
    """The command's streams are parameters: a run in this process, on pipes and files of the test's own."""
    from rollfilter.cli.collect import collect
    from rollfilter.cli.command import CommandConfig
    from rollfilter.cli.environment import Environment
    from rollfilter.cli.statuses import RunEnd
    from rollfilter.config import Config

    read_end, write_end = os.pipe()
    os.write(write_end, rows_jsonl(simple_rows(3)).encode())
    os.close(write_end)
    out, err = (os.open(tmp_path / name, os.O_WRONLY | os.O_CREAT) for name in ("out", "err"))
    try:
        config = CommandConfig(Config(url=demo_server.url), handle_signals=False, progress=False)
        end = await collect(config, environment=Environment.of_descriptors(read_end, out, err, variables={}))
    finally:
        for fd in (read_end, out, err):
            os.close(fd)
    assert end == RunEnd()  # ran to its end, nothing lost
    assert sorted(r["_ng_task_index"] for r in result_lines((tmp_path / "out").read_bytes())) == [0, 1, 2]
    assert summary_of((tmp_path / "err").read_bytes())["rollfilter"]["succeeded"] == 3


def test_at_a_terminal_the_summary_is_a_few_lines_for_a_person_and_in_a_pipe_one_json_line(demo_server):
    rows = rows_jsonl(simple_rows(10))
    code, shown = stderr_at_a_terminal(["-u", demo_server.url, "--no-progress", "-r", "16"], input=rows)
    assert code == 0
    summary = shown[shown.index("160 of 160 rollouts") :].splitlines()  # under the pass histogram's chart
    assert len(summary) <= 25
    assert summary[0] == "160 of 160 rollouts: 160 succeeded, 0 failed"
    assert [line.split()[0] for line in summary[2:8]] == ["reward", "mean@16", "pass@1", "pass@2", "pass@4", "pass@8"]
    assert "{" not in shown
    assert summary[-1] == "the whole summary: --metrics FILE, or standard error to a file or a pipe (one JSON line)"
    proc = run(["-u", demo_server.url, "-r", "16"], input=rows)
    [line] = proc.stderr.decode().splitlines()  # where standard error is no terminal: as it was
    assert json.loads(line)["rollfilter"]["succeeded"] == 160


def interrupted(args: list[str], out: Path, stderr: int) -> int:
    """The command started with `stderr`, interrupted once -o `out` holds the quick rows' five lines."""
    proc = subprocess.Popen(
        [*rollfilter_command(), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=stderr,
        env=clean_env(TERM="xterm"),
    )
    wait_for(lambda: out.exists() and out.read_bytes().count(b"\n") == 5)
    proc.send_signal(signal.SIGINT)
    return proc.wait(timeout=SUBPROCESS_TIMEOUT)


def test_ctrl_c_at_a_terminal_with_an_output_ends_with_the_line_that_resumes_it(tmp_path, demo_server: DemoServer):
    rows = [
        {"id": i, "responses_create_params": {"input": "x"}, "demo": {"latency": 0.01 if i < 5 else 30}}
        for i in range(10)
    ]
    inputs, out = tmp_path / "rows.jsonl", tmp_path / "out.jsonl"
    inputs.write_text(rows_jsonl(rows))
    args = ["-u", demo_server.url, "-H", "Authorization: Bearer s3cret", "-j", "10", "-o", str(out), str(inputs)]
    controller, terminal = pty.openpty()
    try:
        status = interrupted([*args, "--no-progress"], out, terminal)
        os.close(terminal)
        terminal = -1
        shown = read_terminal(controller)
    finally:
        if terminal >= 0:
            os.close(terminal)
        os.close(controller)
    assert status == 130
    resumed = f"rollfilter -u {demo_server.url} -H 'Authorization: ...' -j 10 -o {out} {inputs} --no-progress --resume"
    assert shown.splitlines()[-1] == (
        f"rollfilter: to go on where it stopped: {resumed}"
        " (give again the header values and the URL credentials or queries cut here)"
    )
    assert "s3cret" not in shown
    out.unlink()
    Path(f"{out}.run.json").unlink()
    errors = tmp_path / "stderr"
    with errors.open("wb") as file:  # where standard error is no terminal: no such line, the summary last
        assert interrupted(args, out, file.fileno()) == 130
    assert json.loads(errors.read_bytes().splitlines()[-1])["rollfilter"]["succeeded"] == 5
