"""A tracker run in Weights & Biases, through its client: `pip install 'rollfilter[wandb]'`. The
rest (WANDB_MODE, WANDB_API_KEY, WANDB_ENTITY, WANDB_DIR) is W&B's own environment."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any, Literal

from rollfilter.trackers.log import Final

# How a run ended, as W&B's `finish` takes it: an exit code (0 is finished, others failed).
_EXIT_CODES = {"FINISHED": 0, "KILLED": 130, "FAILED": 1}


class WandbTracker:
    """A run of W&B project `project`, named `run_name`."""

    name = "W&B"

    def __init__(self, project: str, run_name: str | None) -> None:
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
        return str(self._run.id)

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def end(self, final: Final) -> None:
        run = self._run
        run.log(dict(final.metrics), step=final.step)
        run.summary.update(dict(final.metrics))
        run.summary["rollfilter/status"] = final.status
        if final.rollouts:
            rows = [[line.decode().rstrip("\n")] for line in final.rollouts]
            run.log({"rollouts": self._wandb.Table(columns=["result"], data=rows)}, step=final.step)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "summary.json")
            with open(path, "w", encoding="utf-8") as file:
                json.dump(json.loads(final.summary), file)
            artifact = self._wandb.Artifact(f"summary-{run.id}", type="summary")
            artifact.add_file(path, name="summary.json")
            run.log_artifact(artifact)
            run.finish(exit_code=_EXIT_CODES.get(final.status, 1))
