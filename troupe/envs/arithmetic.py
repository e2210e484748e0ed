"""Verifiable arithmetic: ``a+b`` (or ``a-b``, ``a*b``) with an exact checker.

Train and test problems are disjoint by construction (a problem's split is a hash of its
operands), so held-out accuracy measures generalisation, not recall.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from typing import Any

import numpy as np

from troupe.envs.datasets import PromptDataset
from troupe.envs.task import Task, check_dataset_file, load_rows
from troupe.platform.config import check, to_dict

_INT = re.compile(r"-?\d+")


class ArithmeticTask(Task):
    """Problems with ``digits``-digit operands; ``test_fraction`` of all pairs are held out."""

    @dataclasses.dataclass
    class Config(Task.Config):
        name: str = "arithmetic"
        digits: int = 2
        ops: list[str] = dataclasses.field(default_factory=lambda: ["+"])
        test_fraction: float = 0.2
        eval_seed: int = 12345  # draws the held-out set
        # Rows {"prompt", "answer"} (a .jsonl, .json, .csv or .parquet file, or a save_to_disk
        # folder) that replace the synthetic RL prompts / held-out set
        # (SFT still fits the synthetic problems).
        dataset: str | None = None
        eval_dataset: str | None = None

        def __post_init__(self) -> None:
            check(1 <= self.digits <= 6, "task.digits", self.digits, "1 to 6")
            check(bool(self.ops) and all(o in ("+", "-", "*") for o in self.ops), "task.ops", list(self.ops),
                  "a non-empty list of '+', '-', '*'")
            check(0 < self.test_fraction < 1, "task.test_fraction", self.test_fraction, "a number in (0, 1)")

        def validate(self) -> None:
            for key in ("dataset", "eval_dataset"):
                check_dataset_file(getattr(self, key), f"task.{key}")

    def is_test(self, a: int, b: int, op: str) -> bool:
        h = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=4).digest()
        return int.from_bytes(h, "little") / 2**32 < self.config.test_fraction

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        """``n`` synthetic rows ``{"prompt", "answer"}`` from ``split`` ("train" or "test")."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        digits, ops = self.config.digits, self.config.ops
        lo, hi = 10 ** (digits - 1) if digits > 1 else 0, 10**digits
        rows: list[dict] = []
        while len(rows) < n:
            a, b = (int(x) for x in rng.integers(lo, hi, size=2))
            op = ops[int(rng.integers(len(ops)))]
            if self.is_test(a, b, op) != (split == "test"):
                continue
            rows.append({"prompt": f"{a}{op}{b}=", "answer": str(_apply(a, b, op))})
        return rows

    def corpus(self, n: int = 2000, seed: int = 0) -> list[str]:
        """Text to train a tokenizer on."""
        rng = np.random.default_rng(seed)
        return [r["prompt"] + r["answer"] for r in self.sample(n, "train", rng)]

    # -- the Task contract -------------------------------------------------------------------
    def train_rows(self, n: int, rng: np.random.Generator) -> list[dict]:
        if self.config.dataset:
            return self._dataset.sample(n, rng)
        return self.sample(n, "train", rng)

    def eval_rows(self, n: int) -> list[dict]:
        if self.config.eval_dataset:
            return load_rows(self.config.eval_dataset, "task.eval_dataset").rows[:n]
        return self.sample(n, "test", np.random.default_rng(self.config.eval_seed))

    def checker(self) -> str:
        return "arithmetic_exact"

    def sft_task(self) -> ArithmeticTask:
        return self  # the synthetic problems, with or without a dataset

    def cache_key(self) -> dict[str, Any]:
        # The keys of the SFT checkpoints built before test_fraction and eval_seed were config
        # keys stay the same: the seed of the held-out set does not shape SFT, and the default
        # test fraction is left out.
        key = to_dict(self.config)
        del key["eval_seed"]
        if key["test_fraction"] == 0.2:
            del key["test_fraction"]
        return key

    @functools.cached_property
    def _dataset(self) -> PromptDataset:
        return load_rows(self.config.dataset, "task.dataset")


def _apply(a: int, b: int, op: str) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def parse_integer(text: str) -> int | None:
    """The first integer in ``text``, or None."""
    m = _INT.search(text)
    return int(m.group()) if m else None


def arithmetic_exact(completion: str, answer: str, **_: object) -> float:
    """1 when the first integer of the completion equals the answer, else 0."""
    got = parse_integer(completion)
    return float(got is not None and str(got) == str(answer).strip())


