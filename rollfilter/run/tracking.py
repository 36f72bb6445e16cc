"""A run's experiment trackers (`Config.trackers`): its snapshot rendered for them while it goes,
its summary when it ends.

The trackers count nothing: every few seconds `watch` takes the run's snapshot (`RunStatistics`)
and hands a point to the trackers' thread (`rollfilter.trackers.log`), stepped by the rollouts
finished, earlier runs' included, so that a resumed run's steps go on from where they were. At
the end, `end` hands it every number of the summary (`flattened`), the summary, the errors'
kinds as counts, and the sample of result lines the run's tally fed to `reservoir`. What is
logged as params is the run's record, or its config's identity from Python, with what a URL
may carry of secrets cut (`redact.shown`) and never a header.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from rollfilter._version import __version__
from rollfilter.config import Config, ConfigError, Trackers
from rollfilter.redact import secrets_in, shown, shown_as_typed
from rollfilter.run.statistics import RunStatistics
from rollfilter.trackers.flatten import flattened
from rollfilter.trackers.ids import keep_ids, read_ids, read_places, read_servers
from rollfilter.trackers.log import Final, Tracker, TrackerLog
from rollfilter.trackers.reservoir import Reservoir

if TYPE_CHECKING:
    from rollfilter.engine.tally import Tally

# How often a live point is taken: a tracker's chart wants a few a minute, not one a row.
LIVE_EVERY_S = 5.0
# How long the end waits for the trackers to take the final figures: a few seconds, then the run ends.
END_WAIT_S = 10.0
# How a run ended, as a tracker run's status.
FINISHED, KILLED, FAILED = "FINISHED", "KILLED", "FAILED"
# Each tracker as a person reads its name.
NAMES = {"mlflow": "MLflow", "wandb": "W&B"}
# The pip command that installs each tracker's client.
EXTRAS = {"mlflow": "pip install 'rollfilter[mlflow]'", "wandb": "pip install 'rollfilter[wandb]'"}
_encode = msgspec.json.Encoder().encode
_logger = logging.getLogger("rollfilter")


def missing_client(name: str) -> str | None:
    """The pip command that installs tracker `name`'s client ("mlflow", "wandb"), when it is not installed."""
    import importlib.util

    return EXTRAS[name] if importlib.util.find_spec(name) is None else None


def params_of(record: Mapping[str, Any]) -> dict[str, str]:
    """A run's record as a tracker's params: each field by its path (`repeats_by_agent.math`),
    a list or a value as its JSON, with the rollfilter version."""
    found = {"rollfilter_version": __version__}

    def add(value: Any, path: str) -> None:
        if isinstance(value, Mapping) and value:
            for key, item in value.items():
                add(item, f"{path}.{key}" if path else str(key))
        else:
            found[path] = value if isinstance(value, str) else json.dumps(value, default=str)

    add(record, "")
    return found


def identity_of(config: Config) -> dict[str, Any]:
    """What identifies a run of `config` where it has no record (the Python API): the fields the
    command's record keeps, and where its rows go, with no credential, query or header."""
    return {
        "url": shown(config.url) if config.url is not None else None,
        "endpoints": {name: [shown(url) for url in urls] for name, urls in config.endpoints.items()},
        "head_server": shown(config.head_server) if config.head_server is not None else None,
        "params": [list(pair) for pair in config.params],
        "agent": config.agent,
        "repeats": config.repeats.count,
        "repeats_by_agent": dict(config.repeats.by_agent),
        "repeat_seeds": config.repeats.seeds,
        "shard": list(config.shard) if config.shard is not None else None,
        "limit": config.limit,
        "groups": config.groups is not None,
        "policy_version": config.policy_version,
    }


class RunTracking:
    """The trackers of one run (`trackers`), logging `record` (the run's identity) as params, and
    keeping their run ids in `trackers.ids_file` under `key`. Warnings go to `on_warning`
    (None: the "rollfilter" logger). ConfigError when a tracker's client is not installed."""

    def __init__(
        self,
        trackers: Trackers,
        record: Mapping[str, Any],
        *,
        key: str = "",
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        for name in ("mlflow", "wandb"):
            install = missing_client(name) if getattr(trackers, name) is not None else None
            if install is not None:
                raise ConfigError(f"trackers.{name}", f"needs its client: {install}")
        run_name = trackers.run_name or time.strftime("rollfilter-%Y%m%d-%H%M%S")
        openers: dict[str, Callable[[], Tracker]] = {}
        hidden: tuple[str, ...] = ()
        self._places: dict[str, str] = {}  # where each tracker run goes: an MLflow experiment, a W&B project
        self._servers: dict[str, str] = {}  # on which server: MLflow's, its secrets cut
        if trackers.mlflow is not None:
            uri, experiment = trackers.mlflow, trackers.experiment
            hidden = secrets_in(uri)
            openers["mlflow"] = lambda: _mlflow(uri, experiment, run_name)
            self._places["mlflow"] = experiment
            self._servers["mlflow"] = shown_as_typed(uri)
        if trackers.wandb is not None:
            project = trackers.wandb
            openers["wandb"] = lambda: _wandb(project, run_name)
            self._places["wandb"] = project
        ids_file, self._key = trackers.ids_file, key
        ids = read_ids(ids_file, key)
        _refuse_elsewhere(ids, read_servers(ids_file, key), self._servers, ids_file, _server_field, key=_server_key)
        _refuse_elsewhere(ids, read_places(ids_file, key), self._places, ids_file, _place_field)
        self._log = TrackerLog(openers, params_of(record), ids, self._keep, hidden=hidden, names=NAMES)
        self._ids_file = ids_file
        self.reservoir = Reservoir(trackers.rollouts) if trackers.rollouts else None
        self._say = on_warning if on_warning is not None else _logger.warning
        self._started = self._ended = False
        self._versions_logged: dict[int, float] = {}

    def _keep(self, ids: dict[str, str]) -> None:
        if self._ids_file is not None:
            places = {name: self._places[name] for name in ids}
            servers = {name: self._servers[name] for name in ids if name in self._servers}
            keep_ids(self._ids_file, ids, self._key, places, servers)

    async def start(self) -> None:
        """Make the trackers' clients, importing them in a thread while the run waits (once the run
        sends, an import beside it would cost its rows CPU), then start the trackers' thread
        (once): it starts or continues each tracker run."""
        if not self._started:
            self._started = True
            await trio.to_thread.run_sync(self._log.make)
            self._log.start()

    @classmethod
    def of_run(
        cls,
        config: Config,
        tally: Tally,
        tracked: Mapping[str, Any] | None,
        key: str,
        on_warning: Callable[[str], None] | None,
    ) -> RunTracking | None:
        """The trackers of a run of `config` (None without `Config.trackers`), logging `tracked`
        (the run's record; None: what `config` says of it) as params, fed each result `tally`
        counts for their sample."""
        if config.trackers is None:
            return None
        record = tracked if tracked is not None else identity_of(config)
        tracking = cls(config.trackers, record, key=key, on_warning=on_warning)
        if tracking.reservoir is not None:
            tally.sample = tracking.reservoir.add
        return tracking

    async def beside(self, send_all: Callable[[], Awaitable[None]], statistics: Callable[[], RunStatistics]) -> None:
        """`send_all` (the engine's run), with the live points taken beside it."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.watch, statistics)
            await send_all()
            nursery.cancel_scope.cancel()

    async def watch(self, statistics: Callable[[], RunStatistics]) -> None:
        """Every few seconds, until cancelled: a point of the run's snapshot to the trackers, and
        what went wrong with them said."""
        while True:
            await trio.sleep(LIVE_EVERY_S)
            self.point(statistics())
            self.say_warnings()

    def point(self, statistics: RunStatistics) -> None:
        """The live figures of `statistics`, at the step of the rollouts finished."""
        metrics = {
            "live/finished": float(statistics.finished),
            "live/failed": float(statistics.failed),
            "live/in_flight": float(statistics.in_flight),
            "live/rows_per_s": statistics.rows_per_s,
            "live/reward_mean": statistics.reward_mean,
        }
        changed = {
            version: mean
            for version, mean in statistics.reward_by_version.items()
            if self._versions_logged.get(version) != mean
        }
        if self._log.point(metrics, statistics.finished, changed):
            self._versions_logged.update(changed)

    def say_warnings(self, on_warning: Callable[[str], None] | None = None) -> None:
        for text in self._log.warnings():
            (on_warning or self._say)(text)

    async def end(
        self,
        summary: Mapping[str, Any],
        statistics: RunStatistics,
        status: str,
        *,
        on_warning: Callable[[str], None] | None = None,
    ) -> None:
        """The final figures to the trackers (once), their run ended with `status`; it waits for
        them a few seconds at most, in a thread (so that a signal is taken meanwhile: a cancel
        cuts the wait short, and the trackers are left as they are), then says what went wrong
        (to `on_warning`, None: the run's)."""
        if self._ended or not self._started:
            return
        self._ended = True
        metrics = flattened(summary)
        metrics.update((f"errors/{kind}", float(count)) for kind, count in statistics.failed_by_kind.items())
        sample = self.reservoir.kept if self.reservoir is not None else []
        final = Final(
            metrics=metrics,
            step=statistics.finished,
            summary=_encode(summary),
            rollouts=tuple(_encode(result) + b"\n" for result in sample),
            status=status,
            versions=statistics.reward_by_version,
        )
        try:
            wait = functools.partial(self._log.end, final, wait_s=END_WAIT_S)
            await trio.to_thread.run_sync(wait, abandon_on_cancel=True)
        except trio.Cancelled:
            (on_warning or self._say)("trackers: stopped before done logging; left as they are")
            raise
        finally:
            self.say_warnings(on_warning)


def _refuse_elsewhere(
    ids: Mapping[str, str],
    kept: Mapping[str, str],
    given: Mapping[str, str],
    ids_file: str | None,
    field_of: Callable[[str], tuple[str, str]],
    *,
    key: Callable[[str], object] = str,
) -> None:
    """ConfigError when a tracker run this run would continue (`ids`) is kept elsewhere (`kept`:
    another experiment or project, another server) than this run names (`given`), as `key`
    compares them: continued, it would go on there, or its id would name no run. `field_of(name)`
    is the Config field and the word for what differs."""
    for name, place in given.items():
        earlier = kept.get(name)
        if name in ids and earlier is not None and key(earlier) != key(place):
            field, what = field_of(name)
            raise ConfigError(
                field,
                f"{place!r} is not the {what} of the {NAMES[name]} run this run continues ({earlier!r}, as"
                f" {ids_file} keeps it): give {earlier!r}, or remove that file to start another",
            )


def _place_field(name: str) -> tuple[str, str]:
    return ("trackers.experiment", "experiment") if name == "mlflow" else ("trackers.wandb", "project")


def _server_field(name: str) -> tuple[str, str]:
    return f"trackers.{name}", "server"


def _server_key(uri: str) -> object:
    """A tracking URI as kept (`shown_as_typed`), as two that name one server compare: an http(s)
    URL by its origin (the host in any case, the scheme's default port written or not) and its path
    without a trailing slash; any other (a path, `databricks`) as it is."""
    import httpx

    from rollfilter.http.origin import origin_of

    try:
        url = httpx.URL(uri)
        return origin_of(url), url.path.rstrip("/")
    except (httpx.InvalidURL, httpx.UnsupportedProtocol):
        return uri


def _mlflow(uri: str, experiment: str, run_name: str) -> Tracker:
    from rollfilter.trackers.to_mlflow import MlflowTracker

    return MlflowTracker(uri, experiment, run_name)


def _wandb(project: str, run_name: str) -> Tracker:
    from rollfilter.trackers.to_wandb import WandbTracker

    return WandbTracker(project, run_name)
