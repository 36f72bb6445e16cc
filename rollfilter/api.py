"""Use rollfilter from Python: the engine the CLI runs, fed rows by your program.

    async with open_rollouts(rows, Config(url="http://127.0.0.1:8000")) as run:   # trio or asyncio
        async for outcome in run:
            ...
    run.summary

    for outcome in rollouts(rows, Config(url="http://127.0.0.1:8000")):        # any thread
        ...

Each outcome is a `Rollout` (the row as sent and the agent's result) or a `Failure` (the
same kinds as the errors record). A failed row is data, never an exception: only
misconfiguration raises (`UsageError`, `ServiceError`), and it does so before anything
is sent. Under asyncio the engine runs as a trio guest on the running loop, in the same
thread (`rollfilter.guest`); under trio it runs in the caller's trio run.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import msgspec
import sniffio
import trio

from rollfilter.aggregate import ResultSpool, aggregate_run
from rollfilter.client import transport_for
from rollfilter.config import Config
from rollfilter.engine import RunControl, RunStatus, prepare
from rollfilter.metrics import Metrics
from rollfilter.outcomes import Outcome
from rollfilter.sinks import ChannelSink
from rollfilter.source import InputLine
from rollfilter.tasks import TaskStats
from rollfilter.writers import Release

Rows = Iterable[Any] | AsyncIterable[Any]
_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


class _RowFeed:
    """Hands the planner the caller's rows (dicts, or JSON lines as str or bytes) one at a time."""

    def __init__(self, rows: Rows) -> None:
        self._sync = iter(rows) if isinstance(rows, Iterable) else None
        self._async = aiter(rows) if self._sync is None else None  # type: ignore[arg-type]
        self._number = 0
        self._waiting: list[Any] = []  # an item fill() took from an async iterable
        self._done = False

    def next_line_nowait(self) -> InputLine | None:
        if self._waiting:
            return self._line(self._waiting.pop())
        if self._done:
            return None
        if self._sync is None:
            raise trio.WouldBlock
        try:
            return self._line(next(self._sync))
        except StopIteration:
            self._done = True
            return None

    async def fill(self) -> None:
        if self._async is not None and not self._waiting and not self._done:
            try:
                self._waiting.append(await anext(self._async))
            except StopAsyncIteration:
                self._done = True

    def _line(self, item: Any) -> InputLine:
        self._number += 1
        if isinstance(item, bytes):
            return InputLine("<rows>", self._number, item)
        try:
            data = item.encode() if isinstance(item, str) else _encode(item)
        except Exception as exc:  # a lone surrogate, an object msgspec cannot encode, a cycle: that row's failure
            problem = f"row cannot be encoded as {'UTF-8' if isinstance(item, str) else 'JSON'}: {exc}"
            return InputLine("<rows>", self._number, None, problem)
        return InputLine("<rows>", self._number, data)

    async def aclose(self) -> None:
        """Close the iterator taken from the rows (a generator left mid-way), as the run owns it."""
        if self._async is not None and hasattr(self._async, "aclose"):
            await self._async.aclose()
        elif self._sync is not None and hasattr(self._sync, "close"):
            self._sync.close()


class RolloutRun:
    """The outcomes of one run, as they finish; `summary` is set once the run has ended.

    With `Config(aggregate=True)`, `aggregate` then holds NeMo Gym's aggregate entries (one per
    agent: agent_ref, agent_metrics, key_metrics, group_level_metrics), the summary holds each
    agent's `key_metrics`, and `aggregate_problems` says, a line each, which agents gave none.
    """

    def __init__(self, receive: trio.MemoryReceiveChannel[tuple[Outcome, Release]]) -> None:
        self._receive = receive
        self.summary: dict[str, Any] | None = None
        self.aggregate: list[dict[str, Any]] | None = None
        self.aggregate_problems: list[str] = []
        self._status: Callable[[], RunStatus] | None = None

    def status(self) -> RunStatus:
        """A snapshot of the run so far: done, failed, in flight, rows/s, and its oldest rollouts
        in flight (where each came from, its indices, agent, attempt and age), as `kill -USR1`
        shows the command's."""
        if self._status is None:
            return RunStatus(0, 0, 0, 0.0, 0.0, ())
        return self._status()

    def __aiter__(self) -> RolloutRun:
        return self

    async def __anext__(self) -> Outcome:
        try:
            outcome, release = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        release()
        return outcome


def open_rollouts(rows: Rows, config: Config) -> contextlib.AbstractAsyncContextManager[RolloutRun]:
    """Run `rows` through the agents `config` names, inside the caller's trio run or asyncio loop.

    Rows are taken from `rows` only as capacity frees up (at most `config.concurrency`
    outcomes are unconsumed or in flight), so an endless generator is fine. Leaving the
    block early, or cancelling the task in it, cancels what is in flight; leaving waits until
    the run has ended. The run owns its connections and the iterator it takes from `rows` (a
    generator is closed on the way out). Raises UsageError or ServiceError on entry, before
    anything is sent. An exception from the caller's rows iterator ends the run: trio raises
    it in an ExceptionGroup, asyncio as itself.

    Under asyncio the engine runs as a trio guest on the running loop (`rollfilter.guest`),
    and an async iterable of rows is stepped in asyncio, so it may await asyncio things.
    """
    if _asyncio_is_running():
        from rollfilter.guest import open_rollouts_as_guest  # imports this module

        return open_rollouts_as_guest(rows, config, _open_rollouts_in_trio)
    return _open_rollouts_in_trio(rows, config)


def _asyncio_is_running() -> bool:
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False  # trio then says what is wrong


@contextlib.asynccontextmanager
async def _open_rollouts_in_trio(rows: Rows, config: Config) -> AsyncIterator[RolloutRun]:
    metrics = Metrics()
    control = RunControl()
    tasks = TaskStats(config.max_repeats, config.pass_threshold) if config.max_repeats > 1 else None
    send, receive = trio.open_memory_channel[tuple[Outcome, Release]](math.inf)
    run = RolloutRun(receive)
    transport = transport_for(config)
    feed = _RowFeed(rows)
    spool = ResultSpool() if config.aggregate else None
    try:
        engine = await prepare(
            config, source=feed, sink=ChannelSink(send), transport=transport,
            control=control, metrics=metrics, tasks=tasks, spool=spool,
        )  # fmt: skip
        run._status = engine.status

        async def drive() -> None:
            report = None
            try:
                await engine.run()
                if spool is not None and not control.scope.cancel_called:
                    with control.stoppable():
                        report = await aggregate_run(spool, engine.router, config)
            finally:
                metrics.replicas = engine.router.replica_counts()
                stopped = control.reason or ("stopped early by the caller" if control.scope.cancel_called else None)
                run.summary = metrics.summary(stopped=stopped, tasks=tasks)
                if report is not None:
                    run.aggregate = report.entries
                    run.aggregate_problems = report.problems
                    report.add_to(run.summary)
                send.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drive)
            try:
                yield run
            finally:
                control.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await transport.aclose()
            await feed.aclose()
            if spool is not None:
                spool.close()


class Rollouts:
    """The same run for code that is not async: iterate from any thread. A trio loop runs
    in a worker thread of its own. (Async code, asyncio included, uses `open_rollouts`.)

    Iterating starts the run; leaving the loop early (break, an exception, close(), or the
    end of a `with` block) cancels what is in flight and joins the worker thread.
    `summary` is set once the run has ended. Misconfiguration raises from the first
    `next()`, before anything is sent. Anything else that ends the run, such as an
    exception from the caller's own rows iterator, is raised from `next()` as trio
    raises it (an ExceptionGroup).
    """

    def __init__(self, rows: Rows, config: Config) -> None:
        self._rows = rows
        self._config = config
        self.summary: dict[str, Any] | None = None
        self.aggregate: list[dict[str, Any]] | None = None  # as RolloutRun.aggregate
        self.aggregate_problems: list[str] = []
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._run: RolloutRun | None = None
        self._error: BaseException | None = None

    def __iter__(self) -> Iterator[Outcome]:
        if self._thread is not None:
            raise RuntimeError("a Rollouts object can be iterated only once")
        self._thread = threading.Thread(target=trio.run, args=(self._serve,), name="rollfilter", daemon=True)
        self._thread.start()
        self._ready.wait()
        try:
            while (outcome := self._next_from_thread()) is not None:
                yield outcome
        finally:
            self.close()
        if self._error is not None:  # the run ended by failing, after its last outcome
            raise self._error

    def _next_from_thread(self) -> Outcome | None:
        if self._error is None:
            try:
                return trio.from_thread.run(self._next, trio_token=self._token)
            except (trio.RunFinishedError, trio.Cancelled):
                if self._error is None:
                    raise
        raise self._error  # the run failed in its thread (an exception from the caller's rows, say)

    async def _serve(self) -> None:
        try:
            async with open_rollouts(self._rows, self._config) as run:
                self._run = run
                self._stop = trio.Event()
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await self._stop.wait()
            self.summary = run.summary
            self.aggregate = run.aggregate
            self.aggregate_problems = run.aggregate_problems
        except BaseException as exc:  # handed to the iterating thread
            self._error = exc
        finally:
            self._ready.set()

    async def _next(self) -> Outcome | None:
        assert self._run is not None
        return await anext(self._run, None)

    def close(self) -> None:
        """Cancel what is in flight, close connections, and join the worker thread."""
        if self._thread is None or not self._thread.is_alive():
            return
        if self._stop is not None and self._token is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join()

    def __enter__(self) -> Rollouts:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def rollouts(rows: Rows, config: Config) -> Rollouts:
    """Outcomes of running `rows` through the agents `config` names, from any thread."""
    return Rollouts(rows, config)
