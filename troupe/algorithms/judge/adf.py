"""ALGORITHMS.md §G.3(b)'s ADF step: project a mixture of Dirichlets onto one Dirichlet (Minka 2001).

The projection keeps the mixture's mean m = E[θ] and the sum of its second moments
s = Σ_k E[θ_k²]. A Dir(α) with α_0 = Σα has Σ_k E[θ_k²] = (α_0 Σ m_k² + 1)/(α_0 + 1), hence
α_0 = (1 − s)/(s − Σ m_k²) and α = α_0 m.
"""

from __future__ import annotations

import numpy as np


def dirichlet_moments(alpha: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """E[θ] and E[θ²] (elementwise) of Dir(alpha) over the last axis."""
    a0 = alpha.sum(-1, keepdims=True)
    return alpha / a0, alpha * (alpha + 1) / (a0 * (a0 + 1))


def moment_match(alphas: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The Dirichlet matching Σ_c w_c Dir(alphas[..., c, :]) in mean and Σ_k E[θ_k²].

    alphas (..., C, K), weights (..., C) summing to 1 → (..., K). One component returns its own α.
    """
    w = weights[..., None]
    mean1, mean2 = dirichlet_moments(alphas)
    m = (w * mean1).sum(-2)
    s = (w * mean2).sum(-2).sum(-1)
    sq = (m * m).sum(-1)
    a0 = (1.0 - s) / np.maximum(s - sq, 1e-300)
    return a0[..., None] * m
