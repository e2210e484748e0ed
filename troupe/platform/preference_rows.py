"""Preference rows as users and datasets give them: a prompt, two responses and a label, and
the demonstrations a row carries in its context (``row["demos"]``).

Here, below the actors and the environments, because both read them: a reward-model actor
scores rows whose demos steer it, and the preference tasks build such rows.
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
