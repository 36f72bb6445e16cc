"""A tracker run in Weights & Biases, through its client: `pip install 'rollfilter[wandb]'`. The
rest (WANDB_MODE, WANDB_API_KEY, WANDB_ENTITY, WANDB_DIR) is W&B's own environment."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any, Literal

from rollfilter.trackers.log import VERSION_METRIC, Final

VERSION_STEP = "policy/version"
FINISHED_STEP = "rollouts_finished"

# How a run ended, as W&B's `finish` takes it: an exit code (0 is finished, others failed).
_EXIT_CODES = {"FINISHED": 0, "KILLED": 130, "FAILED": 1}


class WandbTracker:
    """A run of W&B project `project`, named `run_name`."""

    name = "W&B"

    def __init__(self, project: str, run_name: str | None) -> None:
        # W&B's notices (a WANDB_DIR not made yet, where it writes) come on stderr before its
        # settings' `silent` applies: what went wrong is said by the run, once. What the user set stays.
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb

        self._wandb = wandb
        self._project, self._run_name = project, run_name
        self._run: Any = None

    def start(self, params: Mapping[str, str], run_id: str | None) -> str:
        offline = os.environ.get("WANDB_MODE") in ("offline", "dryrun")
        # W&B checks that a run to resume exists at its server; offline, there is none to ask.
        resume: Literal["allow", "must"] | None = None if run_id is None else "allow" if offline else "must"
        settings = self._wandb.Settings(silent=True, console="off")
        self._run = self._wandb.init(
            project=self._project,
            name=self._run_name,
            id=run_id,
            resume=resume,
            config=dict(params),
            settings=settings,
            reinit="create_new",
        )
        # W&B's own step counts the rows logged, and must only grow: the live figures are charted
        # against the rollouts finished, and a version's reward mean against the version, instead.
        for step, charted in ((FINISHED_STEP, "live/*"), (VERSION_STEP, VERSION_METRIC)):
            self._run.define_metric(step)
            self._run.define_metric(charted, step_metric=step)
        return str(self._run.id)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log({**metrics, FINISHED_STEP: step})

    def log_versions(self, means: Mapping[int, float]) -> None:
        for version, mean in sorted(means.items()):
            self._run.log({VERSION_STEP: version, VERSION_METRIC: mean})

    def end(self, final: Final) -> None:
        run = self._run
        if final.versions:
            self.log_versions(final.versions)
        run.log({**final.metrics, FINISHED_STEP: final.step})
        run.summary.update(dict(final.metrics))
        run.summary["rollfilter/status"] = final.status
        if final.rollouts:
            rows = [[line.decode().rstrip("\n")] for line in final.rollouts]
            run.log({"rollouts": self._wandb.Table(columns=["result"], data=rows)})
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "summary.json")
            with open(path, "w", encoding="utf-8") as file:
                json.dump(json.loads(final.summary), file)
            artifact = self._wandb.Artifact(f"summary-{run.id}", type="summary")
            artifact.add_file(path, name="summary.json")
            run.log_artifact(artifact)
            run.finish(exit_code=_EXIT_CODES.get(final.status, 1))
