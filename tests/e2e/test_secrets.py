"""Header values and URL credentials never appear in output, messages or the summary."""

from __future__ import annotations

import pytest

from tests.conftest import (
    CLOSED_PORT,
    CLOSED_PORT_URL,
    DemoServer,
    closed_port_url,
    rows_jsonl,
    run,
    simple_rows,
    with_closed_port,
)


def test_header_values_never_appear_in_output(tmp_path, start_demo):
    secret = "s3cr3t-t0ken-value"
    server = start_demo("--fail-rate", "1.0")
    errors = tmp_path / "errors.jsonl"
    dead = closed_port_url()
    for args in (
        ["-u", server.url, "--retries", "0"],
        ["-u", server.url, "--retries", "0", "--errors", str(errors)],
        ["-u", dead, "--retries", "0", "--connect-timeout", "0.2"],  # stopped once refused for that long
        ["-u", dead, "--retries", "0", "--connect-timeout", "0.2", "--errors", str(errors), "--append"],
        ["-u", server.url, "-H", "Authorization"],  # malformed: value-less
    ):
        proc = run(["-H", f"Authorization: Bearer {secret}", *args], input=rows_jsonl(simple_rows(2)))
        assert proc.returncode in (1, 2, 3)  # 3: the dead agent stops the run
        assert secret not in (proc.stdout + proc.stderr).decode()
    assert errors.read_text().count("\n") >= 3  # the dead agent's second row may not have been sent
    assert secret not in errors.read_text()


def test_credentials_in_an_agent_url_are_never_printed(demo_server: DemoServer):
    url = demo_server.url.replace("http://", "http://user:pa55word@") + "?key=k3y-value"
    rows = rows_jsonl(simple_rows(2))
    # Two replicas of one server (a URL given twice is refused), each shown in the summary.
    for args in (["-v"], ["--dry-run"], ["-e", f"a={url},{url}&replica=2", "-a", "a"]):
        proc = run(["-u", url, *args], input=rows)
        assert proc.returncode == 0, proc.stderr
        printed = (proc.stdout + proc.stderr).decode()
        assert demo_server.base.removeprefix("http://") in printed  # the URL is shown...
        assert "pa55word" not in printed  # ...but not its secrets
        assert "k3y-value" not in printed


@pytest.mark.parametrize(
    "args",
    [
        ["-u", "http://user:S3CRET@127.0.0.1:99999/run?token=S3CRET"],  # a bad port
        ["-u", "ftp://user:S3CRET@127.0.0.1/run"],  # not http(s)
        ["-e", "a=http://user:S3CRET@127.0.0.1:abc/run"],
        ["--head-server", "http://user:S3CRET@127.0.0.1:99999", "-a", "a"],
        ["--proxy", f"ftp://user:S3CRET@127.0.0.1:{CLOSED_PORT}", "-u", CLOSED_PORT_URL],
    ],
)
def test_unusable_urls_are_one_line_without_their_secrets(args):
    proc = run(with_closed_port(args), input=rows_jsonl(simple_rows(1)))
    assert proc.returncode == 2
    assert proc.stderr.decode().count("\n") == 1
    assert b"Traceback" not in proc.stderr
    assert b"S3CRET" not in proc.stderr
