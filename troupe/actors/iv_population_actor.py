"""The population role of an IV experiment: it alone holds the true response functions.

Experimenters send queries ``(unit, z)`` and get back a realised treatment and outcome; they
send posteriors and get back how far those are from the truth. Answers use common random
numbers: the k-th time a cell asks unit u at level z under seed s, the draw depends only on
(population, s, u, z, k), so two methods that ask the same query see the same answer.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import Any

import numpy as np

from troupe.platform.errors import DataError


class IVPopulationActor:
    """Holds populations by label; built from ``{label: (factory, params)}`` given by the algorithm."""

    def __init__(self, populations: dict[str, tuple[Any, dict[str, Any]]]) -> None:
        # The factory (a population class) arrives from the algorithm, so this actor needs no
        # import of any environment module.
        self.populations = {label: factory(**params) for label, (factory, params) in populations.items()}
        self.visits: dict[str, Counter] = {}
        self.queries = 0

    def _population(self, label: str) -> Any:
        if label not in self.populations:
            raise DataError(f"no population {label!r}; this actor holds {', '.join(self.populations)}")
        return self.populations[label]

    def info(self, label: str) -> Any:
        """What an experimenter may know: covariates of pool and target, instrument levels."""
        return self._population(label).info()

    def query(self, label: str, cell: str, seed: int, unit: int, z_index: int) -> tuple[int, float]:
        """One answer (t, y) to the query (unit, z_levels[z_index])."""
        pop = self._population(label)
        counts = self.visits.setdefault(cell, Counter())
        visit = counts[(unit, z_index)]
        counts[(unit, z_index)] += 1
        self.queries += 1
        rng = np.random.default_rng([int(seed), zlib.crc32(label.encode()), int(unit), int(z_index), visit])
        return pop.draw(int(unit), int(z_index), rng)

    def restore_visits(self, cell: str, units: list[int], z_index: list[int]) -> int:
        """Set a cell's visit counts from its query log (after a resume)."""
        self.visits[cell] = Counter(zip((int(u) for u in units), (int(k) for k in z_index), strict=True))
        return len(units)

    def score(self, label: str, snapshots: list[dict[str, Any]]) -> list[dict[str, float]]:
        """Target-CATE RMSE, NLPD, 90% coverage and first-stage Brier of each posterior snapshot."""
        pop = self._population(label)
        return [pop.score(s["mean"], s["var"], s.get("p_hat")) for s in snapshots]

    def truth(self, label: str) -> dict[str, Any]:
        """The truth on pool and target, for the final report's plots (never for an experimenter)."""
        return self._population(label).truth()
