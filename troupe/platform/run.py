"""What an algorithm sees of its run: the run directory, the seed, the metric log."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger("troupe")


@dataclasses.dataclass
class RunContext:
    """Handed to every algorithm: where to write, which seed, how long remote calls may take."""

    run_dir: Path
    seed: int = 0
    call_timeout_s: float = 900.0
    resumed_from_step: int | None = None

    @property
    def plots_dir(self) -> Path:
        p = self.run_dir / "plots"
        p.mkdir(parents=True, exist_ok=True)
        return p

    @property
    def prepared_path(self) -> Path:
        return self.run_dir / "prepare.json"

    def prepared(self) -> dict[str, Any]:
        """What the algorithm's `prepare` returned (``{}`` before it ran)."""
        import json

        p = self.prepared_path
        return json.loads(p.read_text()) if p.is_file() else {}

    @property
    def checkpoints_dir(self) -> Path:
        return self.run_dir / "checkpoints"

    def artifact(self, name: str) -> Path:
        """A path inside the run directory for an algorithm's own files (tables, samples)."""
        p = self.run_dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def info(self, msg: str, *args: Any) -> None:
        log.info(msg, *args)
