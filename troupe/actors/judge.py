"""An LLM judge: a causal LM asked which of two responses is better, in both presentation orders.

Each comparison (prompt, response a, response b) is put to the judge twice, a shown first (order
AB) and b shown first (order BA), with a prompt that asks for one letter: ``A`` (the first
response is better), ``B`` (the second) or ``T`` (a tie). The judge's answer is not sampled: its
verdict distribution is read from the log-probs of the three letters as the first answer token
(`HFRolloutEngine.generate(..., option_letters=...)`), renormalised over the letters. An answer
whose letters together hold less than ``min_mass`` of the first token's probability (the model
is not answering with a verdict) parses to no verdict: it is counted and reported as None,
never dropped. Distributions are returned in content space (§G.2: order BA's "first" is b), so
the two orders of one comparison are directly comparable; `troupe.algorithms.judge.reward`
turns them into BayesJudge `JudgePair`s and posteriors.

The engine runs in this process, chosen from ``ROLLOUT_BACKENDS`` by name like a rollout role's.
As a Ray actor (the reward role, or a judge role of its own) its calls are timed out by the
platform's call timeout like every role's; `stats` counts them.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from collections.abc import Sequence

import numpy as np

from troupe.actors.base import configure_threads
from troupe.actors.sampling import SamplingConfig
from troupe.platform.errors import ConfigError
from troupe.platform.registry import ROLLOUT_BACKENDS

LETTERS = "ABT"  # first better, second better, tie: the positional answers
POSITIONS = ("first", "second", "tie")
DEFAULT_TEMPLATE = (
    "Which response answers the question better?\n"
    "Question: {prompt}\n"
    "Response A: {first}\n"
    "Response B: {second}\n"
    "Answer with one letter: A if response A is better, B if response B is better, T if they are equally good."
)


def check_template(template: str | None) -> str:
    """The judge's question template (the default for None); a ConfigError unless it shows all three fields."""
    template = template or DEFAULT_TEMPLATE
    for field in ("{prompt}", "{first}", "{second}"):
        if field not in template:
            raise ConfigError(f"reward.judge_template lacks {field}; it must show the prompt and both responses")
    return template


def check_judge_path(path: str, key: str = "reward.path") -> None:
    """A ConfigError naming ``key`` unless ``path`` (a local directory or a hub id) holds a causal
    LM; read from its config only, so the driver checks it before any actor starts."""
    from troupe.actors.models import model_config_or_error

    config = model_config_or_error(path, key, "the judge's causal LM")
    archs = list(getattr(config, "architectures", None) or [])
    if archs and not any(a.endswith(("ForCausalLM", "ForConditionalGeneration")) for a in archs):
        raise ConfigError(f"{key}={path!r} is a {', '.join(archs)} checkpoint, not a causal LM that can answer the "
                          "judge's question; with reward.kind=judge give a causal LM (reward.kind=model scores "
                          "with a reward model)")


def judge_prompt(template: str, prompt: str, first: str, second: str) -> str:
    """The judge's question with ``first`` shown as response A and ``second`` as response B."""
    return template.format(prompt=prompt, first=first, second=second)


def position_distribution(letter_logprobs: Sequence[float], min_mass: float) -> np.ndarray | None:
    """(3,) P(first, second, tie) from the three letters' log-probs, renormalised over them; None
    when their total probability is below ``min_mass`` or not finite (no verdict in the answer)."""
    lp = np.asarray(letter_logprobs, dtype=np.float64)
    mass = float(np.exp(lp).sum())
    if not math.isfinite(mass) or mass <= 0 or mass < min_mass:
        return None
    return np.exp(lp - np.logaddexp.reduce(lp))


def to_content(order: str, position: np.ndarray | None) -> np.ndarray | None:
    """A positional distribution (first, second, tie) as P(A, B, T) over the content (§G.2):
    order AB shows A first; order BA shows B first, so its "first" is B."""
    if position is None:
        return None
    return position.copy() if order == "AB" else position[[1, 0, 2]]


@dataclasses.dataclass
class JudgeCall:
    """One comparison judged in both orders: content-space verdict distributions over (A, B, T)
    (None for an order whose answer parsed to no verdict) and each order's greedy answer text."""

    ab: np.ndarray | None
    ba: np.ndarray | None
    text_ab: str
    text_ba: str

    @property
    def unparsed(self) -> int:
        """How many of the two orders parsed to no verdict."""
        return (self.ab is None) + (self.ba is None)


class LLMJudge:
    """A frozen causal LM that judges pairs of responses in both presentation orders, in batches."""

    def __init__(self, path: str, backend: str = "hf", dtype: str = "float32", device: str = "cpu",
                 batch_size: int = 16, min_mass: float = 0.5, template: str | None = None, seed: int = 0) -> None:
        configure_threads()
        if not 0 <= min_mass <= 1:
            raise ConfigError(f"reward.judge_min_mass={min_mass}: expected a probability in [0, 1]")
        self.template = check_template(template)
        engine_cls = ROLLOUT_BACKENDS.resolve(backend, "reward.judge_backend")
        offered = {"dtype": dtype, "device": device, "seed": seed}
        accepted = inspect.signature(engine_cls).parameters
        # Backends differ in what they take (vLLM places itself on its GPU): pass what each accepts.
        self.engine = engine_cls(model_path=path, **{k: v for k, v in offered.items() if k in accepted})
        self.batch_size = batch_size
        self.min_mass = min_mass
        # One greedy token: the verdict is read from the letters' log-probs at that position.
        self.sampling = SamplingConfig(temperature=0.0, max_new_tokens=1)
        self.counts = {"calls": 0, "judgments": 0, "unparsed": 0, "seconds": 0.0}

    def judge_order(self, prompts: Sequence[str], firsts: Sequence[str],
                    seconds: Sequence[str]) -> list[tuple[np.ndarray | None, str]]:
        """Positional verdict distributions (first, second, tie) and answer texts for one order,
        ``batch_size`` questions per engine call."""
        if not len(prompts) == len(firsts) == len(seconds):
            raise ValueError(f"judge: {len(prompts)} prompts, {len(firsts)} first and {len(seconds)} second responses")
        questions = [judge_prompt(self.template, p, a, b) for p, a, b in zip(prompts, firsts, seconds, strict=True)]
        out: list[tuple[np.ndarray | None, str]] = []
        for lo in range(0, len(questions), self.batch_size):
            chunk = questions[lo:lo + self.batch_size]
            t0 = time.perf_counter()
            batch = self.engine.generate(chunk, self.sampling, option_letters=[LETTERS] * len(chunk))
            self.counts["calls"] += 1
            self.counts["seconds"] += time.perf_counter() - t0
            for lp, text in zip(batch["option_logprobs"].tolist(), batch["completion"], strict=True):
                q = position_distribution(lp, self.min_mass)
                self.counts["unparsed"] += q is None
                out.append((q, text))
        self.counts["judgments"] += len(questions)
        return out

    def compare(self, prompts: Sequence[str], responses_a: Sequence[str], responses_b: Sequence[str]) -> list[JudgeCall]:
        """Judge each (prompt, a, b) with a first (order AB) and with b first (order BA)."""
        ab = self.judge_order(prompts, responses_a, responses_b)
        ba = self.judge_order(prompts, responses_b, responses_a)
        return [JudgeCall(to_content("AB", qa), to_content("BA", qb), ta, tb)
                for (qa, ta), (qb, tb) in zip(ab, ba, strict=True)]

    def stats(self) -> dict[str, float]:
        """Engine calls, questions judged (two per comparison), unparsed answers and seconds so far."""
        return dict(self.counts)
