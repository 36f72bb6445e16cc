"""connect.py: the headers a Config puts on every request, and a run's TLS context: its CA file read
once and refused before anything is written."""

from __future__ import annotations

import json
import os
import ssl
from pathlib import Path
from typing import Any

import certifi
import pytest

from rollfilter import Config, Tls, rollouts
from rollfilter.config import ConfigError
from rollfilter.run.connect import request_headers, tls_context_for
from tests.conftest import URL, DemoServer, rows_jsonl, run, simple_rows

CA_BUNDLE = certifi.where()  # a PEM file of real CA certificates


@pytest.fixture
def bad_ca_files(tmp_path: Path) -> list[tuple[Path, str]]:
    """CA files that cannot serve, each with what the refusal says of it."""
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello\n")
    return [
        (tmp_path / "missing.pem", "cannot be read: No such file or directory"),
        (not_pem, "holds no PEM certificates"),
    ]


@pytest.fixture
def ca_file_loads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The CA files loaded into a TLS context from here on, one entry a load."""
    loads: list[str] = []
    create = ssl.create_default_context

    def counted(*args: Any, cafile: str | None = None, **kwargs: Any) -> ssl.SSLContext:
        if cafile is not None:
            loads.append(cafile)
        return create(*args, cafile=cafile, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    return loads


def test_the_context_trusts_the_ca_file_or_checks_nothing_when_insecure(ca_file_loads: list[str]):
    assert tls_context_for(Config()) is None  # the system's trust store: the transport loads it when it needs it
    assert ca_file_loads == []
    trusting = tls_context_for(Config(tls=Tls(cacert=CA_BUNDLE)))
    assert trusting is not None
    assert trusting.verify_mode is ssl.CERT_REQUIRED
    assert trusting.check_hostname
    assert len(trusting.get_ca_certs()) == Path(CA_BUNDLE).read_text().count("BEGIN CERTIFICATE")
    insecure = tls_context_for(Config(tls=Tls(insecure=True)))
    assert insecure is not None
    assert (insecure.verify_mode, insecure.check_hostname) == (ssl.CERT_NONE, False)
    assert ca_file_loads == [CA_BUNDLE]


def test_a_ca_file_that_cannot_serve_is_refused_by_its_field(bad_ca_files: list[tuple[Path, str]]):
    for path, problem in bad_ca_files:
        for tls in (Tls(cacert=str(path)), Tls(cacert=str(path), insecure=True)):  # as curl: read even then
            with pytest.raises(ConfigError) as refused:
                tls_context_for(Config(tls=tls))
            assert refused.value.field == "tls.cacert"
            assert str(refused.value) == f"Config.tls.cacert: {path} {problem}"


def test_a_bad_cacert_is_refused_before_any_output_file_is_created(
    demo_server: DemoServer, bad_ca_files: list[tuple[Path, str]], tmp_path: Path
):
    outputs = tmp_path / "outputs"
    outputs.mkdir()
    os.utime(outputs, ns=(0, 0))  # creating or removing a file in it, even for a moment, sets its mtime
    for path, problem in bad_ca_files:
        args = ["-u", demo_server.url, "-o", str(outputs / "out.jsonl"), "--errors", str(outputs / "errors.jsonl")]
        proc = run(
            [*args, "--metrics", str(outputs / "metrics.json"), "--cacert", str(path)], input=rows_jsonl(simple_rows(2))
        )
        assert proc.returncode == 2
        assert proc.stderr.decode() == f"rollfilter: --cacert {path} {problem}\n"
        assert proc.stdout == b""
    assert list(outputs.iterdir()) == []
    assert os.stat(outputs).st_mtime_ns == 0
    assert demo_server.stats()["requests"] == 0


def test_a_bad_cacert_leaves_a_resumed_output_as_it_was(
    demo_server: DemoServer, bad_ca_files: list[tuple[Path, str]], tmp_path: Path
):
    output = tmp_path / "out.jsonl"
    before = b'{"_ng_task_index": 0, "_ng_rollout_index": 0, "reward": 1.0}\n{"_ng_task_in'  # a torn last line
    output.write_bytes(before)
    path, problem = bad_ca_files[0]
    proc = run(
        ["-u", demo_server.url, "-o", str(output), "--resume", "--cacert", str(path)], input=rows_jsonl(simple_rows(2))
    )
    assert proc.returncode == 2
    assert proc.stderr.decode() == f"rollfilter: --cacert {path} {problem}\n"
    assert output.read_bytes() == before  # resuming would have cut the torn line: it did not start
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not.pem", "out.jsonl"]


def test_a_command_line_run_reads_its_ca_file_once(demo_server: DemoServer, ca_file_loads: list[str], tmp_path: Path):
    aggregate = tmp_path / "aggregate.json"
    rows = rows_jsonl(simple_rows(3, agent_ref={"name": "demo"}))
    proc = run(["-e", f"demo={demo_server.url}", "--cacert", CA_BUNDLE, "--aggregate", str(aggregate)], input=rows)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.splitlines()) == 3
    assert [entry["agent_ref"]["name"] for entry in json.loads(aggregate.read_text())] == ["demo"]  # asked too
    assert ca_file_loads == [CA_BUNDLE]


def test_a_python_run_reads_its_ca_file_once(demo_server: DemoServer, ca_file_loads: list[str]):
    config = Config(endpoints={"demo": demo_server.url}, aggregate=True, tls=Tls(cacert=CA_BUNDLE))
    assert ca_file_loads == []  # building a Config reads no file
    with rollouts(simple_rows(3, agent_ref={"name": "demo"}), config) as run_:
        assert len(list(run_)) == 3
    assert [entry["agent_ref"]["name"] for entry in run_.aggregate or ()] == ["demo"]  # asked too
    assert ca_file_loads == [CA_BUNDLE]


def test_h_headers_replace_rollfilters_own_of_the_same_name():
    config = Config(url=URL, headers=(("user-agent", "mine/1"), ("Accept", "*/*"), ("X-Token", "t")))
    headers = request_headers(config)
    names = [name.lower() for name, _ in headers]
    assert len(names) == len(set(names))
    assert {name.lower(): value for name, value in headers} == {
        "content-type": "application/json",
        "accept": "*/*",
        "accept-encoding": "gzip",
        "user-agent": "mine/1",
        "x-token": "t",
    }
    own = dict(request_headers(Config(url=URL)))
    assert own["User-Agent"].startswith("rollfilter/")
    assert own["Accept-Encoding"] == "gzip"


def test_an_empty_h_header_removes_rollfilters_own_as_curl_does():
    headers = request_headers(Config(url=URL, headers=(("Accept", ""), ("Accept-Encoding", ""))))
    assert [name for name, _ in headers] == ["Content-Type", "User-Agent"]
