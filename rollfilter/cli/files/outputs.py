"""Every output of a command-line run, in one place: named, checked together, opened and locked
before anything is sent, and written whole at the end (the summary, --metrics, --aggregate).

A run's outputs are the files its options name (those --gym-layout derives among them), the run
record beside -o, and the standard streams that carry something: standard output when results
(or --summarize's summary, or --dry-run's bodies) go there, and standard error always. Two of
them that are one file (by device and inode, so a symlink, a hard link, /dev/stdout and
/proc/self/fd/1 all count; by path for one not made yet) would lose or mix lines: a file renamed
into place takes the other's name from it, and two descriptors of one regular file overwrite each
other. Only /dev/null may be shared: what goes there is thrown away on purpose.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import stat
from collections.abc import Callable, Iterable, Sequence
from typing import Literal

import msgspec
import trio

from rollfilter.cli.command import CommandConfig
from rollfilter.cli.environment import Environment
from rollfilter.cli.files import identity, locks
from rollfilter.cli.files.descriptors import started_without
from rollfilter.cli.files.identity import RECORD_SUFFIX
from rollfilter.errors import OutputInUse, RollfilterError, UsageError
from rollfilter.formats.source import STDIN, display_name
from rollfilter.formats.writers import WholeFile
from rollfilter.run.materialize import building, claim

_encode = msgspec.json.Encoder().encode
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND
# The files of a run, by CommandConfig field, each with the option that names it.
FILE_OPTIONS = (
    ("output", "-o"),
    ("errors_file", "--errors"),
    ("metrics_file", "--metrics"),
    ("per_task_file", "--per-task"),
    ("aggregate_file", "--aggregate"),
    ("materialized_file", "--materialized"),
    ("progress_file", "--progress-file"),
    ("dropped_file", "--dropped"),
    ("prometheus_file", "--prometheus-file"),
)
SAME_FILE = "two outputs cannot be one file"


class RunOutputs:
    """The outputs of one command-line run (see the module's docstring); `check` refuses, with one
    line naming both, two that are one file, an output that is an input, and an output named as a
    run record is, all before any file is opened."""

    def __init__(
        self, command: CommandConfig, streams: Environment, *, dry_run: bool = False, summarize: bool = False
    ) -> None:
        self.command = command
        self.stdin = streams.stdin
        # A dry run writes no file: it prints what it would send.
        self.files = [] if dry_run else [(o, p) for f, o in FILE_OPTIONS if (p := getattr(command, f)) is not None]
        self.record = None if dry_run or summarize else identity.record_target(command)
        self.held = held_target(command) if not (dry_run or summarize) else None
        carries_stdout = summarize or dry_run or command.output is None
        self.streams = [("standard output", streams.stdout)] * carries_stdout + [("standard error", streams.stderr)]

    def named_files(self) -> list[tuple[str, str]]:
        """Each file as the messages name it (`--metrics m.json`), the run record last."""
        named = [(f"{option} {path}", path) for option, path in self.files]
        if self.held is not None:
            named.append((f"the held file {self.held}", self.held))
        if self.record is not None:
            named.append((f"the run record {self.record}", self.record))
        return named

    def check(self) -> None:
        for option, path in self.files:
            if identity.is_record_name(path):
                raise UsageError(
                    f"{option} {path}: a name ending in {RECORD_SUFFIX} is a run record's"
                    f" (-o FILE keeps its record in FILE{RECORD_SUFFIX}): give another name"
                )
        named: list[tuple[str, str | int]] = [*self.streams, *self.named_files()]
        refuse_inputs(self.command.inputs, named, self.stdin)
        refuse_shared(self.streams, self.named_files())


def held_target(command: CommandConfig) -> str | None:
    """The held file of `command`'s run (`CommandConfig.held_file`), if -o may have one beside it:
    a regular file, or one not made yet."""
    held = command.held_file
    return held if held is not None and identity.may_hold_a_record(command.output or "") else None


def refuse_inputs(inputs: Sequence[str], outputs: Iterable[tuple[str, str | int]], stdin_fd: int) -> None:
    """UsageError when an output (a path, or a descriptor such as stdout's) is one of the inputs:
    the run would read what it writes and never end, or destroy its input. Regular files, as GNU
    cat tells them, and pipes (`--errors /dev/stdin` would feed its records back as rows); a
    terminal or /dev/null may be read and written."""
    read: dict[tuple[int, int], str] = {}
    for path in inputs:
        key = _file_or_pipe(stdin_fd if path == STDIN else path)
        if key is not None:
            read.setdefault(key, display_name(path))
    for name, target in outputs if read else ():
        key = _file_or_pipe(target)
        if key in read:
            raise UsageError(f"{name} is also the input {read[key]}: input file is output file")


def refuse_shared(streams: Iterable[tuple[str, int]], files: Iterable[tuple[str, str]]) -> None:
    """UsageError naming both when a file output is another or a standard stream that carries
    something. The standard streams are not compared with each other: `2>&1` is the shell's."""
    seen: dict[object, str] = {}
    for name, fd in streams:
        key = _identity(fd)
        if key is not None:
            seen.setdefault(key, name)
    for name, path in files:
        key = _identity(path)
        if key is None:
            continue
        if key in seen:
            raise UsageError(f"{name} is also {seen[key]}: {SAME_FILE}")
        seen[key] = name


def _identity(target: str | int) -> object | None:
    """What makes outputs one file: the device and inode (a symlink followed), or for a path not
    there yet the path it would be made at; None for /dev/null and for a closed descriptor."""
    try:
        info = os.stat(target)
    except OSError:
        return ("path", os.path.realpath(target)) if isinstance(target, str) else None
    if stat.S_ISCHR(info.st_mode) and info.st_rdev == os.stat(os.devnull).st_rdev:
        return None
    return (info.st_dev, info.st_ino)


def _file_or_pipe(target: str | int) -> tuple[int, int] | None:
    try:
        info = os.stat(target)
    except OSError:  # an output not made yet, or an input that check_inputs reports
        return None
    if stat.S_ISREG(info.st_mode) or stat.S_ISFIFO(info.st_mode) or stat.S_ISSOCK(info.st_mode):
        return (info.st_dev, info.st_ino)
    return None


def refuse_earlier_lines(path: str, option: str) -> None:
    """UsageError when `path` is a regular file that already holds lines: a second run's lines
    must never be mixed silently into a first run's (give --resume or --append)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise UsageError(f"cannot write {option} {path}: {exc.strerror}") from None
    if stat.S_ISREG(info.st_mode) and info.st_size > 0:
        raise UsageError(
            f"{option} {path} already holds lines of another run: give --resume to finish that run,"
            " --append to add to it, --overwrite to replace it, or a new file"
        )


Lock = Literal["exclusive", "shared"]


class OutputFiles(contextlib.ExitStack):
    """The files a run writes, opened (and checked, and those it appends to locked) before
    anything is sent. A run refused after they were opened (a RollfilterError: nothing was
    sent) leaves no file it created."""

    def __init__(self) -> None:
        super().__init__()
        self._created: list[str] = []  # removed on a refusal while still empty
        self._written: list[str] = []  # removed on a refusal
        self._folders: list[str] = []  # made for an output, removed on a refusal while still empty
        self.caveats: list[str] = []  # what to say of locks that do not hold as locks do

    def remove_if_refused(self, path: str) -> None:
        """`path` is about to be written by this run: a refused run removes it, unless it was there already."""
        if not os.path.lexists(path):
            self._written.append(path)

    def open(
        self,
        path: str | None,
        option: str,
        *,
        must_be_empty: bool = False,
        lock: Lock | None = None,
        mode: int = 0o666,
    ) -> int | None:
        """Open `path` to append, creating it (with `mode`, less the umask) and its missing parent
        folders; with `lock`, a regular file is locked too (OutputInUse when another run holds it).

        With `must_be_empty`, a regular file that already holds lines is refused: a second run's
        lines must never be mixed silently into a first run's (give --resume or --append)."""
        if path is None:
            return None
        stand_in = started_without(path)
        if stand_in is not None:  # a write to it fails, as to the closed descriptor it stands for
            fd = os.dup(stand_in)
            self.callback(os.close, fd)
            return fd
        try:
            self.make_folders(path)
            opened = locks.open_locked(path, APPEND_FLAGS, shared=lock == "shared", locking=lock is not None, mode=mode)
        except locks.Held as held:
            raise in_use(f"{option} {path}", held.holders) from None
        except OSError as exc:
            raise UsageError(f"cannot write {option} {path}: {exc.strerror or exc}") from None
        assert opened is not None, "made when not there"
        self.callback(os.close, opened.fd)
        if opened.created:
            self._created.append(os.path.realpath(path))
        if opened.caveat is not None:
            self.caveats.append(f"{option} {path}: {opened.caveat}")
        if must_be_empty:
            refuse_earlier_lines(path, option)
        return opened.fd

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> Literal[False]:
        refused = isinstance(error, RollfilterError) or (
            isinstance(error, BaseExceptionGroup) and error.subgroup(RollfilterError) is not None
        )
        # Removed while still open and locked: no other run can take a file this one is removing.
        for path in self._created if refused else ():
            with contextlib.suppress(OSError):
                if os.stat(path).st_size == 0:
                    os.unlink(path)
        for path in self._written if refused else ():
            with contextlib.suppress(OSError):
                os.unlink(path)
        for folder in reversed(self._folders) if refused else ():
            with contextlib.suppress(OSError):  # not empty: another run's, or a file of this one kept
                os.rmdir(folder)
        super().__exit__(kind, error, tb)  # type: ignore[arg-type]  # its callbacks close files: nothing is suppressed
        return False

    def lock_replaced(self, path: str, option: str) -> None:
        """Hold the file at `path` that this run will replace whole (--materialized) until the run
        ends: claimed by this process (see `materialize.claim`), and locked if it is there.
        OutputInUse when another run holds it, or builds its own."""
        builders = building(path)
        if builders:
            raise in_use(f"{option} {path}", builders)
        try:
            claimed = claim(path)
            self.callback(_remove, claimed)
            builders = building(path)  # two runs claiming at once: each finds the other, neither writes
            if builders:
                raise in_use(f"{option} {path}", builders)
            # Not blocking: a FIFO with no writer (refused as no regular file) would hang the start.
            opened = locks.open_locked(path, os.O_RDONLY | os.O_NONBLOCK, shared=False, create=False)
        except locks.Held as held:
            raise in_use(f"{option} {path}", held.holders) from None
        except OSError as exc:
            raise UsageError(f"cannot write {option} {path}: {exc.strerror or exc}") from None
        if opened is not None:
            self.callback(os.close, opened.fd)

    def keep_locked(self, fd: int) -> None:
        """Lock the file this run made at `fd` (the one renamed into place) until the run ends."""
        held = os.dup(fd)
        self.callback(os.close, held)
        locks.lock_held(held)

    def make_folders(self, path: str) -> None:
        """Make the missing folders above `path`, which a refused run removes again. OSError."""
        missing = []
        folder = os.path.dirname(os.path.abspath(path))
        while folder and not os.path.lexists(folder):
            missing.append(folder)
            folder = os.path.dirname(folder)
        for folder in reversed(missing):
            os.mkdir(folder)
            self._folders.append(folder)

    def whole(self, path: str | None, option: str, *, regular_only: bool = False) -> WholeFile | None:
        """A file written whole when there is content (see WholeFile), checked now."""
        if path is None:
            return None
        try:
            self.make_folders(path)
        except OSError as exc:
            raise UsageError(f"cannot write {option} {path}: {exc.strerror or exc}") from None
        stand_in = started_without(path)
        file = WholeFile(path, option, regular_only=regular_only, fd=None if stand_in is None else os.dup(stand_in))
        self.callback(file.close)
        return file


def _remove(path: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(path)


def in_use(output: str, holders: list[int]) -> OutputInUse:
    """Another run holds `output` (`-o out.jsonl`): its processes are `holders`, if known."""
    holder = locks.holder_text(holders)
    message = f"{output} is in use by {holder}: one run writes an output at a time (--wait-lock waits)"
    return OutputInUse(message, output=output, holder=holder)


@dataclasses.dataclass(frozen=True, slots=True)
class RunFiles:
    """A run's outputs as opened: where results, failures and the files written whole go.
    A dry run has none but standard output and standard error."""

    results: int  # -o's descriptor, or standard output's
    results_name: str  # as messages name it: "-o out.jsonl", "standard output"
    errors: int | None  # --errors' descriptor; None: failures are lines on standard error
    errors_name: str
    per_task: int | None
    dropped: int | None  # --dropped's descriptor
    held: int | None  # the held file's (see CommandConfig.held_file)
    metrics: WholeFile | None
    aggregate: WholeFile | None
    progress: WholeFile | None
    prometheus: WholeFile | None  # --prometheus-file's
    listening: list[socket.socket]  # --prometheus's sockets, bound before anything is sent
    materialized: str | None  # written by the first pass, when it is done
    keep_locked: Callable[[int], None] | None  # what locks the materialized file made, until the end
    record: identity.RunRecord | None  # written beside -o before anything is sent
    output: str | None  # -o, beside which the record is written


LOCK_POLL_SECONDS = 0.2  # how often --wait-lock tries an output another run holds


async def open_appended(
    command: CommandConfig, files: OutputFiles, stderr: int, say: Callable[[str, int], None]
) -> list[int | None]:
    """-o, --errors, --per-task, --dropped and the held file, opened to append and locked: shared
    with --append (runs that only add lines may share a file), else exclusive. An output another
    run holds is refused (OutputInUse), or with --wait-lock waited for; they are locked in the
    order of their paths, so that two waiting runs never hold one each of what the other waits
    for. A fresh run's held file is emptied: what an earlier run left in it is not this run's, and
    with --overwrite so are -o, --errors and --dropped, once locked."""
    fresh_only = not (command.resume or command.append or command.overwrite)
    lock: Lock = "shared" if command.append and not command.resume else "exclusive"
    held_file = held_target(command)
    wanted = [
        (command.output, "-o", fresh_only),
        (command.errors_file, "--errors", fresh_only),
        (command.per_task_file, "--per-task", False),
        (command.dropped_file, "--dropped", fresh_only),
        (held_file, "the held file", False),
        (command.materialized_file, "--materialized", False),  # replaced whole: its file is locked
    ]
    fds: dict[int, int | None] = {}
    for number in sorted(range(len(wanted)), key=lambda n: os.path.realpath(wanted[n][0] or "")):
        path, option, must_be_empty = wanted[number]
        said = False
        while True:
            try:
                if option == "--materialized":
                    fds[number] = None
                    if path is not None:
                        files.lock_replaced(path, option)
                else:
                    # The held file copies the results: it is never more readable than -o.
                    mode = identity.beside_mode(command.output or "") if number == 4 else 0o666
                    fds[number] = files.open(path, option, must_be_empty=must_be_empty, lock=lock, mode=mode)
                break
            except OutputInUse as held:
                if not command.wait_lock:
                    raise
                if not said:
                    say(f"{held.output} is in use by {held.holder}: waiting for it (--wait-lock)", stderr)
                    said = True
                await trio.sleep(LOCK_POLL_SECONDS)
    if fds[4] is not None:  # the held file copies the results: never more readable than -o
        narrow_mode(fds[4], identity.beside_mode(command.output or ""), held_file)
    emptied = [4, *([0, 1, 3] if command.overwrite else [])]  # the held file, and what --overwrite replaces
    for number in emptied if not command.resume else ():
        path, option, _ = wanted[number]
        fd = fds[number]
        if fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe or a device is not replaced
            continue
        try:
            os.ftruncate(fd, 0)
        except OSError as exc:
            raise UsageError(f"cannot write {option} {path}: {exc.strerror}") from None
    return [fds[number] for number in range(len(wanted) - 1)]


def narrow_mode(fd: int, mode: int, path: str | None) -> None:
    """Take from the file `fd` the permissions not in `mode` (one an earlier run made wider)."""
    try:
        current = stat.S_IMODE(os.fstat(fd).st_mode)
        if current & ~mode & 0o777:
            os.fchmod(fd, current & mode)
    except OSError as exc:
        raise UsageError(f"cannot narrow the permissions of {path}: {exc.strerror}") from None


def run_files(
    command: CommandConfig,
    files: OutputFiles,
    streams: Environment,
    appended: Sequence[int | None],
    record: identity.RunRecord | None,
) -> RunFiles:
    """The files of `command`'s run that are written whole, checked and opened (`appended` are
    the descriptors of -o, --errors and --per-task, opened by `open_appended`)."""
    out, errors, per_task, dropped, held = appended
    materialized = command.materialized_file
    if materialized is not None:
        if not (command.resume or command.append or command.overwrite):
            refuse_earlier_lines(materialized, "--materialized")
        checked = files.whole(materialized, "--materialized", regular_only=True)  # its folder, made and checked
        assert checked is not None
    if record is not None and command.output is not None:
        files.remove_if_refused(identity.record_path(command.output))
    return RunFiles(
        results=streams.stdout if out is None else out,
        results_name="standard output" if out is None else f"-o {command.output}",
        errors=errors,
        errors_name=f"--errors {command.errors_file}",
        per_task=per_task,
        dropped=dropped,
        held=held,
        metrics=files.whole(command.metrics_file, "--metrics"),
        aggregate=files.whole(command.aggregate_file, "--aggregate"),
        progress=files.whole(command.progress_file, "--progress-file", regular_only=True),
        prometheus=files.whole(command.prometheus_file, "--prometheus-file", regular_only=True),
        listening=listening(command, files),
        materialized=materialized,
        keep_locked=files.keep_locked,
        record=record,
        output=command.output,
    )


def dry_run_files(streams: Environment) -> RunFiles:
    """A dry run's outputs: the bodies on standard output, the rest on standard error."""
    return RunFiles(
        streams.stdout,
        "standard output",
        None,
        "",
        *(None,) * 7,
        listening=[],
        materialized=None,
        keep_locked=None,
        record=None,
        output=None,
    )


def listening(command: CommandConfig, files: OutputFiles) -> list[socket.socket]:
    """--prometheus's sockets, bound now (UsageError when they cannot be), closed when the run ends."""
    if command.prometheus is None:
        return []
    from rollfilter.cli.exporter import listen  # and prometheus_client: only for a run that exports

    sockets = listen(*command.prometheus)
    for sock in sockets:
        files.callback(sock.close)
    return sockets


def replace_content(file: WholeFile | None, data: bytes) -> None:
    """Replace the content of a file written whole (--metrics, --aggregate); OutputFailed when it cannot."""
    if file is not None:
        file.replace(data)
