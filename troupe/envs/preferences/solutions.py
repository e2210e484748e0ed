"""(correct, incorrect) solution pairs of arithmetic problems: ICRM on verifiable math (§C.2,
"for verifiable math, the demos are (correct, incorrect) solution pairs for *other* problems").

A problem is `troupe.envs.arithmetic.ArithmeticTask`'s: the prompt ``"23+48="`` and, as the
policy fitted on that task writes it, the answer ``"71"`` (its checker reads the first integer).
An incorrect solution is one a policy plausibly writes (`MISTAKES`):

* ``off_by``: the answer off by a small amount (±1, ±2, ±10);
* ``carry``: a dropped carry (``+``, ``"86+67="`` → ``"143"``) or borrow (``-``, ``"52-38="`` →
  ``"26"``), column by column; only where the problem has one;
* ``digit``: one digit of the answer replaced by another.

`solution_pool` draws distinct problems of one split with a wrong answer of each kind, once;
`solution_episodes` draws episodes from it: the query a (correct, incorrect) pair for one problem,
shown in a random order (label 1 iff ``a`` is the correct one), and ``k`` demos, pairs of *other*
problems. The preference is exact: the correct solution is always preferred.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from troupe.envs.arithmetic import ArithmeticTask, _apply
from troupe.envs.preferences.episodes import Comparison, Episode, draw_k
from troupe.platform.errors import DataError

MISTAKES = ("off_by", "carry", "digit")
CARRY_OPS = ("+", "-")  # a carry or borrow is dropped in addition and subtraction only
OFFSETS = (-10, -2, -1, 1, 2, 10)
_PROBLEM = re.compile(r"^(\d+)([+\-*])(\d+)=$")


@dataclasses.dataclass(frozen=True)
class Problem:
    a: int
    b: int
    op: str

    @property
    def prompt(self) -> str:
        return f"{self.a}{self.op}{self.b}="

    @property
    def answer(self) -> int:
        return _apply(self.a, self.b, self.op)


def parse_problem(prompt: str) -> Problem:
    """The problem of an ArithmeticTask prompt (``"23+48="``), or a DataError naming it."""
    m = _PROBLEM.match(prompt.strip())
    if not m:
        raise DataError(f"prompt {prompt!r} is not an arithmetic problem like '23+48='")
    return Problem(int(m.group(1)), int(m.group(3)), m.group(2))


def off_by(answer: int, rng: np.random.Generator) -> int:
    """``answer`` plus a small offset; a non-negative answer stays non-negative."""
    offsets = [d for d in OFFSETS if answer < 0 or answer + d >= 0]
    return answer + int(offsets[int(rng.integers(len(offsets)))])


def dropped_carry(p: Problem) -> int | None:
    """The answer written column by column with the carry dropped (``+``: each column's sum mod 10,
    the leftmost written whole, ``86+67=`` → 143), or the borrow (``-``: each column the smaller
    digit from the larger, ``52-38=`` → 26, of the larger operand minus the smaller, the sign kept);
    None for ``*`` or when nothing carries."""
    if p.op not in CARRY_OPS:
        return None
    x, y = (p.a, p.b) if p.op == "+" else (max(p.a, p.b), min(p.a, p.b))
    out, place = 0, 1
    while x or y:
        dx, dy = x % 10, y % 10
        last = x < 10 and y < 10
        column = dx + dy if p.op == "+" else abs(dx - dy)
        out += (column if last else column % 10) * place
        x, y, place = x // 10, y // 10, place * 10
    if p.op == "-" and p.a < p.b:
        out = -out
    return None if out == p.answer else out


def wrong_digit(answer: int, rng: np.random.Generator) -> int:
    """``answer`` with one digit replaced by another (a leading digit never by 0)."""
    digits = list(str(abs(answer)))
    i = int(rng.integers(len(digits)))
    choices = [c for c in "0123456789" if c != digits[i] and not (c == "0" and i == 0 and len(digits) > 1)]
    digits[i] = choices[int(rng.integers(len(choices)))]
    value = int("".join(digits))
    return -value if answer < 0 else value


def wrong_answer(p: Problem, kind: str, rng: np.random.Generator) -> int | None:
    """A plausible incorrect answer to ``p`` of mistake ``kind``, or None where it cannot be made."""
    if kind == "off_by":
        return off_by(p.answer, rng)
    if kind == "carry":
        return dropped_carry(p)
    if kind == "digit":
        return wrong_digit(p.answer, rng)
    raise ValueError(f"mistake {kind!r}: expected one of {MISTAKES}")


def kinds_possible(digits: int, ops: Sequence[str], kinds: Sequence[str]) -> list[str]:
    """The mistake kinds of ``kinds`` that some problem of ``digits``-digit operands and these
    operators admits: one column never carries, nor does ``*`` here."""
    return [k for k in kinds if k != "carry" or (digits >= 2 and any(o in CARRY_OPS for o in ops))]


def split_size(task: ArithmeticTask, split: str) -> int | None:
    """How many distinct problems ``split`` holds (None when too many to count)."""
    digits, ops = task.config.digits, task.config.ops
    lo, hi = (10 ** (digits - 1) if digits > 1 else 0), 10**digits
    if (hi - lo) ** 2 * len(ops) > 200_000:
        return None
    return sum(task.is_test(a, b, op) == (split == "test") for op in ops for a in range(lo, hi) for b in range(lo, hi))


def draw_problems(task: ArithmeticTask, n: int, split: str, rng: np.random.Generator) -> list[Problem]:
    """``n`` distinct problems of ``split`` ("train" or "test"), in the order drawn."""
    digits, ops = task.config.digits, task.config.ops
    lo, hi = (10 ** (digits - 1) if digits > 1 else 0), 10**digits
    seen: set[Problem] = set()
    out: list[Problem] = []
    for _ in range(200 * n + 1000):
        if len(out) == n:
            return out
        a, b = (int(x) for x in rng.integers(lo, hi, size=2))
        p = Problem(a, b, ops[int(rng.integers(len(ops)))])
        if p in seen or task.is_test(p.a, p.b, p.op) != (split == "test"):
            continue
        seen.add(p)
        out.append(p)
    if len(out) < n:
        raise DataError(f"only {len(out)} distinct {split} problems were found of the {n} asked for "
                        f"(task.digits={digits}, task.ops={list(ops)}): ask for fewer or raise the digits")
    return out


@dataclasses.dataclass(frozen=True)
class SolutionPool:
    """Problems, each with its correct answer and one wrong answer per mistake kind it admits."""

    prompts: tuple[str, ...]
    answers: tuple[str, ...]
    wrong: tuple[dict[str, str], ...]

    def __len__(self) -> int:
        return len(self.prompts)

    def texts(self) -> list[tuple[str, str]]:
        """Every (prompt, response) of the pool, correct ones first per problem."""
        return [(p, r) for p, a, w in zip(self.prompts, self.answers, self.wrong, strict=True) for r in (a, *w.values())]

    def having(self, kinds: Sequence[str]) -> np.ndarray:
        """Indices of the problems with a wrong answer of one of ``kinds``."""
        return np.array([i for i, w in enumerate(self.wrong) if any(k in w for k in kinds)], dtype=int)

    def pair(self, i: int, kinds: Sequence[str], rng: np.random.Generator) -> Comparison:
        """Problem ``i``'s correct answer against a wrong one of a kind among ``kinds`` it has, in a
        random order: label 1 iff ``a`` is the correct one."""
        have = [k for k in kinds if k in self.wrong[i]]
        wrong = self.wrong[i][have[int(rng.integers(len(have)))]]
        c = Comparison(self.prompts[i], self.answers[i], wrong, 1)
        return c.swapped() if rng.random() < 0.5 else c


def solution_pool(problems: Sequence[Problem], kinds: Sequence[str], rng: np.random.Generator) -> SolutionPool:
    """The pool of ``problems`` with a wrong answer of each of ``kinds`` each admits; a problem that
    admits none is left out."""
    prompts, answers, wrong = [], [], []
    for p in problems:
        w = {k: str(v) for k in kinds if (v := wrong_answer(p, k, rng)) is not None}
        if w:
            prompts.append(p.prompt)
            answers.append(str(p.answer))
            wrong.append(w)
    return SolutionPool(tuple(prompts), tuple(answers), tuple(wrong))


def solution_episodes(pool: SolutionPool, kinds: Sequence[str], n: int, rng: np.random.Generator,
                      k: int | tuple[int, int] = (0, 8)) -> list[Episode]:
    """n episodes: a query pair for one problem of ``pool`` (its wrong side of a kind in ``kinds``)
    and ``k`` demos (int or ``(lo, hi)`` uniform), pairs of other problems of the same kinds."""
    index = pool.having(kinds)
    ks = draw_k(n, k, rng)
    if len(index) < 2 and ks.max(initial=0) > 0:
        raise DataError(f"{len(index)} problem(s) with a mistake of {list(kinds)}: demos come from other "
                        "problems, so at least 2 are needed")
    if not len(index):
        raise DataError(f"no problem of the pool admits a mistake of {list(kinds)}")
    out = []
    for e in range(n):
        q = int(index[rng.integers(len(index))])
        others = index[index != q]
        picks = others[rng.integers(len(others), size=int(ks[e]))] if ks[e] else []
        demos = tuple(pool.pair(int(i), kinds, rng) for i in picks)
        out.append(Episode(demos, pool.pair(q, kinds, rng), "correct"))
    return out


def with_solution_demos(rows: list[dict], pool: SolutionPool, kinds: Sequence[str], k: int,
                        rng: np.random.Generator) -> list[dict]:
    """ArithmeticTask rows with what an in-context reward model reads beside them: ``demos``, ``k``
    (correct, incorrect) pairs of pool problems other than the row's, and ``reference``, a wrong
    answer to the row's own problem that the pairwise rewards compare each completion with."""
    index = pool.having(kinds)
    out = []
    for row in rows:
        p = parse_problem(row["prompt"])
        others = np.array([i for i in index if pool.prompts[i] != row["prompt"]], dtype=int)
        picks = others[rng.integers(len(others), size=k)] if k else []
        wrong = [v for kind in kinds if (v := wrong_answer(p, kind, rng)) is not None] or [off_by(p.answer, rng)]
        reference = wrong[int(rng.integers(len(wrong)))]
        out.append({**row, "demos": [pool.pair(int(i), kinds, rng).as_row() for i in picks],
                    "reference": str(reference)})
    return out
