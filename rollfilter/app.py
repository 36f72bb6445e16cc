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
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from rollfilter import demo as demo_agent
from rollfilter.client import AgentClient, Router, request_headers
from rollfilter.config import Config
from rollfilter.dispatch import Engine, Release, RunControl
from rollfilter.errors import ExitStatus, UsageError
from rollfilter.metrics import Metrics
from rollfilter.outcome import RowFailure
from rollfilter.plan import ROLLOUT_INDEX, TASK_INDEX, Job, Planner, ResumeIndex, drop_torn_tail
from rollfilter.sink import BatchWriter, Reorderer
from rollfilter.source import LineReader, check_inputs
from rollfilter.transport import HTTP11Transport

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
        fd = os.open(path, APPEND_FLAGS, 0o666)
    except OSError as exc:
        raise UsageError(f"cannot write {option} {path}: {exc.strerror}") from None
    if stat.S_ISDIR(os.fstat(fd).st_mode):  # pragma: no cover - open() refuses directories for writing
        os.close(fd)
        raise UsageError(f"cannot write {option} {path}: Is a directory")
    return fd


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

    def __init__(
        self, results: BatchWriter, errors: BatchWriter, *, records: bool, ordered: bool, repeats: int
    ) -> None:
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
            if control.status in (ExitStatus.INTERRUPTED, ExitStatus.TERMINATED):
                os._exit(status)  # a second signal during the wind-down: leave now
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


async def run(
    config: Config,
    *,
    streams: Streams = Streams(),
    demo: demo_agent.DemoOptions | None = None,
    handle_signals: bool = True,
    quiet: bool = False,
) -> ExitStatus:
    """Run the rollouts `config` describes; return the exit status. Prints the summary."""
    check_inputs(config.inputs)
    if config.url is None and not config.endpoints and demo is None:
        raise UsageError("no agent to send to: give -u URL, -e NAME=URL, or --demo")
    resume = None
    if config.resume and config.output:
        drop_torn_tail(config.output)
        resume = ResumeIndex.from_file(config.output, config.repeats)
    opened: list[int] = []
    try:
        out_fd = streams.stdout
        if config.output is not None:
            out_fd = open_for_append(config.output, "-o")
            opened.append(out_fd)
        err_fd = streams.stderr
        if config.errors_file is not None:
            err_fd = open_for_append(config.errors_file, "--errors")
            opened.append(err_fd)
        metrics_fd = None
        if config.metrics_file is not None:
            metrics_fd = open_for_append(config.metrics_file, "--metrics")
            opened.append(metrics_fd)
        return await _run_open(config, streams, out_fd, err_fd, metrics_fd, resume, demo, handle_signals, quiet)
    finally:
        for fd in opened:
            os.close(fd)


async def _run_open(
    config: Config,
    streams: Streams,
    out_fd: int,
    err_fd: int,
    metrics_fd: int | None,
    resume: ResumeIndex | None,
    demo: demo_agent.DemoOptions | None,
    handle_signals: bool,
    quiet: bool,
) -> ExitStatus:
    control = RunControl()
    metrics = Metrics()
    transport = HTTP11Transport(
        verify=not config.insecure, connect_timeout=config.connect_timeout, headers=request_headers(config)
    )
    results = BatchWriter(out_fd, on_closed_output=lambda: control.stop(ExitStatus.BROKEN_PIPE))
    errors = BatchWriter(err_fd)
    sink = LineSink(
        results, errors, records=config.errors_file is not None, ordered=config.ordered, repeats=config.repeats
    )
    reader = LineReader(config.inputs, max_line_bytes=config.max_line_bytes, stdin_fd=streams.stdin)

    def count_retry(_failure: RowFailure, _delay: float) -> None:
        metrics.retries += 1

    try:
        async with trio.open_nursery() as services:
            services.start_soon(results.run)
            services.start_soon(errors.run)
            if handle_signals:
                await services.start(_watch_signals, control)
            if out_fd == streams.stdout and _is_pipe(out_fd):
                services.start_soon(_watch_reader_gone, out_fd, lambda: control.stop(ExitStatus.BROKEN_PIPE))
            if demo is not None:
                port = await services.start(
                    lambda task_status: demo_agent.serve(demo_agent.DemoAgent(demo), task_status=task_status)
                )
                config = dataclasses.replace(config, url=f"http://127.0.0.1:{port}/run")
            router = Router(config)
            engine = Engine(
                planner=Planner(reader, config, resume),
                router=router,
                client=AgentClient(config, transport, on_retry=count_retry),
                sink=sink,
                metrics=metrics,
                control=control,
                concurrency=config.concurrency,
                failure_limit=config.max_failures,
            )
            await engine.run()
            metrics.skipped = engine.planner.skipped
            if control.status is not None:
                sink.flush_held()
            results.close()
            errors.close()
            await results.drained.wait()
            await errors.drained.wait()
            services.cancel_scope.cancel()
    finally:
        reader.close()
        await transport.aclose()
    status = control.status
    if status is None:
        status = ExitStatus.ROWS_FAILED if metrics.failed else ExitStatus.OK
    stopped = control.reason or (status.name.lower().replace("_", " ") if control.status else None)
    summary = _encode(metrics.summary(stopped=stopped)) + b"\n"
    if metrics_fd is not None:
        os.ftruncate(metrics_fd, 0)
        os.write(metrics_fd, summary)
    if control.reason:
        _write_stderr(streams.stderr, f"rollfilter: {control.reason}\n".encode())
    if not quiet:
        _write_stderr(streams.stderr, summary)
    return status


def _write_stderr(fd: int, data: bytes) -> None:
    with contextlib.suppress(OSError):
        os.write(fd, data)
