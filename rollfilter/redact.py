"""URLs and server text made safe to print: on a terminal, in a log, in an errors record.

Every message that quotes a server, a file or a URL goes through here: `printable` escapes
what could drive a terminal, `shown` takes the secrets out of a URL (`shown_split` out of one
that httpx may not take), and `origin` names a server by its origin alone.
"""

from __future__ import annotations

import urllib.parse

import httpx

from rollfilter.http import origin_of


def printable(text: str) -> str:
    """`text` with control and other unprintable characters escaped, so text from a server
    cannot drive the terminal it is printed on."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def shown(url: httpx.URL) -> str:
    """A URL as rollfilter prints it: without user, password or query, which may hold secrets."""
    return printable(str(url.copy_with(username=None, password=None, query=None, fragment=None)))


def shown_split(parts: urllib.parse.SplitResult) -> str:
    """A URL that httpx may not take, split by urllib, as a message may show it: without user,
    password or query. Not escaped: the caller quotes it with repr()."""
    return urllib.parse.urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query=""))


def origin(url: httpx.URL | str) -> str:
    """A URL's origin for messages (scheme://host, and the port unless it is the scheme's
    default): never the path, query or credentials of a URL."""
    try:
        return printable(str(origin_of(httpx.URL(url))))
    except (httpx.InvalidURL, httpx.UnsupportedProtocol):
        return "(an invalid URL)"
