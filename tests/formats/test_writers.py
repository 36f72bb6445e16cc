"""writers.py: a writer stops at its first failed write."""

from __future__ import annotations

import os
import resource
import signal
from collections.abc import Callable, Iterator

import pytest
import trio
import trio.testing

from rollfilter.formats.writers import BatchWriter, OutputClosed, OutputFailed
from tests.conftest import (
    TOO_LARGE,
)


@pytest.fixture
def file_size_limit() -> Iterator[Callable[[int], None]]:
    """Set this process's file size limit for one test; the old limit comes back after it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN  # Python's default: EFBIG, not a kill
    try:
        yield lambda limit: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


async def test_a_writer_writes_nothing_after_a_failed_write(tmp_path, file_size_limit):
    # A later write that succeeded (the space freed meanwhile) would leave the torn line of
    # the failed one in the middle of the file, where --resume cannot cut it off.
    path = tmp_path / "out.jsonl"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    failures: list[OutputClosed | OutputFailed] = []
    released: list[int] = []
    lines = [b'{"n":0}\n', b'{"n":1,"text":"' + b"x" * 100 + b'"}\n', b'{"n":2}\n']
    writer = BatchWriter(fd, name=f"-o {path}", on_failure=failures.append)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(writer.serve)
            file_size_limit(len(lines[0]) + 10)
            for n, line in enumerate(lines):
                if n == 2:
                    file_size_limit(resource.RLIM_INFINITY)  # the space is back
                writer.write(line, lambda n=n: released.append(n))
                await trio.testing.wait_all_tasks_blocked()
            writer.close()
            await writer.drained.wait()
    finally:
        os.close(fd)
    assert path.read_bytes() == lines[0] + lines[1][:10]
    assert [str(f) for f in failures] == [f"cannot write -o {path}: {TOO_LARGE}"]
    assert released == [0, 1, 2]  # every line's slot is given back, written or not
