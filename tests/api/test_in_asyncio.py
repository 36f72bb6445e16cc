"""`open_rollouts` the same under trio and under asyncio (the engine as a trio guest), against the demo agent.

Each scenario is written once over `Library`, the few things it needs from the async library it
runs under, and run under `trio.run` and under `asyncio.run`. The asyncio runs also check that no
trio guest run is left on the loop afterwards.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sniffio
import trio

from rollfilter import Config, Failure, Rollout, RolloutRun, open_rollouts
from rollfilter.errors import ErrorKind, ServiceError, UsageError
from rollfilter.outcomes import Outcome
from tests.conftest import (
    SUBPROCESS_TIMEOUT,
    DemoProcess,
    DemoServer,
    Holdings,
    clean_env,
    closed_port_url,
    expected_reward,
    simple_rows,
    wait_for,
)

TICK = 0.01  # the other task's sleep, in seconds
GAP_BOUND = 1.0  # the longest wait for a 0.01 s tick: a stalled loop, not a speed test (0.11 s seen under load)
WAIT = 20.0  # seconds: every wait for a condition is bounded


class Library:
    """What a scenario needs from the async library it runs under."""

    name: str

    def run(self, scenario: Callable[[], Awaitable[Any]]) -> Any:
        raise NotImplementedError

    async def sleep(self, seconds: float) -> None:
        raise NotImplementedError

    async def within(self, seconds: float, step: Callable[[], Awaitable[Any]]) -> bool:
        """Await `step()`, cancelled after `seconds`; whether it finished."""
        raise NotImplementedError

    async def beside(self, background: Callable[[], Awaitable[None]], body: Callable[[], Awaitable[Any]]) -> Any:
        """Await `body()` while `background()` runs in a task of its own, cancelled after."""
        raise NotImplementedError

    async def gather(self, *bodies: Callable[[], Awaitable[Any]]) -> list[Any]:
        raise NotImplementedError

    async def cancel_when(self, body: Callable[[], Awaitable[None]], ready: Callable[[], bool]) -> None:
        """Run `body()` in a task, cancel that task once `ready()` holds, and return when it has ended."""
        raise NotImplementedError

    def raises(self, exc_type: type[BaseException], match: str) -> Any:
        """How an exception that ends a run (from the caller's rows, or from the block) reaches the caller."""
        raise NotImplementedError


class Trio(Library):
    name = "trio"

    def run(self, scenario: Callable[[], Awaitable[Any]]) -> Any:
        return trio.run(scenario)

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)

    async def within(self, seconds: float, step: Callable[[], Awaitable[Any]]) -> bool:
        with trio.move_on_after(seconds):
            await step()
            return True
        return False

    async def beside(self, background: Callable[[], Awaitable[None]], body: Callable[[], Awaitable[Any]]) -> Any:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(background)
            result = await body()
            nursery.cancel_scope.cancel()
        return result

    async def gather(self, *bodies: Callable[[], Awaitable[Any]]) -> list[Any]:
        results: list[Any] = [None] * len(bodies)

        async def keep(i: int) -> None:
            results[i] = await bodies[i]()

        async with trio.open_nursery() as nursery:
            for i in range(len(bodies)):
                nursery.start_soon(keep, i)
        return results

    async def cancel_when(self, body: Callable[[], Awaitable[None]], ready: Callable[[], bool]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(body)
            await wait_until(self, ready)
            nursery.cancel_scope.cancel()

    def raises(self, exc_type: type[BaseException], match: str) -> Any:
        return pytest.RaisesGroup(pytest.RaisesExc(exc_type, match=match), flatten_subgroups=True)


class Asyncio(Library):
    name = "asyncio"

    def run(self, scenario: Callable[[], Awaitable[Any]]) -> Any:
        async def main() -> Any:
            result = await scenario()
            assert not trio.lowlevel.in_trio_run(), "a trio guest run was left on the loop"
            return result

        return asyncio.run(main())

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def within(self, seconds: float, step: Callable[[], Awaitable[Any]]) -> bool:
        try:
            async with asyncio.timeout(seconds):
                await step()
        except TimeoutError:
            return False
        return True

    async def beside(self, background: Callable[[], Awaitable[None]], body: Callable[[], Awaitable[Any]]) -> Any:
        task = asyncio.ensure_future(background())
        try:
            return await body()
        finally:
            task.cancel()
            await asyncio.wait([task])

    async def gather(self, *bodies: Callable[[], Awaitable[Any]]) -> list[Any]:
        return list(await asyncio.gather(*(body() for body in bodies)))

    async def cancel_when(self, body: Callable[[], Awaitable[None]], ready: Callable[[], bool]) -> None:
        task = asyncio.ensure_future(body())
        await wait_until(self, lambda: ready() or task.done())
        assert not task.done(), task
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    def raises(self, exc_type: type[BaseException], match: str) -> Any:
        return pytest.raises(exc_type, match=match)


@pytest.fixture(params=[Trio(), Asyncio()], ids=lambda lib: lib.name)
def lib(request: pytest.FixtureRequest) -> Library:
    library: Library = request.param
    return library


def connections_open_at(port: int) -> int:
    """TCP connections the server listening on `port` still holds established (closed ones wait in CLOSE_WAIT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as lines:
            for line in itertools.islice(lines, 1, None):
                fields = line.split()
                local_port = int(fields[1].rsplit(":", 1)[1], 16)
                count += fields[3] == "01" and local_port == port  # 01: ESTABLISHED
    return count


async def wait_until(lib: Library, condition: Callable[[], bool], deadline: float | None = None) -> None:
    """Poll `condition` until it holds; fail at `deadline` (time.monotonic()), by default WAIT from now."""
    deadline = time.monotonic() + WAIT if deadline is None else deadline
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await lib.sleep(0.01)


async def no_connection_left(lib: Library, port: int) -> None:
    """The agent on `port` comes to hold no connection open. The episodes these tests cancel last
    30 s, longer than any wait here (WAIT): a run that waited them out instead of cancelling them
    fails, and no figure of speed is asserted."""
    await wait_until(lib, lambda: connections_open_at(port) == 0)


def row(i: int, **demo: Any) -> dict[str, Any]:
    return {"id": i, "responses_create_params": {"input": "q" * (i % 5)}, **({"demo": demo} if demo else {})}


def test_rows_from_a_list_come_back_as_outcomes_with_a_summary(lib: Library, demo_server: DemoServer):
    rows: list[Any] = [*simple_rows(30), row(30, fault="422"), "{not json"]

    async def scenario() -> tuple[list[Any], dict[str, Any] | None]:
        async with open_rollouts(rows, Config(url=demo_server.url, repeats=2)) as run:
            assert isinstance(run, RolloutRun)  # the public type, under asyncio as under trio
            outcomes = [outcome async for outcome in run]
        return outcomes, run.summary

    outcomes, summary = lib.run(scenario)
    assert len(outcomes) == 64
    rollouts = [o for o in outcomes if isinstance(o, Rollout)]
    assert sorted((o.task_index, o.rollout_index) for o in rollouts) == [(t, k) for t in range(30) for k in range(2)]
    assert all(o.result["reward"] == expected_reward(o.row) for o in rollouts)
    assert sorted((f.number, f.kind) for f in outcomes if isinstance(f, Failure)) == [
        (31, ErrorKind.HTTP_STATUS),
        (31, ErrorKind.HTTP_STATUS),
        (32, ErrorKind.BAD_INPUT),
        (32, ErrorKind.BAD_INPUT),
    ]
    assert summary is not None
    assert summary["rollfilter"]["succeeded"] == 60
    assert summary["rollfilter"]["failed"] == 4
    assert "stopped" not in summary["rollfilter"]
    assert demo_server.stats()["requests"] == 62


def test_a_row_that_cannot_be_encoded_is_a_failure_and_the_run_goes_on(lib: Library, demo_server: DemoServer):
    cyclic: dict[str, Any] = {}
    cyclic["self"] = cyclic
    unencodable: list[Any] = [
        '{"responses_create_params": {"input": "\ud800"}}',  # a lone surrogate, as json.loads gives it
        {"responses_create_params": {"input": "\udc80"}},
        {"\ud800": 1},
        cyclic,
        object(),
    ]
    rows = [item for bad in unencodable for item in (row(0), bad)]

    async def scenario() -> list[Any]:
        async with open_rollouts(rows, Config(url=demo_server.url, concurrency=4)) as run:
            return [outcome async for outcome in run]

    outcomes = lib.run(scenario)
    failures = sorted((o.number, o.kind) for o in outcomes if isinstance(o, Failure))
    assert failures == [(n, ErrorKind.BAD_INPUT) for n in range(2, 2 * len(unencodable) + 1, 2)]
    assert sum(o.ok for o in outcomes) == len(unencodable)


def test_async_rows_are_stepped_in_the_callers_library(lib: Library, demo_server: DemoServer):
    stepped_in: set[str] = set()

    async def rows() -> AsyncIterator[dict[str, Any]]:
        for i in range(40):
            stepped_in.add(sniffio.current_async_library())
            await lib.sleep(0.001)  # asyncio.sleep under asyncio: it cannot be awaited inside trio
            yield row(i)

    async def scenario() -> list[Any]:
        async with open_rollouts(rows(), Config(url=demo_server.url, concurrency=8)) as run:
            return [outcome async for outcome in run]

    outcomes = lib.run(scenario)
    assert sorted(o.row["id"] for o in outcomes if o.ok) == list(range(40))
    assert stepped_in == {lib.name}


def test_rows_from_an_asyncio_queue(demo_server: DemoServer):
    async def scenario() -> list[Any]:
        queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue(maxsize=4)

        async def produce() -> None:
            for i in range(50):
                await queue.put(row(i))
            await queue.put(None)

        async def rows() -> AsyncIterator[dict[str, Any]]:
            while (item := await queue.get()) is not None:
                yield item

        async with asyncio.TaskGroup() as group:
            group.create_task(produce())
            async with open_rollouts(rows(), Config(url=demo_server.url, concurrency=8)) as run:
                return [outcome async for outcome in run]

    outcomes = Asyncio().run(scenario)
    assert sorted(o.row["id"] for o in outcomes if o.ok) == list(range(50))


def test_the_loop_is_never_blocked_while_thousands_of_rows_run(lib: Library, demo_server: DemoServer):
    gaps: list[float] = []

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await lib.sleep(TICK)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async def collect() -> int:
        async with open_rollouts(simple_rows(3000), Config(url=demo_server.url, concurrency=32)) as run:
            return sum([1 async for _ in run])

    async def scenario() -> int:
        return int(await lib.beside(tick, collect))

    assert lib.run(scenario) == 3000
    assert len(gaps) > 10
    assert max(gaps) < GAP_BOUND, f"the other task waited {max(gaps):.3f} s for a {TICK} s tick"


def test_cancelling_the_consumer_closes_what_is_in_flight(lib: Library, demo_process: DemoProcess):
    demo_server = demo_process  # in a process of its own: this one's descriptors are counted
    concurrency = 8
    holdings = Holdings()
    closed_rows: list[bool] = []
    consumed = 0
    summaries: list[dict[str, Any] | None] = []

    async def rows() -> AsyncIterator[dict[str, Any]]:
        try:
            yield row(0)
            for i in itertools.count(1):
                yield row(i, latency=30)  # ends only by cancellation
        finally:
            closed_rows.append(True)

    async def consume() -> None:
        nonlocal consumed
        run = open_rollouts(rows(), Config(url=demo_server.url, concurrency=concurrency))
        try:
            async with run as outcomes:
                async for _ in outcomes:
                    consumed += 1
        finally:
            summaries.append(outcomes.summary)

    def all_in_flight() -> bool:
        return consumed == 1 and demo_server.stats()["requests"] == concurrency + 1

    async def scenario() -> None:
        await lib.cancel_when(consume, all_in_flight)
        assert closed_rows == [True]  # by the run, not later by the garbage collector
        await no_connection_left(lib, demo_server.port)

    lib.run(scenario)
    assert closed_rows == [True]
    assert holdings.left_behind()[1] == set()
    assert summaries[0] is not None
    assert summaries[0]["rollfilter"]["succeeded"] == 1
    assert summaries[0]["rollfilter"]["stopped"] == "stopped early by the caller"
    assert demo_server.stats()["requests"] == concurrency + 1


def test_leaving_the_loop_early_cancels_and_closes(lib: Library, demo_server: DemoServer):
    concurrency = 8
    taken = 0

    async def rows() -> AsyncIterator[dict[str, Any]]:
        nonlocal taken
        for i in itertools.count():
            taken += 1
            yield row(i) if i % 3 else row(i, latency=30)  # a third never answered while the test lasts

    async def scenario() -> tuple[int, dict[str, Any] | None]:
        consumed = 0
        async with open_rollouts(rows(), Config(url=demo_server.url, concurrency=concurrency)) as run:
            async for _ in run:
                consumed += 1
                await lib.sleep(0.005)  # a slow consumer
                if consumed == 10:
                    break
        await no_connection_left(lib, demo_server.port)
        return consumed, run.summary

    consumed, summary = lib.run(scenario)
    assert taken <= consumed + concurrency + 1  # rows are taken only as capacity frees up
    assert summary is not None
    assert summary["rollfilter"]["stopped"] == "stopped early by the caller"
    assert demo_server.stats()["requests"] <= taken


def test_an_exception_from_the_callers_rows_reaches_the_caller(lib: Library, demo_server: DemoServer):
    async def rows() -> AsyncIterator[dict[str, Any]]:
        yield row(0)
        await wait_until(lib, lambda: demo_server.stats()["requests"] == 1)  # the run has started: row 0 is sent
        raise ValueError("the dataset is broken")

    async def scenario() -> None:
        with lib.raises(ValueError, "dataset is broken"):
            async with open_rollouts(rows(), Config(url=demo_server.url)) as run:
                async for _ in run:
                    pass

    lib.run(scenario)


def test_an_exception_from_sync_rows_reaches_the_caller(lib: Library, demo_server: DemoServer):
    def rows() -> Iterator[dict[str, Any]]:
        yield row(0)
        raise ValueError("the dataset is broken")

    async def scenario() -> None:
        with lib.raises(ValueError, "dataset is broken"):
            async with open_rollouts(rows(), Config(url=demo_server.url)) as run:
                async for _ in run:
                    pass

    lib.run(scenario)


def test_misconfiguration_raises_on_entry_before_anything_is_sent(lib: Library):
    taken = 0

    async def rows() -> AsyncIterator[dict[str, Any]]:
        nonlocal taken
        taken += 1
        yield row(0)

    async def scenario() -> None:
        with pytest.raises(UsageError, match="no agent"):
            async with open_rollouts(rows(), Config()):
                pytest.fail("entered")
        with pytest.raises(ServiceError, match="head server"):
            async with open_rollouts(rows(), Config(head_server=closed_port_url())):
                pytest.fail("entered")

    lib.run(scenario)
    assert taken == 0


def test_an_outcome_awaited_past_a_timeout_is_not_lost(lib: Library, demo_server: DemoServer):
    async def scenario() -> tuple[bool, list[Any]]:
        # The two sent first outlast the 0.05 s wait; the rest are quick.
        rows = [row(i, latency=0.15 if i < 2 else 0.01) for i in range(6)]
        async with open_rollouts(rows, Config(url=demo_server.url, concurrency=2)) as run:
            first = await lib.within(0.05, lambda: anext(run))

            def arrived_unasked() -> bool:
                # The first outcome has ended; under asyncio the run's task has also taken it for
                # the ask that was cancelled (it drops that ask then): where it could be lost.
                return run.status().ended >= 1 and (lib.name == "trio" or not run._asks)

            await wait_until(lib, arrived_unasked)
            return first, [outcome async for outcome in run]

    finished_early, outcomes = lib.run(scenario)
    assert not finished_early
    assert sorted(o.row["id"] for o in outcomes if o.ok) == list(range(6))


def test_several_tasks_take_outcomes_from_one_run(lib: Library, demo_server: DemoServer):
    async def scenario() -> list[list[Any]]:
        async with open_rollouts(simple_rows(60), Config(url=demo_server.url, concurrency=8)) as run:

            async def take() -> list[Any]:
                taken = []
                async for outcome in run:
                    taken.append(outcome)
                    await lib.sleep(0.001)
                return taken

            return list(await lib.gather(take, take, take))

    shares = lib.run(scenario)
    assert sorted(o.row["id"] for share in shares for o in share) == list(range(60))


def test_runs_side_by_side_and_one_after_another_on_one_loop(lib: Library, demo_server: DemoServer):
    async def collect(first: int, n: int) -> list[Any]:
        rows = [row(i, latency=0.05) for i in range(first, first + n)]
        async with open_rollouts(rows, Config(url=demo_server.url, concurrency=4)) as run:
            return [outcome async for outcome in run]

    async def scenario() -> list[list[Any]]:
        side_by_side = await lib.gather(lambda: collect(0, 20), lambda: collect(100, 20))
        return [*side_by_side, await collect(200, 5)]

    first, second, third = lib.run(scenario)
    assert sorted(o.row["id"] for o in first) == list(range(20))
    assert sorted(o.row["id"] for o in second) == list(range(100, 120))
    assert sorted(o.row["id"] for o in third) == list(range(200, 205))


def test_an_error_in_the_block_passes_through_and_the_run_is_stopped(lib: Library, demo_server: DemoServer):
    async def scenario() -> dict[str, Any] | None:
        rows = [row(0), *(row(i, latency=30) for i in range(1, 5))]
        with lib.raises(KeyError, match="the caller's own"):
            async with open_rollouts(rows, Config(url=demo_server.url)) as run:
                async for _ in run:
                    raise KeyError("the caller's own")
        await no_connection_left(lib, demo_server.port)
        return run.summary

    summary = lib.run(scenario)
    assert summary is not None
    assert summary["rollfilter"]["stopped"] == "stopped early by the caller"


def test_a_timeout_around_the_block_stops_the_run(demo_server: DemoServer):
    async def collect() -> None:
        rows = [row(i, latency=30) for i in range(4)]
        async with asyncio.timeout(0.3), open_rollouts(rows, Config(url=demo_server.url)) as run:
            async for _ in run:
                pass

    async def scenario() -> None:
        with pytest.raises(TimeoutError):
            await collect()
        await no_connection_left(Asyncio(), demo_server.port)

    Asyncio().run(scenario)


def test_open_rollouts_in_a_trio_guest_of_asyncio_uses_that_trio_run(demo_server: DemoServer):
    """Called from trio code that is itself a guest on asyncio, the run is a plain trio run."""

    async def in_trio() -> list[Any]:
        async with open_rollouts(simple_rows(5), Config(url=demo_server.url)) as run:
            return [outcome async for outcome in run]

    async def scenario() -> list[Any]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()
        trio.lowlevel.start_guest_run(
            in_trio,
            run_sync_soon_threadsafe=loop.call_soon_threadsafe,
            done_callback=done.set_result,
            host_uses_signal_set_wakeup_fd=True,
        )
        return list((await done).unwrap())

    assert len(Asyncio().run(scenario)) == 5


def test_a_second_cancellation_while_leaving_still_waits_for_the_run(demo_server: DemoServer):
    closed_rows: list[bool] = []

    async def rows() -> AsyncIterator[dict[str, Any]]:
        try:
            for i in itertools.count():
                yield row(i, latency=30)
        finally:
            closed_rows.append(True)

    async def consume() -> None:
        async with open_rollouts(rows(), Config(url=demo_server.url, concurrency=4)) as run:
            async for _ in run:
                pass

    async def scenario() -> None:
        task = asyncio.ensure_future(consume())
        await wait_until(Asyncio(), lambda: demo_server.stats()["requests"] == 4)
        task.cancel()
        asyncio.get_running_loop().call_soon(task.cancel)  # lands while the block is being left
        with pytest.raises(asyncio.CancelledError):
            await task
        assert closed_rows == [True]
        await no_connection_left(Asyncio(), demo_server.port)

    Asyncio().run(scenario)


CTRL_C_SCRIPT = """
import asyncio, itertools, sys
from rollfilter import Config, open_rollouts

async def main(url):
    rows = ({"responses_create_params": {"input": "x"}, "demo": {"latency": 3600}} for _ in itertools.count())
    async with open_rollouts(rows, Config(url=url, concurrency=4)) as run:
        print("entered", flush=True)
        async for _ in run:
            pass

asyncio.run(main(sys.argv[1]))
"""


@pytest.mark.parametrize("thread", ["main", "another"])
def test_ctrl_c_in_an_asyncio_program_stops_the_run(demo_server: DemoServer, tmp_path: Path, thread: str):
    """The kernel hands a process's SIGINT to any of its threads that does not block it; one
    handed to trio's I/O thread must wake the loop as one handed to the main thread does (the
    episodes in flight last an hour: nothing else would wake it)."""
    script = tmp_path / "train.py"
    script.write_text(CTRL_C_SCRIPT)
    process = subprocess.Popen(
        [sys.executable, str(script), demo_server.url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=clean_env(PYTHONFAULTHANDLER="1"),  # a SIGABRT prints every thread's stack
        # As a terminal starts it: a shell's background job (the suite run with `&`) ignores
        # SIGINT, and Python then leaves it ignored.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline() == b"entered\n"
        wait_for(lambda: demo_server.stats()["requests"] == 4)

        def others() -> list[int]:
            return [int(tid) for tid in os.listdir(f"/proc/{process.pid}/task") if int(tid) != process.pid]

        if thread == "another":  # trio starts its I/O thread the first time the guest must block: not yet, maybe
            wait_for(lambda: bool(others()))
        # kill() of a thread's id is still sent to the process, but that thread is offered it first.
        os.kill(process.pid if thread == "main" else others()[0], signal.SIGINT)
        try:
            _, stderr = process.communicate(timeout=SUBPROCESS_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.send_signal(signal.SIGABRT)
            pytest.fail(f"still running after a Ctrl-C: {process.communicate()[1].decode(errors='replace')}")
    finally:
        process.kill()
        process.communicate()
    assert process.returncode == -signal.SIGINT  # asyncio.run re-raises KeyboardInterrupt, as without rollfilter
    assert stderr.decode().rstrip().endswith("KeyboardInterrupt")
    assert "guest run" not in stderr.decode()  # trio's warning for a guest run left unfinished


def test_a_drain_waiting_ends_not_drained_when_the_run_is_resumed(lib: Library, demo_server: DemoServer):
    # The two sent first are still out when the resume ends the drain; the two after are quick.
    latencies = (0.3, 0.3, 0.01, 0.01)
    rows = [{"responses_create_params": {"input": "hi"}, "demo": {"latency": latency}} for latency in latencies]

    async def scenario() -> tuple[list[Any], int]:
        async with open_rollouts(rows, Config(url=demo_server.url, concurrency=2)) as run:
            await wait_until(lib, lambda: run.statistics().steering.requests_out == 2)

            async def resume_once_paused() -> None:
                await wait_until(lib, lambda: run.statistics().steering.paused)
                run.resume()

            answers = await lib.gather(lambda: run.drain(WAIT), resume_once_paused)
            out = run.statistics().steering.requests_out  # the episodes go on: the resume ended the drain
            assert len([outcome async for outcome in run]) == 4
        return answers, out

    answers, out = lib.run(scenario)
    assert answers == [False, None]
    assert out == 2


def test_a_run_is_paused_drained_and_steered_from_its_own_library(lib: Library, demo_server: DemoServer):
    rows = [{"responses_create_params": {"input": "hi"}, "demo": {"latency": 0.05}} for _ in range(8)]

    async def scenario() -> tuple[list[Outcome], int, int]:
        async with open_rollouts(rows, Config(url=demo_server.url, concurrency=2, policy_version=1)) as run:
            outcomes = [await anext(run)]
            assert await run.drain(WAIT)  # pauses, then waits for the other one out
            sent = demo_server.stats()["requests"]
            await lib.sleep(0.1)  # longer than an episode: nothing new may start meanwhile
            sent_while_paused = demo_server.stats()["requests"] - sent
            stats = run.statistics().steering
            assert (stats.paused, stats.requests_out, stats.concurrency) == (True, 0, 2)
            run.set_concurrency(4)
            run.set_policy_version(2)
            run.resume()
            outcomes += [outcome async for outcome in run]
        return outcomes, sent, sent_while_paused

    outcomes, sent, sent_while_paused = lib.run(scenario)
    assert sent_while_paused == 0
    assert len(outcomes) == 8
    versions = [outcome.result["_rf_policy_version"]["sent"] for outcome in outcomes if isinstance(outcome, Rollout)]
    assert versions.count(1) == sent
    assert versions.count(2) == 8 - sent


def test_the_documented_rl_loop_steps_the_trainer_off_the_loop_and_ends_at_the_target(demo_server: DemoServer):
    from rollfilter import Groups

    rows = [{"responses_create_params": {"input": f"task {i}"}} for i in range(20)]
    config = Config(url=demo_server.url, repeats=2, groups=Groups(target=3, max_staleness=0, batch=1), policy_version=0)
    stepped = threading.Event()

    def step(batch: list[Any]) -> bool:
        # A trainer's step blocks its thread; the loop goes on meanwhile, and is what lets it end.
        return stepped.wait(timeout=WAIT)

    async def scenario() -> tuple[int, list[bool], str | None]:
        steps: list[bool] = []
        async with open_rollouts(rows, config) as run:
            version, groups = 0, 0
            async for group in run.groups():  # ends once the target's groups are out
                groups += 1
                stepped.clear()
                asyncio.get_running_loop().call_soon(stepped.set)  # runs only while the loop is free
                steps.append(await asyncio.to_thread(step, [group]))
                version += 1
                run.set_policy_version(version)
            return groups, steps, run.statistics().stopped

    groups, steps, stopped = asyncio.run(scenario())
    assert (groups, steps) == (3, [True, True, True])
    assert stopped is not None
    assert "target" in stopped
