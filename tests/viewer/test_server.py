import dataclasses
import html
import http.client
import json
import os
import re
import socket
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import pytest

from rollfilter.viewer.query import Query
from rollfilter.viewer.server import Viewer, _Handler
from tests.viewer.conftest import catalog_of, result, serving, write_lines


def get(viewer: Viewer, target: str, *, host: str | None = None, method: str = "GET", **headers: str):
    connection = http.client.HTTPConnection("127.0.0.1", viewer.port, timeout=10)
    try:
        given = {"Host": host if host is not None else f"127.0.0.1:{viewer.port}", **headers}
        connection.request(method, target, headers=given)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read().decode()
    finally:
        connection.close()


def rollouts_listed(page: str) -> list[str]:
    return re.findall(r'href="/rollout/(\d+/\d+)"', page)


def test_the_index_shows_the_figures_and_the_rollouts(viewer: Viewer):
    status, headers, page = get(viewer, "/")
    assert status == 200
    assert "script-src" not in headers["Content-Security-Policy"]  # default-src 'none': no script at all
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "mean@2" in page
    assert "pass@2" in page
    assert "<svg" in page
    assert rollouts_listed(page) == ["0/0", "0/1", "1/0", "1/1", "2/0", "2/1"]


@pytest.mark.parametrize(
    ("query", "listed"),
    [
        ("task=1", ["1/0", "1/1"]),
        ("min_reward=0.5&max_reward=0.9", ["2/1"]),
        ("failed=1", ["2/0"]),
        ("unhealthy=1", ["1/0"]),
        ("q=PARIS", ["0/0"]),
        ("q=onerror", ["0/1"]),
        ("sort=-reward&max_reward=0.7", ["2/1", "0/1"]),
        ("sort=-reward", ["0/0", "1/0", "1/1", "2/1", "0/1", "2/0"]),  # no reward last, ties in file order
        ("sort=reward", ["0/1", "2/1", "0/0", "1/0", "1/1", "2/0"]),
    ],
)
def test_filters_in_the_url_keep_their_rollouts(viewer: Viewer, query: str, listed: list[str]):
    status, _, page = get(viewer, f"/?{query}")
    assert status == 200
    assert rollouts_listed(page) == listed


def test_a_filter_that_cannot_be_read_is_a_bad_request(viewer: Viewer):
    status, _, page = get(viewer, "/?min_reward=high")
    assert status == 400
    assert "min_reward is a number, not &#x27;high&#x27;" in page


def test_markup_in_model_output_is_shown_as_text(viewer: Viewer):
    status, _, page = get(viewer, "/rollout/0/1")
    assert status == 200
    assert "<script>" not in page
    assert "<img" not in page
    assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;&lt;img src=x onerror=" in page


def test_a_transcript_shows_the_tool_call_and_the_verdicts(viewer: Viewer):
    _, _, page = get(viewer, "/rollout/0/0?beside=1")
    assert "get_weather" in page
    assert "&quot;city&quot;: &quot;Paris&quot;" in page
    assert "sunny, 21 degrees" in page
    assert "I should look it up" in page
    assert "output_tokens" in page
    assert page.count('class="transcript"') == 2  # rollout 1 beside it
    _, _, unhealthy = get(viewer, "/rollout/1/0")
    assert "_rf_health" in unhealthy
    assert "empty_output" in unhealthy


@pytest.mark.parametrize("host", ["evil.example:80", "127.0.0.1", "", "127.0.0.1:1"])
def test_a_request_for_another_host_is_refused(viewer: Viewer, host: str):
    status, _, _ = get(viewer, "/", host=host)
    assert status == 403


def test_the_names_of_loopback_are_answered(viewer: Viewer):
    assert get(viewer, "/", host=f"localhost:{viewer.port}")[0] == 200


def test_it_only_reads(viewer: Viewer, results_file: Path):
    before = results_file.read_bytes()
    for method in ("POST", "PUT", "DELETE"):
        assert get(viewer, "/", method=method)[0] == 405
    assert get(viewer, "/../../etc/passwd")[0] == 404
    assert get(viewer, "/raw/0")[2] == before.decode().splitlines()[0]
    assert results_file.read_bytes() == before


def test_beyond_loopback_every_request_gives_the_token(results_file: Path):
    for viewer in serving(catalog_of(results_file), host="0.0.0.0"):
        assert viewer.token is not None
        assert viewer.url.endswith(f"/?token={viewer.token}")
        assert get(viewer, "/", host="anything:1")[0] == 403
        assert get(viewer, "/?token=wrong")[0] == 403
        status, headers, _ = get(viewer, f"/?token={viewer.token}")
        assert status == 200
        cookie = headers["Set-Cookie"].split(";")[0]
        assert get(viewer, "/rollout/0/0", Cookie=cookie)[0] == 200


def test_the_comparison_pairs_the_tasks(tmp_path: Path, results_file: Path):
    baseline_file = tmp_path / "baseline.jsonl"
    write_lines(baseline_file, [result(0, 0, 0.0), result(0, 1, 0.0), result(1, 0, 1.0), result(1, 1, 1.0)])
    catalog = catalog_of(results_file, baseline=catalog_of(baseline_file))
    for viewer in serving(catalog):
        _, _, page = get(viewer, "/compare")
        assert "improved" in page
        assert 'href="/compare/0"' in page
        _, _, task = get(viewer, "/compare/0")
        assert "baseline" in task
        assert task.count('class="transcript"') == 4


def test_lines_that_are_not_results_are_said(tmp_path: Path):
    path = tmp_path / "mixed.jsonl"
    path.write_text('not json\n{"reward": 1.0}\n')
    for viewer in serving(catalog_of(path)):
        _, _, page = get(viewer, "/")
        assert "1 line is not a result, counted as failed (bad_input); the first: " in page


def test_a_file_gone_is_an_error_page(viewer: Viewer, results_file: Path):
    results_file.unlink()
    status, _, page = get(viewer, "/")
    assert status == 500
    assert "cannot read the files: No such file or directory" in page


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("café au lait", ["0/0"]),  # written as \u00e9 by json.dumps
        ("CAFÉ", ["0/0"]),
        ('said "hi"', ["0/1"]),  # written with \\" escapes
        ("two\nlines", ["0/1"]),
        ("nowhere", []),
    ],
)
def test_a_search_reads_what_the_escapes_stand_for(tmp_path: Path, text: str, found: list[str]):
    path = tmp_path / "escaped.jsonl"
    write_lines(path, [result(0, 0, 1.0, "a café au lait"), result(0, 1, 1.0, 'he said "hi"\\ntwo\nlines')])
    for viewer in serving(catalog_of(path)):
        _, _, page = get(viewer, "/?" + urlencode({"q": text}))
        assert rollouts_listed(page) == found


@pytest.mark.parametrize("beside", ["%C2%B2", "--1", "1" * 5000])  # ² passes str.isdigit, not int()
def test_a_beside_that_is_no_rollout_shows_the_rollout_alone(viewer: Viewer, beside: str):
    status, _, page = get(viewer, f"/rollout/0/0?beside={beside}")
    assert status == 200
    assert page.count('class="transcript"') == 1


@pytest.mark.parametrize("path", ["/rollout/" + "9" * 5000 + "/0", "/raw/" + "9" * 5000, "/rollout/0/1" + "0" * 30])
def test_a_number_too_long_for_the_index_is_no_page(viewer: Viewer, path: str):
    assert get(viewer, path)[0] == 404


@pytest.mark.parametrize(("target", "cookie"), [("/?token=%C3%A9", ""), ("/", "rollfilter_token_8000=\xe9")])
def test_a_token_past_ascii_is_refused(results_file: Path, target: str, cookie: str):
    viewer = Viewer(catalog_of(results_file), host="192.0.2.1", port=8000, token="abc")
    assert viewer.respond("GET", target, {"Cookie": cookie}).status == 403


@pytest.mark.parametrize(
    ("request_line", "status"),
    [
        (b"FOO / HTTP/1.0", 501),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.0", 414),
        (b"GET / HTTP/1.0\r\nX: " + b"a" * 70000, 431),
    ],
)
def test_http_servers_own_errors_carry_the_policy(viewer: Viewer, request_line: bytes, status: int):
    with socket.create_connection(("127.0.0.1", viewer.port), timeout=10) as connection:
        connection.sendall(request_line + f"\r\nHost: 127.0.0.1:{viewer.port}\r\n\r\n".encode())
        response = http.client.HTTPResponse(connection)
        response.begin()
        response.close()
    assert response.status == status
    assert response.headers["Content-Security-Policy"].startswith("default-src 'none'")
    assert response.headers["X-Content-Type-Options"] == "nosniff"


def test_a_page_carries_the_policy_once(viewer: Viewer):
    connection = http.client.HTTPConnection("127.0.0.1", viewer.port, timeout=10)
    connection.request("GET", "/", headers={"Host": f"127.0.0.1:{viewer.port}"})
    assert len(connection.getresponse().headers.get_all("Content-Security-Policy")) == 1
    connection.close()


def test_two_viewers_on_one_host_keep_their_own_cookie(results_file: Path):
    catalog = catalog_of(results_file)
    first, second = (Viewer(catalog, host="192.0.2.1", port=port, token=f"t{port}") for port in (8000, 8001))
    cookies = [
        viewer.respond("GET", f"/?token={viewer.token}", {}).headers[0][1].split(";")[0] for viewer in (first, second)
    ]
    assert cookies[0] != cookies[1]
    both = "; ".join(cookies)  # the browser sends both to either port
    assert first.respond("GET", "/", {"Cookie": both}).status == 200
    assert second.respond("GET", "/", {"Cookie": both}).status == 200


def test_a_file_name_that_is_not_utf8_is_served_escaped(results_file: Path, tmp_path: Path):
    named = tmp_path / os.fsdecode(b"run-\xff.jsonl")
    named.write_bytes(results_file.read_bytes() + b"not json\n")  # the problem line names the file too
    for viewer in serving(catalog_of(named)):
        status, _, page = get(viewer, "/")
        assert status == 200
        assert page.count("run-\\udcff.jsonl") == 2


def test_a_client_that_sends_nothing_is_let_go(results_file: Path, monkeypatch: pytest.MonkeyPatch):
    assert _Handler.timeout is not None  # without one, an idle connection holds its thread for good
    monkeypatch.setattr(_Handler, "timeout", 0.1)  # what it does, seen quickly
    for viewer in serving(catalog_of(results_file)):
        with socket.create_connection(("127.0.0.1", viewer.port), timeout=10) as idle:
            idle.sendall(b"GET / HTTP/1.1\r\n")  # and no more
            assert idle.recv(100) == b""  # closed by the viewer, not by the 10 s bound
        assert get(viewer, "/")[0] == 200


def test_the_unhealthy_count_is_a_figure_of_the_index(tmp_path: Path):
    path = tmp_path / "empty.jsonl"
    empty = result(0, 1, 0.0)
    empty["response"]["output"] = []  # judged unhealthy (empty_output) as the summary reads it back
    write_lines(path, [result(0, 0, 1.0), empty])
    catalog = catalog_of(path)
    assert catalog.summary["rollfilter"]["health"]["unhealthy"] == 1
    for viewer in serving(catalog):
        assert '<div class="card"><b>1</b>unhealthy</div>' in get(viewer, "/")[2]


@pytest.mark.parametrize("given", ["task=0", "max_reward=0", "min_reward=0.1234567"])
def test_the_next_page_keeps_the_filters(tmp_path: Path, given: str):
    path = tmp_path / "many.jsonl"
    write_lines(path, [result(0, rollout, rollout % 2 * 0.2) for rollout in range(120)])
    for viewer in serving(catalog_of(path)):
        _, _, first = get(viewer, f"/?{given}&sort=-tokens")
        following = re.search(r'rel="next" href="([^"]*)"', first)
        assert following is not None
        shown = Query.of(parse_qs(urlsplit(html.unescape(following.group(1))).query))
        assert shown == dataclasses.replace(Query.of(parse_qs(f"{given}&sort=-tokens")), page=1)


def test_a_pair_with_two_lines_links_each(tmp_path: Path):
    results_path, errors_path = tmp_path / "out.jsonl", tmp_path / "failed.jsonl"
    write_lines(results_path, [result(0, 0, 1.0), result(0, 1, 1.0)])
    write_lines(errors_path, [{"_ng_task_index": 0, "_ng_rollout_index": 1, "error": {"kind": "timeout"}}])
    for viewer in serving(catalog_of(results_path, errors_path)):
        _, _, page = get(viewer, "/")
        assert re.findall(r'href="(/(?:rollout|line)/[\d/]+)"', page) == ["/rollout/0/0", "/rollout/0/1", "/line/2"]
        assert "timeout" in get(viewer, "/line/2")[2]
        _, _, first = get(viewer, "/rollout/0/0")
        assert 'href="/rollout/0/1"' in first
        assert 'href="/line/2"' in first


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "127.0.0.1:80"])
def test_on_port_80_the_host_may_leave_out_the_port(results_file: Path, host: str):
    viewer = Viewer(catalog_of(results_file), host="127.0.0.1", port=80, token=None)
    assert viewer.respond("GET", "/", {"Host": host}).status == 200
    assert viewer.respond("GET", "/", {"Host": "evil.example"}).status == 403


@pytest.mark.parametrize("text", ["Straße", "STRASSE", "straße"])
def test_a_search_for_letters_that_fold_past_ascii_finds_them_as_written(tmp_path: Path, text: str):
    path = tmp_path / "utf8.jsonl"
    record = json.dumps(result(0, 0, 1.0, "Hauptstraße 5"), ensure_ascii=False)  # as rollfilter writes it
    path.write_text(record + "\n" + json.dumps(result(0, 1, 1.0)) + "\n", encoding="utf-8")
    for viewer in serving(catalog_of(path)):
        _, _, page = get(viewer, "/?" + urlencode({"q": text}))
        assert rollouts_listed(page) == (["0/0"] if text != "STRASSE" else [])  # ASCII q: bytes, as grep -i


def test_a_page_that_fails_says_so(viewer: Viewer, monkeypatch: pytest.MonkeyPatch):
    def failing(*_: object, **__: object) -> str:
        raise TypeError("<b>an odd line</b>")

    monkeypatch.setattr("rollfilter.viewer.server.rollout_page", failing)
    status, headers, page = get(viewer, "/rollout/0/0")
    assert status == 500
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "cannot show this page: TypeError: &lt;b&gt;an odd line&lt;/b&gt;" in page
    assert get(viewer, "/")[0] == 200
