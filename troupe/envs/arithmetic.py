"""Verifiable arithmetic: ``a+b`` (or ``a-b``, ``a*b``) with an exact checker.

Train and test problems are disjoint by construction (a problem's split is a hash of its
operands), so held-out accuracy measures generalisation, not recall.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

import numpy as np

from troupe.platform.errors import ConfigError
from troupe.platform.registry import ENVIRONMENTS, REWARDS

_INT = re.compile(r"-?\d+")


@dataclasses.dataclass
class ArithmeticTask:
    """Problems with ``digits``-digit operands; ``test_fraction`` of all pairs are held out."""

    digits: int = 2
    ops: tuple[str, ...] = ("+",)
    test_fraction: float = 0.2

    def __post_init__(self) -> None:
        if not 1 <= self.digits <= 6:
            raise ConfigError(f"env.digits={self.digits}: expected 1 to 6")
        bad = [o for o in self.ops if o not in "+-*"]
        if bad or not self.ops:
            raise ConfigError(f"env.ops={list(self.ops)}: each op must be one of '+', '-', '*'")
        if not 0 < self.test_fraction < 1:
            raise ConfigError(f"env.test_fraction={self.test_fraction}: expected a number in (0, 1)")

    def is_test(self, a: int, b: int, op: str) -> bool:
        h = hashlib.blake2b(f"{a}{op}{b}".encode(), digest_size=4).digest()
        return int.from_bytes(h, "little") / 2**32 < self.test_fraction

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        """``n`` rows ``{"prompt", "answer"}`` from ``split`` ("train" or "test")."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        lo, hi = 10 ** (self.digits - 1) if self.digits > 1 else 0, 10**self.digits
        rows: list[dict] = []
        while len(rows) < n:
            a, b = (int(x) for x in rng.integers(lo, hi, size=2))
            op = self.ops[int(rng.integers(len(self.ops)))]
            if self.is_test(a, b, op) != (split == "test"):
                continue
            rows.append({"prompt": f"{a}{op}{b}=", "answer": str(_apply(a, b, op))})
        return rows

    def eval_set(self, n: int, seed: int = 12345) -> list[dict]:
        """A fixed held-out set (the same for every run with the same task)."""
        return self.sample(n, "test", np.random.default_rng(seed))

    def corpus(self, n: int = 2000, seed: int = 0) -> list[str]:
        """Text to train a tokenizer on."""
        rng = np.random.default_rng(seed)
        return [r["prompt"] + r["answer"] for r in self.sample(n, "train", rng)]


def _apply(a: int, b: int, op: str) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def parse_integer(text: str) -> int | None:
    """The first integer in ``text``, or None."""
    m = _INT.search(text)
    return int(m.group()) if m else None


@REWARDS.register("arithmetic_exact")
def arithmetic_exact(completion: str, answer: str, **_: object) -> float:
    """1 when the first integer of the completion equals the answer, else 0."""
    got = parse_integer(completion)
    return float(got is not None and str(got) == str(answer).strip())


ENVIRONMENTS.register("arithmetic", ArithmeticTask)
