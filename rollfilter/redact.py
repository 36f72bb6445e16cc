"""URLs and server text made safe to print: on a terminal, in a log, in an errors record.

Every message that quotes a server, a file or a URL goes through here: `printable` escapes
what could drive a terminal, `shown` takes the secrets out of a URL, and `origin` names a server
by its origin alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx


def printable(text: str) -> str:
    """`text` with control and other unprintable characters escaped, so text from a server
    cannot drive the terminal it is printed on."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def shown(url: httpx.URL | str) -> str:
    """A URL as rollfilter prints it: without user, password, query or fragment, which may hold
    secrets. A text that no URL parser takes is cut the same way, as text."""
    import httpx  # here: every message escapes its text with `printable`, before any URL is parsed

    if isinstance(url, str):
        text = url
        try:
            url = httpx.URL(text)
        except httpx.InvalidURL:
            return printable(_without_secrets(text))
    return printable(str(url.copy_with(username=None, password=None, query=None, fragment=None)))


def shown_as_typed(text: str) -> str:
    """A URL's text as it was typed, cut as `shown` cuts a URL (credentials, query and fragment),
    without the rest of `shown`'s reading of it: no scheme added, nothing escaped or normalized."""
    return printable(_without_secrets(text))


def _without_secrets(text: str) -> str:
    """A URL's text without what precedes an '@' in its authority, and what follows a '?' or '#'."""
    text = text.partition("#")[0].partition("?")[0]
    scheme, sep, rest = text.partition("://")
    if not sep:
        return text.rpartition("@")[2]
    authority, slash, path = rest.partition("/")
    return scheme + sep + authority.rpartition("@")[2] + slash + path


def secrets_in(text: str) -> tuple[str, ...]:
    """What of a URL's `text` may be a secret, as a message quoting the URL in part may hold it:
    the whole, its user information, query and fragment, and each user, password and query value
    alone, as typed and decoded; longest first, so that each is cut whole."""
    from urllib.parse import unquote

    before_fragment, _, fragment = text.partition("#")
    query = before_fragment.partition("?")[2]
    authority = before_fragment.partition("?")[0].partition("://")[2].partition("/")[0]
    user_information = authority.rpartition("@")[0]
    values = [pair.partition("=")[2] for pair in query.split("&")]
    parts = {text, user_information, *user_information.split(":", 1), query, *values, fragment}
    parts |= {unquote(part) for part in parts}
    parts.discard(shown_as_typed(text))
    return tuple(sorted(filter(None, parts), key=len, reverse=True))


def origin(url: httpx.URL | str) -> str:
    """A URL's origin for messages (scheme://host, and the port unless it is the scheme's
    default): never the path, query or credentials of a URL."""
    import httpx

    from rollfilter.http.origin import origin_of

    try:
        return printable(str(origin_of(httpx.URL(url))))
    except (httpx.InvalidURL, httpx.UnsupportedProtocol):
        return "(an invalid URL)"
