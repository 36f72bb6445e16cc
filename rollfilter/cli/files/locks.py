"""One run owns an output at a time: an advisory lock on each file a run appends to.

A run takes `flock` on its own descriptor of `-o`, `--errors` and `--per-task`: exclusive for a
fresh or resumed run, shared with `--append` (runs that only add whole lines may share a file;
none may share it with a run that reads it back or starts it afresh). The kernel drops the lock
with the last descriptor of the process, so a run killed with `kill -9` leaves nothing stale.
`flock`, not `fcntl`'s record locks: those are dropped as soon as the process closes any
descriptor of the file, which resume does when it reads the file back.

A lock only counts while the path still names the file locked: a run refused on another
output removes a file it created, and a run that had just opened that file would otherwise
lock an unlinked one. So the lock is taken, then the path checked, and taken again if it moved.

Where locks cannot be had (NFS without its lock daemon answers ENOLCK) or hold on one machine
only (NFS or Lustre mounted with local locks), the run goes on and says so once.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import os
import stat
from collections.abc import Callable

# What flock answers where the file system keeps no locks: NFS without lockd, Lustre without -o flock.
NO_LOCKS = frozenset({errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL})
# Mount options under which a network file system keeps flock locks on the client alone.
LOCAL_ONLY = ("local_lock=all", "local_lock=flock", "localflock")
ATTEMPTS = 10  # a path replaced this many times while it was being locked is given up on


class LockTaken(Exception):
    """Another process holds the lock; `holders` are their process IDs, as /proc/locks tells them."""

    def __init__(self, holders: list[int]) -> None:
        super().__init__(holders)
        self.holders = holders


@dataclasses.dataclass(frozen=True, slots=True)
class Locked:
    """A file opened and locked: its descriptor, whether this run created it, and what to say
    about the lock (None: it holds as locks do)."""

    fd: int
    created: bool
    caveat: str | None = None


def open_locked(
    path: str,
    flags: int,
    *,
    shared: bool,
    locking: bool = True,
    create: bool = True,
    lock: Callable[[int, int], None] = fcntl.flock,
    mode: int = 0o666,
) -> Locked | None:
    """Open (creating, unless not `create`, with `mode` less the umask) `path` with `flags` and,
    with `locking`, lock it at once if it is a regular file; LockTaken when another process has it.
    None when `path` is not there and not to be created; OSError when it cannot be opened."""
    for _ in range(ATTEMPTS):
        if not create and not os.path.exists(path):
            return None
        opened = _open(path, flags, mode) if create else _open_existing(path, flags)
        if opened is None:  # removed since it was found: look again
            continue
        fd, created = opened
        try:
            if not (locking and stat.S_ISREG(os.fstat(fd).st_mode)):
                return Locked(fd, created)
            caveat = _lock(fd, shared, lock)
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            return Locked(fd, created, caveat)
        os.close(fd)  # locked a file that the path no longer names
    raise OSError(errno.EAGAIN, "the file was replaced while it was being locked")


def _open_existing(path: str, flags: int) -> tuple[int, bool] | None:
    try:
        return os.open(path, flags), False
    except FileNotFoundError:
        return None


def lock_new_file(fd: int) -> None:
    """Lock a file this process made and no other opened yet (none can have it): for as long
    as a duplicate of `fd` stays open."""
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _open(path: str, flags: int, mode: int) -> tuple[int, bool] | None:
    """A descriptor of `path`, and whether this call created the file; None if it vanished meanwhile."""
    try:
        return os.open(path, flags | os.O_CREAT | os.O_EXCL, mode), True
    except FileExistsError:
        pass
    try:
        return os.open(path, flags), False
    except FileNotFoundError:
        if not os.path.islink(path):
            return None
    return os.open(path, flags | os.O_CREAT, mode), True  # a dangling symlink: make the file it names


def _lock(fd: int, shared: bool, lock: Callable[[int, int], None]) -> str | None:
    try:
        lock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        raise LockTaken(lock_holders(fd)) from None
    except OSError as exc:
        if exc.errno in NO_LOCKS:
            return "its file system keeps no locks (NFS without its lock daemon?): other runs are not kept out"
        raise
    return local_only(fd)


def lock_holders(fd: int, locks_table: str = "/proc/locks") -> list[int]:
    """The processes holding a flock on the file `fd` is open on, from the kernel's lock table
    (empty where it cannot tell: no /proc, or a holder on another host of a network file system)."""
    info = os.fstat(fd)
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    holders = []
    try:
        with open(locks_table, encoding="ascii", errors="replace") as table:
            for line in table:
                # "3: FLOCK  ADVISORY  WRITE 4242 fe:00:1234 0 EOF"; a waiter's line has "->" after the number.
                fields = line.split()
                if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted and fields[4].isdigit():
                    holders.append(int(fields[4]))
    except OSError:
        return []
    return sorted(set(holders))


def local_only(fd: int, mountinfo: str = "/proc/self/mountinfo") -> str | None:
    """What to say when the file `fd` is open on sits on a network file system whose locks hold
    on this machine alone (from its mount options); None otherwise, or when it cannot tell."""
    info = os.fstat(fd)
    device = f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}"
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as table:
            for line in table:
                # "36 35 0:52 / /mnt rw,relatime - nfs4 server:/export rw,vers=4.2,local_lock=none"
                mount, _, rest = line.partition(" - ")
                fields = mount.split()
                if len(fields) < 3 or fields[2] != device:
                    continue
                kind, _, options = [*rest.split(), "", "", ""][:3]
                local = next((option for option in options.split(",") if option in LOCAL_ONLY), None)
                if local is not None:
                    return f"{kind} locks it on this machine only ({local}): runs on other hosts are not kept out"
                return None
    except OSError:
        return None
    return None


def holder_text(holders: list[int]) -> str:
    """The processes of `holders` as a message names them: `process 4242 (rollfilter)`."""
    if not holders:
        return "another process (one of another host, or one this system does not name)"
    named = ", ".join(f"{pid} ({_command(pid)})" if _command(pid) else str(pid) for pid in holders)
    return f"process{'es' if len(holders) > 1 else ''} {named}"


def _command(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as comm:
            return comm.read().strip()
    except OSError:
        return ""
