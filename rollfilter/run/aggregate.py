"""The agents' own aggregate metrics: NeMo Gym's `/aggregate_metrics`, asked when a run ends.

Each agent name gets one `POST /aggregate_metrics` whose body, `{"verify_responses": [...]}`, is
streamed from the run's spool (`spool.ResultSpool`), sorted by (task, rollout) as NeMo Gym sends
them. The answers make NeMo Gym's aggregate file: a JSON list with one
`{agent_ref, agent_metrics, key_metrics, group_level_metrics}` per agent.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping
from typing import Any

import httpx
import msgspec
import trio

from rollfilter.config import Config, endpoint_beside
from rollfilter.engine.client import transport_failure
from rollfilter.engine.routing import Router
from rollfilter.formats.spool import ResultSpool
from rollfilter.http import AgentTransport
from rollfilter.redact import origin

AGGREGATE_PATH = "/aggregate_metrics"
_encode = msgspec.json.Encoder().encode


class _Answer(msgspec.Struct):
    """NeMo Gym's AggregateMetrics; group_level_metrics (a line a task) is passed on unparsed."""

    agent_metrics: Any = msgspec.field(default_factory=dict)
    key_metrics: Any = msgspec.field(default_factory=dict)
    group_level_metrics: msgspec.Raw = msgspec.Raw(b"[]")


@dataclasses.dataclass(slots=True)
class AggregateReport:
    """The agents' answers (for the aggregate file) and one-line problems, by agent name."""

    entries: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    unnamed: int = 0  # results left out of every agent's aggregate: they named no agent

    @property
    def whole(self) -> bool:
        """Every result is in the answer of its agent: each agent answered, and every result named one."""
        return not self.problems

    @property
    def key_metrics(self) -> dict[str, Any]:
        return {entry["agent_ref"]["name"]: entry["key_metrics"] for entry in self.entries}

    def file_bytes(self) -> bytes:
        """NeMo Gym's `_aggregate_metrics.json`: a JSON list, one entry per agent."""
        return msgspec.json.format(_encode(self.entries), indent=2) + b"\n"


def aggregate_url(run_url: str) -> str:
    """An agent's /aggregate_metrics beside its /run URL, or a resources server's beside its /verify
    (see `endpoint_beside`)."""
    return endpoint_beside(run_url, AGGREGATE_PATH)


async def request_aggregates(
    spool: ResultSpool, run_urls: Mapping[str, str], transport: AgentTransport, seconds_per_call: float | None = None
) -> AggregateReport:
    """POST each spooled agent's results to its /aggregate_metrics through `transport`, each
    call within `seconds_per_call` when given; never raises for an agent."""
    report = AggregateReport(unnamed=spool.unnamed)
    if spool.unnamed:
        report.problems.append(
            f"{spool.unnamed} results name no agent (their rows went to a URL, not to an agent by name),"
            " so no agent was asked to aggregate them"
        )
    if spool.error is not None:
        report.problems.append(spool.error)
        return report
    for name in sorted(spool.agents):
        run_url = run_urls.get(name)
        if run_url is None:
            report.problems.append(f"no URL for agent {name!r}")
            continue
        url = httpx.URL(aggregate_url(run_url))
        where = f"agent {name!r} ({origin(url)})"
        reply = None
        with trio.move_on_after(math.inf if seconds_per_call is None else seconds_per_call):
            try:
                reply = await transport.request(
                    b"POST", url, functools.partial(spool.body, name), length=spool.body_size(name)
                )
            except httpx.TransportError as exc:
                report.problems.append(f"{where}: /aggregate_metrics failed: {transport_failure(url, exc).message}")
                continue
            except Exception as exc:  # one agent's surprise costs its aggregate (its text may hold secrets)
                report.problems.append(f"{where}: /aggregate_metrics failed: unexpected {type(exc).__name__}")
                continue
        if reply is None:
            report.problems.append(f"{where}: /aggregate_metrics gave no answer within {seconds_per_call:g} s")
            continue
        if reply.status == 404:
            report.problems.append(f"{where} has no /aggregate_metrics (HTTP 404)")
            continue
        if reply.status != 200:
            report.problems.append(f"{where}: /aggregate_metrics answered HTTP {reply.status}")
            continue
        try:
            answer = msgspec.json.decode(reply.body, type=_Answer)
        except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
            report.problems.append(f"{where}: /aggregate_metrics answered something that is not its metrics")
            continue
        report.entries.append(
            {
                "agent_ref": {"name": name},
                "agent_metrics": answer.agent_metrics,
                "key_metrics": answer.key_metrics,
                "group_level_metrics": answer.group_level_metrics,
            }
        )
    return report


async def aggregate_run(
    spool: ResultSpool, router: Router, config: Config, transport: AgentTransport
) -> AggregateReport:
    """Ask each agent of the run for its aggregate metrics at the URL its rows went to
    (`router`), through the run's `transport`: the -H headers, the TLS options, --proxy, the
    reply bound and the error kinds apply as they do to /run. `--timeout` bounds each call when given."""
    urls = {name: router.run_url(name) for name in spool.agents}
    known = {name: url for name, url in urls.items() if url}
    return await request_aggregates(spool, known, transport, config.timeout.attempt)
