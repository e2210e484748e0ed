"""Weights & Biases: an offline run in ``run_dir/wandb`` unless ``WANDB_MODE`` says otherwise."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from troupe.platform.trackers.base import Tracker, load_tracker_state, numbers, save_tracker_state


class WandbTracker(Tracker):
    """A wandb run named after the run directory, in project ``$WANDB_PROJECT`` (default
    ``troupe``), with the resolved config as its config and every row at troupe's step.

    Offline by default (``WANDB_MODE=offline`` unless set): the run lands in
    ``run_dir/wandb/offline-run-*`` and ``wandb sync`` uploads it later. The run id is kept in
    ``run_dir/trackers.json``; ``--resume`` reopens that id with ``resume="allow"``. Online, the
    same run goes on; offline, the resumed part is a second ``offline-run-*`` folder with the
    same id. wandb drops a row whose step is below the last step it holds, so after a crash
    between checkpoints the rewritten steps keep their first values in wandb (metrics.jsonl
    and MLflow hold the rewritten ones).
    """

    requires = "wandb"
    extra = "wandb"

    def __init__(self) -> None:
        self.run: Any = None

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        import wandb

        run_id = load_tracker_state(run_dir, "wandb").get("id") if resume else None
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "troupe",
            name=Path(run_dir).name,
            dir=str(run_dir),
            mode=os.environ.get("WANDB_MODE") or "offline",
            id=run_id,
            resume="allow" if run_id else None,
            config=None if run_id else config,
        )
        if run_id:  # an extended run (run.steps=300) changes values the first part logged
            self.run.config.update(config, allow_val_change=True)
        save_tracker_state(run_dir, "wandb", {"id": self.run.id})

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = numbers(metrics)
        if values:
            self.run.log(values, step=step)

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
