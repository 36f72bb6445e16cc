"""Counting a rollout: the one place where a rollout's end goes into a run's figures.

A rollout is counted once, where it ends: into the run's counters (`Metrics`), its tasks'
figures (`TaskStats`, with repeats) and the spool of results for `/aggregate_metrics`. The
engine counts the rollouts it takes and ends, the groups count those of groups that closed (a
cancelled group's are in no figure), a resumed run counts what earlier runs finished and the
failures of theirs it gives up on (in the figures, not in this run's counters), and
`--summarize` counts the lines of result files as a run that wrote them would have. Each of
them calls the `Tally` of its run, and nothing else adds to those figures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollfilter.config import Config
from rollfilter.cost import Spending
from rollfilter.engine.metrics import Metrics
from rollfilter.engine.plan import Job
from rollfilter.errors import ErrorKind
from rollfilter.figures.health import RecentShare, failed_checks, verdict_of_line
from rollfilter.figures.means import RewardByVersion, reward_of
from rollfilter.figures.passk import TaskStats
from rollfilter.formats.spool import ResultSpool
from rollfilter.outcomes import AttemptFailure
from rollfilter.rows import HEALTH, POLICY_VERSION, ROLLOUT_INDEX, TASK_INDEX, agent_name, is_masked


class Tally:
    """Counts each rollout of a run once, into `metrics`, `tasks` (None: no task figures, as
    without repeats or in a dry run, whose rollouts are never answered) and `spool` (None: no
    aggregate). `repeats_for(agent)` is the group size of an agent's tasks, for results read
    from files, which no plan sizes (see `TaskStats.reached`).

    A result's health is judged once: as it was received, by the client, which marks an unhealthy
    one (`_rf_health`); a result read back from a file is judged again here, so that files of any
    run are judged alike. With `mask_unhealthy`, an unhealthy result is masked, as one that says
    `mask_sample: true` is; `watch` keeps the windows a limit on a rate of them looks at.

    The engine's calls (`started`, `result`, `failure`, `not_persisted`) are on the path of
    every row: each is one call, and adds to the figures directly."""

    __slots__ = ("_repeats_for", "mask_unhealthy", "metrics", "sample", "spool", "tasks")

    def __init__(
        self,
        metrics: Metrics,
        tasks: TaskStats | None = None,
        spool: ResultSpool | None = None,
        *,
        repeats_for: Callable[[str | None], int | None] | None = None,
        mask_unhealthy: bool = False,
        watch: bool = False,
    ) -> None:
        self.metrics = metrics
        self.tasks = tasks
        self.spool = spool
        self._repeats_for = repeats_for
        self.mask_unhealthy = mask_unhealthy
        if watch:
            metrics.recent_unhealthy, metrics.recent_masked = RecentShare(), RecentShare()
        self.sample: Callable[[dict[str, Any]], None] | None = None  # each result, for a tracker's sample

    @classmethod
    def for_config(cls, config: Config, tasks: TaskStats | None, spool: ResultSpool | None) -> Tally:
        """The tally of a run of `config`: each agent's repeats, its health settings, and the
        metrics it counts into, with what the run spends (given prices) and each policy version's
        reward mean (given a version)."""
        metrics, health = Metrics(), config.health
        if config.cost.prices:
            metrics.spending = Spending(config.cost.prices)
        if config.policy_version is not None:
            metrics.by_version = RewardByVersion(POLICY_VERSION)
        return cls(
            metrics,
            tasks,
            spool,
            repeats_for=config.repeats.for_agent,
            mask_unhealthy=health.unhealthy == "mask",
            watch=health.watched,
        )

    def started(self) -> None:
        """A rollout is taken from the input: it ends in one of the calls below, or is cancelled."""
        self.metrics.taken += 1

    def result(self, job: Job, result: dict[str, Any], latency: float | None) -> None:
        """`job` ended with `result`, `latency` seconds after it was sent."""
        checks = result.get(HEALTH)
        if checks is None:  # healthy: no keywords, whose calls cost more than the rest
            masked = False
            self.metrics.add_result(result, latency, job.agent_name)
        else:
            masked = self.mask_unhealthy  # the means read mask_sample themselves
            self.metrics.add_result(result, latency, job.agent_name, masked=masked, checks=checks)
        if self.tasks is not None:  # without repeats, no reward to read
            masked = masked or is_masked(result)
            self.tasks.rollout_ended(
                job.task_index,
                reward_of(result),
                job.rollout_index,
                result,
                job.agent_name,
                masked=masked,
                unhealthy=checks is not None,
            )
        if self.spool is not None:  # by the result's agent, as an earlier run's results are spooled
            self.spool.add(agent_name(result), result)
        if self.sample is not None:
            self.sample(result)

    def failure(self, job: Job, failure: AttemptFailure) -> None:
        """`job` failed for good (after its retries, or before it could be sent)."""
        checks = _unhealthy_checks(failure.kind, failure.answer)
        self.metrics.add_failure(failure, job.agent_name, checks)
        if self.tasks is not None:
            unhealthy = checks is not None
            self.tasks.rollout_ended(job.task_index, None, job.rollout_index, None, job.agent_name, unhealthy=unhealthy)

    def not_persisted(self, job: Job) -> None:
        """`job`'s agent asked for its rollout to be kept nowhere (`_ng_no_persist`)."""
        self.metrics.add_not_persisted(job.agent_name)
        if self.tasks is not None:
            self.tasks.rollout_ended(job.task_index, None, job.rollout_index, None, job.agent_name)

    def retry(self, job: Job, failure: AttemptFailure) -> None:
        """An attempt at `job` failed with `failure`, and is sent again: an unhealthy answer's
        cost is counted here, as no later step sees it."""
        self.metrics.add_retry(failure, job.agent_name)
        if failure.answer is not None and self.metrics.spending is not None:
            self.metrics.spending.add(job.agent_name, failure.answer)

    def earlier(self, result: dict[str, Any]) -> None:
        """A result an earlier run finished (a resumed run's summary and aggregate cover the whole
        output): into the means, the tasks and the spool, not into this run's counters."""
        agent = agent_name(result)
        checks = verdict_of_line(result)
        masked = is_masked(result) or (self.mask_unhealthy and checks is not None)
        self.metrics.add_earlier_result(result, agent, masked=masked)
        self._task_and_spool(result, agent, masked=masked, checks=checks, read_back=False)

    def standing_failure(self, task: Any, rollout: int) -> None:
        """A rollout an earlier run failed that this one does not send again (--resume: out of
        attempts, or terminal): a failure in its task's figures, not in this run's counters."""
        if self.tasks is not None:
            self.tasks.rollout_ended(task, None, rollout)

    def written_result(self, record: dict[str, Any]) -> None:
        """A result line of a results file, counted as the run that wrote it counted it."""
        agent = agent_name(record)
        self.metrics.taken += 1
        checks = verdict_of_line(record)
        masked = is_masked(record) or (self.mask_unhealthy and checks is not None)
        self.metrics.add_result(record, None, agent, masked=masked, checks=checks)
        self._task_and_spool(record, agent, masked=masked, checks=checks, read_back=True)

    def written_failure(self, failure: AttemptFailure, record: dict[str, Any] | None = None) -> None:
        """A failed row read back: its errors record `record` (a line that is not a result has
        none), counted as the run that wrote it counted it."""
        agent = agent_name(record) if record is not None else None
        self.metrics.taken += 1
        checks = _unhealthy_checks(failure.kind, record)
        self.metrics.add_failure(failure, agent, checks)
        if self.tasks is not None and record is not None and TASK_INDEX in record:
            self._reached(record, agent)
            unhealthy = checks is not None
            self.tasks.rollout_ended(record[TASK_INDEX], None, record.get(ROLLOUT_INDEX), unhealthy=unhealthy)

    def _task_and_spool(
        self, result: dict[str, Any], agent: str | None, *, masked: bool, checks: list[str] | None, read_back: bool
    ) -> None:
        if self.tasks is not None and TASK_INDEX in result:
            if read_back:
                self._reached(result, agent)
            rollout, unhealthy = result.get(ROLLOUT_INDEX), checks is not None
            self.tasks.rollout_ended(
                result[TASK_INDEX], reward_of(result), rollout, result, agent, masked=masked, unhealthy=unhealthy
            )
        if self.spool is not None:
            self.spool.add(agent, result)
        if self.sample is not None:
            self.sample(result)

    def _reached(self, record: dict[str, Any], agent: str | None) -> None:
        """A task of a file has the rollouts its agent's group size gives it, or the groups of them
        its rollout indices reach: one with fewer results is unfinished, as in the run that wrote them."""
        assert self.tasks is not None
        size = self._repeats_for(agent) if self._repeats_for is not None else None
        self.tasks.reached(record[TASK_INDEX], record.get(ROLLOUT_INDEX), size or 1)


def _unhealthy_checks(kind: ErrorKind, answer: dict[str, Any] | None) -> list[str] | None:
    """The health checks a failed rollout of kind `unhealthy` failed (its answer's), else None."""
    if kind is not ErrorKind.UNHEALTHY:
        return None
    checks = answer.get(HEALTH) if answer is not None else None
    if type(checks) is not list:
        checks = failed_checks(answer) if answer is not None else None
    return [str(check) for check in checks] if checks else []
