"""Garbage-collector settings for a process that is one long trio run (the command, the demo agent)."""

from __future__ import annotations

import gc


def collect_garbage_for_a_run() -> None:
    """Fit the cyclic garbage collector to a run. Only for programs that own their process.

    A run keeps thousands of coroutines, connections and parsers alive and makes almost no
    reference cycles: at -j 2000, collections freed next to nothing, yet with the defaults
    they took a large share of the command's CPU and stalled every row in flight while they
    ran (docs/benchmarks.md, "The garbage collector", has the figures). Start-up objects are
    frozen out of every later pass, and young objects are collected every 20,000 allocations
    instead of 700: cycles are still freed, only less often. The command's start-up turns the
    collector off for its imports; this turns it on.
    """
    gc.freeze()
    gc.set_threshold(20_000, 10, 10)
    gc.enable()
