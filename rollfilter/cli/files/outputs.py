"""Every output of a command-line run, in one place: named, checked together, opened and locked
before anything is sent, and written whole at the end (the summary, --metrics, --aggregate).

A run's outputs are the files its options name (those --gym-layout derives among them), the run
record beside -o, and the standard streams that carry something: standard output when results
(or --summarize's summary, or --dry-run's bodies) go there, and standard error always. Two of
them that are one file (by device and inode, so a symlink, a hard link, /dev/stdout and
/proc/self/fd/1 all count; by path for one not made yet) would lose or mix lines: a file renamed
into place takes the other's name from it, and two descriptors of one regular file overwrite each
other. Only /dev/null may be shared: what goes there is thrown away on purpose.

Each file is a row of one table, `OUTPUTS`: the option that names it, whether lines are appended
to it or it is written whole, whether it is locked, must be empty, may be a pipe. The checks, the
opening, the locking and the messages all read it, and the files opened come back by name
(`OpenedOutputs`, keyed by `OutputKey`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import socket
import stat
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Literal

import msgspec
import trio

from rollfilter.cli.command import CommandConfig
from rollfilter.cli.environment import Environment
from rollfilter.cli.files import identity, locks
from rollfilter.cli.files.descriptors import started_without
from rollfilter.cli.files.identity import RECORD_SUFFIX
from rollfilter.cli.messages import failure_message, message_line, say
from rollfilter.errors import OutputInUse, RollfilterError, UsageError
from rollfilter.formats.source import STDIN, display_name
from rollfilter.formats.writers import BatchWriter, LineWriter, OutputClosed, OutputFailed, WholeFile
from rollfilter.run.earlier import Earlier, EarlierFiles
from rollfilter.run.outputs import RunOutputs
from rollfilter.stops import StopControl

if TYPE_CHECKING:
    from rollfilter.outcomes import Failure

_encode = msgspec.json.Encoder().encode
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND
# The CommandConfig field (or property) that holds an output's path, and its name among the opened files.
OutputKey = Literal[
    "output",
    "errors_file",
    "metrics_file",
    "per_task_file",
    "aggregate_file",
    "materialized_file",
    "progress_file",
    "dropped_file",
    "prometheus_file",
    "held_file",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Output:
    """One output of a command-line run, as `OUTPUTS` has it: what checks, opens, locks and
    names it asks of it."""

    key: OutputKey
    option: str  # how messages name it, before its path: `--metrics m.json`
    appended: bool  # lines are appended to it while the run goes; else it is written whole, replaced
    locked: bool  # locked from before anything is sent to the run's end: two runs never write it at once
    must_be_empty: bool  # a fresh run refuses it when it holds another run's lines; --overwrite empties it
    may_be_pipe: bool  # a pipe or a device will do; else a regular file only (its content is renamed into place)
    # Made by the run beside -o, not named by an option (the held file): never more readable than
    # -o, and emptied by a fresh run, since what an earlier run left in it is not this run's.
    beside_output: bool = False


# Every output a run's options can name, in the order a message that two are one file names them.
OUTPUTS = (
    Output("output", "-o", appended=True, locked=True, must_be_empty=True, may_be_pipe=True),
    Output("errors_file", "--errors", appended=True, locked=True, must_be_empty=True, may_be_pipe=True),
    Output("metrics_file", "--metrics", appended=False, locked=False, must_be_empty=False, may_be_pipe=True),
    Output("per_task_file", "--per-task", appended=True, locked=True, must_be_empty=False, may_be_pipe=True),
    Output("aggregate_file", "--aggregate", appended=False, locked=False, must_be_empty=False, may_be_pipe=True),
    # Written by the first pass, whole, before anything is sent.
    Output("materialized_file", "--materialized", appended=False, locked=True, must_be_empty=True, may_be_pipe=False),
    Output("progress_file", "--progress-file", appended=False, locked=False, must_be_empty=False, may_be_pipe=False),
    Output("dropped_file", "--dropped", appended=True, locked=True, must_be_empty=True, may_be_pipe=True),
    Output(
        "prometheus_file", "--prometheus-file", appended=False, locked=False, must_be_empty=False, may_be_pipe=False
    ),
    Output(
        "held_file",
        "the held file",
        appended=True,
        locked=True,
        must_be_empty=False,
        may_be_pipe=True,
        beside_output=True,
    ),
)


def output_paths(command: CommandConfig, beside: identity.Beside) -> list[tuple[Output, str]]:
    """The outputs `command` names, and those kept `beside` its -o, with their paths, in `OUTPUTS`' order."""
    given = []
    for output in OUTPUTS:
        path = beside.held if output.beside_output else getattr(command, output.key)
        if path is not None:
            given.append((output, path))
    return given


SAME_FILE = "two outputs cannot be one file"


class NamedOutputs:
    """The outputs a command-line run names (see the module's docstring); `check` refuses, with one
    line naming both, two that are one file, an output that is an input, and an output named as a
    run record is, all before any file is opened."""

    def __init__(self, command: CommandConfig, streams: Environment, *, summarize: bool = False) -> None:
        self.inputs = named_inputs(command, streams.stdin)
        beside = identity.Beside() if summarize else identity.beside(command)  # --summarize keeps nothing beside
        self.files = output_paths(command, beside)
        self.record = beside.record
        carries_stdout = summarize or command.output is None
        self.streams = [("standard output", streams.stdout)] * carries_stdout + [("standard error", streams.stderr)]

    @classmethod
    def standard_streams(cls, command: CommandConfig, streams: Environment) -> NamedOutputs:
        """The outputs of a run that writes no file (--dry-run): standard output and standard error."""
        outputs = cls(command, streams)
        outputs.files, outputs.record = [], None
        outputs.streams = [("standard output", streams.stdout), ("standard error", streams.stderr)]
        return outputs

    def named_files(self) -> list[tuple[str, str]]:
        """Each file as the messages name it (`--metrics m.json`), the run record last."""
        named = [(f"{output.option} {path}", path) for output, path in self.files]
        if self.record is not None:
            named.append((f"the run record {self.record}", self.record))
        return named

    def check(self) -> None:
        for output, path in self.files:
            if identity.is_record_name(path):
                raise UsageError(
                    f"{output.option} {path}: a name ending in {RECORD_SUFFIX} is a run record's"
                    f" (-o FILE keeps its record in FILE{RECORD_SUFFIX}): give another name"
                )
        named: list[tuple[str, str | int]] = [*self.streams, *self.named_files()]
        refuse_inputs(self.inputs, named)
        refuse_shared(self.streams, self.named_files())


def named_inputs(command: CommandConfig, stdin_fd: int) -> list[tuple[str, str | int]]:
    """What `command`'s run reads, as messages name it: each FILE (`-` by standard input's
    descriptor, named `<stdin>`), and with --reverify the materialized inputs whose lines become
    the bodies sent."""
    named: list[tuple[str, str | int]] = [
        (display_name(path), stdin_fd if path == STDIN else path) for path in command.inputs
    ]
    rescoring = command.config.reverify
    if rescoring is not None:
        named.append((f"--reverify {rescoring.materialized}", rescoring.materialized))
    return named


def refuse_inputs(inputs: Iterable[tuple[str, str | int]], outputs: Iterable[tuple[str, str | int]]) -> None:
    """UsageError when an output (a path, or a descriptor such as stdout's) is one of the named
    `inputs` (paths or descriptors): the run would read what it writes and never end, or destroy
    its input. Regular files, as GNU cat tells them, and pipes (`--errors /dev/stdin` would feed
    its records back as rows); a terminal or /dev/null may be read and written."""
    read: dict[tuple[int, int], str] = {}
    for name, source in inputs:
        key = _file_or_pipe(source)
        if key is not None:
            read.setdefault(key, name)
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
        except locks.LockTaken as taken:
            raise in_use(f"{option} {path}", taken.holders) from None
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
        from rollfilter.run.materialize import building, claim  # loaded by the runs that write the file

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
        except locks.LockTaken as taken:
            raise in_use(f"{option} {path}", taken.holders) from None
        except OSError as exc:
            raise UsageError(f"cannot write {option} {path}: {exc.strerror or exc}") from None
        if opened is not None:
            self.callback(os.close, opened.fd)

    def keep_locked(self, fd: int) -> None:
        """Lock the file this run made at `fd` (the one renamed into place) until the run ends."""
        duplicate = os.dup(fd)
        self.callback(os.close, duplicate)
        locks.lock_new_file(duplicate)

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
class OpenedOutputs:
    """A run's outputs as opened, by `OutputKey`: where results, failures and the files written
    whole go. A dry run's (`OpenedOutputs.standard_streams`) are standard output and standard error only."""

    results: int  # -o's descriptor, or standard output's
    results_name: str  # as messages name it: "-o out.jsonl", "standard output"
    appended: Mapping[OutputKey, int] = dataclasses.field(default_factory=dict)  # -o's among them
    whole: Mapping[OutputKey, WholeFile] = dataclasses.field(default_factory=dict)
    names: Mapping[OutputKey, str] = dataclasses.field(default_factory=dict)  # as messages name them
    listening: list[socket.socket] = dataclasses.field(default_factory=list)  # --prometheus's, bound
    materialized: str | None = None  # written by the first pass, when it is done
    keep_locked: Callable[[int], None] | None = None  # what locks the materialized file made, until the end
    record: identity.RunRecord | None = None  # written beside -o before anything is sent
    beside: identity.Beside = dataclasses.field(default_factory=identity.Beside)  # where the record goes, its mode

    @classmethod
    def standard_streams(cls, streams: Environment) -> OpenedOutputs:
        """A dry run's outputs: the bodies on standard output, the rest on standard error."""
        return cls(streams.stdout, "standard output")


class OutputWriters:
    """A writer over each output of a run that lines go to while it runs, made over the files
    `files` opened and standard error (`stderr`): the results, the errors record (None: failures
    go to stderr), --per-task, --dropped and the held file. The command serves each (`every`),
    and `close` ends them in their order; `on_failure` hears of a write that failed."""

    def __init__(
        self, files: OpenedOutputs, stderr: int, on_failure: Callable[[OutputClosed | OutputFailed], None]
    ) -> None:
        def writer(fd: int, name: str) -> BatchWriter:
            return BatchWriter(fd, name=name, on_failure=on_failure)

        self._results_fd = files.results

        self.results = writer(files.results, files.results_name)
        self.stderr = writer(stderr, "standard error")
        appended = {key: writer(fd, files.names[key]) for key, fd in files.appended.items() if key != "output"}
        self.errors = appended.get("errors_file")
        self.per_task = appended.get("per_task_file")
        self.dropped = appended.get("dropped_file")
        self.held = appended.get("held_file")
        named = (self.results, self.errors, self.stderr, self.per_task, self.dropped, self.held)
        self.every = [writer for writer in named if writer is not None]

    def run_outputs(
        self, command: CommandConfig, *, log: LineWriter, fold: Callable[[Failure, bytes], bytes]
    ) -> RunOutputs:
        """What a run of `command` writes its lines to: these writers, failures to --errors or else
        on stderr through `log` (above the display), folded by `fold`; `log` for its messages."""
        results_fd = self._results_fd
        return RunOutputs(
            results=self.results,
            errors=self.errors or log,
            log=log,
            stderr_line=message_line,
            records=self.errors is not None,
            ordered=command.ordered,
            per_task=self.per_task,
            dropped=self.dropped,
            held=self.held,
            results_size=lambda: os.lseek(results_fd, 0, os.SEEK_CUR),
            # An internal error's details are a -v event line (a dry run has none).
            message_of=functools.partial(failure_message, details_hint=not (command.verbose or command.dry_run)),
            fold=fold,
        )

    async def close(self) -> None:
        """Write what each holds, and end it. Standard error is closed last: a status asked for
        (SIGUSR1) while the other outputs are still written, as when a wind-down waits on a full
        stdout, is printed, not dropped. The held file is closed after the results: it is told
        how far they hold whole groups."""
        last = (self.held, self.stderr)
        others = [writer for writer in self.every if writer not in last]
        for group in (others, [self.held] if self.held is not None else [], [self.stderr]):
            for writer in group:
                writer.close()
            for writer in group:
                await writer.drained.wait()


LOCK_POLL_SECONDS = 0.2  # how often --wait-lock tries an output another run holds


async def open_appended(
    command: CommandConfig,
    beside: identity.Beside,
    files: OutputFiles,
    stderr: int,
    say: Callable[[str, int], None],
) -> tuple[dict[OutputKey, int], identity.Beside]:
    """The locked outputs (`Output.locked`) of `command`, opened to append (or, written whole,
    held: --materialized), locked: shared with --append (runs that only add lines may share a
    file), else exclusive; the descriptors of those appended to come back by key, with `beside`
    taking its mode from -o as it was locked. An output another run holds is refused
    (OutputInUse), or with --wait-lock waited for; they are locked in the order of their paths,
    so that two waiting runs never hold one each of what the other waits for. A fresh run's held
    file is emptied, and with --overwrite so are the outputs that must be empty, once locked."""
    fresh_only = not (command.resume or command.append or command.overwrite)
    lock: Lock = "shared" if command.append and not command.resume else "exclusive"
    wanted = [(output, path) for output, path in output_paths(command, beside) if output.locked]
    appended: dict[OutputKey, int] = {}
    for output, path in sorted(wanted, key=lambda given: os.path.realpath(given[1])):
        said = False
        while True:
            try:
                if not output.appended:  # replaced whole: its file is locked
                    files.lock_replaced(path, output.option)
                else:
                    # A file beside -o copies the results: it is never more readable than -o.
                    mode = beside.mode if output.beside_output else 0o666
                    must_be_empty = output.must_be_empty and fresh_only
                    opened = files.open(path, output.option, must_be_empty=must_be_empty, lock=lock, mode=mode)
                    assert opened is not None, "a path is given"
                    appended[output.key] = opened
                    if output.key == "output":  # -o before what is beside it: its name sorts first
                        # Its mode as locked: -o may have changed (or been made) while --wait-lock waited.
                        beside = dataclasses.replace(beside, mode=stat.S_IMODE(os.fstat(opened).st_mode) & 0o666)
                break
            except OutputInUse as taken:
                if not command.wait_lock:
                    raise
                if not said:
                    say(f"{taken.output} is in use by {taken.holder}: waiting for it (--wait-lock)", stderr)
                    said = True
                await trio.sleep(LOCK_POLL_SECONDS)
    for output, path in wanted:
        if output.beside_output and output.key in appended:
            narrow_mode(appended[output.key], beside.mode, path)
    for output, path in wanted if not command.resume else ():
        emptied = output.beside_output or (command.overwrite and output.must_be_empty)
        fd = appended.get(output.key)
        if not emptied or fd is None or not stat.S_ISREG(os.fstat(fd).st_mode):  # a pipe or a device is kept
            continue
        try:
            os.ftruncate(fd, 0)
        except OSError as exc:
            raise UsageError(f"cannot write {output.option} {path}: {exc.strerror}") from None
    return appended, beside


async def open_outputs(
    command: CommandConfig, files: OutputFiles, environment: Environment, control: StopControl
) -> tuple[CommandConfig, OpenedOutputs, Earlier | None] | None:
    """`command`'s outputs opened and locked (`open_appended`, `run_files`), then read under the
    lock: its run record, and what earlier runs left in them (`Earlier`); with the command as
    recorded. None when a stop came while --wait-lock waited. A dry run opens nothing and changes
    no file: it reads what resume skips, and writes on the standard streams."""
    beside = identity.beside(command)  # -o read once, before this run makes it; its mode again once locked
    if command.dry_run:
        command, _ = identity.command_as_recorded(command, beside.record)
        return command, OpenedOutputs.standard_streams(environment), _earlier(command, beside, Earlier.skipped)
    appended: dict[OutputKey, int] = {}
    with control.stoppable():  # a stop while --wait-lock waits: the summary of nothing sent
        appended, beside = await open_appended(command, beside, files, environment.stderr, say)
    if control.cause is not None and "output" not in appended:
        return None
    for caveat in files.caveats:
        say(caveat, environment.stderr)
    command, record = identity.command_as_recorded(command, beside.record)
    earlier = _earlier(command, beside, Earlier.read)  # it cuts torn last lines, and may cut a group off -o
    return command, run_files(command, beside, files, environment, appended, record), earlier


def _earlier(command: CommandConfig, beside: identity.Beside, read: Callable[..., Earlier]) -> Earlier | None:
    """What earlier runs left in the outputs of a resumed run, as `read` reads them."""
    if not (command.resume and command.output):
        return None
    paths = (command.output, command.errors_file, command.materialized_file, command.dropped_file)
    files = EarlierFiles(*paths, held=beside.held)
    groups = command.config.groups
    target = groups.target if groups is not None else None
    return read(files, max_attempts=command.max_attempts, target_groups=target)


def resume_cuts(command: CommandConfig, earlier: Earlier | None) -> list[str]:
    """What reading earlier runs' results cut off -o, a line (none when it cut nothing)."""
    resume = earlier.resume if earlier is not None else None
    if resume is not None and resume.reopened:
        return [
            f"--resume: cut {resume.cut_bytes} bytes of results off -o {command.output}, from the first"
            f" group written incomplete whose failed rollouts run again ({resume.reopened} in all): those"
            " groups are written again, whole, with the groups after them"
        ]
    if resume is not None and resume.cut_bytes:
        return [
            f"--resume: cut {resume.cut_bytes} bytes of results off -o {command.output} that may be a group"
            " a kill left in part: they are written again with their group"
        ]
    return []


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
    beside: identity.Beside,
    files: OutputFiles,
    streams: Environment,
    appended: Mapping[OutputKey, int],
    record: identity.RunRecord | None,
) -> OpenedOutputs:
    """The files of `command`'s run, those written whole checked and opened now (`appended`: the
    descriptors `open_appended` opened)."""
    fresh_only = not (command.resume or command.append or command.overwrite)
    named = output_paths(command, beside)
    whole: dict[OutputKey, WholeFile] = {}
    # The one locked (--materialized) first: a file another run left is refused before anything is made.
    for output, path in sorted(named, key=lambda given: not given[0].locked):
        if output.appended:
            continue
        if output.must_be_empty and fresh_only:
            refuse_earlier_lines(path, output.option)
        opened = files.whole(path, output.option, regular_only=not output.may_be_pipe)  # its folder made and checked
        assert opened is not None, "a path is given"
        if output.key != "materialized_file":  # the first pass writes that one by its path
            whole[output.key] = opened
    if record is not None and beside.record is not None:
        files.remove_if_refused(beside.record)
    out = appended.get("output")
    return OpenedOutputs(
        results=streams.stdout if out is None else out,
        results_name="standard output" if out is None else f"-o {command.output}",
        appended=dict(appended),
        whole=whole,
        names={output.key: f"{output.option} {path}" for output, path in named},
        listening=listening(command, files),
        materialized=command.materialized_file,
        keep_locked=files.keep_locked,
        record=record,
        beside=beside,
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
