"""Chains with a controllable horizon: H short deterministic steps, each checkable (§B on LMs).

The answer writes one digit per step, each a function of the digits before it, so an error
anywhere propagates to the final answer:

* ``running_sum``: s_t = (s_{t−1} + d_t) mod 10 with s_0 = 0 (``sum 3518=`` → ``3897``);
* ``carry``: the digits of the sum of two H-digit numbers written low digit first, each step
  adding a column and its carry (``add 47+85=`` → ``231``, i.e. 132 read backwards, one digit
  more when the last column carries);
* ``recurrence``: the prompt is six digits and the answer continues them by
  s_t = (s_{t−1} + s_{t−2}) mod 10 (``rec 000031`` → ``4594``). Every step, the first
  included, reads the two digits just before it (with no chat turn between prompt and
  answer: see `PLAIN_TEMPLATE`), at the same distance at every step; the other two kinds make
  the model find the t-th prompt digit, a lookup the tiny model takes thousands of updates to
  learn, where it learns this rule in about a thousand. Its 10^6 prompts cannot be memorised,
  so held-out prompts are answered by the rule; but every chain walks the same 100-state
  table, so the expert is a function of the last two tokens: the LM counterpart of §B.5's
  ``context=2`` caveat, where what one state teaches carries to every prefix that ends alike.

The horizon ``H`` (4 to 32) is the number of steps; ``checker`` scores the final answer exactly
(all steps right), `step_correct` says which steps are right, and `first_error` where the chain
first goes wrong, the quantity a noisy expert's errors are counted in. Train and held-out
prompts are disjoint by construction (a prompt's split is a hash of its digits). Every step is
one addition of two digits; what grows with H is only the chain.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

import numpy as np

from troupe.envs.task import Task
from troupe.platform.config import check

KINDS = ("running_sum", "carry", "recurrence")
# A chat template with no turn markers: the answer follows the prompt's text directly, as a base
# model's continuation (set as model.chat_template).
PLAIN_TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
MIN_H, MAX_H = 4, 32
_DIGIT = re.compile(r"\d")


class ChainTask(Task):
    """H-step digit chains with an exact checker of the final answer and of every step."""

    @dataclasses.dataclass
    class Config(Task.Config):
        name: str = "chain"
        kind: str = "running_sum"  # running_sum, carry or recurrence
        horizon: int = 8  # H: steps per chain
        test_fraction: float = 0.2
        eval_seed: int = 12345

        def __post_init__(self) -> None:
            check(self.kind in KINDS, "task.kind", self.kind, f"one of {KINDS}")
            check(isinstance(self.horizon, int) and MIN_H <= self.horizon <= MAX_H, "task.horizon", self.horizon,
                  f"an integer from {MIN_H} to {MAX_H}")
            check(0 < self.test_fraction < 1, "task.test_fraction", self.test_fraction, "a number in (0, 1)")

    # -- problems ----------------------------------------------------------------------------
    def is_test(self, digits: tuple[int, ...]) -> bool:
        h = hashlib.blake2b(f"{self.config.kind}:{''.join(map(str, digits))}".encode(), digest_size=4).digest()
        return int.from_bytes(h, "little") / 2**32 < self.config.test_fraction

    def problem(self, rng: np.random.Generator) -> tuple[int, ...]:
        """One chain's inputs: H digits (running_sum), 2H, the two numbers' digits high first
        (carry), or six (recurrence: the sequence the answer continues)."""
        if self.config.kind == "recurrence":
            return tuple(int(d) for d in rng.integers(0, 10, 6))
        n = self.config.horizon * (2 if self.config.kind == "carry" else 1)
        return tuple(int(d) for d in rng.integers(0, 10, n))

    def prompt(self, digits: tuple[int, ...]) -> str:
        if self.config.kind == "running_sum":
            return "sum " + "".join(map(str, digits)) + "="
        if self.config.kind == "recurrence":
            return "rec " + "".join(map(str, digits))  # no "=": the answer continues the digits
        h = self.config.horizon
        return f"add {''.join(map(str, digits[:h]))}+{''.join(map(str, digits[h:]))}="

    def steps(self, digits: tuple[int, ...]) -> list[int]:
        """The chain's step outputs, in the order they are written."""
        return chain_steps(self.config.kind, digits, self.config.horizon)

    def row(self, digits: tuple[int, ...]) -> dict[str, Any]:
        steps = self.steps(digits)
        return {"prompt": self.prompt(digits), "answer": "".join(map(str, steps)), "steps": steps,
                "kind": self.config.kind, "horizon": self.config.horizon, "inputs": list(digits)}

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        rows: list[dict] = []
        while len(rows) < n:
            digits = self.problem(rng)
            if self.is_test(digits) == (split == "test"):
                rows.append(self.row(digits))
        return rows

    def corpus(self, n: int = 2000, seed: int = 0) -> list[str]:
        return [f"{r['prompt']}{r['answer']}" for r in self.sample(n, "train", np.random.default_rng(seed))]

    # -- the Task contract -------------------------------------------------------------------
    def train_rows(self, n: int, rng: np.random.Generator) -> list[dict]:
        return self.sample(n, "train", rng)

    def eval_rows(self, n: int) -> list[dict]:
        return self.sample(n, "test", np.random.default_rng(self.config.eval_seed))

    def checker(self) -> str:
        return "chain_exact"

    def sft_task(self) -> ChainTask:
        return self


class ChainMixture:
    """The chain task at several horizons, rows drawn from each in turn: what one student
    tokenizer and one teacher are built on when a run compares horizons (an `SFTTask`)."""

    def __init__(self, tasks: list[ChainTask]) -> None:
        self.tasks = list(tasks)

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        per = [t.sample(-(-n // len(self.tasks)), split, rng) for t in self.tasks]
        return [per[i % len(per)][i // len(per)] for i in range(n)]

    def corpus(self, n: int = 2000, seed: int = 0) -> list[str]:
        return [f"{r['prompt']}{r['answer']}" for r in self.sample(n, "train", np.random.default_rng(seed))]

    def cache_key(self) -> dict[str, Any]:
        return {"chain_mixture": [t.cache_key() for t in self.tasks]}


def chain_steps(kind: str, digits: tuple[int, ...] | list[int], horizon: int) -> list[int]:
    """Every step's output of a chain (see the module docstring)."""
    if kind == "running_sum":
        out, s = [], 0
        for d in digits:
            s = (s + d) % 10
            out.append(s)
        return out
    if kind == "carry":
        a, b = digits[:horizon][::-1], digits[horizon:][::-1]  # low digit first
        out, carry = [], 0
        for x, y in zip(a, b, strict=True):
            carry, digit = divmod(x + y + carry, 10)
            out.append(digit)
        return out + [carry] if carry else out
    if kind == "recurrence":
        window = list(digits[-2:])  # the sequence so far ends in s_-1, s_0
        out = []
        for _ in range(horizon):
            window = [window[1], (window[0] + window[1]) % 10]
            out.append(window[1])
        return out
    raise ValueError(f"chain kind {kind!r} is unknown: expected one of {KINDS}")


def next_step(row: dict, written: list[int]) -> int | None:
    """The clean expert at a state: the digit that continues the chain from the digits written
    so far (``written``), or None where the answer is complete (the end token comes next).

    It follows the state, as a model trained on clean chains would: after a wrong digit, the
    recurrence adds the two digits actually written and the running sum adds to the one written
    last, so a noisy teacher's later steps stay consistent with its own errors. (The carry
    chain's carry cannot be read off a wrong digit: there the expert writes the true digit.)"""
    kind, horizon, inputs = row["kind"], row["horizon"], row["inputs"]
    t = len(written)
    if t >= answer_length(kind, horizon):
        return None
    if kind == "recurrence":
        seq = [*inputs[-2:], *written]
        return (seq[-1] + seq[-2]) % 10
    if kind == "running_sum":
        return ((written[-1] if written else 0) + inputs[t]) % 10
    steps = chain_steps(kind, inputs, horizon)
    return steps[t] if t < len(steps) else None


def answer_length(kind: str, horizon: int) -> int:
    """The most digits a chain's answer has: H, one more for a carry out."""
    return horizon + (1 if kind == "carry" else 0)


def parse_steps(completion: str) -> list[int]:
    """The digits a completion wrote, in order."""
    return [int(d) for d in _DIGIT.findall(completion)]


def step_correct(completion: str, steps: list[int]) -> list[bool]:
    """For each step, whether the completion's digit at that step is the right one."""
    got = parse_steps(completion)
    return [i < len(got) and got[i] == s for i, s in enumerate(steps)]


def first_error(completion: str, steps: list[int]) -> int | None:
    """The first step the completion gets wrong (0-based), or None when every step is right
    and nothing follows the last one."""
    ok = step_correct(completion, steps)
    if False in ok:
        return ok.index(False)
    return len(steps) if len(parse_steps(completion)) > len(steps) else None


def chain_exact(completion: str, steps: list[int], **_: object) -> float:
    """1 when the completion writes exactly the chain's steps (so its final answer is right)."""
    return float(parse_steps(completion) == list(steps))
