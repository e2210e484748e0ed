"""The noisy expert of ALGORITHMS.md §B.1 and the closed forms the benchmark is checked against.

π̃(·|s) = (1-ε)·π*(·|s) + ε·ν(·|s), with ν uniform over the vocabulary by default. Mode
preservation with margin γ: π̃(π*(s)|s) ≥ max_{a≠π*(s)} π̃(a|s) + γ; uniform noise keeps it for
every ε < 1, with γ = 1-ε.
"""

from __future__ import annotations

import math

import numpy as np


def noisy_expert(clean: np.ndarray, eps: float, nu: np.ndarray | None = None) -> np.ndarray:
    """(1-ε)·clean + ε·ν along the last axis; ``clean`` holds distributions (one-hot for a
    deterministic expert), ν defaults to uniform."""
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"opd.eps={eps}: expected a number in [0, 1]")
    clean = np.asarray(clean, dtype=float)
    if nu is None:
        nu = np.full(clean.shape, 1.0 / clean.shape[-1])
    return (1.0 - eps) * clean + eps * np.asarray(nu, dtype=float)


def one_hot(actions: np.ndarray | int, vocab: int) -> np.ndarray:
    return np.eye(vocab)[np.asarray(actions)]


def mode_margin(noisy: np.ndarray, clean_action: np.ndarray | int) -> np.ndarray:
    """γ(s) = π̃(a*|s) - max_{a≠a*} π̃(a|s); mode preservation holds where it is > 0."""
    noisy = np.asarray(noisy, dtype=float)
    a = np.asarray(clean_action)
    at = np.take_along_axis(noisy, a[..., None], -1)[..., 0]
    others = noisy.copy()
    np.put_along_axis(others, a[..., None], -np.inf, -1)
    return at - others.max(-1)


def clean_step_prob(eps: float, vocab: int) -> float:
    """q = π̃(π*(s)|s) under uniform noise: 1 - ε + ε/|V|."""
    return 1.0 - eps + eps / vocab


def success_prob_sampling(eps: float, vocab: int, horizon: int) -> float:
    """J at temperature 1 of the noisy expert itself: q^H (exponentially small in H)."""
    return clean_step_prob(eps, vocab) ** horizon


def expected_clean_visits(n: int, eps: float, vocab: int, depth: int) -> float:
    """Expected visits of the depth-``depth`` clean state (1-based) by n noisy trajectories: n·q^(h-1)."""
    return n * clean_step_prob(eps, vocab) ** (depth - 1)


def votes_needed(gamma: float, vocab: int, horizon: int, delta: float) -> int:
    """m = ⌈2 γ^-2 log(2|V|H/δ)⌉ draws per state, so that every visited state's majority vote
    is the mode with probability ≥ 1 - δ/H (Hoeffding)."""
    if gamma <= 0:
        raise ValueError(f"margin gamma={gamma}: majority votes need a mode-preserving teacher (gamma > 0)")
    return math.ceil(2.0 / gamma**2 * math.log(2 * vocab * horizon / delta))


def majority_vote(draws: np.ndarray, vocab: int, rng: np.random.Generator | None = None) -> int:
    """The most frequent action among ``draws``; ties broken uniformly at random (or lowest index without an rng)."""
    return vote_of_counts(np.bincount(np.asarray(draws, dtype=int), minlength=vocab), rng)


def vote_of_counts(counts: np.ndarray, rng: np.random.Generator | None = None) -> int:
    """The action with the most votes in ``counts`` [V]; ties as in `majority_vote`."""
    best = np.flatnonzero(counts == counts.max())
    return int(best[0] if rng is None or len(best) == 1 else rng.choice(best))
