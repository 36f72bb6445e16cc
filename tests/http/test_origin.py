"""http/origin.py: which URLs share one pool of connections."""

from __future__ import annotations

import httpx
import pytest

from rollfilter.http import origin_of


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("http://127.0.0.1/run", "http://127.0.0.1:80/other"),
        ("https://127.0.0.1/run", "https://127.0.0.1:443/run"),
        ("http://LOCALHOST:8000/run", "http://localhost:8000/v2"),
        ("http://us3r:pa55@127.0.0.1:8000/run", "http://127.0.0.1:8000/run?key=s3cret"),
    ],
)
def test_urls_written_differently_have_one_origin(one: str, other: str):
    assert origin_of(httpx.URL(one)) == origin_of(httpx.URL(other))


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("http://127.0.0.1:443/run", "https://127.0.0.1/run"),  # the same port number, another scheme
        ("http://127.0.0.1:8000/run", "http://127.0.0.1:8001/run"),
        ("http://127.0.0.1:8000/run", "http://127.0.0.2:8000/run"),
    ],
)
def test_another_scheme_host_or_port_is_another_origin(one: str, other: str):
    assert origin_of(httpx.URL(one)) != origin_of(httpx.URL(other))


def test_an_origin_always_has_its_port_and_only_http_and_https_have_one():
    assert origin_of(httpx.URL("https://127.0.0.1/run")) == ("https", "127.0.0.1", 443)
    with pytest.raises(httpx.UnsupportedProtocol):
        origin_of(httpx.URL("ftp://127.0.0.1/file"))
