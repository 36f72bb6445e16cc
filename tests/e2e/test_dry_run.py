"""--dry-run: each body printed as it would be sent, in input order, nothing sent and no file written."""

from __future__ import annotations

import json

from tests.conftest import (
    DemoServer,
    rows_jsonl,
    run,
    simple_rows,
    summary_of,
)


def test_a_dry_run_prints_each_body_as_sent_and_its_route_in_input_order(demo_server: DemoServer):
    """Through the engine's own loop, with -j 16 given: bodies on stdout, route and failure lines
    on stderr, both in input order, and nothing sent. Each row yields to the scheduler between
    its route and its body, so a dry run on 16 workers would write the bodies in the scheduler's
    order (as it did in 9 runs of 9 when tried): the one worker is what keeps input order."""
    rows = [{"responses_create_params": {"input": f"q{i}"}, "agent_ref": {"name": "ab"[i % 3 == 0]}} for i in range(40)]
    lines = [json.dumps(row) for row in rows]
    lines[5] = "{not json"
    lines[7] = json.dumps({"responses_create_params": {"input": "q7"}, "agent_ref": {"name": "c"}})
    other = demo_server.url.replace("/run", "/other")
    args = ["-e", f"a={demo_server.url}", "-e", f"b={other}", "-r", "2", "-j", "16", "--dry-run"]
    proc = run(args, input="\n".join(lines) + "\n")
    assert proc.returncode == 1, proc.stderr  # the bad line and agent c's row are lost, as in a real run
    sent = [(i, k) for i in range(40) if i not in (5, 7) for k in range(2)]
    bodies = [
        json.dumps({**rows[i], "_ng_task_index": i, "_ng_rollout_index": k}, separators=(",", ":")).encode()
        for i, k in sent
    ]
    assert proc.stdout.splitlines() == bodies
    expected: list[bytes] = []
    for i in range(40):
        for k in range(2):
            if i == 5:
                expected.append(b"rollfilter: <stdin>:6 (rollout %d): bad_input: invalid JSON" % k)
            elif i == 7:
                expected.append(
                    b"rollfilter: <stdin>:8 (rollout %d): no_route: no endpoint for agent 'c', and the run" % k
                )
            else:
                url = (demo_server.url if i % 3 else other).encode()
                expected.append(b"rollfilter: <stdin>:%d task %d rollout %d -> POST %s" % (i + 1, i, k, url))
    printed = proc.stderr.splitlines()[: len(expected)]
    assert [line[: len(start)] for line, start in zip(printed, expected, strict=True)] == expected
    figures = summary_of(proc.stderr)["rollfilter"]
    assert (figures["succeeded"], figures["would_send"]) == (0, len(sent))  # nothing was sent
    assert demo_server.stats()["requests"] == 0


def test_a_dry_run_stops_at_the_failure_limit(demo_server: DemoServer):
    rows = ["{bad", "{bad", *map(json.dumps, simple_rows(3))]
    proc = run(["-u", demo_server.url, "--max-failures", "2", "--dry-run"], input="\n".join(rows) + "\n")
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == b""  # the rows after the second bad line are not taken
    figures = summary_of(proc.stderr)["rollfilter"]
    assert figures["stopped"] == "stopped after 2 failed rows (the limit: 2)"
    assert figures["rows_read"] == 2


def test_a_dry_run_writes_no_file_even_with_resume(tmp_path, demo_server: DemoServer):
    out, errors = tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    out.write_text('{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1}\n{"_ng_task_in')  # a torn tail
    args = ["-u", demo_server.url, "-o", str(out), "--errors", str(errors), "--resume", "--dry-run"]
    proc = run(args, input=rows_jsonl(simple_rows(3)))
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(line)["id"] for line in proc.stdout.splitlines()] == [1, 2]  # what resume would send
    assert out.read_text().endswith('{"_ng_task_in')  # untouched: not even the torn tail is cut
    assert not errors.exists()
    assert demo_server.stats()["requests"] == 0


def test_nemo_gym_s_spelling_of_a_param_is_sent_as_the_key_it_names(demo_server: DemoServer):
    for spelling in ("responses_create_params.temperature", "+responses_create_params.temperature"):
        proc = run(["-u", demo_server.url, "--dry-run", "-p", f"{spelling}=0.7"], input=rows_jsonl(simple_rows(1)))
        assert proc.returncode == 0, proc.stderr
        [body] = map(json.loads, proc.stdout.splitlines())
        assert body["responses_create_params"] == {"input": "", "temperature": 0.7}  # nothing nested
        assert set(body) == {"id", "responses_create_params", "_ng_task_index", "_ng_rollout_index"}
