"""The episode of ALGORITHMS.md §C.1: k preference demonstrations and one query pair.

Two forms of one thing:

* `Episode` of `Comparison` objects, for text: a prompt, two responses ``a`` and ``b`` and a label
  (1 iff ``a`` is preferred). A demonstration is stored as it was shown, ``(a, b, label)``; a model
  reads it as the (chosen, rejected) pair of §C.1 (`Comparison.chosen`, `Comparison.rejected`);
* `FeatureEpisodes`, a batch in numbers: response features φ of every demo and query response,
  demos already ordered (chosen, rejected), and a mask of the ``k`` demos each episode holds.

`comparison_from_row` and `demos_from_rows` read the rows a user or a dataset gives (dicts with
``prompt``, ``a``, ``b``, ``label``) and name the row, the key and the fix when one is wrong.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from troupe.platform.errors import DataError

ROW_KEYS = ("prompt", "a", "b", "label")


def check_label(label: Any, where: str) -> int:
    """``label`` as the int 0 or 1 (1 iff response ``a`` is preferred), or a DataError naming ``where``."""
    if isinstance(label, bool | np.bool_):
        return int(label)
    if isinstance(label, int | np.integer | float | np.floating) and float(label) in (0.0, 1.0):
        return int(label)
    raise DataError(f"{where}: label={label!r} is not 0 or 1; give 1 if response 'a' is preferred, "
                    "0 if response 'b' is")


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One labelled pair: ``label`` is 1 iff ``a`` is preferred to ``b`` under the prompt."""

    prompt: str
    a: str
    b: str
    label: int

    @property
    def chosen(self) -> str:
        return self.a if self.label == 1 else self.b

    @property
    def rejected(self) -> str:
        return self.b if self.label == 1 else self.a

    def swapped(self) -> Comparison:
        """The same comparison shown the other way round (the label flips)."""
        return Comparison(self.prompt, self.b, self.a, 1 - self.label)

    def as_row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


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


def comparison_from_row(row: Any, where: str) -> Comparison:
    """A `Comparison` from a row ``{"prompt", "a", "b", "label"}``; ``where`` names the row in errors
    (``"data.jsonl: row 3: demo 2"``). A missing prompt is the empty prompt; both responses are required."""
    if not isinstance(row, Mapping):
        raise DataError(f"{where}: expected an object with keys {list(ROW_KEYS)}, got {row!r}")
    missing = [k for k in ("a", "b") if not isinstance(row.get(k), str) or not row.get(k)]
    if missing:
        raise DataError(f"{where}: lacks response(s) {missing} (it has keys {sorted(row)}); a demonstration "
                        "needs both responses 'a' and 'b' as non-empty strings, and a 'label' (1 if 'a' is "
                        "preferred)")
    if "label" not in row:
        raise DataError(f"{where}: has no 'label'; give 1 if response 'a' is preferred, 0 if 'b' is")
    prompt = row.get("prompt", "")
    if not isinstance(prompt, str):
        raise DataError(f"{where}: prompt={prompt!r} is not a string")
    return Comparison(prompt, row["a"], row["b"], check_label(row["label"], where))


def demos_from_rows(rows: Sequence[Any] | None, where: str) -> tuple[Comparison, ...]:
    """The demonstrations of one row's context (``row["demos"]``), each checked by `comparison_from_row`."""
    if rows is None:
        return ()
    if isinstance(rows, str | Mapping) or not isinstance(rows, Sequence):
        raise DataError(f"{where}: demos={rows!r} is not a list of {{prompt, a, b, label}} objects")
    return tuple(comparison_from_row(r, f"{where}: demo {i}") for i, r in enumerate(rows))


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
