"""The open-file limit: raised as far as it goes, and the connections that fit under it; and the
default bound on a reply's size."""

from __future__ import annotations

# Longer than any plausible agent reply: the default bound on a reply's body, as received and as
# decoded, whatever frames it (Content-Length, chunked, the connection's end, gzip).
DEFAULT_MAX_REPLY_BYTES = 256 * 1024 * 1024

# Open files kept for everything but agent connections (standard streams, outputs, trio's
# own descriptors, a head-server connection) when the connections are fitted to the open-file limit.
FILES_FOR_OTHER_USES = 64


def raise_open_file_limit() -> int:
    """Raise this process's soft limit on open files to its hard limit; the soft limit now."""
    try:
        import resource
    except ImportError:  # not a Unix
        return 1 << 20
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 1 << 20
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return soft if soft != resource.RLIM_INFINITY else 1 << 20
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    except (ValueError, OSError):
        return soft
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connections_that_fit(wanted: int, open_file_limit: int, *, files_per_connection: int = 1) -> int:
    """How many of `wanted` connections fit under the open-file limit, beside other uses."""
    room = (open_file_limit - FILES_FOR_OTHER_USES) // files_per_connection
    return max(1, min(wanted, room))
