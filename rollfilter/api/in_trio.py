"""A run of the Python API: what it hands out, and the run itself in trio.

`RolloutRun` is what every run hands out, under trio and under asyncio alike: its outcomes as
they finish, its status, and once it has ended what it leaves (`FinalReport`: the summary and
NeMo Gym's aggregate). `open_rollouts_in_trio` runs the engine in the caller's trio run, fed
the caller's rows; `api.open_rollouts` calls it under trio, and `guest` runs it in a trio guest
under asyncio.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import math
import threading
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec
import trio

from rollfilter.config import Config
from rollfilter.formats.source import InputLine
from rollfilter.formats.writers import Release
from rollfilter.http import AgentTransport
from rollfilter.outcomes import Group, Outcome
from rollfilter.run.outputs import ChannelSink
from rollfilter.run.run import KEEP, Run
from rollfilter.run.statistics import RunStatistics, RunStatus

Rows = Iterable[Any] | AsyncIterable[Any]
_encode = msgspec.json.Encoder().encode
# How a run left by an exception ends its tracker runs: KILLED when cancelled, interrupted or closed.
_TRACKER_STATUS = {trio.Cancelled: "KILLED", KeyboardInterrupt: "KILLED", GeneratorExit: "KILLED"}


class FinalReport:
    """What a run leaves once it has ended: `summary` (None until then).

    With `Config(aggregate=True)`, `aggregate` then holds NeMo Gym's aggregate entries (one per
    agent: agent_ref, agent_metrics, key_metrics, group_level_metrics), the summary holds each
    agent's `key_metrics`, and `aggregate_problems` says, a line each, which agents gave none.
    `warnings` says, a line each, what in the config the rows showed to be of no use (an agent
    given a repeat count that no row named).
    """

    def __init__(self) -> None:
        self.summary: dict[str, Any] | None = None
        self.aggregate: list[dict[str, Any]] | None = None
        self.aggregate_problems: list[str] = []
        self.warnings: list[str] = []

    def _take_results(self, run: FinalReport) -> None:
        """Hold what `run` left: a run that hands out another's outcomes leaves its results too."""
        self.summary = run.summary
        self.aggregate = run.aggregate
        self.aggregate_problems = run.aggregate_problems
        self.warnings = run.warnings

    def _take_ended_run(self, run: Run) -> None:
        """Hold what the ended `run` leaves."""
        self.summary = run.summary()
        self.warnings = [str(warning) for warning in run.warnings()]
        if run.report is not None:
            self.aggregate = run.report.entries
            self.aggregate_problems = run.report.problems


@dataclasses.dataclass(slots=True)
class LiveFigures:
    """Where a run's figures are taken from (`rollfilter.api.prometheus` renders them), from any
    thread: the run, the trio loop that changes its figures, and that loop's thread."""

    run: Run
    token: trio.lowlevel.TrioToken
    thread: int
    ended: bool = False

    def statistics(self) -> RunStatistics:
        """The run's snapshot (`Run.statistics()`), taken in the run's own thread, or by its trio
        loop for a caller in another thread, so that it is never read half changed; once the run
        has `ended` nothing changes it, and it is taken where it is asked for (the loop may be
        busy with the caller's own work then, or gone)."""
        if self.ended or threading.get_ident() == self.thread:
            return self.run.statistics()
        try:
            return trio.from_thread.run_sync(self.run.statistics, trio_token=self.token)
        except trio.RunFinishedError:  # the run has ended: its figures stay as they are
            return self.run.statistics()


class RolloutRun(FinalReport, abc.ABC):
    """The outcomes of one run, as they finish; `summary` is set once the run has ended.

    A run can be steered while it runs, from the task or loop that iterates it: `pause()` and
    `resume()`, `await drain(timeout)`, `set_concurrency(n)`, `set_rate(...)`,
    `set_policy_version(v)`, and `statistics()` for what is in force. A change that cannot be
    made raises `SteeringError` (a ValueError) and changes nothing.
    """

    def __init__(self) -> None:
        super().__init__()
        self.figures: LiveFigures | None = None  # set once the run has started
        self._run: Run | None = None  # set once the run has started

    def _steered(self) -> Run:
        if self._run is None:
            raise RuntimeError("the run has not started")
        return self._run

    def pause(self) -> None:
        """Send no new /run request from now on (one being written may finish); what is in flight
        goes on, and its outcomes still come. Retries wait too."""
        self._steered().steering.pause()

    def resume(self) -> None:
        """Undo `pause()`: the rollouts waiting on it are sent."""
        self._steered().steering.resume()

    async def drain(self, timeout: float | None = None) -> bool:  # noqa: ASYNC109  # an answer, not an error
        """Pause, and wait until no request is in flight, for at most `timeout` seconds (None: as
        long as it takes). Whether none is in flight; the run stays paused until `resume()`,
        which ends a drain waiting, not drained."""
        return await self._steered().steering.drain(timeout)

    def set_concurrency(self, concurrency: int) -> None:
        """Bound the requests in flight by `concurrency` from now on (with `Config.adaptive`, the
        windows' ceiling); a lower bound cancels nothing, the excess finishes first."""
        self._steered().set_concurrency(concurrency)

    def set_rate(self, agent: str | None = None, *, rpm: float | None = KEEP, tpm: float | None = KEEP) -> None:
        """Requests (`rpm`) and tokens (`tpm`) a minute for rows of `agent` (None: every agent);
        None removes a limit, one not given stays. In force for the requests waiting too."""
        self._steered().set_rate(agent, rpm=rpm, tpm=tpm)

    def set_policy_version(self, version: int) -> None:
        """The policy version from now on (a whole number, never lower): results sent from now on
        carry it as `_rf_policy_version["sent"]`, and with `Config.groups.max_staleness` more groups may go."""
        self._steered().set_policy_version(version)

    def statistics(self) -> RunStatistics:
        """The run's snapshot, as the command's summary, status and Prometheus render it (frozen):
        its counts, rates and each agent's figures, why it stopped (`stopped`), and under
        `steering` what is in force: paused, the concurrency, the windows and rates, the policy
        version, and the groups waiting on the policy version."""
        return self._steered().statistics()

    def status(self) -> RunStatus:
        """A snapshot of the run so far: ended, failed, in flight, rows/s, and its oldest rollouts
        in flight (where each came from, its indices, agent, attempt and age), as `kill -USR1`
        shows the command's."""
        statistics = self._run.statistics() if self._run is not None else None
        if statistics is None or not statistics.connected:
            return RunStatus(0, 0, 0, 0.0, 0.0, ())
        return statistics.status()

    def __aiter__(self) -> RolloutRun:
        return self

    @abc.abstractmethod
    async def __anext__(self) -> Outcome: ...

    async def groups(self) -> AsyncIterator[Group]:
        """With `Config(groups=True)`: the groups to train on (`Group.ok`), each as soon as it is
        whole (iterating the run itself gives every group, the dropped ones too)."""
        async for outcome in self:
            if isinstance(outcome, Group) and outcome.ok:
                yield outcome


class _ChannelRun(RolloutRun):
    """A run in trio: its outcomes come from the engine's sink through a channel."""

    def __init__(self, receive: trio.MemoryReceiveChannel[tuple[Outcome, Release]]) -> None:
        super().__init__()
        self._receive = receive

    async def __anext__(self) -> Outcome:
        try:
            outcome, release = await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None
        release()
        return outcome


@runtime_checkable
class WrappedRows(Protocol):
    """The caller's rows as another loop hands them to the run (`in_asyncio`)."""

    def whole_rows(self) -> Rows:
        """The caller's rows themselves."""
        ...


class _RowFeed:
    """Hands the planner the caller's rows (dicts, or JSON lines as str or bytes) one at a time."""

    def __init__(self, rows: Rows) -> None:
        self._rows = rows
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

    def read_again(self) -> _RowFeed | None:
        """The same rows from the first, when they are a sequence (a list), which can be read twice."""
        rows = self._rows
        whole = rows.whole_rows() if isinstance(rows, WrappedRows) else rows
        return _RowFeed(whole) if isinstance(whole, Sequence) else None

    async def aclose(self) -> None:
        """Close the iterator taken from the rows (a generator left mid-way), as the run owns it."""
        if self._async is not None and hasattr(self._async, "aclose"):
            await self._async.aclose()
        elif self._sync is not None and hasattr(self._sync, "close"):
            self._sync.close()


@contextlib.asynccontextmanager
async def open_rollouts_in_trio(
    rows: Rows, config: Config, *, transport: AgentTransport | None = None
) -> AsyncIterator[RolloutRun]:
    """`api.open_rollouts` in the caller's trio run: its docstring says what the run does.
    `transport`, when given, is sent through in place of the one `config` asks for."""
    send, receive = trio.open_memory_channel[tuple[Outcome, Release]](math.inf)
    results = _ChannelRun(receive)
    feed = _RowFeed(rows)
    keep_incomplete = config.groups is not None and config.groups.keep_incomplete
    sink = ChannelSink(send, grouped=config.groups is not None, keep_incomplete=keep_incomplete)
    run = Run(config, source=feed, sink=sink, transport=transport)
    try:
        await run.connect()
        results._run = run
        results.figures = figures = LiveFigures(run, trio.lowlevel.current_trio_token(), threading.get_ident())

        ended = "KILLED"  # the tracker runs' status, unless the run ends on its own
        left = False  # whether the caller left before the run ended (its end is then a cancel's)

        async def drive() -> None:
            nonlocal ended
            try:
                await run.send()
                await run.finish()
                ended = "KILLED" if left else "FINISHED"
            finally:
                results._take_ended_run(run)
                figures.ended = True
                send.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(drive)
            try:
                yield results
            finally:
                left = True
                run.control.cancel()
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await run.end_tracking(_TRACKER_STATUS.get(type(exc), "FAILED"))
        raise
    else:
        await run.end_tracking(ended)
    finally:
        with trio.CancelScope(shield=True):
            await run.aclose()
            await feed.aclose()
