"""§C.4's metrics of a preference probability μ, as pure numpy functions.

``target`` is the drawn label (0/1) or a soft label (the persona's own P(a ≻ b)); each metric is
then the expected one over labels drawn from it.
"""

from __future__ import annotations

import numpy as np

EPS = 1e-6


def _arrays(mu: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    mu, target = np.asarray(mu, dtype=float), np.asarray(target, dtype=float)
    if mu.shape != target.shape:
        raise ValueError(f"mu has shape {mu.shape}, target {target.shape}: expected one target per prediction")
    return mu, target


def accuracy(mu: np.ndarray, target: np.ndarray) -> float:
    """Share of pairs where μ > 1/2 picks the side the target favours (a soft target: p > 1/2)."""
    mu, target = _arrays(mu, target)
    return float(np.mean((mu > 0.5) == (target > 0.5)))


def brier(mu: np.ndarray, target: np.ndarray) -> float:
    """E (μ − ℓ)² over ℓ ~ Bernoulli(target): (μ − t)² + t(1 − t)."""
    mu, t = _arrays(mu, target)
    return float(np.mean((mu - t) ** 2 + t * (1 - t)))


def nll(mu: np.ndarray, target: np.ndarray) -> float:
    """−E log P(ℓ) = −t log μ − (1 − t) log(1 − μ), μ clipped to [1e-6, 1 − 1e-6]."""
    mu, t = _arrays(mu, target)
    mu = np.clip(mu, EPS, 1 - EPS)
    return float(np.mean(-t * np.log(mu) - (1 - t) * np.log(1 - mu)))


def equal_mass_bins(mu: np.ndarray, bins: int = 15) -> list[np.ndarray]:
    """Indices of ``bins`` groups of (near-)equal size, by increasing μ (ties broken by order)."""
    order = np.argsort(np.asarray(mu, dtype=float), kind="stable")
    return [b for b in np.array_split(order, bins) if len(b)]


def ece(mu: np.ndarray, target: np.ndarray, bins: int = 15) -> float:
    """Expected calibration error over ``bins`` equal-mass bins (§C.4: 15):
    Σ_b (n_b / n) |mean μ − mean target| within bin b."""
    mu, t = _arrays(mu, target)
    if not len(mu):
        return float("nan")
    return float(sum(len(b) * abs(mu[b].mean() - t[b].mean()) for b in equal_mass_bins(mu, bins)) / len(mu))


def reliability(mu: np.ndarray, target: np.ndarray, bins: int = 15) -> tuple[np.ndarray, np.ndarray]:
    """(mean μ, mean target) per equal-mass bin: the points of a reliability diagram."""
    mu, t = _arrays(mu, target)
    groups = equal_mass_bins(mu, bins)
    return np.array([mu[b].mean() for b in groups]), np.array([t[b].mean() for b in groups])


def summary(mu: np.ndarray, target: np.ndarray, bins: int = 15) -> dict[str, float]:
    return {"accuracy": accuracy(mu, target), "ece": ece(mu, target, bins), "brier": brier(mu, target),
            "nll": nll(mu, target), "mean_confidence": float(np.mean(np.abs(np.asarray(mu) - 0.5)) + 0.5)}


def hypervolume_2d(points: np.ndarray, reference: np.ndarray) -> float:
    """Area dominated by ``points`` (m, 2), both objectives maximised, above ``reference`` (§C.4:
    the reference point is (min, min) of the compared sets)."""
    pts = np.asarray(points, dtype=float)
    ref = np.asarray(reference, dtype=float)
    pts = pts[(pts[:, 0] > ref[0]) & (pts[:, 1] > ref[1])]
    if not len(pts):
        return 0.0
    pts = pts[np.argsort(-pts[:, 0])]
    area, best_y = 0.0, ref[1]
    for x, y in pts:  # sweep from the largest first objective down
        if y > best_y:
            area += (x - ref[0]) * (y - best_y)
            best_y = y
    return float(area)
