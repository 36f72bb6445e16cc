"""NeMo Gym's materialized inputs file: every planned body, written whole before the first /run.

NeMo Gym's collector writes this file before it sends anything, and its resume takes the file
as the whole job: a pair missing from it is never run, and nothing says so. So a run that
writes it plans its inputs twice. This first pass writes every body a run would send (the
rows that cannot be sent left out), then the run plans the same inputs again as it sends.
Memory stays flat: the first pass keeps only its numbering, dropped when it ends.

The file is built beside its target and renamed over it when the pass is done, so a run
killed during the pass leaves the file as it was (or absent): never a partial job list; the
temporary file a killed run leaves is removed by the next run that builds the file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable

import trio

from rollfilter.engine.plan import Planner
from rollfilter.engine.routing import Router
from rollfilter.formats.keytable import KeyTable
from rollfilter.formats.resume import pair_key
from rollfilter.formats.writers import OutputFailed, write_all
from rollfilter.outcomes import AttemptFailure

FLUSH_BYTES = 1 << 20  # bodies gathered before a write
CHECKPOINT_JOBS = 4096  # jobs planned between two scheduler checkpoints (a signal is seen at once)


@dataclasses.dataclass(frozen=True, slots=True)
class MaterializedPlan:
    """What the first pass found: the rollouts the inputs hold, and what could not be planned."""

    rollouts: int  # every (task, rollout) pair of the inputs, earlier runs' included
    written: int  # bodies added to the file
    agents_without_repeats: frozenset[str | None]


async def write_materialized(
    planner: Planner,
    router: Router,
    path: str,
    *,
    name: str,
    keep_existing: bool,
    already: KeyTable | None,
    on_staged: Callable[[int], None] | None = None,
) -> MaterializedPlan:
    """Plan every job of `planner` and write the body of each sendable one to `path`, replacing
    it at once when done (`name` is how messages name it). With `keep_existing`, the file's lines
    stay first and only pairs not in `already` are added (a resumed or appended run); the file is
    left alone when none is new.

    `on_staged` gets the descriptor of the file being built, the one renamed into place (the
    command line locks it, as it locks the file it replaces).

    Raises OutputFailed when the file cannot be written; `path` is then as it was. It is left
    as it was too when some rows have no repeat count (`agents_without_repeats`).
    """
    staged = _StagedFile(path, name, keep_existing=keep_existing, on_staged=on_staged)
    rollouts = written = 0
    try:
        pending: list[bytes] = []
        size = 0
        while (job := await planner.next_job()) is not None:
            rollouts += 1
            if rollouts % CHECKPOINT_JOBS == 0:
                await trio.lowlevel.checkpoint()
            if job.failure is not None or isinstance(router.route(job.agent_name), AttemptFailure):
                continue
            if already is not None and pair_key(job.task_index, job.rollout_index) in already:
                continue
            pending.append(job.body + b"\n")
            size += len(job.body) + 1
            written += 1
            if size >= FLUSH_BYTES:
                staged.write(b"".join(pending))
                pending, size = [], 0
        staged.write(b"".join(pending))
        if not planner.agents_without_repeats:  # else the run is refused: the file stays as it was
            staged.commit(changed=written > 0 or not keep_existing)
    finally:
        staged.discard()
    return MaterializedPlan(rollouts, written, frozenset(planner.agents_without_repeats))


class _StagedFile:
    """The materialized file being built: a temporary file beside the (regular) target, holding
    the target's lines first with `keep_existing`, renamed over it by `commit`."""

    def __init__(self, path: str, name: str, *, keep_existing: bool, on_staged: Callable[[int], None] | None) -> None:
        self.name = name
        self._target = os.path.realpath(path)
        directory, base = os.path.split(self._target)
        _remove_left_behind(directory, base)
        self._temporary: str | None = os.path.join(directory, f".{base}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            self._fd = os.open(self._temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except OSError as exc:
            raise OutputFailed(self.name, exc) from None
        if on_staged is not None:
            on_staged(self._fd)
        if keep_existing:
            try:
                _copy_existing(self._target, self._fd, self.name)
            except BaseException:
                self.discard()
                raise

    def write(self, data: bytes) -> None:
        write_all(self._fd, data, self.name)

    def commit(self, *, changed: bool) -> None:
        if self._temporary is not None and changed:
            try:
                os.replace(self._temporary, self._target)
            except OSError as exc:
                raise OutputFailed(self.name, exc) from None
            self._temporary = None

    def discard(self) -> None:
        """Close the file; a temporary file not renamed into place is removed."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._temporary is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._temporary)
            self._temporary = None


def claim(path: str) -> str:
    """Mark the materialized file at `path` as built by this process, from before its first pass
    (which may wait long for standard input) to its end: a temporary file named as the ones being
    built are, which `building` finds. The caller removes it, by the name returned. OSError."""
    directory, base = os.path.split(os.path.realpath(path))
    name = os.path.join(directory, f".{base}.{os.getpid()}.claim.tmp")
    os.close(os.open(name, os.O_WRONLY | os.O_CREAT, 0o600))
    return name


def building(path: str) -> list[int]:
    """The processes (this one left out) whose first pass is building the materialized file at
    `path`: its temporary files are named by their process."""
    directory, base = os.path.split(os.path.realpath(path))
    return sorted({pid for _, pid, alive in _staged(directory, base) if alive})


def _remove_left_behind(directory: str, base: str) -> None:
    """Remove the temporary files of `base` that a killed run left (their process is gone)."""
    for name, _, alive in _staged(directory, base):
        if not alive:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(directory, name))


def _staged(directory: str, base: str) -> list[tuple[str, int, bool]]:
    """The temporary files of `base` in `directory` that other processes made: each name, the
    process that made it, and whether that process is alive."""
    prefix = f".{base}."
    try:
        names = [name for name in os.listdir(directory) if name.startswith(prefix) and name.endswith(".tmp")]
    except OSError:
        return []
    found = []
    for name in names:
        pid = name[len(prefix) :].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            alive = True
        except ProcessLookupError:
            alive = False
        except PermissionError:  # another user's live process
            alive = True
        found.append((name, int(pid), alive))
    return found


def _copy_existing(path: str, fd: int, name: str) -> None:
    """The whole lines of the file at `path` (a torn last line is left out), written to `fd`."""
    try:
        source = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    with os.fdopen(source, "rb") as file:
        tail = b""
        while chunk := file.read(FLUSH_BYTES):
            chunk = tail + chunk
            cut = chunk.rfind(b"\n") + 1
            write_all(fd, chunk[:cut], name)
            tail = chunk[cut:]
