"""redact.py: URLs and server text made safe to print."""

from __future__ import annotations

import httpx
import pytest

from rollfilter.config import Config
from rollfilter.errors import UsageError
from rollfilter.redact import origin, printable, secrets_in, shown


def test_printable_escapes_only_what_is_not_printable():
    assert printable("plain text, ünïcode ok") == "plain text, ünïcode ok"
    assert printable("a\x1bb\x07c\u202ed\x00") == "a\\x1bb\\x07c\\u202ed\\x00"


def test_printable_keeps_what_a_terminal_shows_and_escapes_the_rest():
    assert printable("agent 'ünï' at 127.0.0.1") == "agent 'ünï' at 127.0.0.1"
    assert printable("\x1b]0;owned\x07\u202e") == "\\x1b]0;owned\\x07\\u202e"


def test_shown_leaves_out_credentials_query_and_fragment():
    url = httpx.URL("http://us3r:pa55@127.0.0.1:8000/run?key=s3cret#part")
    assert shown(url) == "http://127.0.0.1:8000/run"
    assert origin(url) == "http://127.0.0.1:8000"


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("http://us3r:pa55@127.0.0.1:8000/run?key=s3cret", "http://127.0.0.1:8000"),
        ("http://127.0.0.1/run", "http://127.0.0.1"),
        ("http://127.0.0.1:80/run", "http://127.0.0.1"),  # the default port, as URLs leave it out
        ("https://127.0.0.1:443/run", "https://127.0.0.1"),
        ("http://127.0.0.1:443/run", "http://127.0.0.1:443"),  # another scheme's default is no default
        ("https://127.0.0.1:80/run", "https://127.0.0.1:80"),
        ("http://[::1]:8000/run", "http://[::1]:8000"),
        ("HTTP://LOCALHOST:8000/", "http://localhost:8000"),
        ("http://[::1/", "(an invalid URL)"),
        ("ftp://127.0.0.1/file", "(an invalid URL)"),
    ],
)
def test_an_origin_is_shown_as_urls_write_it_and_never_more(url: str, expected: str):
    assert origin(url) == expected


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://us3r:pa55@127.0.0.1/run?key=s3cret", "Config.url: not an http(s) URL: 'ftp://127.0.0.1/run'"),
        ("http://us3r:pa55@127.0.0.1:99999/run?key=s3cret", "Config.url: bad port in URL 'http://127.0.0.1:99999/run'"),
        (
            "http://us3r:pa55@[::1/run?key=s3cret",
            "Config.url: not an http(s) URL: 'http://[::1/run' (Invalid port: ':1')",
        ),
    ],
)
def test_a_url_that_is_refused_is_quoted_without_its_secrets(url: str, message: str):
    with pytest.raises(UsageError) as refused:
        Config(url=url)
    assert str(refused.value) == message


def test_the_secrets_in_a_url_are_each_part_that_may_be_quoted_alone():
    found = secrets_in("http://me:p%40ss@host:5000/mlflow?token=t0k3n&x=1#frag")
    for part in ("me:p%40ss", "p%40ss", "p@ss", "me", "token=t0k3n&x=1", "t0k3n", "frag"):
        assert part in found, part
    assert list(found) == sorted(found, key=len, reverse=True)  # a part is cut before what it holds
    assert secrets_in("http://host:5000/mlflow") == ()
