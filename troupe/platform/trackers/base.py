"""The tracker interface: what `MetricsLog` writes to ``metrics.jsonl`` goes to each tracker too."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any


class Tracker:
    """An experiment tracker (TensorBoard, wandb, MLflow, or a user's own).

    `start` gets the run directory, the resolved config (what ``config.yaml`` holds) and whether
    the run resumes; `log` gets every row of ``metrics.jsonl`` at its step (evaluations included),
    without the ``step`` key; `close` runs at the end of the run and on errors.
    """

    requires: str | None = None  # the optional package `start` imports, checked before the run starts
    extra: str | None = None  # the troupe extra that installs it

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        """Open the tracker's run; on ``resume``, continue the one this run directory started."""

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        """Record one row of ``metrics.jsonl`` (every value, numbers or not) at ``step``."""
        raise NotImplementedError

    def close(self) -> None:
        """Flush and end the tracker's run."""


def numbers(metrics: dict[str, Any]) -> dict[str, int | float]:
    """The finite numbers of a row: what a scalar tracker can record (``metrics.jsonl`` keeps the rest)."""
    return {k: v for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}


def flatten(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"run": {"steps": 4}}`` → ``{"run.steps": 4}``: the config as flat parameters."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def load_tracker_state(run_dir: Path, name: str) -> dict[str, Any]:
    """What tracker ``name`` kept in ``run_dir/trackers.json`` (its run id), or ``{}``."""
    path = Path(run_dir) / "trackers.json"
    if not path.is_file():
        return {}
    return dict(json.loads(path.read_text()).get(name, {}))


def save_tracker_state(run_dir: Path, name: str, state: dict[str, Any]) -> None:
    """Keep ``state`` (e.g. the tracker's run id) under ``name`` in ``run_dir/trackers.json``."""
    from troupe.platform.checkpoint import atomic_write_json

    path = Path(run_dir) / "trackers.json"
    data = json.loads(path.read_text()) if path.is_file() else {}
    data[name] = state
    atomic_write_json(path, data)
