"""Prompt datasets from files: JSON lines with the fields a task requires."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from troupe.platform.errors import DataError


class PromptDataset:
    """Rows (dicts) with at least ``required`` fields; sampled reproducibly by a generator."""

    def __init__(self, rows: list[dict], required: Sequence[str] = ("prompt",), source: str = "<memory>") -> None:
        for i, row in enumerate(rows):
            if not isinstance(row, dict):
                raise DataError(f"{source}: row {i} is not an object: {row!r}")
            missing = [k for k in required if k not in row]
            if missing:
                raise DataError(
                    f"{source}: row {i} lacks required field(s) {missing}; it has {sorted(row)}. "
                    f"Every row needs {list(required)}."
                )
        if not rows:
            raise DataError(f"{source}: the dataset is empty")
        self.rows = rows
        self.source = source

    @classmethod
    def from_jsonl(cls, path: str | Path, required: Sequence[str] = ("prompt",)) -> PromptDataset:
        path = Path(path)
        if not path.is_file():
            raise DataError(f"dataset file {str(path)!r} does not exist")
        rows = []
        with open(path) as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: not valid JSON: {e}") from e
        return cls(rows, required, str(path))

    def __len__(self) -> int:
        return len(self.rows)

    def sample(self, n: int, rng: np.random.Generator) -> list[dict]:
        idx = rng.integers(len(self.rows), size=n)
        return [self.rows[int(i)] for i in idx]
