"""The text comparison task of ``troupe run judge``: which of two responses names a fruit?

Every prompt asks ``name a fruit``; a response is one word, right when it is a fruit and wrong
otherwise. The latent verdict of a comparison (A_i, B_i) is A when only A is right, B when only B
is, and T (tie) when both are right or both wrong, drawn from π like §G.6's verdicts.

The tiny LM judge is fitted by SFT on judge questions of this task in both presentation orders.
Its SFT answers are noisy the way real judges are [ASM]: with probability ``first_bias`` the
answer is "A" (the response shown first) whatever the truth, and with probability ``label_noise``
a uniform letter; otherwise the right positional letter. A judge fitted to these answers learns a
first-position bias, which BayesJudge's order-bias posterior should detect.

The run's comparisons are drawn from their own seed, apart from the SFT rows'. (A task whose
judge must compare a response with the prompt, such as copying a digit string, stayed at chance
for the 100k-parameter model over 1500 SFT steps; a word's class it learns in a few hundred.)
"""

from __future__ import annotations

import dataclasses

import numpy as np

from troupe.actors.judge import LETTERS, judge_prompt
from troupe.algorithms.judge.model import VERDICTS, A, T
from troupe.platform.config import check

# Short: the tiny judge reads every token of it twice per comparison.
TEMPLATE = "{prompt}\nA: {first}\nB: {second}\nbetter: A, B or T?"
PROMPT = "name a fruit"
RIGHT = ["apple", "pear", "plum", "grape", "lemon", "mango", "peach", "melon", "cherry", "lime", "fig", "kiwi"]
WRONG = ["stone", "chair", "cloud", "river", "spoon", "brick", "shirt", "piano", "candle", "lamp", "rope", "wheel"]


@dataclasses.dataclass
class WordTaskConfig:
    pi: list[float] = dataclasses.field(default_factory=lambda: [0.4, 0.4, 0.2])  # verdicts A, B, T
    first_bias: float = 0.2  # SFT answers: "first shown" whatever the truth
    label_noise: float = 0.1  # SFT answers: a uniform letter

    def __post_init__(self) -> None:
        check(len(self.pi) == 3 and min(self.pi) >= 0 and abs(sum(self.pi) - 1) < 1e-9, "lm.task.pi", self.pi,
              "a probability vector over (A, B, T)")
        for key in ("first_bias", "label_noise"):
            check(0 <= getattr(self, key) <= 1, f"lm.task.{key}", getattr(self, key), "a probability in [0, 1]")
        check(self.first_bias + self.label_noise < 1, "lm.task.first_bias", self.first_bias,
              "first_bias + label_noise < 1 (some SFT answers must follow the truth)")


@dataclasses.dataclass(frozen=True)
class TextComparison:
    id: str
    prompt: str
    a: str
    b: str
    verdict: int  # index into VERDICTS


class WordComparisons:
    """Comparisons of the word task, SFT rows for its judge, and a tokenizer corpus."""

    def __init__(self, config: WordTaskConfig, template: str = TEMPLATE) -> None:
        self.config = config
        self.template = template

    def comparison(self, rng: np.random.Generator, cid: str = "") -> TextComparison:
        """One comparison with its latent verdict."""
        v = int(rng.choice(3, p=self.config.pi))

        def word(right: bool) -> str:
            pool = RIGHT if right else WRONG
            return pool[int(rng.integers(len(pool)))]

        if v == T:
            both = bool(rng.random() < 0.5)  # a tie: both right or both wrong
            a, b = word(both), word(both)
        else:
            a, b = word(v == A), word(v != A)
        return TextComparison(cid, PROMPT, a, b, v)

    def comparisons(self, n: int, seed: int, prefix: str = "lm") -> list[TextComparison]:
        rng = np.random.default_rng([seed, 11])
        return [self.comparison(rng, f"{prefix}{i}") for i in range(n)]

    def sft_answer(self, verdict: int, a_first: bool, rng: np.random.Generator) -> str:
        """The positional letter an SFT row teaches (the right one, or the biased or noisy one)."""
        c = self.config
        u = rng.random()
        if u < c.first_bias:
            return "A"
        if u < c.first_bias + c.label_noise:
            return LETTERS[int(rng.integers(3))]
        if verdict == T:
            return "T"
        return "A" if (verdict == A) == a_first else "B"

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        """``n`` SFT rows ``{"prompt": the judge question, "answer": a letter}``, orders at random."""
        rows = []
        for _ in range(n):
            c = self.comparison(rng)
            a_first = bool(rng.random() < 0.5)
            first, second = (c.a, c.b) if a_first else (c.b, c.a)
            rows.append({"prompt": judge_prompt(self.template, c.prompt, first, second),
                         "answer": self.sft_answer(c.verdict, a_first, rng), "verdict": VERDICTS[c.verdict]})
        return rows

    def corpus(self, n: int = 4000, seed: int = 0) -> list[str]:
        """Text to train the judge's tokenizer on."""
        rows = self.sample(n, "train", np.random.default_rng(seed))
        return [f"{r['prompt']}\n{r['answer']}" for r in rows]
