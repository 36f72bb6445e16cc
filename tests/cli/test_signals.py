"""cli/signals.py: the status block that SIGUSR1 prints, from a run's snapshot."""

from __future__ import annotations

import dataclasses

from rollfilter.cli.signals import status_block
from rollfilter.engine.metrics import Metrics
from rollfilter.engine.nursery import InFlight
from rollfilter.engine.statistics import statistics_of


def test_the_status_block_says_what_the_snapshot_says():
    taken = statistics_of(Metrics())
    oldest = (InFlight("rows.jsonl", 3, 7, 0, "a", attempt=2, age_s=12.5, waiting=True),)
    shown = dataclasses.replace(
        taken,
        connected=True,
        succeeded=40,
        failed=2,
        in_flight=5,
        waiting_on_rate_limits=3,
        rows_per_s=1.5,
        elapsed_s=30.0,
        oldest=oldest,
    )
    assert status_block(shown) == [
        "status: 42 done, 2 failed, 5 in flight (3 held by --rpm/--tpm), 1.5 rows/s, 30.0 s",
        "  in flight 12.5 s: rows.jsonl:3 task 7 rollout 0 agent a attempt 2 (not sent yet: --rpm/--tpm)",
    ]


def test_a_run_not_connected_yet_has_sent_nothing():
    assert status_block(statistics_of(Metrics())) == ["status: starting, nothing sent yet"]
