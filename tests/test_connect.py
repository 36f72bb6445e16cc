"""connect.py: the headers a Config puts on every request."""

from __future__ import annotations

from rollfilter.config import Config
from rollfilter.connect import request_headers
from tests.conftest import URL


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
