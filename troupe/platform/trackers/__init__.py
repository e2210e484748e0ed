"""Experiment trackers: ``run.trackers`` names the ones a run writes to, beside ``metrics.jsonl``.

Each is an entry of `TRACKERS` (``tensorboard``, ``wandb``, ``mlflow``, or ``"module:Class"``)
built with no arguments; its optional package is imported only when it is chosen.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from troupe.platform.errors import ConfigError, RegistryError
from troupe.platform.trackers.base import Tracker


def build_trackers(names: Sequence[str]) -> list[Tracker]:
    """One tracker per name; a chosen tracker whose package is missing is one `ConfigError`
    that names the extra to install, raised before the run starts."""
    from troupe.platform.registry import TRACKERS

    trackers = []
    for name in names:
        try:
            cls = TRACKERS.resolve(name, "run.trackers")
        except RegistryError as e:
            raise ConfigError(str(e)) from None
        package = getattr(cls, "requires", None)
        if package and importlib.util.find_spec(package) is None:
            extra = getattr(cls, "extra", None)
            how = f"pip install 'troupe[{extra}]'" if extra else f"pip install {package}"
            raise ConfigError(f"run.trackers: {name!r} needs the {package!r} package, which is not installed: {how}")
        trackers.append(cls())
    return trackers


__all__ = ["Tracker", "build_trackers"]
