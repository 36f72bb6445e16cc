"""cli/signals.py: the status block that SIGUSR1 prints, from a run's snapshot."""

from __future__ import annotations

import dataclasses

from rollfilter.cli.signals import status_block
from rollfilter.engine.nursery import InFlight
from rollfilter.run.statistics import RunStatistics


def test_the_status_block_says_what_the_snapshot_says():
    taken = RunStatistics.empty()
    oldest = (
        InFlight("rows.jsonl", 2, 6, 0, "a", attempt=1, age_s=13.0),
        InFlight("rows.jsonl", 3, 7, 0, "a", attempt=2, age_s=12.5, waiting="rate limits"),
    )
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
        "status: 42 done, 2 failed, 5 in flight (3 waiting on rate limits), 1.5 rows/s, 30.0 s",
        "  in flight 13.0 s: rows.jsonl:2 task 6 rollout 0 agent a attempt 1",
        "  waiting 12.5 s: rows.jsonl:3 task 7 rollout 0 agent a attempt 2 (not sent yet: --rpm/--tpm)",
    ]


def test_the_rollouts_waiting_are_said_apart_from_those_in_flight_by_what_they_wait_on():
    taken = RunStatistics.empty()
    steering = dataclasses.replace(taken.steering, paused=True, waiting_on_policy_version=12)
    oldest = (InFlight("rows.jsonl", 3, 7, 0, None, attempt=1, age_s=2.0, waiting="pause"),)
    shown = dataclasses.replace(
        taken,
        connected=True,
        succeeded=4,
        in_flight=0,
        waiting_on_pause=7,
        waiting_on_window=2,
        steering=steering,
        oldest=oldest,
    )
    assert status_block(shown) == [
        "status: paused, 4 done, 0 failed, 0 in flight (7 waiting on the pause, 2 waiting on the adaptive window,"
        " 12 waiting for the policy version), 0.0 rows/s, 0.0 s",
        "  waiting 2.0 s: rows.jsonl:3 task 7 rollout 0 agent (no name) attempt 1 (not sent yet: paused)",
    ]


def test_a_run_not_connected_yet_has_sent_nothing():
    assert status_block(RunStatistics.empty()) == ["status: starting, nothing sent yet"]


def test_with_groups_the_rollouts_back_in_open_groups_are_said_too():
    """With --groups a finished rollout is counted when its group closes: until then it is neither
    done nor in flight, and the status says how many wait so, or its counts would not add up."""
    shown = dataclasses.replace(
        RunStatistics.empty(), connected=True, started=10, succeeded=4, in_flight=2, in_open_groups=4
    )
    assert shown.status().in_open_groups == 4
    assert status_block(shown) == ["status: 4 done, 0 failed, 2 in flight, 4 back in open groups, 0.0 rows/s, 0.0 s"]
