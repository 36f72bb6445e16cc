"""`python -m rollfilter.demo`: the demo agent on its own, with faults to inject for trying
pipelines (and for the tests and the benchmark)."""

from __future__ import annotations

import argparse
import sys

import trio

from rollfilter.demo.agent import DemoAgent, DemoOptions
from rollfilter.demo.server import serve
from rollfilter.gc_policy import collect_garbage_for_a_run


def _schedule(text: str) -> tuple[tuple[float, int], ...]:
    """`T=N,...` (seconds, episodes at once), in time order."""
    steps = []
    for part in text.split(","):
        after, sep, episodes = part.partition("=")
        try:
            steps.append((float(after), int(episodes)))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not T=N (seconds=episodes)") from None
        if not sep or steps[-1][0] < 0:
            raise argparse.ArgumentTypeError(f"{part!r} is not T=N (seconds=episodes)")
    return tuple(sorted(steps))


def parse_args(argv: list[str] | None = None) -> tuple[DemoOptions, str, int]:
    """`python -m rollfilter.demo`'s command line: the agent's options, the host and the port."""
    parser = argparse.ArgumentParser(
        prog="python -m rollfilter.demo",
        description="Run rollfilter's demo agent (POST /run, GET /stats) with optional injected faults.",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8000, help="port (0 picks a free one; default 8000)")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds each episode takes")
    parser.add_argument("--jitter", type=float, default=0.0, help="up to this many extra seconds, at random")
    parser.add_argument("--fail-rate", type=float, default=0.0, help="share of requests answered 500")
    parser.add_argument("--throttle-rate", type=float, default=0.0, help="share answered 429 with Retry-After")
    parser.add_argument("--retry-after", type=float, default=1.0, help="Retry-After seconds of a 429 (default 1)")
    parser.add_argument("--hang-rate", type=float, default=0.0, help="share never answered")
    parser.add_argument("--garbage-rate", type=float, default=0.0, help="share answered 200 with a non-JSON body")
    parser.add_argument("--drop-rate", type=float, default=0.0, help="share whose connection is closed unanswered")
    parser.add_argument("--seed", type=int, default=None, help="seed for the fault and jitter draws")
    parser.add_argument(
        "--capacity",
        type=int,
        default=None,
        help="episodes at once; requests beyond are answered 429 with Retry-After (a model server's limit)",
    )
    parser.add_argument(
        "--slots",
        type=int,
        default=None,
        help="episodes at once; requests beyond wait in a queue, first come first served (a model server's batch)",
    )
    parser.add_argument(
        "--thrash",
        type=float,
        default=0.0,
        help="with --slots: past twice the slots in the system, each episode slows by this share per slots more",
    )
    parser.add_argument(
        "--schedule",
        type=_schedule,
        default=(),
        metavar="T=N,...",
        help="--slots (or --capacity) becomes N at T seconds after the first /run, e.g. 10=20,20=40",
    )
    parser.add_argument(
        "--record-arrivals", action="store_true", help="GET /stats lists when each /run arrived (memory grows)"
    )
    parser.add_argument(
        "--no-aggregate-groups",
        action="store_true",
        help="answer /aggregate_metrics without per-task groups (counts only what it reads)",
    )
    args = parser.parse_args(argv)
    options = DemoOptions(
        latency=args.latency,
        jitter=args.jitter,
        fail_rate=args.fail_rate,
        throttle_rate=args.throttle_rate,
        retry_after=args.retry_after,
        hang_rate=args.hang_rate,
        garbage_rate=args.garbage_rate,
        drop_rate=args.drop_rate,
        seed=args.seed,
        aggregate_groups=not args.no_aggregate_groups,
        record_arrivals=args.record_arrivals,
        capacity=args.capacity,
        slots=args.slots,
        thrash=args.thrash,
        schedule=args.schedule,
    )
    if sum((options.fail_rate, options.throttle_rate, options.hang_rate, options.garbage_rate, options.drop_rate)) > 1:
        parser.error("the fault rates add up to more than 1")
    if options.slots is not None and options.capacity is not None:
        parser.error("--slots (a queue) and --capacity (a refusal) are two kinds of server: give one")
    if options.schedule and options.slots is None and options.capacity is None:
        parser.error("--schedule changes --slots or --capacity: give one of them")
    episodes = [n for n in (options.slots, options.capacity) if n is not None] + [n for _, n in options.schedule]
    if any(n < 1 for n in episodes):
        parser.error("--slots, --capacity and the --schedule's episodes must be at least 1")
    return options, args.host, args.port


def main(argv: list[str] | None = None) -> None:
    """`python -m rollfilter.demo`: run the demo agent on its own, with optional faults."""
    options, host, port = parse_args(argv)

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(
                lambda task_status: serve(DemoAgent(options), host=host, port=port, task_status=task_status)
            )
            print(f"demo agent listening on http://{host}:{bound}", file=sys.stderr, flush=True)

    collect_garbage_for_a_run()
    try:
        trio.run(run)
    except KeyboardInterrupt:
        sys.exit(130)
    except OSError as exc:
        sys.exit(f"python -m rollfilter.demo: cannot listen on {host}:{port}: {exc.strerror}")
