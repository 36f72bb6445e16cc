"""The standard descriptors a command was started without (`>&-`, `2>&-`, `<&-`).

Start-up (`cli/startup.py`, before anything else is imported) takes up each closed one with
/dev/null, opened the other way round: its number is held, so that no file or socket opened
later gets it (results or the summary would go there), and reading or writing it still fails
with EBADF, as on the closed descriptor. A path that names such a descriptor (/dev/stdout) must
be written through it too: opened again, it would be /dev/null, and all written there lost.
"""

from __future__ import annotations

import fcntl
import os

# Each standard descriptor, and how start-up opens /dev/null on it when it is closed.
CLOSED_STREAM_STAND_INS = ((0, os.O_WRONLY), (1, os.O_RDONLY), (2, os.O_RDONLY))
_SYMLINK_HOPS = 40  # as the kernel's own bound on a path's symlinks


def hold_closed_streams() -> None:
    """Put /dev/null on each closed standard descriptor, opened for the other direction."""
    for fd, flags in CLOSED_STREAM_STAND_INS:
        try:
            os.fstat(fd)
        except OSError:
            stand_in = os.open(os.devnull, flags)
            if stand_in != fd:
                os.dup2(stand_in, fd)
                os.close(stand_in)


def started_without(path: str) -> int | None:
    """The standard descriptor `path` names (/dev/stdout, /dev/fd/1, /proc/self/fd/1, or this
    process's own number) when the command was started without it; None for any other path."""
    name = path
    for _ in range(_SYMLINK_HOPS):
        fd = _standard_descriptor(os.path.normpath(name))
        if fd is not None:
            return fd if _is_stand_in(fd) else None
        try:
            name = os.path.join(os.path.dirname(name), os.readlink(name))
        except OSError:  # not a symlink: the path names no descriptor
            return None
    return None


def _standard_descriptor(name: str) -> int | None:
    folder, _, number = name.rpartition("/")
    if number not in ("0", "1", "2"):
        return None
    if folder in ("/dev/fd", "/proc/self/fd", f"/proc/{os.getpid()}/fd"):
        return int(number)
    return None


def _is_stand_in(fd: int) -> bool:
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
        info = os.fstat(fd)
    except OSError:
        return False
    return (fd, mode) in CLOSED_STREAM_STAND_INS and info.st_rdev == os.stat(os.devnull).st_rdev
