"""`open_rollouts` inside asyncio: the trio engine runs as a guest on the running asyncio loop.

trio's guest mode (`trio.lowlevel.start_guest_run`) runs trio's scheduler as callbacks on the
host loop, on the host's thread; only trio's wait for I/O sits in a helper thread. The two
loops share the thread, so each side may call the other's synchronous functions directly
(trio's guest-mode documentation shows host code cancelling a `trio.CancelScope`). Three
hand-offs cross between them, each a synchronous call on one side waking a task on the other:

- the caller asks for the next outcome: an asyncio future, resolved by the run's trio task;
- the engine asks for the next row of an async iterable: an asyncio task steps the iterator
  (so it may await asyncio things), and a trio event wakes the engine;
- the caller leaves the block: the run's trio cancel scope is cancelled, and the caller waits
  until the run's trio task has ended.

A host loop holds at most one guest run, so the runs open on one loop share it: the first
starts it, each run is a task in its nursery, and the last one out waits for it to end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import math
import signal
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any

import trio

from rollfilter.api.in_trio import RolloutRun, Rows, open_rollouts_in_trio
from rollfilter.config import Config
from rollfilter.outcomes import Outcome

if TYPE_CHECKING:
    import outcome

_END = object()  # the rows iterator is exhausted


class _Guest:
    """The one trio guest run on an asyncio loop, shared by the rollout runs open on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.users = 0
        self.ended: asyncio.Future[outcome.Outcome[None]] = loop.create_future()
        self._runs: set[GuestRolloutRun] = set()
        self._spawn, self._spawned = trio.open_memory_channel[Callable[[], Awaitable[None]]](math.inf)
        trio.lowlevel.start_guest_run(
            self._main,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            run_sync_soon_not_threadsafe=loop.call_soon,
            done_callback=self._done,
            host_uses_signal_set_wakeup_fd=_host_has_wakeup_fd(),
        )

    async def _main(self) -> None:
        async with trio.open_nursery() as nursery:
            async for serve in self._spawned:
                nursery.start_soon(serve)

    def _done(self, result: outcome.Outcome[None]) -> None:
        if _GUESTS.get(self.loop) is self:
            del _GUESTS[self.loop]
        for run in self._runs:  # none, unless trio itself failed: their callers must not wait forever
            run._finish(RuntimeError(f"rollfilter's trio guest run ended first: {result!r}"))
        self.ended.set_result(result)

    def spawn(self, run: GuestRolloutRun) -> None:
        async def serve() -> None:
            try:
                await run.serve()
            finally:
                self._runs.discard(run)

        self._runs.add(run)
        self._spawn.send_nowait(serve)

    def close(self) -> None:
        """Let the guest run end once its last task has ended."""
        self._spawn.close()


_GUESTS: dict[asyncio.AbstractEventLoop, _Guest] = {}


def _host_has_wakeup_fd() -> bool:
    """Whether the host loop set the signal wakeup fd (asyncio does for loop.add_signal_handler).

    If it did, trio must leave it: taking it over would leave the host's handlers asleep. If it
    did not (asyncio.run's Ctrl-C handler is a plain signal.signal one), trio sets its own: a
    signal that the kernel hands to trio's I/O thread, not the main one, would otherwise run
    its Python handler only once the main thread next wakes, which may be the end of an episode.
    """
    try:
        fd = signal.set_wakeup_fd(-1)
    except ValueError:  # not the main thread: signals are handled on the main thread's own loop
        return True
    signal.set_wakeup_fd(fd)
    return fd != -1


async def _join_guest(loop: asyncio.AbstractEventLoop) -> _Guest:
    while (guest := _GUESTS.get(loop)) is not None and guest.users == 0:
        await asyncio.wait([guest.ended])  # the last run out is still waiting for it to end
    if guest is None:
        guest = _GUESTS[loop] = _Guest(loop)
    guest.users += 1
    return guest


async def _leave_guest(guest: _Guest) -> None:
    guest.users -= 1
    if guest.users == 0:
        guest.close()
        await asyncio.wait([guest.ended])
        guest.ended.result().unwrap()  # the guest run's own failure (KeyboardInterrupt delivered by trio, say)


async def _wait_through_cancellation(task: asyncio.Task[None]) -> None:
    """Wait for `task` to end even if this task is cancelled meanwhile; the cancellation is raised after."""
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        raise cancelled
    task.result()


async def _next_or_end(rows: AsyncIterator[Any]) -> Any:
    try:
        return await anext(rows)
    except StopAsyncIteration:
        return _END


class _RowsInTrio:
    """The caller's iterable, stepped by the engine in trio as it would be under trio; what it raises is noted."""

    def __init__(self, rows: Iterable[Any]) -> None:
        self._rows = rows
        self._iterator = iter(rows)
        self.error: BaseException | None = None  # what the caller's iterator raised

    def whole_rows(self) -> Iterable[Any]:
        return self._rows

    def __iter__(self) -> _RowsInTrio:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._iterator)
        except StopIteration:
            raise
        except Exception as exc:
            self.error = exc
            raise

    def close(self) -> None:
        """Close a generator left mid-way, as the run owns it (the engine calls this)."""
        close = getattr(self._iterator, "close", None)
        if close is not None:
            close()


class _RowsFromHost:
    """The caller's async iterable as the engine sees it: each step runs as an asyncio task.

    The steps run in a copy of the caller's context, so libraries that ask which async library
    is running get asyncio's answer. The iterator is closed on the asyncio side, after the run.
    """

    def __init__(self, rows: AsyncIterable[Any], loop: asyncio.AbstractEventLoop) -> None:
        self._iterator = aiter(rows)
        self._loop = loop
        self._context = contextvars.copy_context()
        self._step: asyncio.Task[Any] | None = None
        self.error: BaseException | None = None  # what the caller's iterator raised

    def __aiter__(self) -> _RowsFromHost:
        return self

    async def __anext__(self) -> Any:  # in trio
        step = self._step = self._loop.create_task(_next_or_end(self._iterator), context=self._context)
        stepped = trio.Event()
        step.add_done_callback(lambda _: stepped.set())
        try:
            await stepped.wait()
        finally:
            step.cancel()  # the run is stopping (a no-op once the step is done)
        try:
            row = step.result()
        except Exception as exc:
            self.error = exc
            raise
        if row is _END:
            raise StopAsyncIteration
        return row

    async def aclose_on_host(self) -> None:  # in asyncio
        """Wait for a step the run left behind, then close the iterator (a generator left mid-way)."""
        step, self._step = self._step, None
        if step is not None:
            await asyncio.wait([step])
            if not step.cancelled():
                step.exception()  # seen: the run has raised it already, or stopped first
        aclose = getattr(self._iterator, "aclose", None)
        if aclose is not None:
            await aclose()


def _only(error: BaseException, leaf: BaseException) -> bool:
    """Whether `error` is `leaf`, or a group of groups that holds `leaf` and nothing else."""
    if error is leaf:
        return True
    if not isinstance(error, BaseExceptionGroup):
        return False
    matched, rest = error.split(lambda e: e is leaf)
    return matched is not None and rest is None


class GuestRolloutRun(RolloutRun):
    """A run's outcomes in asyncio, taken from its task in the trio guest one at a time."""

    def __init__(self, rows: Rows, config: Config, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._config = config
        self._rows = _RowsInTrio(rows) if isinstance(rows, Iterable) else _RowsFromHost(rows, loop)
        self._loop = loop
        self._scope = trio.CancelScope()
        self._asks: collections.deque[asyncio.Future[Outcome | None]] = collections.deque()
        self._asked = trio.Event()
        self._spare: collections.deque[Outcome] = collections.deque()  # taken for an ask cancelled since
        self._entered: asyncio.Future[None] = loop.create_future()
        self._ended: asyncio.Future[None] = loop.create_future()
        self._stopping: asyncio.Task[None] | None = None
        self.error: BaseException | None = None  # what ended the run, as the caller gets it

    async def __anext__(self) -> Outcome:
        if self._spare:
            return self._spare.popleft()
        if self._ended.done():
            if self.error is not None:
                raise self.error
            raise StopAsyncIteration
        ask: asyncio.Future[Outcome | None] = self._loop.create_future()
        self._asks.append(ask)
        self._asked.set()
        taken = await ask
        if taken is None:
            raise StopAsyncIteration
        return taken

    async def drain(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109  # an answer, not an error
        """Pause, and wait in asyncio until no request is in flight (see `RolloutRun.drain`)."""
        steering = self._steered().steering
        steering.pause()
        quiet: asyncio.Future[bool] = self._loop.create_future()

        def on_quiet(drained: bool) -> None:  # called in the guest, on this loop's thread
            _resolve(quiet, drained)

        steering.when_quiet(on_quiet)
        try:
            await asyncio.wait([quiet], timeout=timeout)
        finally:
            steering.forget_quiet(on_quiet)
        return quiet.done() and quiet.result()

    async def serve(self) -> None:  # the run's task in the guest
        error: BaseException | None = None
        run: RolloutRun | None = None
        try:
            with self._scope:
                async with open_rollouts_in_trio(self._rows, self._config) as run:
                    self.figures = run.figures
                    self._run = run._run
                    _resolve(self._entered, None)
                    await self._answer_asks(run)
        except BaseException as exc:  # handed to the asyncio side
            error = exc
        if run is not None:
            self._take_results(run)
        self._finish(error)

    async def _answer_asks(self, run: RolloutRun) -> None:
        while True:
            await self._asked.wait()
            self._asked = trio.Event()
            while self._waiting_ask() is not None:
                taken = await anext(run, None)
                if taken is None:
                    return  # the asks waiting are answered when the run has ended
                if (waiting := self._waiting_ask()) is not None:
                    _resolve(waiting, taken)
                    self._asks.popleft()
                else:  # its asker was cancelled meanwhile: the next ask gets it
                    self._spare.append(taken)

    def _waiting_ask(self) -> asyncio.Future[Outcome | None] | None:
        while self._asks and self._asks[0].done():  # cancelled by its asker
            self._asks.popleft()
        return self._asks[0] if self._asks else None

    def _finish(self, error: BaseException | None) -> None:
        if self._ended.done():
            return
        rows_error = self._rows.error
        if error is not None and rows_error is not None and _only(error, rows_error):
            error = rows_error  # the caller's own exception, as their iterator raised it
        self.error = error
        for ask in self._asks:
            if ask.done():
                continue
            if error is None:
                ask.set_result(None)
            else:
                ask.set_exception(error)
        self._asks.clear()
        _resolve(self._entered, None)
        _resolve(self._ended, None)

    async def stop(self, guest: _Guest) -> None:
        """Cancel what is in flight, wait for the run's trio task to end, close the caller's rows,
        and leave `guest`; all of it even if the calling task is cancelled meanwhile."""
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop(guest))
        await _wait_through_cancellation(self._stopping)

    async def _stop(self, guest: _Guest) -> None:
        self._scope.cancel()
        try:
            await asyncio.wait([self._ended])
            if isinstance(self._rows, _RowsFromHost):
                await self._rows.aclose_on_host()
        finally:
            await _leave_guest(guest)


def _resolve(future: asyncio.Future[Any], value: Any) -> None:
    if not future.done():
        future.set_result(value)


@contextlib.asynccontextmanager
async def open_rollouts_as_guest(rows: Rows, config: Config) -> AsyncIterator[RolloutRun]:
    """`open_rollouts_in_trio(rows, config)`, run in the trio guest of the running asyncio loop.

    Leaving the block (at the end, by break, by an exception or by cancellation) cancels what
    is in flight and waits until the run has ended and its connections are closed, even if
    the waiting task is cancelled again meanwhile. An exception from the caller's own rows
    iterator is raised as itself; anything else that ends the run as trio raises it.
    """
    loop = asyncio.get_running_loop()
    run = GuestRolloutRun(rows, config, loop)
    guest = await _join_guest(loop)
    try:
        guest.spawn(run)
        await asyncio.shield(run._entered)
        if run.error is not None:
            raise run.error  # misconfiguration: nothing was sent
        yield run  # an exception from the block passes as it is, after the finally below
        await run.stop(guest)
        if run.error is not None:
            raise run.error  # the run failed, and the block did not raise it
    finally:
        await run.stop(guest)
