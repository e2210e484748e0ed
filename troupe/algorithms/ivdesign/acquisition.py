"""Acquisitions over a pool of (unit, instrument level) queries: IVIG and its baselines.

IVIG is the expected information about the target CATE vector tau* from the joint answer
(t, y) to a query (x, z). Under the empirical-Bayes point first stage, t carries no
information about tau* itself, so (ALGORITHMS.md §F.3)::

    IVIG(x, z) = sum_t p_hat(t | x, z) I_t,
    I_t = 1/2 log det Sigma* - 1/2 log det(Sigma* - c_t c_t' / s_t^2)
        = -1/2 log(1 - c_t' Sigma*^-1 c_t / s_t^2)              (matrix determinant lemma)

with h_t the treatment-realisation-specific design row, s_t^2 = h_t' Sigma h_t + noise_t and
c_t = Sigma_{tau*, .} h_t. Under fixed hyperparameters I_t does not depend on y, so greedy
IVIG is a log-det (D-optimal type) reduction of the target posterior covariance.

Every score is a closed form over a finite candidate set, so the scores are plain numpy;
`PoolAcquisition` wraps a score vector as a botorch acquisition function for botorch's
discrete optimiser.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.linalg import cholesky, solve_triangular

from troupe.algorithms.ivdesign.model import GPIVPosterior


@dataclasses.dataclass
class Candidates:
    """Every (unit, instrument level) query with its first-stage quantities under p_hat.

    ``lam[:, t]`` is lambda_t(eta_hat) and ``noise[:, t]`` the observation noise if t is realised.
    """

    unit: np.ndarray  # pool index
    g: np.ndarray  # grid index of the unit
    z_index: np.ndarray
    p1: np.ndarray  # p_hat(t=1 | x, z)
    lam: np.ndarray  # (K, 2)
    noise: np.ndarray  # (K, 2)

    def __len__(self) -> int:
        return len(self.unit)

    def probs(self) -> np.ndarray:
        return np.column_stack([1 - self.p1, self.p1])


# -- closed forms -----------------------------------------------------------------------------
def gaussian_eig(c: np.ndarray, S: np.ndarray, s2: float) -> float:
    """I(f*; y) = -1/2 log(1 - c' S^-1 c / s2) for jointly Gaussian f* ~ N(., S), Var y = s2."""
    q = float(c @ np.linalg.solve(S, c))
    return -0.5 * float(np.log1p(-q / s2))


def gaussian_eig_logdet(c: np.ndarray, S: np.ndarray, s2: float) -> float:
    """The same information as a log-det reduction: 1/2 log det S - 1/2 log det(S - c c' / s2)."""
    _, ld0 = np.linalg.slogdet(S)
    sign, ld1 = np.linalg.slogdet(S - np.outer(c, c) / s2)
    if sign <= 0:
        return float("inf")
    return 0.5 * (ld0 - ld1)


def _row_moments(post: GPIVPosterior, cands: Candidates, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Predictive mean h_t' mu and variance h_t' Sigma h_t + noise_t of y for each candidate if t occurs."""
    m, S, mu = post.m, post.cov, post.mean
    g, lam = cands.g, cands.lam[:, t]
    mean = mu[g] + t * mu[m + g] + lam * mu[-1]
    var = (S[g, g] + 2 * t * S[g, m + g] + t * t * S[m + g, m + g]
           + 2 * lam * (S[g, -1] + t * S[m + g, -1]) + lam**2 * S[-1, -1])
    return mean, np.maximum(var, 0.0) + cands.noise[:, t]


def ivig_scores(post: GPIVPosterior, cands: Candidates, target: np.ndarray, jitter: float = 1e-8) -> np.ndarray:
    """IVIG for every candidate, by the per-treatment formula with one Cholesky factor of Sigma*.

    c_t = Sigma_{T,g} + t Sigma_{T,m+g} + lambda_t Sigma_{T,rho}, so with L L' = Sigma* the
    quadratic form |L^-1 c_t|^2 expands into six per-unit inner products computed once.
    """
    m, S = post.m, post.cov
    T = m + np.asarray(target)
    ST = S[np.ix_(T, T)]
    scale = float(np.mean(np.diag(ST)))
    if scale <= 0:
        return np.zeros(len(cands))  # tau* is known exactly: nothing to learn
    # Sigma* is near-singular for nearby target units; jitter only lowers c' Sigma*^-1 c, so I_t stays finite.
    L = cholesky(ST + jitter * scale * np.eye(len(T)), lower=True)
    units, inv = np.unique(cands.g, return_inverse=True)
    Bf = solve_triangular(L, S[np.ix_(T, units)], lower=True)
    Bt = solve_triangular(L, S[np.ix_(T, m + units)], lower=True)
    br = solve_triangular(L, S[T, -1], lower=True)
    ff, tt, ft = (Bf * Bf).sum(0)[inv], (Bt * Bt).sum(0)[inv], (Bf * Bt).sum(0)[inv]
    fr, tr, rr = (br @ Bf)[inv], (br @ Bt)[inv], float(br @ br)
    out = np.zeros(len(cands))
    probs = cands.probs()
    for t in (0, 1):
        lam = cands.lam[:, t]
        q = ff + 2 * t * ft + t * t * tt + 2 * lam * (fr + t * tr) + lam**2 * rr  # c_t' Sigma*^-1 c_t
        _, s2 = _row_moments(post, cands, t)
        info = -0.5 * np.log1p(-np.clip(q / s2, 0.0, 1.0 - 1e-15))
        out += np.where(probs[:, t] > 0, probs[:, t] * info, 0.0)
    return out


def ivig_scores_logdet(post: GPIVPosterior, cands: Candidates, target: np.ndarray) -> np.ndarray:
    """IVIG by the two log-determinants per treatment, candidate by candidate (a slow reference)."""
    m, S = post.m, post.cov
    T = m + np.asarray(target)
    ST = S[np.ix_(T, T)]
    out = np.zeros(len(cands))
    for k in range(len(cands)):
        for t in (0, 1):
            p = cands.p1[k] if t == 1 else 1 - cands.p1[k]
            if p <= 0:
                continue
            g, lam = int(cands.g[k]), float(cands.lam[k, t])
            Sh = post.cov_times_row(g, t, lam)
            s2 = Sh[g] + t * Sh[m + g] + lam * Sh[-1] + cands.noise[k, t]
            out[k] += p * gaussian_eig_logdet(Sh[T], ST, s2)
    return out


def outcome_variance_scores(post: GPIVPosterior, cands: Candidates, target: np.ndarray) -> np.ndarray:
    """Var[y | x, z, D] = sum_t p_t s_t^2 + Var_t(E[y | t]) (uncertainty sampling on y)."""
    (m0, v0), (m1, v1) = _row_moments(post, cands, 0), _row_moments(post, cands, 1)
    p1 = cands.p1
    return (1 - p1) * v0 + p1 * v1 + p1 * (1 - p1) * (m1 - m0) ** 2


def marginal_variance_scores(post: GPIVPosterior, cands: Candidates, target: np.ndarray) -> np.ndarray:
    """Var[tau(x) | D] at the queried unit; the same for every z, so ties pick z at random."""
    j = post.m + cands.g
    return post.cov[j, j].copy()


def target_agnostic_eig_scores(post: GPIVPosterior, cands: Candidates, target: np.ndarray) -> np.ndarray:
    """Information about all of (f0, tau, rho): sum_t p_t 1/2 log(s_t^2 / noise_t)."""
    out = np.zeros(len(cands))
    probs = cands.probs()
    for t in (0, 1):
        _, s2 = _row_moments(post, cands, t)
        out += np.where(probs[:, t] > 0, probs[:, t] * 0.5 * np.log(s2 / cands.noise[:, t]), 0.0)
    return out


def random_scores(post: GPIVPosterior, cands: Candidates, target: np.ndarray) -> np.ndarray:
    """Uniform over (x, z): every candidate ties, and ties are broken at random."""
    return np.zeros(len(cands))


ACQUISITIONS: dict[str, Callable[[GPIVPosterior, Candidates, np.ndarray], np.ndarray]] = {
    "ivig": ivig_scores,
    "random": random_scores,
    "outcome_variance": outcome_variance_scores,
    "marginal_variance": marginal_variance_scores,
    "target_agnostic_eig": target_agnostic_eig_scores,
}


def choose(scores: np.ndarray, rng: np.random.Generator, rtol: float = 1e-10) -> int:
    """Index of the largest score; exact and near ties are broken uniformly at random."""
    scores = np.asarray(scores, float)
    top = float(np.max(scores))
    ties = np.flatnonzero(scores >= top - rtol * max(1.0, abs(top)))
    return int(rng.choice(ties))


# -- botorch -----------------------------------------------------------------------------------
def pool_acquisition(scores: np.ndarray) -> Any:
    """A botorch `AcquisitionFunction` whose value at candidate index k (as a 1-d point) is scores[k]."""
    import torch
    from botorch.acquisition import AcquisitionFunction

    class PoolAcquisition(AcquisitionFunction):
        """Closed-form scores of a finite pool; X holds candidate indices (shape b x 1 x 1)."""

        def __init__(self, values: torch.Tensor) -> None:
            super().__init__(model=None)
            self.register_buffer("values", values)

        def forward(self, X: torch.Tensor) -> torch.Tensor:
            return self.values[X[..., 0, 0].round().long()]

    return PoolAcquisition(torch.as_tensor(np.asarray(scores, float)))


def choose_with_botorch(scores: np.ndarray) -> int:
    """Pick the best candidate with botorch's `optimize_acqf_discrete` over the index set."""
    import torch
    from botorch.optim import optimize_acqf_discrete

    acq = pool_acquisition(scores)
    choices = torch.arange(len(scores), dtype=torch.float64).unsqueeze(-1)
    best, _ = optimize_acqf_discrete(acq, q=1, choices=choices)
    return int(best[0, 0].round())
