"""A run's record of what shapes its bodies, kept beside `-o OUT.jsonl` as `OUT.jsonl.run.json`.

The record holds a digest of each input file and the options that change what is sent: `-p`, `-a`,
`-r`, `--repeat-seeds`, `--shard` and `-n`, and those that change which groups are written:
`--groups`, `--drop-uniform` and `--group-field`. `--resume` checks it, so that an output is only ever
finished with the inputs and options that began it (a larger `-r` only adds rollouts, so it is
allowed), and takes the shard from it. `--summarize` reads the records beside shard outputs to say
which shards of N it was given.

It is a file of its own rather than fields in the result lines: the results stay exactly what NeMo
Gym writes and reads (its resume, its aggregation, and `/aggregate_metrics` see no new key), a shard
that finished no rollout still says what it is, and nothing is added to the per-row path. NeMo Gym's
readers take `*.jsonl` files, and the record is `.json`. Its name is the output's whole name and a
suffix, so two outputs never share one (`a.jsonl` and `a.json` each have their own), and no output
may be given a name with that suffix: it would be another run's record.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
from collections.abc import Sequence
from typing import Any

import msgspec

from rollfilter.cli.command import CommandConfig
from rollfilter.errors import UsageError
from rollfilter.formats.source import STDIN
from rollfilter.formats.writers import WholeFile

RECORD_SUFFIX = ".run.json"
_encode = msgspec.json.Encoder().encode


class InputDigest(msgspec.Struct, frozen=True):
    """One input as it was read: its name, and the SHA-256 of its bytes (None for standard input,
    which cannot be read twice)."""

    name: str
    sha256: str | None


class RunRecord(msgspec.Struct, frozen=True, kw_only=True):
    """What shaped a run's bodies. Fields are never renamed: records outlive versions."""

    inputs: tuple[InputDigest, ...]
    params: tuple[tuple[str, Any], ...] = ()
    agent: str | None = None
    repeats: int | None = 1  # None: only the agents of repeats_by_agent (other rows fail)
    repeats_by_agent: dict[str, int] = msgspec.field(default_factory=dict)
    repeat_seeds: bool = False
    shard: tuple[int, int] | None = None
    limit: int | None = None
    groups: bool = False
    drop_uniform: bool = False
    group_field: str | None = None  # with drop_uniform
    reverify: InputDigest | None = None  # re-scoring: the materialized inputs the bodies came from
    judge_failed_only: bool = False  # with reverify


_decode_record = msgspec.json.Decoder(RunRecord).decode


def record_path(output: str) -> str:
    """Where the record of the run writing `output` lives: `OUT.jsonl.run.json` beside `OUT.jsonl`, the
    file itself (a symlink's target: `-o /dev/stdout > OUT.jsonl` keeps it beside OUT.jsonl too)."""
    return os.path.realpath(output) + RECORD_SUFFIX


def is_record_name(path: str) -> bool:
    """Whether `path` (or the file a symlink names) is named as a run record is."""
    return any(
        os.path.basename(name).endswith(RECORD_SUFFIX) and os.path.basename(name) != RECORD_SUFFIX
        for name in (path, os.path.realpath(path))
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Beside:
    """The files a run keeps beside its -o, as `beside` reads them off -o once: its run record and
    its held file, made with `mode`, never more readable or writable than -o."""

    record: str | None = None  # None: no -o, --append (which mixes runs on purpose), or -o /dev/null, a pipe
    held: str | None = None  # `CommandConfig.held_file`, where -o may have files beside it
    mode: int = 0o666


def beside(command: CommandConfig) -> Beside:
    """What the run `command` describes keeps beside its -o (`Beside`)."""
    output = command.output
    if output is None or not may_hold_a_record(output):
        return Beside()
    return Beside(None if command.append else record_path(output), command.held_file, beside_mode(output))


def file_digest(path: str) -> str:
    """The SHA-256 of a file's bytes, in hex."""
    try:
        with open(path, "rb") as file:
            return hashlib.file_digest(file, "sha256").hexdigest()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def record_of(command: CommandConfig) -> RunRecord:
    """The record of the run `command` describes (it reads every input file once)."""
    config, groups = command.config, command.config.groups
    drop_uniform = groups is not None and groups.drop_uniform
    inputs = tuple(
        InputDigest(STDIN if path == STDIN else os.path.basename(path), None if path == STDIN else file_digest(path))
        for path in command.inputs
    )
    record = RunRecord(
        inputs=inputs,
        params=config.params,
        agent=config.agent,
        repeats=config.repeats.default,
        repeats_by_agent=dict(config.repeats.by_agent),
        repeat_seeds=config.repeats.seeds,
        shard=config.shard,
        limit=config.limit,
        groups=groups is not None,
        drop_uniform=drop_uniform,
        group_field=groups.field if groups is not None and drop_uniform else None,
        reverify=_materialized_digest(config.reverify.materialized) if config.reverify is not None else None,
        judge_failed_only=config.reverify is not None and config.reverify.judge_failed_only,
    )
    return _decode_record(_encode(record))  # as it reads back from the file, so that the two compare


def _materialized_digest(path: str) -> InputDigest:
    """The materialized file re-scoring joins with, by name and content (None: it cannot be read,
    which the run itself reports)."""
    try:
        digest: str | None = file_digest(path)
    except UsageError:
        digest = None
    return InputDigest(os.path.basename(path), digest)


def read_record(path: str) -> RunRecord | None:
    """The record at `path`; None when there is none; UsageError when it cannot be read."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(f"cannot read the run record {path}: {exc.strerror}") from None
    try:
        return _decode_record(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UsageError(f"the run record {path} is not one rollfilter wrote ({exc}): move it away") from None


def write_record(path: str, record: RunRecord, *, mode: int = 0o666) -> None:
    """Replace the record at `path` whole: a reader sees the old record or the new, never a torn one
    (made with `mode`, less the umask). UsageError when its folder cannot be written, OutputFailed
    when the write fails."""
    file = WholeFile(path, "the run record", mode=mode)
    try:
        file.replace(_encode(record) + b"\n")
    finally:
        file.close()


def command_as_recorded(command: CommandConfig, path: str | None) -> tuple[CommandConfig, RunRecord | None]:
    """The command as it will run, with the shard its `-o`'s record (at `path`, `Beside.record`)
    names when it names one, and the record to keep there (None: no record).

    On --resume, an output that has a record is finished only with the inputs and options that
    began it: anything else is a UsageError naming what differs, before anything is sent. The
    shard comes from the record unless --shard I/N is given (--shard auto does not count: a
    resubmitted array task sees another array). A shard --shard auto makes must agree with the
    shards of the same run recorded beside -o (see `check_sibling_shards`). --append mixes runs
    on purpose: no record.
    """
    if path is None:
        return command, None
    recorded = read_record(path) if command.resume else None
    if recorded is not None and recorded.shard is not None and (command.config.shard is None or command.shard_auto):
        config = dataclasses.replace(command.config, shard=recorded.shard)
        command = dataclasses.replace(command, config=config)
    record = record_of(command)
    if recorded is not None:
        problems = differences(recorded, record)
        if problems:
            raise UsageError(
                f"--resume: {command.output} was made from other inputs or options (its record is {path}):"
                f" {'; '.join(problems)}; give the same, or a new -o"
            )
    elif command.shard_auto:
        check_sibling_shards(record, path)
    return command, record


def check_sibling_shards(record: RunRecord, path: str) -> None:
    """UsageError when the shard --shard auto made of this array task (in `record`, to be kept at
    `path`) is not one of the shards the records beside it give for the same run: shards of
    another N (a part of an array resubmitted: its tasks see an array of their own), or the same
    shard kept by another output. A task that never started has no record, but the others do."""
    assert record.shard is not None
    index, count = record.shard
    directory = os.path.dirname(path)
    try:
        names = sorted(name for name in os.listdir(directory) if name.endswith(RECORD_SUFFIX))
    except OSError:
        return
    for name in names:
        other_path = os.path.join(directory, name)
        try:
            other = read_record(other_path) if other_path != path else None
        except UsageError:  # not a record this run can read: not one of its shards
            continue
        if other is None or other.shard is None or _unlike_shards(record, other, ("here", "there")):
            continue
        other_output = other_path.removesuffix(RECORD_SUFFIX)
        made = f"--shard auto makes this array task shard {index}/{count}"
        first = "give --shard I/N, the shard this task had in the array first submitted"
        if other.shard[1] != count:
            raise UsageError(
                f"{made}, but {other_output} is shard {_shard(other.shard)} of the same run:"
                f" a part of an array submitted again sees an array of its own; {first}"
            )
        if other.shard[0] == index:
            raise UsageError(f"{made}, which {other_output} holds already; {first}")


def keep(record: RunRecord | None, files: Beside) -> None:
    """Write the record beside -o (`files.record`), once the outputs are open and before anything is sent."""
    if record is not None and files.record is not None:
        write_record(files.record, record, mode=files.mode)


def may_hold_a_record(output: str) -> bool:
    """Whether a file may be kept beside `output` (its record, its held file): when it is a regular
    file with a name of its own, or not there yet. -o /dev/null or a pipe gets none; nor does a
    file with no name (`-o /dev/stdout` onto an anonymous or deleted file, whose real path is
    `#N (deleted)`): a file made beside it would take a name no later run finds, or another's."""
    # The path is stat()ed as given: the realpath of /dev/stdout on a pipe is no path at all ("pipe:[N]").
    try:
        info = os.stat(output)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_nlink > 0 and _found_at_real_path(output, info)


def _found_at_real_path(output: str, info: os.stat_result) -> bool:
    try:
        return os.path.samestat(info, os.stat(os.path.realpath(output)))
    except OSError:
        return False


def beside_mode(output: str) -> int:
    """The mode for a file made beside `output`: never more readable or writable than `output`."""
    try:
        return stat.S_IMODE(os.stat(output).st_mode) & 0o666
    except OSError:
        return 0o666  # not made yet: it will have the umask's mode, as a file made beside it


def differences(recorded: RunRecord, current: RunRecord, *, words: tuple[str, str] = ("then", "now")) -> list[str]:
    """What differs when an output made as `recorded` is resumed as `current`, one phrase each
    ("-p: temperature=0.7 then, none now"). A larger -r is no difference: it adds rollouts to the
    same bodies."""
    then_word, now_word = words
    compared = [
        ("-p", _params(recorded.params), _params(current.params)),
        ("-a", _none(recorded.agent), _none(current.agent)),
        ("--repeat-seeds", _on(recorded.repeat_seeds), _on(current.repeat_seeds)),
        ("-n", _none(recorded.limit), _none(current.limit)),
        ("--shard", _shard(recorded.shard), _shard(current.shard)),
        ("--groups", _on(recorded.groups), _on(current.groups)),
        ("--drop-uniform", _on(recorded.drop_uniform), _on(current.drop_uniform)),
        ("--group-field", _none(recorded.group_field), _none(current.group_field)),
        ("--reverify", _materialized(recorded.reverify), _materialized(current.reverify)),
        ("--judge-failed-only", _on(recorded.judge_failed_only), _on(current.judge_failed_only)),
    ]
    found = _input_differences(recorded.inputs, current.inputs)
    found += [f"{option}: {then} {then_word}, {now} {now_word}" for option, then, now in compared if then != now]
    if recorded.groups and (recorded.repeats, recorded.repeats_by_agent) != (current.repeats, current.repeats_by_agent):
        found.append(f"-r: {_repeats(recorded)} {then_word}, {_repeats(current)} {now_word} (a group keeps its size)")
    elif not _repeats_cover(recorded, current):
        found.append(
            f"-r: {_repeats(recorded)} {then_word}, {_repeats(current)} {now_word} (only a larger -r adds to an output)"
        )
    return found


def _materialized(digest: InputDigest | None) -> str:
    if digest is None:
        return "none"
    return digest.name + ("" if digest.sha256 is None else f" ({digest.sha256[:12]})")


def _unlike_shards(first: RunRecord, other: RunRecord, words: tuple[str, str]) -> list[str]:
    """What differs between two shards' records besides the shard: -r too must be the same."""
    other = msgspec.structs.replace(other, shard=first.shard)
    return differences(first, other, words=words) or differences(other, first, words=words[::-1])


def _input_differences(then: Sequence[InputDigest], now: Sequence[InputDigest]) -> list[str]:
    if len(then) != len(now):
        return [f"inputs: {_names(then)} then, {_names(now)} now"]
    found = []
    for number, (old, new) in enumerate(zip(then, now, strict=True), 1):
        if old.sha256 == new.sha256:
            continue
        if old.sha256 and new.sha256 and old.name == new.name:
            found.append(f"input {number} ({new.name}): other bytes than then")
        else:
            found.append(f"input {number}: {_name(old)} then, {_name(new)} now")
    return found


def _names(inputs: Sequence[InputDigest]) -> str:
    return " ".join(map(_name, inputs)) or "none"


def _name(digest: InputDigest) -> str:
    return "standard input" if digest.sha256 is None else digest.name


def _params(params: Sequence[tuple[str, Any]]) -> str:
    return " ".join(f"{key}={_encode(value).decode()}" for key, value in params) or "none"


def _repeats(record: RunRecord) -> str:
    default = [] if record.repeats is None else [str(record.repeats)]
    return " ".join([*default, *(f"{name}={k}" for name, k in sorted(record.repeats_by_agent.items()))])


def _repeats_cover(recorded: RunRecord, current: RunRecord) -> bool:
    """Whether every agent's rows get at least the rollouts they had (rows of an agent without a
    repeat count failed, so any count now only adds)."""

    def at_least(now: int | None, then: int | None) -> bool:
        return then is None or (now is not None and now >= then)

    agents = recorded.repeats_by_agent.keys() | current.repeats_by_agent.keys()
    return at_least(current.repeats, recorded.repeats) and all(
        at_least(
            current.repeats_by_agent.get(name, current.repeats), recorded.repeats_by_agent.get(name, recorded.repeats)
        )
        for name in agents
    )


def _shard(shard: tuple[int, int] | None) -> str:
    return "none" if shard is None else f"{shard[0]}/{shard[1]}"


def _on(flag: bool) -> str:
    return "on" if flag else "off"


def _none(value: object) -> str:
    return "none" if value is None else str(value)


@dataclasses.dataclass(frozen=True, slots=True)
class ShardCoverage:
    """Which shards of N a set of result files holds, as their records say."""

    of: int
    present: tuple[int, ...]
    missing: tuple[int, ...]
    problems: tuple[str, ...]  # one line each: a missing shard, one given twice, a file that does not fit
    unchecked: bool = False  # standard input was read too: a shard not among the files may be there

    def summary(self) -> dict[str, Any]:
        missing = None if self.unchecked else list(self.missing)  # None: not known
        return {"of": self.of, "present": list(self.present), "missing": missing}


def shard_coverage(paths: Sequence[str]) -> ShardCoverage | None:
    """The coverage of the result files `paths`, from the records beside them; None when none of
    them is a shard (standard input has no record, so with it among `paths` no shard is missing
    for sure: `unchecked`)."""
    records = [(path, read_record(record_path(path))) for path in paths if path != STDIN]
    shards = [(path, record, record.shard) for path, record in records if record is not None and record.shard]
    if not shards:
        return None
    first_path, first, (_, count) = shards[0]
    problems: list[str] = []
    files_of: dict[int, list[str]] = {}
    for path, record, (index, of) in shards:
        if of != count:
            problems.append(f"{path} is shard {index}/{of}, but {first_path} is one of {count}")
            continue
        files_of.setdefault(index, []).append(path)
        unlike = _unlike_shards(first, record, (f"in {first_path}", "here"))
        if unlike:
            problems.append(f"{path} is not from the run {first_path} is from: {'; '.join(unlike)}")
    # A file without a record may be an errors record, or NeMo Gym's: its shard is unknown, not wrong.
    problems += [
        f"{path} is not a shard: its run had no --shard"
        for path, record in records
        if record is not None and record.shard is None
    ]
    problems += [
        f"shard {index}/{count} is given {len(files)} times: {' '.join(files)}"
        for index, files in sorted(files_of.items())
        if len(files) > 1
    ]
    missing = tuple(i for i in range(count) if i not in files_of)
    unchecked = STDIN in paths  # no record there: its lines may be the shards the files lack
    if missing and not unchecked:
        present = ", ".join(map(str, sorted(files_of))) or "none"
        problems.append(
            f"shard{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} of {count}"
            f" {'are' if len(missing) > 1 else 'is'} missing (present: {present})"
        )
    return ShardCoverage(count, tuple(sorted(files_of)), missing, tuple(problems), unchecked)
