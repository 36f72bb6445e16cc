"""The command-line run: files and descriptors, writers, signals, the demo agent, the summary.

`run` owns the services nursery (writers, signal and stdout watchers, the in-process demo
agent) around the engine's nursery, and returns the exit status. It raises only
`RollfilterError` (before anything is sent) and unexpected bugs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import stat
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import trio

from rollfilter import demo as demo_agent
from rollfilter.client import Router, transport_for
from rollfilter.config import Config
from rollfilter.dispatch import Engine, RunControl, describe, prepare, reward_of
from rollfilter.errors import ErrorKind, ExitStatus, UsageError
from rollfilter.metrics import Metrics
from rollfilter.outcome import RowFailure
from rollfilter.plan import ROLLOUT_INDEX, TASK_INDEX, Job, ResumeIndex, drop_torn_tail, parse_row
from rollfilter.sink import BatchWriter, LineWriter, OutputClosed, OutputFailed, Release, Reorderer, write_all
from rollfilter.source import STDIN, LineReader, check_inputs
from rollfilter.tasks import TaskStats
from rollfilter.transport import shown

_encode = msgspec.json.Encoder().encode
APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT


@dataclasses.dataclass(frozen=True, slots=True)
class Streams:
    """The descriptors a run reads and writes; tests pass their own."""

    stdin: int = 0
    stdout: int = 1
    stderr: int = 2


def open_for_append(path: str, option: str) -> int:
    try:
        return os.open(path, APPEND_FLAGS, 0o666)
    except OSError as exc:
        raise UsageError(f"cannot write {option} {path}: {exc.strerror}") from None


def error_record(job: Job, failure: RowFailure) -> dict[str, Any]:
    """One line of the errors record: the row as sent, where it came from, what went wrong."""
    record: dict[str, Any] = {
        "source": job.source,
        "line": job.line,
        TASK_INDEX: job.task_index,
        ROLLOUT_INDEX: job.rollout_index,
        "attempts": failure.attempts,
        "error": {"kind": failure.kind.value, "status": failure.status, "message": failure.message},
    }
    if job.row is not None:
        record["row"] = msgspec.Raw(job.body)
    else:
        record["raw"] = job.body.decode(errors="backslashreplace")
    return record


def error_message(job: Job, failure: RowFailure, repeats: int) -> str:
    """The one-line stderr report of a failed row."""
    where = f"{job.source}:{job.line}"
    if repeats > 1:
        where += f" (rollout {job.rollout_index})"
    tries = f" (after {failure.attempts} attempts)" if failure.attempts > 1 else ""
    return f"rollfilter: {where}: {failure.kind.value}: {failure.message}{tries}"


class LineSink:
    """Writes results as JSON lines and failures as records or stderr lines."""

    def __init__(self, results: LineWriter, errors: LineWriter, *, records: bool, ordered: bool, repeats: int) -> None:
        self._results = results
        self._errors = errors
        self._records = records
        self._repeats = repeats
        self._reorderer = Reorderer() if ordered else None

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None:
        line = _encode(result) + b"\n"
        if self._reorderer is None:
            self._results.write(line, release)
        else:
            self._reorderer.emit(job.seq, lambda: self._results.write(line, release))

    def failure(self, job: Job, failure: RowFailure, release: Release) -> None:
        if self._records:
            self._errors.write(_encode(error_record(job, failure)) + b"\n")
        else:
            self._errors.write(error_message(job, failure, self._repeats).encode(errors="replace") + b"\n")
        if self._reorderer is None:
            release()
        else:
            self._reorderer.emit(job.seq, release)

    def flush_held(self) -> None:
        """Write what --ordered still holds behind unfinished rows (the run was stopped)."""
        if self._reorderer is not None:
            self._reorderer.flush()


async def _watch_signals(control: RunControl, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        task_status.started()
        async for signum in signals:
            status = ExitStatus.INTERRUPTED if signum == signal.SIGINT else ExitStatus.TERMINATED
            if control.scope.cancel_called:
                os._exit(status)  # a signal during the wind-down: leave now
            control.stop(status)


async def _watch_reader_gone(fd: int, on_gone: Callable[[], None]) -> None:
    # The write end of a pipe polls as an error once its reader is gone, so `| head`
    # stops the run at once rather than at the next result.
    await trio.lowlevel.wait_readable(fd)
    on_gone()


def _is_pipe(fd: int) -> bool:
    try:
        return stat.S_ISFIFO(os.fstat(fd).st_mode)
    except OSError:
        return False


class OutputFiles(contextlib.ExitStack):
    """The files a run appends to, opened (and checked) before anything is sent."""

    def open(self, path: str | None, option: str) -> int | None:
        if path is None:
            return None
        fd = open_for_append(path, option)
        self.callback(os.close, fd)
        return fd


def _summary_bytes(metrics: Metrics, tasks: TaskStats | None, stopped: str | None) -> bytes:
    return _encode(metrics.summary(stopped=stopped, tasks=tasks)) + b"\n"


def _write_metrics_file(fd: int | None, summary: bytes, path: str | None) -> None:
    """Replace the --metrics file's content with `summary`; OutputFailed when it cannot."""
    if fd is None:
        return
    name = f"--metrics {path}"
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.ftruncate(fd, 0)
    except OSError as exc:
        raise OutputFailed(name, exc) from None
    write_all(fd, summary, name)


@dataclasses.dataclass(frozen=True, slots=True)
class Presentation:
    """What a command-line run adds around the engine: the demo agent, signals, what it shows."""

    demo: demo_agent.DemoOptions | None = None
    handle_signals: bool = True
    quiet: bool = False
    progress: bool | None = None  # None: on when stderr is a terminal
    verbose: bool = False
    dry_run: bool = False


async def run(config: Config, *, streams: Streams = Streams(), show: Presentation = Presentation()) -> ExitStatus:
    """Run the rollouts `config` describes; return the exit status. Prints the summary."""
    check_inputs(config.inputs)
    if config.url is None and not config.endpoints and config.head_server is None and show.demo is None:
        raise UsageError("no agent to send to: give -u URL, -e NAME=URL, --head-server URL, or --demo")
    resume = None
    if config.resume and config.output:
        drop_torn_tail(config.output)
        resume = ResumeIndex.from_file(config.output, config.repeats)
    with OutputFiles() as files:
        out_fd = files.open(config.output, "-o")
        err_fd = files.open(config.errors_file, "--errors")
        files_fds = _Fds(
            out=streams.stdout if out_fd is None else out_fd,
            err=streams.stderr if err_fd is None else err_fd,
            metrics=files.open(config.metrics_file, "--metrics"),
            per_task=files.open(config.per_task_file, "--per-task"),
        )
        return await _run_open(config, streams, files_fds, resume, show)


@dataclasses.dataclass(frozen=True, slots=True)
class _Fds:
    out: int
    err: int
    metrics: int | None
    per_task: int | None


async def _run_open(
    config: Config, streams: Streams, fds: _Fds, resume: ResumeIndex | None, show: Presentation
) -> ExitStatus:
    control = RunControl()
    metrics = Metrics()
    transport = transport_for(config)
    write_failures: list[OutputFailed] = []

    def output_failed(failure: OutputClosed | OutputFailed) -> None:
        # A write that fails stops the run as Ctrl-C does; a closed pipe stops it quietly.
        if isinstance(failure, OutputClosed):
            control.stop(ExitStatus.BROKEN_PIPE)
        else:
            write_failures.append(failure)
            control.stop(ExitStatus.OUTPUT_FAILED, str(failure))

    def writer_for(fd: int, name: str) -> BatchWriter:
        return BatchWriter(fd, name=name, on_failure=output_failed)

    results = writer_for(fds.out, f"-o {config.output}" if config.output else "standard output")
    stderr_lines = writer_for(streams.stderr, "standard error")
    errors = writer_for(fds.err, f"--errors {config.errors_file}") if fds.err != streams.stderr else stderr_lines
    per_task = writer_for(fds.per_task, f"--per-task {config.per_task_file}") if fds.per_task is not None else None
    writers = list(dict.fromkeys(w for w in (results, errors, stderr_lines, per_task) if w is not None))
    display = None
    if not show.dry_run and progress_wanted(show.progress, quiet=show.quiet, stderr_fd=streams.stderr):
        from rollfilter.progress import ProgressDisplay

        display = ProgressDisplay(metrics, force_terminal=bool(show.progress))
    # While the display is up, stderr lines are printed above it instead of through it.
    log: LineWriter = display if display is not None else stderr_lines
    sink = LineSink(
        results,
        log if errors is stderr_lines else errors,
        records=config.errors_file is not None,
        ordered=config.ordered,
        repeats=config.repeats,
    )
    tasks = None
    if config.repeats > 1:
        on_task = (lambda record: per_task.write(_encode(record) + b"\n")) if per_task is not None else None
        tasks = TaskStats(config.repeats, config.pass_threshold, on_task)
    reader = LineReader(config.inputs, max_line_bytes=config.max_line_bytes, stdin_fd=streams.stdin)
    router: Router | None = None
    events = (lambda text: log.write(f"rollfilter: {text}\n".encode(errors="replace"))) if show.verbose else None

    try:
        async with trio.open_nursery() as services:
            for writer in writers:
                services.start_soon(writer.run)
            if show.handle_signals:
                await services.start(_watch_signals, control)
            if fds.out == streams.stdout and _is_pipe(fds.out):
                services.start_soon(_watch_reader_gone, fds.out, lambda: control.stop(ExitStatus.BROKEN_PIPE))
            if show.demo is not None:
                demo = show.demo
                port = await services.start(
                    lambda task_status: demo_agent.serve(demo_agent.DemoAgent(demo), task_status=task_status)
                )
                config = dataclasses.replace(config, url=f"http://127.0.0.1:{port}/run")
            engine = await prepare(
                config,
                source=reader,
                sink=sink,
                transport=transport,
                control=control,
                metrics=metrics,
                tasks=tasks,
                resume=resume,
                on_event=events,
            )
            router = engine.router
            if display is not None:
                total = _known_total(config)
                services.start_soon(display.run, total)
            if show.dry_run:
                with control.scope:
                    await dry_run(engine, results, log)
            else:
                await engine.run()
            if control.status is not None:
                sink.flush_held()
            for writer in writers:
                writer.close()
            for writer in writers:
                await writer.drained.wait()
            services.cancel_scope.cancel()
    finally:
        reader.close()
        await transport.aclose()
    metrics.replicas = router.replica_counts() if router is not None else []
    status = control.status
    if status is None:
        status = ExitStatus.ROWS_FAILED if metrics.failed else ExitStatus.OK
    stopped = control.reason or (status.name.lower().replace("_", " ") if control.status else None)
    summary = _summary_bytes(metrics, tasks, stopped)
    try:
        _write_metrics_file(fds.metrics, summary, config.metrics_file)
    except OutputFailed as failure:
        write_failures.append(failure)
    messages = list(dict.fromkeys([control.reason, *map(str, write_failures)]))
    for message in filter(None, messages):
        _write_stderr(streams.stderr, f"rollfilter: {message}\n".encode(errors="replace"))
    if write_failures:  # whatever stopped the run first, what it wrote is incomplete
        status = ExitStatus.OUTPUT_FAILED
    if not show.quiet:
        _write_stderr(streams.stderr, summary)
    return status


def progress_wanted(forced: bool | None, *, quiet: bool, stderr_fd: int = 2) -> bool:
    """Shown when stderr is a terminal (not TERM=dumb) unless -q; --progress/--no-progress decide."""
    if forced is not None:
        return forced
    return not quiet and os.isatty(stderr_fd) and os.environ.get("TERM") != "dumb"


def count_lines(paths: Sequence[str]) -> int | None:
    """Lines in regular files (None for stdin or a pipe): the run's total, for an ETA.
    Blank lines are counted too, so it is an estimate when the input has them."""
    total = 0
    for path in paths:
        if path == "-" or not stat.S_ISREG(os.stat(path).st_mode):
            return None
        with open(path, "rb") as file:
            last = b"\n"
            while chunk := file.read(1 << 20):
                total += chunk.count(b"\n")
                last = chunk[-1:]
            total += last != b"\n"
    return total


def _known_total(config: Config) -> Callable[[], int | None]:
    """How to count the run's rollouts, for the progress display's total and ETA."""

    def count() -> int | None:
        lines = None if config.limit is not None and STDIN in config.inputs else count_lines(config.inputs)
        if config.limit is not None:
            lines = config.limit if lines is None else min(lines, config.limit)
        if lines is None:
            return None
        shards = config.shard[1] if config.shard else 1
        return -(-lines // shards) * config.repeats

    return count


async def dry_run(engine: Engine, out: BatchWriter, log: LineWriter) -> None:
    """Write each row exactly as it would be sent, to stdout, and its route to stderr; send nothing."""
    while (job := await engine.planner.next_job()) is not None:
        engine.metrics.taken += 1
        where = describe(job)
        route = job.failure or engine.router.route(job.row or {})
        if isinstance(route, RowFailure):
            engine.metrics.add_failure(route)
            log.write(f"rollfilter: {where}: {route.kind.value}: {route.message}\n".encode(errors="replace"))
            continue
        out.write(job.body + b"\n")
        url = ",".join(shown(replica.url) for replica in route.replicas)
        log.write(f"rollfilter: {where} -> POST {url}\n".encode(errors="replace"))
        engine.metrics.succeeded += 1
    engine.metrics.skipped = engine.planner.skipped


async def summarize(config: Config, *, streams: Streams = Streams()) -> ExitStatus:
    """Recompute the summary from result lines (and errors records) without sending anything.

    Lines with an `error` object and indices count as failed rollouts; other JSON objects
    are results. With --repeats K > 1, mean@K and pass@k are computed over tasks.
    The summary goes to stdout (it is this mode's output) and to --metrics FILE.
    """
    check_inputs(config.inputs)
    metrics = Metrics()
    tasks = TaskStats(config.repeats, config.pass_threshold) if config.repeats > 1 else None
    reader = LineReader(config.inputs, max_line_bytes=config.max_line_bytes, stdin_fd=streams.stdin)
    bad = 0
    try:
        while (line := await reader.next_line()) is not None:
            if line.data is None or not line.data.strip():
                bad += line.data is None
                continue
            record = parse_row(line.data)
            if isinstance(record, str):
                bad += 1
                continue
            metrics.taken += 1
            failure = failure_of(record)
            if failure is not None:
                metrics.add_failure(failure)
            else:
                metrics.add_result(record, None)
            if tasks is not None and TASK_INDEX in record:
                reward = None if failure is not None else reward_of(record)
                tasks.rollout_ended(record[TASK_INDEX], config.repeats, reward)
    finally:
        reader.close()
    if tasks is not None:
        tasks.flush_open()
    summary = _encode(metrics.summary(tasks=tasks, timings=False)) + b"\n"  # the files hold no timings
    with OutputFiles() as files:
        metrics_fd = files.open(config.metrics_file, "--metrics")
        if bad:
            _write_stderr(streams.stderr, f"rollfilter: skipped {bad} lines that are not JSON objects\n".encode())
        write_all(streams.stdout, summary)
        _write_metrics_file(metrics_fd, summary, config.metrics_file)
    return ExitStatus.OK


def failure_of(record: dict[str, Any]) -> RowFailure | None:
    """The failure an errors-record line describes, or None for a result line."""
    error = record.get("error")
    if not isinstance(error, dict) or TASK_INDEX not in record:
        return None
    try:
        kind = ErrorKind(str(error.get("kind")))
    except ValueError:
        kind = ErrorKind.BAD_RESPONSE
    return RowFailure(kind, str(error.get("message", "")), error.get("status"))


def _write_stderr(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, data)
