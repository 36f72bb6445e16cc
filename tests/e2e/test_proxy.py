"""--proxy and ROLLFILTER_PROXY: every request of a run through the proxy, and no proxy from other variables."""

from __future__ import annotations

import urllib.parse
import urllib.request

from tests.conftest import (
    DemoServer,
    HeadServer,
    QuietHandler,
    ThreadedHTTPServer,
    clean_env,
    closed_port_urls,
    result_lines,
    rows_jsonl,
    run,
    serving,
    simple_rows,
    summary_of,
)

PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


class RecordingProxy(ThreadedHTTPServer):
    """A plain-HTTP forward proxy on 127.0.0.1 that records every request it is asked to carry."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        self.notes: list[str | None] = []  # each request's X-Note, as its bytes read in Latin-1
        proxy = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"

            def forward(self) -> None:
                proxy.requests.append(f"{self.command} {self.path}")
                proxy.notes.append(self.headers.get("X-Note"))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                request = urllib.request.Request(self.path, data=body, method=self.command)
                request.add_header("Content-Type", "application/json")
                opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
                with opener.open(request, timeout=30) as response:
                    self.send_json(response.status, response.read())

            do_GET = do_POST = forward

            def do_CONNECT(self) -> None:
                proxy.requests.append(f"CONNECT {self.path}")
                self.send_json(405, b"{}")

        super().__init__(Handler)


def test_rollfilter_proxy_sends_through_the_proxy(demo_server: DemoServer):
    with serving(RecordingProxy()) as proxy:
        proc = run(["-u", demo_server.url], input=rows_jsonl(simple_rows(3)), env=clean_env(ROLLFILTER_PROXY=proxy.url))
    assert proc.returncode == 0, proc.stderr
    assert len(proxy.requests) == 3
    assert demo_server.stats()["requests"] == 3


def test_proxy_environment_variables_are_not_read(demo_server: DemoServer):
    rows = rows_jsonl([{**row, "agent_ref": {"name": "simple_agent"}} for row in simple_rows(3)])
    with serving(RecordingProxy()) as proxy, serving(HeadServer(port=demo_server.port)) as head:
        env = clean_env(**dict.fromkeys(PROXY_VARIABLES, proxy.url))
        by_url = run(["-u", demo_server.url], input=rows, env=env)
        by_name = run(["--head-server", head.url], input=rows, env=env)
    assert (by_url.returncode, by_name.returncode) == (0, 0), (by_url.stderr, by_name.stderr)
    assert proxy.requests == []
    assert demo_server.stats()["requests"] == 6


def test_every_call_of_a_run_goes_through_the_proxy(demo_server: DemoServer, tmp_path):
    """The head server, /run and /aggregate_metrics share one HTTP path, --proxy included."""
    rows = [{**row, "agent_ref": {"name": "simple_agent"}} for row in simple_rows(3)]
    with serving(RecordingProxy()) as proxy, serving(HeadServer(port=demo_server.port)) as head:
        args = ["--head-server", head.url, "--proxy", proxy.url, "--aggregate", str(tmp_path / "agg.json")]
        proc = run(args, input=rows_jsonl(rows))
    assert proc.returncode == 0, proc.stderr
    carried = sorted(f"{method} {urllib.parse.urlsplit(url).path}" for method, url in map(str.split, proxy.requests))
    assert carried == ["GET /global_config_dict_yaml", "POST /aggregate_metrics", *["POST /run"] * 3]


def test_a_socks5_proxy_is_usable(tmp_path):
    """socks5 is accepted, so its support is installed: a dead proxy fails a row, no traceback, and
    since no agent was ever reached through it, stops the run."""
    proxy, agent = closed_port_urls(2)
    # --connect-timeout: the stop comes once connections have failed for that long.
    args = ["--proxy", proxy.replace("http://", "socks5://"), "-u", agent, "--retries", "0", "-j", "1"]
    proc = run([*args, "--connect-timeout", "0.2"], input=rows_jsonl(simple_rows(2)))
    assert proc.returncode == 3
    assert b"Traceback" not in proc.stderr
    assert summary_of(proc.stderr)["rollfilter"]["failed_by_kind"] == {"connect": 1}


def test_proxy_option_sends_through_the_proxy(demo_server: DemoServer):
    with serving(RecordingProxy()) as proxy:
        proc = run(["-u", demo_server.url, "--proxy", proxy.url, "-j", "4"], input=rows_jsonl(simple_rows(12)))
    assert proc.returncode == 0, proc.stderr
    assert len(result_lines(proc.stdout)) == 12
    assert len(proxy.requests) == 12
    assert demo_server.stats()["requests"] == 12


def test_a_header_value_beyond_ascii_goes_through_the_proxy_as_utf8(demo_server: DemoServer):
    """As it is sent without a proxy, and as curl sends it: the value's UTF-8 bytes."""
    with serving(RecordingProxy()) as proxy:
        proc = run(
            ["-u", demo_server.url, "--proxy", proxy.url, "-H", "X-Note: café ☕"], input=rows_jsonl(simple_rows(2))
        )
    assert proc.returncode == 0, proc.stderr
    assert proxy.notes == ["café ☕".encode().decode("latin-1")] * 2
