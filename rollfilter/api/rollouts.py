"""Use rollfilter from Python: the engine the CLI runs, fed rows by your program.

    async with open_rollouts(rows, Config(url="http://127.0.0.1:8000")) as run:   # trio or asyncio
        async for outcome in run:
            ...
    run.summary

    for outcome in rollouts(rows, Config(url="http://127.0.0.1:8000")):        # any thread
        ...

Each outcome is a `Rollout` (the row as sent and the agent's result) or a `Failure` (the
same kinds as the errors record); with `Config(groups=True)`, a `Group` of a task's rollouts,
and `run.groups()` gives the kept ones to a trainer as each is whole. A failed row is data, never an exception: only
misconfiguration raises (`UsageError`, `ServiceError`), and it does so before anything
is sent. Under asyncio the engine runs as a trio guest on the running loop, in the same
thread (`rollfilter.api.in_asyncio`); under trio it runs in the caller's trio run
(`rollfilter.api.in_trio`).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

import sniffio
import trio

from rollfilter.api.in_trio import FinalReport, RolloutRun, Rows, open_rollouts_in_trio
from rollfilter.config import Config
from rollfilter.outcomes import Group, Outcome
from rollfilter.run.run import KEEP
from rollfilter.run.statistics import RunStatistics

T = TypeVar("T")


def open_rollouts(rows: Rows, config: Config) -> contextlib.AbstractAsyncContextManager[RolloutRun]:
    """Run `rows` through the agents `config` names, inside the caller's trio run or asyncio loop.

    Rows are taken from `rows` only as capacity frees up (at most `config.concurrency`
    outcomes are unconsumed or in flight), so an endless generator is fine. Leaving the
    block early, or cancelling the task in it, cancels what is in flight; leaving waits until
    the run has ended. The run owns its connections and the iterator it takes from `rows` (a
    generator is closed on the way out). Raises UsageError or ServiceError on entry, before
    anything is sent. An exception from the caller's rows iterator ends the run: trio raises
    it in an ExceptionGroup, asyncio as itself.

    Under asyncio the engine runs as a trio guest on the running loop (`rollfilter.api.in_asyncio`),
    and an async iterable of rows is stepped in asyncio, so it may await asyncio things.
    """
    if _asyncio_is_running():
        from rollfilter.api.in_asyncio import open_rollouts_as_guest  # asyncio's side is imported only where it runs

        return open_rollouts_as_guest(rows, config)
    return open_rollouts_in_trio(rows, config)


def _asyncio_is_running() -> bool:
    try:
        return sniffio.current_async_library() == "asyncio"
    except sniffio.AsyncLibraryNotFoundError:
        return False  # trio then says what is wrong


class Rollouts(FinalReport):
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
        super().__init__()
        self._rows = rows
        self._config = config
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

    def groups(self) -> Iterator[Group]:
        """With `Config(groups=True)`: the groups to train on (`Group.ok`), each as soon as it is
        whole (iterating the run itself gives every group, the dropped ones too)."""
        for outcome in self:
            if isinstance(outcome, Group) and outcome.ok:
                yield outcome

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
            self._take_results(run)
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

    def _in_run(self, call: Callable[[RolloutRun], T]) -> T:
        """`call(run)` in the run's trio loop, from this thread."""
        if self._token is None or self._run is None:
            raise RuntimeError("the run has not started: steer it once iterating has begun")
        run = self._run
        try:
            return trio.from_thread.run_sync(lambda: call(run), trio_token=self._token)
        except trio.RunFinishedError:
            raise RuntimeError("the run has ended: there is nothing left to steer") from None

    def pause(self) -> None:
        """Send no new /run request from now on (see `RolloutRun.pause`)."""
        self._in_run(lambda run: run.pause())

    def resume(self) -> None:
        """Undo `pause()`."""
        self._in_run(lambda run: run.resume())

    def drain(self, timeout: float | None = None) -> bool:
        """Pause, and block until no request is in flight, for at most `timeout` seconds (None:
        as long as it takes). Whether none is in flight; the run stays paused until `resume()`,
        which ends a drain waiting, not drained."""
        if self._token is None or self._run is None:
            raise RuntimeError("the run has not started: steer it once iterating has begun")
        try:
            return trio.from_thread.run(self._run.drain, timeout, trio_token=self._token)
        except trio.RunFinishedError:
            raise RuntimeError("the run has ended: there is nothing left to steer") from None

    def set_concurrency(self, concurrency: int) -> None:
        """See `RolloutRun.set_concurrency`."""
        self._in_run(lambda run: run.set_concurrency(concurrency))

    def set_rate(self, agent: str | None = None, *, rpm: float | None = KEEP, tpm: float | None = KEEP) -> None:
        """See `RolloutRun.set_rate`."""
        self._in_run(lambda run: run.set_rate(agent, rpm=rpm, tpm=tpm))

    def set_policy_version(self, version: int) -> None:
        """See `RolloutRun.set_policy_version`."""
        self._in_run(lambda run: run.set_policy_version(version))

    def statistics(self) -> RunStatistics:
        """See `RolloutRun.statistics`."""
        return self._in_run(lambda run: run.statistics())

    def __enter__(self) -> Rollouts:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def rollouts(rows: Rows, config: Config) -> Rollouts:
    """Outcomes of running `rows` through the agents `config` names, from any thread."""
    return Rollouts(rows, config)
