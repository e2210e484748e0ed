"""G-optimal experimental design (Kiefer–Wolfowitz) by Frank–Wolfe, and the pieces of phased
elimination that use it: projection onto the arms' span, support reduction, the phase's pull
allocation, least squares and the confidence width (Lattimore & Szepesvári, ch. 21–22).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


def project_to_span(arms: np.ndarray, rtol: float = 1e-9) -> tuple[np.ndarray, np.ndarray]:
    """Coordinates of ``arms`` in an orthonormal basis of their span: ``(coords k x r, basis r x d)``."""
    _, s, vt = np.linalg.svd(arms, full_matrices=False)
    if s.size == 0 or s[0] == 0:
        raise ValueError("the arms span only the zero vector; a design needs at least one non-zero arm")
    rank = int((s > rtol * s[0]).sum())
    basis = vt[:rank]
    return arms @ basis.T, basis


# V(pi) = sum_a pi(a) a a^T
def design_matrix(x: np.ndarray, pi: np.ndarray) -> np.ndarray:
    return x.T @ (pi[:, None] * x)


# g(pi) per arm: ||a||^2_{V(pi)^{-1}}; infinite where V(pi) is singular
def leverages(x: np.ndarray, pi: np.ndarray) -> np.ndarray:
    v = design_matrix(x, pi)
    try:
        vinv = np.linalg.inv(v)
    except np.linalg.LinAlgError:
        return np.full(x.shape[0], math.inf)
    if not np.isfinite(vinv).all() or np.linalg.cond(v) > 1e12:
        return np.full(x.shape[0], math.inf)
    return np.einsum("ij,jk,ik->i", x, vinv, x)


def g_value(x: np.ndarray, pi: np.ndarray) -> float:
    """``g(pi) = max_a ||a||^2_{V(pi)^{-1}}`` (Kiefer–Wolfowitz: its minimum over pi is d)."""
    return float(leverages(x, pi).max())


@dataclasses.dataclass
class Design:
    """A design ``pi`` over the rows of ``x`` and its ``g(pi)``."""

    pi: np.ndarray
    g: float
    iterations: int

    @property
    def support(self) -> np.ndarray:
        return np.flatnonzero(self.pi > 0)


def frank_wolfe(x: np.ndarray, eta: float = 0.1, max_iter: int = 100_000) -> Design:
    """Near G-optimal design on the rows of a full-column-rank ``x`` (k x d): ``g(pi) <= (1+eta) d``.

    Fedorov–Wynn step: a_k = argmax_a ||a||^2_{V^{-1}}, gamma_k = (g_k/d - 1)/(g_k - 1),
    pi <- (1 - gamma_k) pi + gamma_k delta_{a_k}; the inverse is updated by Sherman–Morrison.
    """
    k, d = x.shape
    if eta <= 0:
        raise ValueError(f"eta={eta}: the Frank–Wolfe tolerance must be > 0")
    pi = np.full(k, 1.0 / k)
    vinv = np.linalg.inv(design_matrix(x, pi))
    g = np.einsum("ij,jk,ik->i", x, vinv, x)
    it = 0
    for it in range(1, max_iter + 1):
        j = int(np.argmax(g))
        gk = float(g[j])
        if gk <= (1 + eta) * d:
            break
        gamma = (gk / d - 1) / (gk - 1)
        pi *= 1 - gamma
        pi[j] += gamma
        # (V')^{-1} for V' = (1-γ)V + γ a a^T, kept exact enough by a periodic refresh
        u = vinv @ x[j]
        vinv = (vinv - gamma * np.outer(u, u) / ((1 - gamma) + gamma * gk)) / (1 - gamma)
        if it % 50 == 0:
            vinv = np.linalg.inv(design_matrix(x, pi))
        g = np.einsum("ij,jk,ik->i", x, vinv, x)
    g_final = g_value(x, pi)
    return Design(pi=pi, g=g_final, iterations=it)


def reduce_support(x: np.ndarray, pi: np.ndarray, bound: float) -> np.ndarray:
    """Greedy support reduction: drop the smallest-mass arm while ``g <= bound`` still holds."""
    pi = pi.copy()
    for j in np.argsort(np.where(pi > 0, pi, np.inf)):
        if pi[j] <= 0 or (pi > 0).sum() <= 1:
            break
        trial = pi.copy()
        trial[j] = 0.0
        trial /= trial.sum()
        if g_value(x, trial) > bound:
            break
        pi = trial
    return pi


def g_optimal_design(x: np.ndarray, eta: float = 0.1, reduce_to: float | None = 2.0) -> Design:
    """Frank–Wolfe design on ``x`` (projected to its span), then support reduction to ``g <= reduce_to * d``."""
    des = frank_wolfe(x, eta)
    if reduce_to is None:
        return des
    d = x.shape[1]
    pi = reduce_support(x, des.pi, max(reduce_to, 1 + eta) * d)
    return Design(pi=pi, g=g_value(x, pi), iterations=des.iterations)


# Phased elimination: N_a = ceil(2 d pi(a) sigma^2 / eps^2 * log(k l (l+1) / delta))
def phase_allocation(pi: np.ndarray, d: int, eps: float, k: int, phase: int, delta: float,
                     sigma: float = 1.0) -> np.ndarray:
    """Pulls per arm in phase ``phase`` (>= 1); zero off the support."""
    log_term = math.log(k * phase * (phase + 1) / delta)
    n = np.ceil(2 * d * pi * sigma**2 / eps**2 * log_term)
    return np.where(pi > 0, np.maximum(n, 1), 0).astype(np.int64)


# theta_hat = (sum_a N_a a a^T)^{-1} sum_a N_a a mu_hat_a  (weighted least squares on per-arm means)
def least_squares(x: np.ndarray, counts: np.ndarray, means: np.ndarray) -> np.ndarray:
    v = x.T @ (counts[:, None] * x)
    return np.linalg.pinv(v) @ (x.T @ (counts * means))


# width = sigma * sqrt(2 * max_a ||a||^2_{V_N^{-1}} * log(k l (l+1) / delta)), V_N = sum_a N_a a a^T
def confidence_width(x_support: np.ndarray, counts: np.ndarray, x_active: np.ndarray, k: int, phase: int,
                     delta: float, sigma: float = 1.0) -> float:
    """The half-width every ``<theta_hat - theta, a>`` on the active arms stays within w.p. 1 - delta."""
    v = x_support.T @ (counts[:, None] * x_support)
    lev = np.einsum("ij,jk,ik->i", x_active, np.linalg.pinv(v), x_active)
    return float(sigma * math.sqrt(2 * max(lev.max(), 0.0) * math.log(k * phase * (phase + 1) / delta)))


def round_design(pi: np.ndarray, n: int) -> np.ndarray:
    """Integer counts summing to ``n`` close to ``n * pi`` (largest remainders; top-n arms if n < support)."""
    support = np.flatnonzero(pi > 0)
    counts = np.zeros(pi.shape, dtype=np.int64)
    if n < support.size:
        counts[support[np.argsort(-pi[support], kind="stable")[:n]]] = 1
        return counts
    # one pull per support arm first, so the least squares of the batch is well posed
    counts[support] = 1
    rest = n - support.size
    target = rest * pi
    base = np.floor(target).astype(np.int64)
    counts += base
    left = rest - int(base.sum())
    if left:
        order = np.argsort(-(target - base), kind="stable")[:left]
        counts[order] += 1
    return counts
