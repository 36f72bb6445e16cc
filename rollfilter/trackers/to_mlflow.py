"""A tracker run in MLflow, through its client (`mlflow-skinny`): `pip install 'rollfilter[mlflow]'`."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping

from rollfilter.trackers.log import VERSION_METRIC, Final

# MLflow's client retries an unreachable server for minutes by default; a run's tracker is given
# seconds. What the user set in the environment stays.
_CLIENT_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# The client prints a link to each run it ends on standard output, where results go: never.
_CLIENT_SETTINGS = {"MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
# MLflow takes at most this many metrics or params in one call.
_BATCH = 1000
_PARAM_CHARS = 6000


class MlflowTracker:
    """A run of experiment `experiment` at the tracking server `uri`, named `run_name`."""

    name = "MLflow"

    def __init__(self, uri: str, experiment: str, run_name: str | None) -> None:
        for variable, value in _CLIENT_DEFAULTS.items():
            os.environ.setdefault(variable, value)
        os.environ.update(_CLIENT_SETTINGS)
        from mlflow.tracking import MlflowClient

        # The client's notices would come between the run's lines and its summary: what went
        # wrong is said by the run, once.
        logging.getLogger("mlflow").setLevel(logging.ERROR)

        self._client = MlflowClient(tracking_uri=uri)
        self._experiment, self._run_name = experiment, run_name
        self._run_id = ""

    def start(self, params: Mapping[str, str], run_id: str | None) -> str:
        client = self._client
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            self._run_id = run_id
            return run_id
        found = client.get_experiment_by_name(self._experiment)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(self._experiment)
        run = client.create_run(experiment_id, run_name=self._run_name, tags={"rollfilter": "1"})
        self._run_id = run.info.run_id
        from mlflow.entities import Param

        items = [Param(key, value[:_PARAM_CHARS]) for key, value in params.items()]
        for start in range(0, len(items), 100):
            client.log_batch(self._run_id, params=items[start : start + 100])
        return self._run_id

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(key, value, now, step) for key, value in metrics.items()]
        for start in range(0, len(items), _BATCH):
            self._client.log_batch(self._run_id, metrics=items[start : start + _BATCH])

    def log_versions(self, means: Mapping[int, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        items = [Metric(VERSION_METRIC, mean, now, version) for version, mean in means.items()]
        for start in range(0, len(items), _BATCH):
            self._client.log_batch(self._run_id, metrics=items[start : start + _BATCH])

    def end(self, final: Final) -> None:
        self.log(final.metrics, final.step)
        if final.versions:
            self.log_versions(final.versions)
        client = self._client
        client.log_text(self._run_id, final.summary.decode(), "summary.json")
        if final.rollouts:
            client.log_text(self._run_id, b"".join(final.rollouts).decode(), "rollouts.jsonl")
        client.set_terminated(self._run_id, status=final.status)
