"""The episode of ALGORITHMS.md §C.1: k preference demonstrations and one query pair.

Two forms of one thing:

* `Episode` of `Comparison` objects, for text: a prompt, two responses ``a`` and ``b`` and a label
  (1 iff ``a`` is preferred). A demonstration is stored as it was shown, ``(a, b, label)``; a model
  reads it as the (chosen, rejected) pair of §C.1 (`Comparison.chosen`, `Comparison.rejected`);
* `FeatureEpisodes`, a batch in numbers: response features φ of every demo and query response,
  demos already ordered (chosen, rejected), and a mask of the ``k`` demos each episode holds.

`comparison_from_row` and `demos_from_rows` (`troupe.platform.preference_rows`, where the reward-model
actor reads them too) read the rows a user or a dataset gives (dicts with
``prompt``, ``a``, ``b``, ``label``) and name the row, the key and the fix when one is wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from troupe.platform.errors import DataError
from troupe.platform.preference_rows import (  # noqa: F401  (the row types, re-exported where tasks use them)
    ROW_KEYS,
    Comparison,
    check_label,
    comparison_from_row,
    demos_from_rows,
)


@dataclasses.dataclass(frozen=True)
class Episode:
    """§C.1's input: demos labelled by one preference distribution, and the query it labels too.
    ``objective`` names that distribution (a persona or an attribute weighting)."""

    demos: tuple[Comparison, ...]
    query: Comparison
    objective: str = ""

    @property
    def k(self) -> int:
        return len(self.demos)

    def as_row(self) -> dict[str, Any]:
        """The query as a row with the demos in its context, the shape a reward actor reads."""
        return {**self.query.as_row(), "demos": [d.as_row() for d in self.demos], "objective": self.objective}


@dataclasses.dataclass(frozen=True)
class FeatureEpisodes:
    """A batch of n episodes in feature space, with room for ``K`` demos each (d features):

    * ``demo_chosen``, ``demo_rejected``: (n, K, d), the demos as (y⁺, y⁻) of §C.1, zero past ``k``;
    * ``k``: (n,) demos per episode, ``demo_mask``: (n, K), True for the first ``k[i]`` slots;
    * ``demo_label``: (n, K) each demo's label in the order it was drawn (1 iff its first response
      won; zero past ``k``), for §C.2's ``episode_elbo`` reading, which counts demo labels;
    * ``query_a``, ``query_b``: (n, d); ``label``: (n,) 1 iff ``a`` won the draw;
    * ``p_true``: (n,) P(a ≻ b) under the episode's preference distribution (for calibration);
    * ``objective``: (n,) index of that distribution in the generator's list.
    """

    demo_chosen: np.ndarray
    demo_rejected: np.ndarray
    demo_mask: np.ndarray
    demo_label: np.ndarray
    query_a: np.ndarray
    query_b: np.ndarray
    label: np.ndarray
    p_true: np.ndarray
    objective: np.ndarray

    @property
    def k(self) -> np.ndarray:
        return self.demo_mask.sum(1)

    def __len__(self) -> int:
        return len(self.label)

    @property
    def dim(self) -> int:
        return int(self.query_a.shape[1])

    @property
    def capacity(self) -> int:
        """K, the demo slots of the batch (at least the largest k)."""
        return int(self.demo_mask.shape[1])


def demo_slots(k: np.ndarray, capacity: int) -> np.ndarray:
    """(n, capacity) mask, True for the first ``k[i]`` slots of row i."""
    return np.arange(capacity)[None, :] < np.asarray(k)[:, None]


def draw_k(n: int, k: int | Sequence[int] | tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Demos per episode: a fixed ``k``, or uniform on ``{lo..hi}`` for a pair ``(lo, hi)`` (§C.2:
    k ~ Unif{0..K_max})."""
    if isinstance(k, int | np.integer):
        if k < 0:
            raise DataError(f"k={k}: the number of demonstrations must be >= 0")
        return np.full(n, int(k))
    lo, hi = (int(v) for v in k)
    if not 0 <= lo <= hi:
        raise DataError(f"k={tuple(k)}: expected (lo, hi) with 0 <= lo <= hi")
    return rng.integers(lo, hi + 1, size=n)
