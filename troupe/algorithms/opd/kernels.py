"""Noise kernels of a noisy expert over a language model's vocabulary (ALGORITHMS.md §B.1).

π̃(·|s) = (1-ε)·π*(·|s) + ε·ν(·|s), in log space over the last axis ``[..., V]``, where ν is

- ``uniform``: uniform over the vocabulary;
- ``topk``: uniform over the clean expert's ``top_k`` most likely tokens (the GPU-scale
  reading: "w.p. ε sample from uniform-over-top-20");
- ``confusion``: a row-stochastic matrix over the answer tokens, row a* = the clean expert's
  most likely token; where that is no answer token (the end of the answer) there is no noise;
- ``step``: a wrong result for the step, uniform over the answer tokens other than a*; no
  noise off the steps (the default of `troupe run opd`). Every step of a chain writes one answer token, so this is the
  step-level corruption of §B.5's GPU-scale setting: one whole step replaced by a wrong one.

`check_noise` turns every bad setting into an error naming its key.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch

from troupe.platform.config import check
from troupe.platform.errors import ConfigError

KERNELS = ("uniform", "topk", "confusion", "step")


@dataclasses.dataclass
class NoiseConfig:
    """The teacher's noise: with probability ``eps`` per token, a draw from ``kernel``."""

    eps: float = 0.3
    kernel: str = "uniform"  # uniform, topk, confusion or step
    top_k: int = 20  # the topk kernel's k
    # The confusion kernel: rows and columns follow `answer_tokens`; each row sums to 1.
    confusion: list[list[float]] | None = None
    answer_tokens: list[str] = dataclasses.field(default_factory=lambda: [str(d) for d in range(10)])
    # A uniform floor mixed in last, (1-floor)·π̃ + floor/V: a program expert or a sparse kernel
    # gives tokens probability 0, where a reverse KL (GKD β=1, NE-OPD rkl) is infinite and its
    # gradient NaN; a model teacher never does. It moves no mode and no margin visibly.
    floor: float = 1e-6

    def __post_init__(self) -> None:
        check(isinstance(self.eps, int | float) and 0.0 <= self.eps < 1.0, "teacher.noise.eps", self.eps,
              "a number in [0, 1) (at 1 the teacher is pure noise)")
        check(self.kernel in KERNELS, "teacher.noise.kernel", self.kernel, "one of " + ", ".join(KERNELS))
        check(isinstance(self.top_k, int) and self.top_k >= 1, "teacher.noise.top_k", self.top_k, "an integer >= 1")
        check(isinstance(self.floor, int | float) and 0.0 <= self.floor <= 0.01, "teacher.noise.floor", self.floor,
              "a number in [0, 0.01] (0 keeps exact zeros, which a reverse KL cannot take)")
        check(len(self.answer_tokens) >= 2, "teacher.noise.answer_tokens", self.answer_tokens,
              "at least two tokens")
        if self.kernel == "confusion":
            if self.confusion is None:
                raise ConfigError("teacher.noise.kernel=confusion needs teacher.noise.confusion: a row-stochastic "
                                  f"matrix with one row and one column per answer token ({len(self.answer_tokens)})")
            confusion_matrix(self.confusion, len(self.answer_tokens))


def confusion_matrix(rows: Sequence[Sequence[float]], n: int) -> torch.Tensor:
    """``rows`` as an ``[n, n]`` row-stochastic tensor, or an error naming the key."""
    m = torch.tensor(rows, dtype=torch.float64)
    if m.shape != (n, n):
        raise ConfigError(f"teacher.noise.confusion has shape {tuple(m.shape)}: expected ({n}, {n}), one row "
                          "and one column per entry of teacher.noise.answer_tokens")
    if (m < 0).any() or not torch.allclose(m.sum(1), torch.ones(n, dtype=m.dtype), atol=1e-6):
        sums = [round(float(s), 6) for s in m.sum(1)]
        raise ConfigError(f"teacher.noise.confusion: every row must be a distribution (entries >= 0, summing to 1); "
                          f"the row sums are {sums}")
    return m


def answer_ids(tokenizer: object, tokens: Sequence[str]) -> list[int]:
    """The vocabulary ids of the answer tokens; each must be a single token of ``tokenizer``."""
    ids = []
    for t in tokens:
        enc = tokenizer(t, add_special_tokens=False)["input_ids"]  # type: ignore[operator]
        if len(enc) != 1:
            raise ConfigError(f"teacher.noise.answer_tokens: {t!r} is {len(enc)} tokens of the student's tokenizer; "
                              "each answer token must be one")
        ids.append(enc[0])
    return ids


def kernel_distribution(clean: torch.Tensor, cfg: NoiseConfig, answer: Sequence[int] = ()) -> torch.Tensor:
    """ν(·|s) ``[..., V]`` for the clean expert's distribution ``clean`` (probabilities)."""
    V = clean.shape[-1]
    if cfg.kernel == "uniform":
        return torch.full_like(clean, 1.0 / V)
    if cfg.kernel == "topk":
        if cfg.top_k > V:
            raise ConfigError(f"teacher.noise.top_k={cfg.top_k} is larger than the vocabulary ({V} tokens)")
        idx = clean.topk(cfg.top_k, dim=-1).indices
        return torch.zeros_like(clean).scatter_(-1, idx, 1.0 / cfg.top_k)
    if not answer:
        raise ValueError(f"the {cfg.kernel} kernel needs the vocabulary ids of teacher.noise.answer_tokens")
    ids = torch.tensor(list(answer), dtype=torch.long, device=clean.device)
    if int(ids.max()) >= V:
        raise ConfigError(f"teacher.noise.answer_tokens have ids up to {int(ids.max())}, beyond the vocabulary ({V})")
    mode = clean.argmax(-1)
    # Where the clean mode is answer token j: its row over the answer tokens; elsewhere, no noise.
    where = (mode.unsqueeze(-1) == ids)  # [..., A]
    on_answer = where.any(-1)
    j = where.float().argmax(-1)
    A = len(ids)
    if cfg.kernel == "confusion":
        rows = confusion_matrix(cfg.confusion, A).to(clean.dtype).to(clean.device)
    else:  # step: a wrong result, uniform over the other answer tokens
        rows = (torch.ones(A, A, dtype=clean.dtype, device=clean.device) - torch.eye(A, dtype=clean.dtype,
                                                                                    device=clean.device)) / (A - 1)
    nu = torch.zeros_like(clean)
    nu[..., ids] = rows[j]
    return torch.where(on_answer.unsqueeze(-1), nu, clean)


def noisy_logprobs(clean_logprobs: torch.Tensor, cfg: NoiseConfig, answer: Sequence[int] = ()) -> torch.Tensor:
    """log π̃ ``[..., V]`` from the clean expert's log-probs (a one-hot expert: 0 and -inf)."""
    clean = clean_logprobs.double().softmax(-1)
    mixed = (1.0 - cfg.eps) * clean + cfg.eps * kernel_distribution(clean, cfg, answer)
    if cfg.floor:
        mixed = (1.0 - cfg.floor) * mixed + cfg.floor / mixed.shape[-1]
    return mixed.log().to(clean_logprobs.dtype)


def mode_margin_of(cfg: NoiseConfig, vocab: int) -> float:
    """γ of §B.1 for a deterministic clean expert: π̃(a*) − max_{a≠a*} π̃(a), the worst over the
    clean actions the kernel treats differently (for confusion, its rows)."""
    e = cfg.eps
    if cfg.kernel == "uniform":
        return 1.0 - e  # (1-ε+ε/V) − ε/V
    if cfg.kernel == "topk":
        return 1.0 - e  # a* is in its own top-k: (1-ε+ε/k) − ε/k
    A = len(cfg.answer_tokens)
    if cfg.kernel == "step":
        return 1.0 - e - e / (A - 1)
    m = confusion_matrix(cfg.confusion, A)
    off = m.clone()
    off.fill_diagonal_(-1.0)
    return float(((1 - e) + e * m.diagonal() - e * off.max(1).values).min())


def majority_targets(noisy_logprobs_: torch.Tensor, votes: int, generator: torch.Generator) -> torch.Tensor:
    """Sample access: ``votes`` draws from π̃ at every position ``[..., V]`` and the most drawn
    token ``[...]`` (ties broken uniformly at random)."""
    if votes < 1:
        raise ConfigError(f"teacher.votes={votes}: expected draws per position >= 1")
    probs = noisy_logprobs_.double().exp().reshape(-1, noisy_logprobs_.shape[-1])
    draws = torch.multinomial(probs, votes, replacement=True, generator=generator)  # [N, m]
    counts = torch.zeros_like(probs).scatter_add_(1, draws, torch.ones_like(draws, dtype=probs.dtype))
    # A uniform jitter below one vote breaks ties at random and never overturns a majority.
    jitter = torch.rand(counts.shape, generator=generator, dtype=probs.dtype) * 0.5
    return (counts + jitter).argmax(-1).reshape(noisy_logprobs_.shape[:-1])
