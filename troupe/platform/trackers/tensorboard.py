"""TensorBoard: event files in ``run_dir/tensorboard`` (the default tracker)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from troupe.platform.trackers.base import Tracker, numbers


class TensorBoardTracker(Tracker):
    """Scalars for ``tensorboard --logdir runs``. The writer opens at the first row; a resumed
    run appends new event files to the same directory, which TensorBoard reads as one run.
    Without torch's TensorBoard support (a trimmed install) it logs nothing."""

    def __init__(self) -> None:
        self.dir: Path | None = None
        self._writer: Any = None
        self._enabled = True

    def start(self, run_dir: Path, config: dict[str, Any], resume: bool) -> None:
        self.dir = Path(run_dir) / "tensorboard"

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        writer = self._open()
        if writer is None:
            return
        for k, v in numbers(metrics).items():
            writer.add_scalar(k, v, step)
        writer.flush()

    def _open(self) -> Any:
        if not self._enabled or self.dir is None:
            return None
        if self._writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # tensorboard is a dependency; a trimmed install still logs JSON
                self._enabled = False
                return None
            self._writer = SummaryWriter(str(self.dir))
        return self._writer

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
