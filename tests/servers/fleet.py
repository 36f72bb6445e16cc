"""A stand-in fleet of an agent's replicas, each in front of a model server with a prefix cache.

Each replica serves `/run` on a port of its own on 127.0.0.1, `slots` episodes at once (the rest
queue), and keeps the prompts (a row's `responses_create_params.input`) of its last `cache`
episodes: an episode whose prompt it holds takes `hit_s`, another `miss_s` (and puts its prompt in
the cache as it starts, so the rollouts of a task that arrive together share one prefill). A
replica can run at a fraction of the speed (`speeds`), or die a number of seconds after its first
request (`deaths`): its listener and connections close, and it stays down; or blip (`blips`): go
down so, and come back on the same port a number of seconds later. `GET /stats` on a replica gives
its requests (and those since it came back), hits and misses, and the tasks it served.

    python -m tests.servers.fleet --replicas 4 --slots 8 --speed 0=0.4 --death 3=1.0

prints one line, `listening on URL,URL,...` (the /run URLs), and serves until killed. The tests
start it in a thread (`Fleet`).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import queue
import sys
import threading
from collections.abc import Iterator
from typing import Any

import msgspec
import trio

from rollfilter.demo.server import serve

_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


@dataclasses.dataclass(frozen=True)
class FleetOptions:
    replicas: int = 4
    slots: int = 8
    cache: int = 32  # prompts a replica's prefix cache holds
    hit_s: float = 0.05
    miss_s: float = 0.2
    speeds: dict[int, float] = dataclasses.field(default_factory=dict)  # replica -> fraction of full speed
    deaths: dict[int, float] = dataclasses.field(default_factory=dict)  # replica -> seconds after its first /run
    blips: dict[int, tuple[float, float]] = dataclasses.field(default_factory=dict)  # replica -> (down at, for)
    aggregate_groups: bool = False  # what rollfilter.demo.server asks of what it serves


class Replica:
    """One replica: what `rollfilter.demo.server.serve` serves."""

    def __init__(self, index: int, options: FleetOptions) -> None:
        self.index = index
        self.options = options
        self._slots = trio.CapacityLimiter(options.slots)
        self._cache: collections.OrderedDict[bytes, None] = collections.OrderedDict()
        self._slowdown = 1.0 / options.speeds.get(index, 1.0)
        self.requests = self.hits = self.misses = 0
        self.back = False  # down once (a blip), and serving again
        self.requests_since_back = 0
        self.tasks: collections.Counter[str] = collections.Counter()
        self.first_run = trio.Event()

    async def run_timers(self) -> None:
        pass

    async def answer(self, method: str, path: str, body: bytes | object) -> tuple[int, list[tuple[str, str]], bytes]:
        if method == "GET" and path == "/stats":
            stats = {
                "requests": self.requests,
                "requests_since_back": self.requests_since_back,
                "hits": self.hits,
                "misses": self.misses,
                "tasks": dict(self.tasks),
            }
            return 200, [], _encode(stats)
        if method != "POST" or path != "/run" or not isinstance(body, bytes):
            return 404, [], _encode({"detail": "Not Found"})
        self.first_run.set()
        row = _decode(body)
        prompt = _encode(row.get("responses_create_params", {}).get("input"))
        self.requests += 1
        self.requests_since_back += self.back
        self.tasks[str(row.get("_ng_task_index"))] += 1
        async with self._slots:
            hit = prompt in self._cache
            self._cache[prompt] = None
            self._cache.move_to_end(prompt)
            while len(self._cache) > self.options.cache:
                self._cache.popitem(last=False)
            if hit:
                self.hits += 1
            else:
                self.misses += 1
            await trio.sleep((self.options.hit_s if hit else self.options.miss_s) * self._slowdown)
        usage = {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}
        result = {"response": {"id": f"fleet-{self.index}", "usage": usage}, "reward": 1.0, "cache_hit": hit}
        return 200, [], _encode(result)


async def serve_fleet(
    options: FleetOptions, task_status: trio.TaskStatus[list[int]] = trio.TASK_STATUS_IGNORED
) -> None:
    """Serve every replica of `options` until cancelled; reports their ports."""
    replicas = [Replica(index, options) for index in range(options.replicas)]
    async with trio.open_nursery() as nursery:
        ports = []
        for replica in replicas:
            scope = trio.CancelScope()
            ports.append(await nursery.start(functools.partial(_serve_replica, replica, scope)))
            if replica.index in options.deaths:
                nursery.start_soon(_die, replica, scope, options.deaths[replica.index])
            if replica.index in options.blips:
                nursery.start_soon(_blip, replica, scope, ports[-1], *options.blips[replica.index])
        task_status.started(ports)


async def _serve_replica(replica: Replica, scope: trio.CancelScope, task_status: trio.TaskStatus[int]) -> None:
    with scope:
        await serve(replica, task_status=task_status)  # type: ignore[arg-type]  # it serves a DemoAgent's surface


async def _die(replica: Replica, scope: trio.CancelScope, after: float) -> None:
    await replica.first_run.wait()
    await trio.sleep(after)
    scope.cancel()


async def _blip(replica: Replica, scope: trio.CancelScope, port: int, after: float, down: float) -> None:
    await _die(replica, scope, after)
    await trio.sleep(down)
    replica.back = True
    await serve(replica, port=port)  # type: ignore[arg-type]  # as _serve_replica


class Fleet:
    """The fleet, served from a trio run in a thread of this process; `close()` ends it."""

    def __init__(self, options: FleetOptions) -> None:
        started: queue.Queue[list[int] | BaseException] = queue.Queue()
        self._scope = trio.CancelScope()

        async def main() -> None:
            self._token = trio.lowlevel.current_trio_token()
            with self._scope:
                async with trio.open_nursery() as nursery:
                    started.put(await nursery.start(serve_fleet, options))

        def thread() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # the test's thread raises it
                started.put(exc)

        self._thread = threading.Thread(target=thread, name="fleet", daemon=True)
        self._thread.start()
        ports = started.get(timeout=30)
        if isinstance(ports, BaseException):
            raise ports
        self.bases = [f"http://127.0.0.1:{port}" for port in ports]
        self.urls = [base + "/run" for base in self.bases]

    def stats(self) -> list[dict[str, Any]]:
        """Each replica's /stats (an empty one for a replica that died)."""
        import urllib.request

        found = []
        for base in self.bases:
            try:
                with urllib.request.urlopen(base + "/stats", timeout=10) as response:
                    found.append(_decode(response.read()))
            except OSError:
                found.append({"requests": 0, "hits": 0, "misses": 0, "tasks": {}, "down": True})
        return found

    def close(self) -> None:
        if self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._scope.cancel, trio_token=self._token)
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the fleet did not stop"


@contextlib.contextmanager
def fleet(**options: Any) -> Iterator[Fleet]:
    running = Fleet(FleetOptions(**options))
    try:
        yield running
    finally:
        running.close()


def _pairs(text: str) -> tuple[int, float]:
    index, _, value = text.partition("=")
    return int(index), float(value)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--cache", type=int, default=32)
    parser.add_argument("--hit", type=float, default=0.05, help="seconds an episode takes on a cache hit")
    parser.add_argument("--miss", type=float, default=0.2, help="seconds an episode takes on a miss")
    parser.add_argument("--speed", type=_pairs, action="append", default=[], metavar="I=F", help="replica I at F")
    parser.add_argument("--death", type=_pairs, action="append", default=[], metavar="I=S", help="I dies S s in")
    args = parser.parse_args(argv)
    options = FleetOptions(
        replicas=args.replicas,
        slots=args.slots,
        cache=args.cache,
        hit_s=args.hit,
        miss_s=args.miss,
        speeds=dict(args.speed),
        deaths=dict(args.death),
    )

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            ports = await nursery.start(serve_fleet, options)
            print(
                "listening on " + ",".join(f"http://127.0.0.1:{port}/run" for port in ports),
                file=sys.stderr,
                flush=True,
            )

    trio.run(run)


if __name__ == "__main__":
    main()
