"""--summarize: the summary recomputed from result lines and errors records, sending nothing."""

from __future__ import annotations

import dataclasses
import glob
import os
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import trio

from rollfilter.cli.chart import chart_lines
from rollfilter.cli.command import CommandConfig
from rollfilter.cli.environment import Environment
from rollfilter.cli.files import identity
from rollfilter.cli.files.outputs import NamedOutputs, OutputFiles, replace_content
from rollfilter.cli.messages import say, write_stderr
from rollfilter.cli.report import summary_for
from rollfilter.cli.statuses import RunEnd, tracker_status
from rollfilter.config import Config
from rollfilter.errors import UsageError
from rollfilter.figures.compare import Comparison, RunComparison
from rollfilter.formats.source import STDIN, LineReader, check_inputs
from rollfilter.formats.writers import OutputFailed, WholeFile, write_all
from rollfilter.redact import printable
from rollfilter.rows import ROLLOUT_INDEX, parse_row
from rollfilter.run.connect import tls_context_for
from rollfilter.run.recount import ResultCounter
from rollfilter.run.run import Run
from rollfilter.stops import StopCause

_encode = msgspec.json.Encoder().encode
# Beside the first file --summarize reads: the ids of the tracker runs that logged those files.
SUMMARIZED_IDS_SUFFIX = ".summarized.trackers.json"
STDIN_UNCHECKED = (
    "--summarize: shards cannot be checked from standard input (no run record beside its lines):"
    " give the result files themselves, as in rollfilter --summarize shard-*.jsonl"
)


async def summarize(command: CommandConfig, *, environment: Environment) -> RunEnd:
    """Recompute the summary from result lines (and errors records) without sending anything.

    Lines with an `error` object or `_ng_failure_class` and indices are failed attempts; other
    JSON objects are results. Each (task, rollout) pair counts once: as a success if any result
    has it (an attempt that failed, then succeeded on --resume), else as one failure. With
    --repeats K > 1, mean@K and pass@k are computed over tasks. With --aggregate, the results
    go to their agents' /aggregate_metrics in one call per agent (shards aggregated as one).
    The summary goes to stdout (it is this mode's output) and to --metrics FILE; when stdout
    cannot take it (or an output fails), to stderr too, after the line that says so (exit status 74);
    standard output and standard error are `environment`'s."""
    config = command.config
    check_inputs(command.inputs)
    baseline = _Baseline.of(command, stdin_fd=environment.stdin)
    NamedOutputs(command, environment, summarize=True).check()
    shards = identity.shard_coverage(command.inputs)
    reader = LineReader(command.inputs, max_line_bytes=command.max_line_bytes, stdin_fd=environment.stdin)
    counted_failed: OutputFailed | None = None
    # Made before the files are opened, so that a CA file that cannot serve is refused with none left.
    # It talks only to the agents' /aggregate_metrics, with --aggregate.
    per_task = _PerTask(command.per_task_file)
    tls = tls_context_for(config) if config.aggregate else None
    coverage = shards.summary() if shards is not None else None
    config, tracking = _tracked(command, environment.stderr)
    run = Run(config, tls=tls, on_task=per_task.write, baseline=baseline.comparison, shards=coverage, **tracking)
    unclustered = _Unclustered(run.tasks is None)
    counter = ResultCounter(run, unclustered.result)
    with OutputFiles() as files:
        metrics_file = files.whole(command.metrics_file, "--metrics")
        aggregate_file = files.whole(command.aggregate_file, "--aggregate")
        per_task.fd = files.open(command.per_task_file, "--per-task", lock="exclusive")
        try:
            await run.connect(send=False)
            try:
                await baseline.read()
                await _count(reader, counter)
            except OutputFailed as failure:  # its temporary file: the summary says how far it got
                counted_failed = failure
                run.control.stop(StopCause.OUTPUT_FAILED, str(failure))  # no aggregate of a part
            await run.finish()  # --per-task's lines, and the aggregate
        finally:
            reader.close()
            baseline.close()
            with trio.CancelScope(shield=True):
                await run.aclose()
        figures = run.summary()  # with no timings: the files hold none
        summary = _encode(figures) + b"\n"
        report = run.report
        failures = [failed for failed in (counted_failed, per_task.failure) if failed is not None]
        for failed in failures:
            say(str(failed), environment.stderr)
        writes: list[tuple[WholeFile | int | None, bytes]] = [
            (aggregate_file, report.file_bytes() if report is not None else b""),
            (environment.stdout, summary),
            (metrics_file, summary),
        ]
        for target, data in writes:
            try:
                if isinstance(target, int):
                    write_all(target, summary_for(data, environment.stdout_is_terminal), "standard output")
                elif data:
                    replace_content(target, data)
            except OutputFailed as failure:
                failures.append(failure)
                say(str(failure), environment.stderr)
                if isinstance(target, int):
                    write_stderr(environment.stderr, summary)  # the figures are not lost with their output
        # After the summary is out: a signal that cuts the trackers' wait short loses nothing else.
        await run.end_tracking(tracker_status(run.control.cause, failed=counted_failed is not None))
    for line in chart_lines(figures, can_draw=environment.stderr_can_draw):
        write_stderr(environment.stderr, line.encode() + b"\n")
    lost = [*counter.unusable.problems(), *reader.problems, *baseline.problems]
    aggregated = [f"--aggregate: {problem}" for problem in (report.problems if report is not None else ())]
    unmatched = [f"--summarize: {problem}" for problem in (shards.problems if shards is not None else ())]
    unmatched += baseline.shard_problems
    for problem in [*lost, *aggregated, *unmatched]:
        say(problem, environment.stderr)
    unchecked = [STDIN_UNCHECKED] if STDIN in command.inputs else []  # a check not made is said, not passed over
    for note in [*unchecked, *baseline.notes(run.statistics().comparison), *unclustered.notes()]:
        say(note, environment.stderr)
    return RunEnd(incomplete=bool(lost or unmatched), output_failed=bool(failures))


def _tracked(command: CommandConfig, stderr: int) -> tuple[Config, dict[str, Any]]:
    """The config of a --summarize that logs to trackers, with their ids kept beside its first
    file by name (`FILE.summarized.trackers.json`) for the same files summarized again, and what its Run
    takes for them: the params (what the files' run records agree on, when each has one), the
    files the ids are kept for, and where warnings go."""
    config = command.config
    if config.trackers is None or STDIN in command.inputs:
        return config, {}
    paths = [os.path.realpath(path) for path in command.inputs]
    # Beside the first by name: the same files given in another order find the same tracker runs.
    trackers = dataclasses.replace(config.trackers, ids_file=min(paths) + SUMMARIZED_IDS_SUFFIX)
    shared = _shared_record(paths)
    tracked = shared if shared is not None else {"inputs": [os.path.basename(p) for p in paths]}
    on_warning: Callable[[str], None] = lambda text: say(text, stderr)  # noqa: E731
    tracking = {"tracked": tracked, "tracking_key": "\n".join(sorted(paths)), "on_warning": on_warning}
    return dataclasses.replace(config, trackers=trackers), tracking


def _shared_record(paths: Sequence[str]) -> dict[str, Any] | None:
    """The fields the run records beside `paths` hold alike (shards' `shard` differs, and is left
    out), as what is true of the files together; None when a file has no record that can be read."""
    records: list[dict[str, Any]] = []
    for path in paths:
        try:
            record = identity.read_record(identity.record_path(path))
        except UsageError:  # a record that cannot be read: the files' summary says enough
            record = None
        if record is None:
            return None
        records.append(msgspec.to_builtins(record))
    first, *others = records
    return {field: value for field, value in first.items() if all(other.get(field) == value for other in others)}


async def _count(reader: LineReader, counter: ResultCounter) -> None:
    """Count each line read into the counter's run, then the failed attempts that no result has.
    OutputFailed when the failures cannot be held."""
    try:
        while (line := await reader.next_line()) is not None:
            counter.line(line)
    except BaseException:
        counter.close()
        raise
    counter.finish()


class _Baseline:
    """--compare BASELINE: the other run's results, read before these into the comparison
    (`compare.RunComparison`) that the run adds these to and makes at its end. Lines of BASELINE
    that are not JSON objects are left out, and said: the exit status is 1, as for the results'
    own."""

    @classmethod
    def of(cls, command: CommandConfig, *, stdin_fd: int) -> _Baseline:
        """`command`'s baseline; UsageError for a file that cannot be read, or a second standard input."""
        paths = baseline_files(command.compare_files)
        check_inputs(paths)
        if STDIN in paths and STDIN in command.inputs:
            raise UsageError("--compare - and the results cannot both be read from standard input")
        return cls(paths, max_line_bytes=command.max_line_bytes, stdin_fd=stdin_fd)

    def __init__(self, paths: tuple[str, ...], *, max_line_bytes: int, stdin_fd: int) -> None:
        self.comparison = RunComparison() if paths else None
        self._reader = LineReader(paths, max_line_bytes=max_line_bytes, stdin_fd=stdin_fd) if paths else None
        self.problems: list[str] = []
        # A baseline in shards is checked as --summarize checks its own: a shard missing is named.
        coverage = identity.shard_coverage(paths) if paths else None
        self.shard_problems = [f"--compare: {problem}" for problem in (coverage.problems if coverage else ())]

    async def read(self) -> None:
        if self._reader is None or self.comparison is None:
            return
        unusable, first = 0, ""
        while (line := await self._reader.next_line()) is not None:
            if line.data is not None and not line.data.strip():
                continue
            record = parse_row(line.data, exact=True) if line.data is not None else (line.problem or "too long")
            if isinstance(record, str):
                first = first or printable(f"{line.source}:{line.number}: {record}")
                unusable += 1
                continue
            self.comparison.add_baseline(record)
        self.problems += [f"--compare: {problem}" for problem in self._reader.problems]
        if unusable:
            lines = "1 line is not a result" if unusable == 1 else f"{unusable} lines are not results"
            self.problems.append(f"--compare: {lines}, left out; the first: {first}")

    def notes(self, compared: Comparison | None) -> list[str]:
        """What the comparison `compared` left out, a line."""
        if compared is None or not (compared.only_in_baseline or compared.only_in_run or compared.without_task):
            return []
        note = (
            f"--compare: {compared.paired} tasks compared; left out: {compared.only_in_baseline} in the baseline"
            f" only, {compared.only_in_run} in these results only"
        )
        return [note + (f", {compared.without_task} results with no task" if compared.without_task else "")]

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()


def baseline_files(patterns: Sequence[str]) -> tuple[str, ...]:
    """--compare's files: each pattern with a wildcard (`*`, `?`, `[`) that names no file itself is
    expanded as the shell would (sorted; run records left out), so that a baseline in shards can
    be given quoted as one: `--compare 'A-*.jsonl'`. UsageError for a pattern that matches no file."""
    paths: list[str] = []
    for pattern in patterns:
        if pattern == STDIN or not any(character in pattern for character in "*?[") or os.path.lexists(pattern):
            paths.append(pattern)
            continue
        matches = sorted(path for path in glob.glob(pattern) if not identity.is_record_name(path))
        if not matches:
            raise UsageError(f"--compare {printable(pattern)}: no file matches it")
        paths += matches
    return tuple(paths)


class _Unclustered:
    """Without -r K, each rollout counts as a task of its own for the error bars: said once when the
    results hold a task's second rollout, whose rollouts are not independent (the bars too small)."""

    def __init__(self, unclustered: bool) -> None:
        self._unclustered = unclustered
        self.seen = False

    def result(self, record: dict[str, Any]) -> None:
        if self._unclustered and not self.seen:
            rollout = record.get(ROLLOUT_INDEX)
            self.seen = type(rollout) is int and rollout > 0

    def notes(self) -> list[str]:
        if not self.seen:
            return []
        return [
            "--summarize: the results hold several rollouts a task: give -r K for error bars clustered by task"
            " (without it, each rollout counts as a task, and the bars are too small)"
        ]


class _PerTask:
    """--per-task FILE: one line a task, written as the tasks' figures are made; the first write
    that fails is kept, and nothing more is written."""

    def __init__(self, path: str | None) -> None:
        self.name = f"--per-task {path}"
        self.fd: int | None = None
        self.failure: OutputFailed | None = None

    def write(self, record: dict[str, Any]) -> None:
        if self.fd is None or self.failure is not None:
            return
        try:
            write_all(self.fd, _encode(record) + b"\n", self.name)
        except OutputFailed as failure:
            self.failure = failure
