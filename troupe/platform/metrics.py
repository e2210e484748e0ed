"""Metrics: one JSON line per step in ``metrics.jsonl``, mirrored to each experiment tracker."""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from troupe.platform.trackers import Tracker

log = logging.getLogger("troupe")


class MetricsLog:
    """Appends ``{"step": N, ...}`` rows; on resume, drops rows past the resumed step.

    Every row also goes to each of ``trackers`` (None: TensorBoard alone), started here with
    ``config`` (the resolved config) and ``resume``; `close` closes them."""

    def __init__(self, run_dir: Path, trackers: Sequence[Tracker] | None = None,
                 config: dict[str, Any] | None = None, resume: bool = False) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        if trackers is None:
            from troupe.platform.trackers.tensorboard import TensorBoardTracker

            trackers = [TensorBoardTracker()]
        self.trackers: list[Tracker] = []
        try:
            for tracker in trackers:
                tracker.start(Path(run_dir), dict(config or {}), resume)
                self.trackers.append(tracker)
        except BaseException:
            self.close()
            raise

    def truncate_after(self, step: int) -> None:
        """Keep what a run had logged when it had done ``step`` steps: training rows of earlier
        steps and evaluation rows up to ``step`` (a resumed run rewrites what followed)."""
        if not self.path.exists():
            return
        rows = [r for r in self.read()
                if r.get("step", -1) < step or (r.get("step") == step and _is_eval_row(r))]
        from troupe.platform.checkpoint import atomic_write_text

        atomic_write_text(self.path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        row = {"step": step, **{k: _scalar(v) for k, v in metrics.items()}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())
        values = {k: v for k, v in row.items() if k != "step"}
        for tracker in self.trackers:
            tracker.log(step, dict(values))

    def read(self) -> list[dict[str, Any]]:
        return read_metrics(self.path)

    def close(self) -> None:
        """Close every tracker (one that fails is logged, the others still close)."""
        trackers, self.trackers = self.trackers, []
        for tracker in trackers:
            try:
                tracker.close()
            except Exception as e:  # teardown goes on; say which tracker failed
                log.warning("closing tracker %s failed: %s", type(tracker).__name__, e)


def mean_se(values: Iterable[float]) -> tuple[float, float, int]:
    """Mean, standard error (sample std / sqrt n; 0 for one value) and count; NaNs for none."""
    v = [float(x) for x in values]
    n = len(v)
    if n == 0:
        return math.nan, math.nan, 0
    mean = math.fsum(v) / n
    se = math.sqrt(math.fsum((x - mean) ** 2 for x in v) / (n - 1) / n) if n > 1 else 0.0
    return mean, se, n


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Rows of a ``metrics.jsonl``; a torn last line (a crash mid-write) is skipped."""
    rows = []
    if not Path(path).exists():
        return rows
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _scalar(v: Any) -> Any:
    if hasattr(v, "item") and callable(v.item):
        try:
            return v.item()
        except (ValueError, RuntimeError):
            return v.tolist()
    return v


def _is_eval_row(row: dict[str, Any]) -> bool:
    return all(k == "step" or k.startswith("eval/") for k in row)
