"""Resume: what earlier runs left behind, read from their results and failures files.

A (task, rollout) pair found in the results file is done. Each line of the failures file
(rollfilter's errors record, or NeMo Gym's `_failures.jsonl` sidecar) is one failed
attempt of its pair; a pair marked terminal, or with `max_attempts` failed attempts, is not
run again. A pair run again carries `_ng_attempt_index`: its failed attempts so far.
Memory grows by about 30 bytes a pair, whatever the indices hold.

A run of whole groups also keeps a held file beside its results (`held_path`): each rollout's
result as it finished; a marker line for each group dropped as uniform (its rollouts), and one for
each group that closed incomplete (its rollouts and the ones that failed); and, each time a group
has reached the results file, how far that file then held only whole groups (`written_through`,
in bytes, with the group when it was kept). Resuming, a pair of a dropped group is not run again,
and the finished rollouts of a group not yet written are taken back (`take_earlier`) instead of
being sent again. Results past the last `written_through` that the held file holds too are cut
off the results file: they may be the first part of a group that a kill cut in two, and are
written again, whole, with the rest of their group. So is a group written incomplete whose
failed rollouts run again, and everything after it: the group is written again whole, in one
place, with the rollouts that finish now.

The held file is also what the dropped groups' file is made of: `rebuild_dropped` writes it
again from the markers, so that each rollout of a uniform group is there once whatever the kills,
and the groups an earlier run left open are written there only by the run that closes them (or,
still open when a run ends, as `cancelled`: `leftover_earlier`).
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Iterator, Mapping
from typing import IO, Any

import msgspec

from rollfilter.errors import UsageError
from rollfilter.formats.keytable import KeyTable
from rollfilter.formats.writers import OutputClosed, OutputFailed, write_all
from rollfilter.outcomes import TERMINAL_KINDS
from rollfilter.rows import ROLLOUT_INDEX, TASK_INDEX

DEFAULT_MAX_ATTEMPTS = 3  # NeMo Gym's NEMO_GYM_MAX_ROLLOUT_ATTEMPTS default
MAX_ATTEMPTS_VARIABLE = "NEMO_GYM_MAX_ROLLOUT_ATTEMPTS"
# The kinds that make a failure terminal in a record written without the flag, as read from JSON.
_TERMINAL_KINDS = frozenset(kind.value for kind in TERMINAL_KINDS)
_encode = msgspec.json.Encoder().encode


class _Record(msgspec.Struct):
    """The few fields resume reads of a result or failure line; the rest is skipped unparsed."""

    task: Any = msgspec.field(name="_ng_task_index", default=msgspec.UNSET)
    rollout: Any = msgspec.field(name="_ng_rollout_index", default=msgspec.UNSET)
    terminal: Any = msgspec.field(name="_ng_failure_terminal", default=None)
    error: Any = None


_decode_record = msgspec.json.Decoder(_Record).decode
_decode = msgspec.json.Decoder().decode

HELD_SUFFIX = ".held"
MASKED = "masked"  # a dropped group's reason: too few of its rollouts were valid measurements
DROPPED_BECAUSE = "dropped_because"  # the key of a dropped group's rollouts (and of the held file's markers)
WRITTEN_THROUGH = "written_through"  # the held file's marker: the results file's whole groups end there
KEPT = "kept"  # beside WRITTEN_THROUGH: the group written then was kept, [task, its first rollout]
ROLLOUTS = "group_rollouts"  # a group marker's rollout indices (its `_ng_rollout_index` is the first)
FAILED = "failed_rollouts"  # an incomplete group's marker: the rollouts that failed
CANCELLED = "cancelled"  # why the finished rollouts of a group still open when a run ends are dropped


class _HeldRecord(msgspec.Struct):
    """What resume reads of a held-file line: a result's indices, or a marker."""

    task: Any = msgspec.field(name="_ng_task_index", default=msgspec.UNSET)
    rollout: Any = msgspec.field(name="_ng_rollout_index", default=msgspec.UNSET)
    dropped: Any = msgspec.field(name=DROPPED_BECAUSE, default=None)
    written_through: Any = msgspec.field(name=WRITTEN_THROUGH, default=None)
    kept: Any = msgspec.field(name=KEPT, default=None)
    rollouts: Any = msgspec.field(name=ROLLOUTS, default=None)
    failed: Any = msgspec.field(name=FAILED, default=None)

    @property
    def is_result(self) -> bool:
        return self.written_through is None and self.dropped is None and not isinstance(self.failed, list)

    def group_rollouts(self) -> list[Any]:
        """A group marker's rollouts (a marker of one rollout names only its own)."""
        return list(self.rollouts) if isinstance(self.rollouts, list) else [self.rollout]


_decode_held = msgspec.json.Decoder(_HeldRecord).decode


def held_path(results: str) -> str:
    """Where a run of whole groups keeps the finished rollouts of its groups, beside `results`."""
    return results + HELD_SUFFIX


def pair_key(task: Any, rollout: Any) -> bytes:
    """A (task, rollout) pair as a KeyTable key."""
    return _encode((task, rollout))


class ResumeState:
    """Pairs done and failed attempts per pair, from earlier runs' files."""

    DONE = -1  # the pair is in the results: skip it
    GIVE_UP = -2  # terminal, or out of attempts: do not run it again
    DROPPED = -3  # its group was dropped (uniform): do not run it again
    EARLIER = -4  # finished, its group not yet written: take its result back (`take_earlier`)

    def __init__(self, max_attempts: int = DEFAULT_MAX_ATTEMPTS) -> None:
        self.max_attempts = max_attempts
        self._done = KeyTable()
        self._failed = KeyTable(("I", "B"))  # failed attempts, terminal
        self._dropped = KeyTable()
        self._closed = KeyTable()  # failed rollouts of a group written incomplete that cannot be written again
        self._kept = KeyTable()  # the kept groups the held file names, by (task, first rollout)
        # A pair of a group still open -> where its result line is in the held file, and its length:
        # read when taken, so that what is taken back costs no memory until then.
        self._earlier_open: dict[bytes, tuple[int, int]] = {}
        self._held_path = ""
        self._known = KeyTable()  # every pair whose result the held file holds
        self.cut_bytes = 0  # cut off the results file: the start of a group a kill cut in two
        self.reopened = 0  # groups written incomplete whose failed rollouts run again: cut off to be written whole
        self.kept_groups = 0  # groups the results file holds that were kept (held file's markers)
        self.target_groups: int | None = None  # the run's --target-groups: met, no group is reopened
        self.dropped_groups = 0  # groups dropped as uniform (held file's markers)
        self.masked_groups = 0  # groups dropped as masked: too few valid measurements (held file's markers)

    @property
    def done_pairs(self) -> int:
        return self._done.count

    @property
    def finished_pairs(self) -> int:
        """The pairs earlier runs finished: written, dropped as uniform, or finished in groups still open."""
        return self._done.count + self._dropped.count + len(self._earlier_open)

    def add_done(self, task: Any, rollout: Any) -> None:
        self._done.add(pair_key(task, rollout))

    def add_failure(self, task: Any, rollout: Any, *, terminal: bool) -> None:
        handle, _ = self._failed.add(pair_key(task, rollout))
        self._failed.set_value(handle, self._failed.value(handle) + 1)
        if terminal:
            self._failed.set_value(handle, 1, 1)

    def decide(self, task: Any, rollout: int) -> int:
        """DONE, GIVE_UP, or the pair's attempt index (0 when it never failed)."""
        key = pair_key(task, rollout)
        if self._done.count and key in self._done:
            return self.DONE
        if self._dropped.count and key in self._dropped:
            return self.DROPPED
        if self._earlier_open and key in self._earlier_open:
            return self.EARLIER
        if self._closed.count and key in self._closed:
            return self.GIVE_UP
        if not self._failed.count:
            return 0
        handle = self._failed.find(key)
        if handle < 0:
            return 0
        attempts = self._failed.value(handle)
        if self._failed.value(handle, 1) or attempts >= self.max_attempts:
            return self.GIVE_UP
        return attempts

    def counted_kept(self, task: Any, first: int) -> bool:
        """Whether `kept_groups` counts the group of `task` starting at rollout `first`."""
        key = pair_key(task, first)
        return bool(self._kept.count) and key in self._kept and key in self._done

    def take_earlier(self, task: Any, rollout: Any) -> dict[str, Any]:
        """The result an earlier run finished for a pair that `decide` calls EARLIER (given once)."""
        result: dict[str, Any] = _decode(self._held_line(*self._earlier_open.pop(pair_key(task, rollout))))
        return result

    def _held_line(self, offset: int, length: int) -> bytes:
        try:
            fd = os.open(self._held_path, os.O_RDONLY)
        except OSError as exc:
            raise UsageError(f"cannot read {self._held_path} to resume from it: {exc.strerror}") from None
        try:
            return os.pread(fd, length, offset)
        finally:
            os.close(fd)

    def leftover_earlier(self) -> Iterator[dict[str, Any]]:
        """The results `take_earlier` did not give (their groups are still open: the run stopped
        first), a task's together, each given once."""
        by_task: dict[bytes, list[dict[str, Any]]] = {}
        for place in self._earlier_open.values():
            result: dict[str, Any] = _decode(self._held_line(*place))
            by_task.setdefault(_encode(result.get(TASK_INDEX)), []).append(result)
        self._earlier_open.clear()
        for results in by_task.values():
            results.sort(key=lambda result: _rollout_order(result.get(ROLLOUT_INDEX)))
            yield from results

    def dropped_results(self, held: str) -> Iterator[dict[str, Any]]:
        """The results of the held file's dropped groups (a resumed run's summary covers them too),
        each once."""
        if not self._dropped.count:
            return
        given = KeyTable()
        for line in _lines(held):
            record = _held_record(line)
            if record is None or not record.is_result:
                continue
            key = pair_key(record.task, record.rollout)
            if key in self._dropped and given.add(key)[1]:
                value = _decode(line)
                if isinstance(value, dict):
                    yield value

    def rebuild_dropped(self, dropped: str, held: str) -> None:
        """Make the dropped groups' file at `dropped` what the held file says (see the module
        docstring): its lines of rollouts the held file holds are cut off, and the rollouts of the
        uniform groups written again, each once and a group's together. Lines of other rollouts
        (another run's, with --append) stand. A file that is not a regular one is left alone."""
        try:
            if not stat.S_ISREG(os.stat(dropped).st_mode):
                return
        except FileNotFoundError:
            return
        except OSError as exc:
            raise UsageError(f"cannot resume from {dropped}: {exc.strerror}") from None
        cut, others, offset = None, [], 0
        for line in _lines(dropped):
            record = _held_record(line)
            known = record is not None and pair_key(record.task, record.rollout) in self._known
            if known and cut is None:
                cut = offset
            elif not known and cut is not None:
                others.append(line)  # another program's, past the first of ours: kept
            offset += len(line)
        try:
            fd = os.open(dropped, os.O_WRONLY | os.O_APPEND)
            try:
                if cut is not None:
                    os.ftruncate(fd, cut)
                    write_all(fd, b"".join(others), dropped)
                for lines in _uniform_groups(held, self._dropped):
                    write_all(fd, lines, dropped)
            finally:
                os.close(fd)
        except OSError as exc:
            raise UsageError(f"cannot resume from {dropped}: {exc.strerror}") from None
        except (OutputFailed, OutputClosed) as exc:
            raise UsageError(f"cannot resume from {dropped}: {exc}") from None

    @classmethod
    def from_files(
        cls,
        results: str,
        failures: str | None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        *,
        held: str | None = None,
        target_groups: int | None = None,
    ) -> ResumeState:
        """Read a results file and, if given, a failures file and a held file (see the module
        docstring: this may cut the results file's tail, unless the results file holds
        `target_groups` kept groups already); missing files are empty."""
        state = cls(max_attempts)
        state.target_groups = target_groups
        if failures is not None:  # read first: whether a failed rollout runs again decides what is cut
            for record in _records(failures):
                error = record.error if isinstance(record.error, dict) else {}
                kind = error.get("kind")
                terminal = bool(record.terminal) or (isinstance(kind, str) and kind in _TERMINAL_KINDS)
                state.add_failure(record.task, record.rollout, terminal=terminal)
        if held is None:
            for record in _records(results):
                state.add_done(record.task, record.rollout)
        else:
            state._read_held(results, held)
        return state

    def _read_held(self, results: str, held: str) -> None:
        self._held_path = held
        vouched = 0
        incomplete: list[_HeldRecord] = []
        groups = KeyTable()
        for line in _lines(held):
            marker = _held_record(line)
            if marker is None:
                continue
            if type(marker.written_through) is int:
                vouched = marker.written_through  # the last one: a cut writes its own
                if isinstance(marker.kept, list) and len(marker.kept) == 2:
                    self._kept.add(pair_key(*marker.kept))
            elif marker.dropped is not None:
                new = groups.add(pair_key(marker.task, marker.rollout))[1]
                if marker.dropped == MASKED:
                    self.masked_groups += new
                else:
                    self.dropped_groups += new
                for rollout in marker.group_rollouts():
                    self._dropped.add(pair_key(marker.task, rollout))
            elif isinstance(marker.failed, list):
                incomplete.append(marker)
        reopen_at, reopened = self._reopen_point(results, incomplete) if incomplete else (None, [])
        if reopen_at is not None and reopen_at < vouched:
            if self._take_back(results, held, reopen_at, vouched):
                self.reopened = len(reopened)
                return
            for key in reopened:  # lines another program wrote past it: the group stands as written
                self._closed.add(key)
            self._done, self._earlier_open, self._known, self.kept_groups = KeyTable(), {}, KeyTable(), 0
        self._take_back(results, held, vouched, vouched)

    def _reopen_point(self, results: str, incomplete: list[_HeldRecord]) -> tuple[int | None, list[bytes]]:
        """Where the first group written incomplete whose failed rollouts run again starts in the
        results file, and those failed rollouts. None when the results file holds the target's
        kept groups already: the run is done, and a cut would take kept groups back out of it."""
        offsets = KeyTable(("Q",))
        kept = 0
        for record, offset in _records_at(results):
            key = pair_key(record.task, record.rollout)
            handle, new = offsets.add(key)
            if new:
                offsets.set_value(handle, offset)
                kept += bool(self._kept.count) and key in self._kept
        if self.target_groups is not None and kept >= self.target_groups:
            return None, []
        start: int | None = None
        reopened: list[bytes] = []
        for marker in incomplete:
            failed = marker.failed if isinstance(marker.failed, list) else []
            keys = [pair_key(marker.task, rollout) for rollout in failed]
            retried = [key for key, rollout in zip(keys, failed, strict=True)
                       if key not in offsets and self.decide(marker.task, rollout) >= 0]  # fmt: skip
            written = [offsets.find(pair_key(marker.task, rollout)) for rollout in marker.group_rollouts()]
            found = [offsets.value(handle) for handle in written if handle >= 0]
            if retried and found:
                reopened.extend(retried)
                start = min(found) if start is None else min(start, *found)
        return start, reopened

    def _take_back(self, results: str, held: str, cut: int, vouched: int) -> bool:
        """The results file's pairs before `cut` are done; those past it are cut off and taken back
        from the held file if it holds each of them (True), else they stand (False, unless `cut` is
        `vouched`: then they stand as done)."""
        beyond: dict[bytes, bool] = {}  # pairs past `cut` -> whether the held file has them
        for record, offset in _records_at(results):
            key = pair_key(record.task, record.rollout)
            if offset < cut:
                self._count_done(key)
            else:
                beyond.setdefault(key, False)
        taken_back: dict[bytes, tuple[int, int]] = {}
        for line, start in _lines_at(held):
            result = _held_record(line)
            if result is None or not result.is_result:
                continue
            key = pair_key(result.task, result.rollout)
            self._known.add(key)
            if key in beyond:
                beyond[key] = True
                taken_back[key] = (start, len(line))
            elif key not in self._done and key not in self._dropped:
                self._earlier_open[key] = (start, len(line))
        if beyond and all(beyond.values()):
            if cut < vouched:  # the mark first: a kill before the cut leaves it to be cut again
                _append(held, _encode({WRITTEN_THROUGH: cut}) + b"\n")
            self.cut_bytes = _cut_at(results, cut)
            self._earlier_open.update(taken_back)
            return True
        if cut < vouched:
            return False
        for key in beyond:  # lines another program wrote (or none): they stand
            self._count_done(key)
            self._earlier_open.pop(key, None)
        return True

    def _count_done(self, key: bytes) -> None:
        if self._done.add(key)[1] and self._kept.count and key in self._kept:
            self.kept_groups += 1


def _rollout_order(rollout: Any) -> tuple[int, Any]:
    return (0, rollout) if type(rollout) is int else (1, repr(rollout))


def _uniform_groups(held: str, dropped: KeyTable) -> Iterator[bytes]:
    """The lines of each uniform group of the held file, stamped, a group's together, each group once."""
    if not dropped.count:
        return
    places = KeyTable(("Q", "I"))  # a dropped pair -> where its result line is in the held file, its length
    given = KeyTable()
    offset = 0
    with open(held, "rb") as file:
        for line in _whole_lines(file):
            start, offset = offset, offset + len(line)
            record = _held_record(line)
            if record is None:
                continue
            if record.is_result:
                key = pair_key(record.task, record.rollout)
                if key in dropped:
                    handle = places.add(key)[0]
                    places.set_value(handle, start)
                    places.set_value(handle, len(line), 1)
            elif record.dropped is not None and given.add(pair_key(record.task, record.rollout))[1]:
                stamped = []
                for rollout in record.group_rollouts():
                    handle = places.find(pair_key(record.task, rollout))
                    if handle >= 0:
                        found = os.pread(file.fileno(), places.value(handle, 1), places.value(handle))
                        stamped.append(_encode({**_decode(found), DROPPED_BECAUSE: record.dropped}) + b"\n")
                yield b"".join(stamped)


def _append(path: str, line: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    except OSError as exc:
        raise UsageError(f"cannot resume from {path}: {exc.strerror}") from None
    try:
        write_all(fd, line, path)
    except (OutputFailed, OutputClosed) as exc:
        raise UsageError(f"cannot resume from {path}: {exc}") from None
    finally:
        os.close(fd)


def _held_record(line: bytes) -> _HeldRecord | None:
    try:
        record = _decode_held(line)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None
    if record.written_through is None and (record.task is msgspec.UNSET or record.rollout is msgspec.UNSET):
        return None
    return record


def _cut_at(path: str, size: int) -> int:
    """Cut the file at `path` down to `size` bytes; the bytes removed."""
    try:
        with open(path, "r+b") as file:
            before = file.seek(0, os.SEEK_END)
            file.truncate(size)
    except OSError as exc:
        raise UsageError(f"cannot resume from {path}: {exc.strerror}") from None
    return before - size


def _lines_at(path: str) -> Iterator[tuple[bytes, int]]:
    """`_lines`, each with the offset it starts at."""
    offset = 0
    for line in _lines(path):
        yield line, offset
        offset += len(line)


def _records_at(path: str) -> Iterator[tuple[_Record, int]]:
    """`_records`, each with the offset its line starts at."""
    for line, start in _lines_at(path):
        try:
            record = _decode_record(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
        if record.task is not msgspec.UNSET and record.rollout is not msgspec.UNSET:
            yield record, start


def _records(path: str) -> Iterator[_Record]:
    """The whole lines of `path` that carry both indices; a torn last line is ignored."""
    for line in _lines(path):
        try:
            record = _decode_record(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
        if record.task is not msgspec.UNSET and record.rollout is not msgspec.UNSET:
            yield record


def _lines(path: str) -> Iterator[bytes]:
    """The whole lines of `path` (none if it does not exist); a last line without a newline is torn."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"cannot read {path} to resume from it: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        yield from _whole_lines(file)


def _whole_lines(file: IO[bytes]) -> Iterator[bytes]:
    for line in file:
        if not line.endswith(b"\n"):
            break
        yield line


class StandingFailures:
    """Failure records, held in a temporary file until every result has been seen, so that each
    (task, rollout) pair counts once: as a success if any result has it (a failed attempt that a
    later, resumed run fixed), else as one failure, its first record's. OutputFailed when the
    temporary file cannot be made or written (a full TMPDIR)."""

    NAME = "a temporary file of the failure records"

    def __init__(self) -> None:
        try:
            self._file = tempfile.TemporaryFile()  # noqa: SIM115 - closed by standing()
        except OSError as exc:
            raise OutputFailed(self.NAME, exc) from None
        self._succeeded = KeyTable()

    def failure(self, line: bytes) -> None:
        try:
            self._file.write(line.strip() + b"\n")
        except OSError as exc:
            raise OutputFailed(self.NAME, exc) from None

    def result(self, record: dict[str, Any]) -> bool:
        """Count a result's pair as succeeded; whether no earlier result had it."""
        return self._succeeded.add(pair_key(record.get(TASK_INDEX), record.get(ROLLOUT_INDEX)))[1]

    def standing(self) -> Iterator[dict[str, Any]]:
        """The failure records of pairs without a result, one a pair; the file is closed after."""
        counted = KeyTable()
        with self._file as file:
            try:
                file.seek(0)  # writes what is buffered first
            except OSError as exc:
                raise OutputFailed(self.NAME, exc) from None
            for line in file:
                record = _decode(line)
                key = pair_key(record.get(TASK_INDEX), record.get(ROLLOUT_INDEX))
                if key not in self._succeeded and counted.add(key)[1]:
                    yield record

    def close(self) -> None:
        self._file.close()


def read_pairs(path: str) -> KeyTable:
    """The (task, rollout) pairs of a file's lines (a materialized-inputs file, say)."""
    pairs = KeyTable()
    for record in _records(path):
        pairs.add(pair_key(record.task, record.rollout))
    return pairs


def result_records(path: str) -> Iterator[dict[str, Any]]:
    """The whole lines of `path` that are JSON objects (a torn last line is ignored)."""
    for line in _lines(path):
        try:
            value = _decode(line)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            continue
        if isinstance(value, dict):
            yield value


def max_attempts_from_environment(environ: Mapping[str, str] | None = None) -> int:
    """NEMO_GYM_MAX_ROLLOUT_ATTEMPTS when it holds a positive integer, else 3 (as NeMo Gym reads it)."""
    text = (os.environ if environ is None else environ).get(MAX_ATTEMPTS_VARIABLE, "")
    try:
        value = int(text)
    except ValueError:
        return DEFAULT_MAX_ATTEMPTS
    return value if value >= 1 else DEFAULT_MAX_ATTEMPTS


def drop_torn_tail(path: str) -> int:
    """Cut a last line without a newline (a write cut off by a kill) off the file at `path`,
    so that appended lines start on a line of their own; returns the bytes removed."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise UsageError(f"cannot resume from {path}: {exc.strerror}") from None
    try:
        size = end = os.fstat(fd).st_size
        if not size or os.pread(fd, 1, size - 1) == b"\n":
            return 0
        while end > 0:
            start = max(0, end - 65536)
            newline = os.pread(fd, end - start, start).rfind(b"\n")
            if newline >= 0:
                end = start + newline + 1
                break
            end = start
        os.ftruncate(fd, end)
        return size - end
    finally:
        os.close(fd)
