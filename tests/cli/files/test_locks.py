"""cli/files/locks.py: an output locked by one run at a time, and what is said where locks do not hold."""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

import pytest

from rollfilter.cli.files.locks import LockTaken, holder_text, local_only, lock_holders, open_locked

FLAGS = os.O_WRONLY | os.O_APPEND


def device_and_inode(path: Path) -> str:
    info = path.stat()
    return f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"


def test_a_file_locked_elsewhere_names_its_holder(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    first = open_locked(str(path), FLAGS, shared=False)
    try:
        assert first.created
        with pytest.raises(LockTaken) as taken:
            open_locked(str(path), FLAGS, shared=False)
        assert taken.value.holders == [os.getpid()]
        assert holder_text(taken.value.holders).startswith(f"process {os.getpid()} (")
        with pytest.raises(LockTaken):
            open_locked(str(path), FLAGS, shared=True)  # an --append run waits for an owner too
    finally:
        os.close(first.fd)
    again = open_locked(str(path), FLAGS, shared=False)  # the lock went with its descriptor
    os.close(again.fd)
    assert not again.created


def test_shared_locks_share_and_keep_an_owner_out(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    shared = [open_locked(str(path), FLAGS, shared=True) for _ in range(2)]
    try:
        with pytest.raises(LockTaken):
            open_locked(str(path), FLAGS, shared=False)
    finally:
        for opened in shared:
            os.close(opened.fd)


def test_the_holders_are_read_from_the_kernels_table(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    path.touch()
    table = tmp_path / "locks"
    key = device_and_inode(path)
    table.write_text(
        f"1: POSIX  ADVISORY  WRITE 11 {key} 0 EOF\n"  # a record lock, not a flock
        f"2: FLOCK  ADVISORY  WRITE 4242 {key} 0 EOF\n"
        f"2: -> FLOCK  ADVISORY  WRITE 5151 {key} 0 EOF\n"  # one waiting for it
        "3: FLOCK  ADVISORY  READ  6161 00:00:1 0 EOF\n"  # another file
    )
    fd = os.open(path, os.O_RDONLY)
    try:
        assert lock_holders(fd, str(table)) == [4242]
        assert lock_holders(fd, str(tmp_path / "missing")) == []
    finally:
        os.close(fd)
    assert holder_text([]) == "another process (one of another host, or one this system does not name)"


def test_a_file_system_without_locks_is_said_not_refused(tmp_path: Path):
    def no_locks(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    opened = open_locked(str(tmp_path / "out.jsonl"), FLAGS, shared=False, lock=no_locks)
    os.close(opened.fd)
    assert opened.caveat is not None
    assert opened.caveat.startswith("its file system keeps no locks (NFS without its lock daemon?)")

    def broken(fd: int, operation: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with pytest.raises(OSError, match="Input/output error"):
        open_locked(str(tmp_path / "out.jsonl"), FLAGS, shared=False, lock=broken)


def test_locks_that_hold_on_one_host_only_are_told_from_the_mount_options(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    path.touch()
    info = path.stat()
    device = f"{os.major(info.st_dev)}:{os.minor(info.st_dev)}"
    mountinfo = tmp_path / "mountinfo"
    fd = os.open(path, os.O_RDONLY)
    try:
        for options, said in (
            ("rw,vers=4.2,local_lock=none", None),
            ("rw,vers=3,nolock,local_lock=all", "nfs locks it on this machine only (local_lock=all)"),
        ):
            mountinfo.write_text(
                "22 1 0:5 / /proc rw - proc proc rw\n"
                f"36 35 {device} / /data rw,relatime shared:1 - nfs server:/export {options}\n"
            )
            found = local_only(fd, str(mountinfo))
            assert (found or "").startswith(said or "")
            assert (found is None) == (said is None)
    finally:
        os.close(fd)


def test_a_path_replaced_while_it_was_locked_is_locked_again(tmp_path: Path):
    path = tmp_path / "out.jsonl"
    replaced = []

    def lock_then_replace(fd: int, operation: int) -> None:
        fcntl.flock(fd, operation)
        if not replaced:  # another run removed the file it had made, and a third made it again
            os.unlink(path)
            path.touch()
            replaced.append(True)

    opened = open_locked(str(path), FLAGS, shared=False, lock=lock_then_replace)
    try:
        assert os.path.samestat(os.fstat(opened.fd), path.stat())
    finally:
        os.close(opened.fd)


def test_a_dangling_symlink_makes_the_file_it_names(tmp_path: Path):
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "target.jsonl")
    opened = open_locked(str(link), FLAGS, shared=False)
    os.close(opened.fd)
    assert opened.created
    assert (tmp_path / "target.jsonl").is_file()
