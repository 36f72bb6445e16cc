"""run.py: one run put together once, as the command line, the API and --summarize use it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollfilter.config import Config, Rates
from rollfilter.engine.plan import Job
from rollfilter.engine.routing import Agent
from rollfilter.formats.source import LineReader
from rollfilter.formats.writers import Release
from rollfilter.outcomes import AttemptFailure
from rollfilter.run.outputs import DryRunClient
from rollfilter.run.run import Run
from tests.conftest import DemoServer, rows_jsonl, simple_rows


class _Shown:
    """What a dry run shows, in the order shown: each job's route, then its body."""

    def __init__(self) -> None:
        self.events: list[tuple[str, int]] = []

    def route(self, job: Job, agent: Agent) -> None:
        self.events.append(("route", job.seq))

    def result(self, job: Job, result: dict[str, Any], release: Release) -> None:
        self.events.append(("body", job.seq))
        release()

    def failure(self, job: Job, failure: AttemptFailure, release: Release) -> None:
        self.events.append(("failure", job.seq))
        release()

    def not_persisted(self, job: Job, attempts: int, release: Release) -> None:
        raise AssertionError("a dry run has no answers")


async def test_a_dry_run_takes_one_row_at_a_time_whatever_the_concurrency(tmp_path: Path, demo_server: DemoServer):
    """Each row's route is shown and the client yields to the scheduler before its body comes
    back: with more than one worker, the next row's route would come in between, and bodies
    would come back in the scheduler's order rather than the input's."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(rows_jsonl(simple_rows(20)))
    config = Config(url=demo_server.url, concurrency=16)
    shown = _Shown()
    reader = LineReader([str(rows)], max_line_bytes=1 << 20)
    run = Run(config, source=reader, sink=shown, client=DryRunClient(shown.route))
    try:
        await run.connect()
        await run.send()
    finally:
        reader.close()
        await run.aclose()
    assert shown.events == [(event, seq) for seq in range(20) for event in ("route", "body")]
    assert demo_server.stats()["requests"] == 0


async def test_a_run_given_a_client_that_sends_nothing_keeps_nothing_for_answers():
    """A dry run is composed by its caller (its client and its sink): the run given such a client
    keeps no spool for /aggregate_metrics and no send slots for rate limits."""
    config = Config(url="http://127.0.0.1:1/run", aggregate=True, rates=Rates(rpm=60))
    sending, dry = Run(config), Run(config, client=DryRunClient(lambda job, agent: None))
    try:
        assert (sending.spool is None, sending.send_slots is None) == (False, False)
        assert (dry.spool, dry.send_slots) == (None, None)
        assert dry.summary()["rollfilter"]["would_send"] == 0
    finally:
        await sending.aclose()
        await dry.aclose()
