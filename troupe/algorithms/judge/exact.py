"""ALGORITHMS.md §G.3(a): the exact posterior of the conjugate model, for small n (validation only).

Marginalising the Dirichlet parameters, p(v_{1:n} | D) ∝ Π_rows B(α_row + counts_row)/B(α_row). The
online form is a mixture of product-Dirichlets indexed by count tables: each comparison splits
every component into 3 verdict branches (times the cells of any set-valued label) with weight
w(v) = E[π_v] Π_r E[Θ_r[v,y_r]] E[Φ[v,cell]], the exact one-step predictive, and components with
identical count tables merge. Each component also carries its conditional verdict marginals
P(V_i = v | component), so the merged mixture still reports every item's smoothing marginal.

`enumerate_posterior` is the brute-force reference: a sum over all 3^n assignments (§G.7 test 3).
Both condition on fixed group means (the conjugate model).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
from scipy.special import gammaln, logsumexp

from troupe.algorithms.judge.model import THETA, EncodedStream, Obs, PriorArrays
from troupe.platform.errors import ConfigError


def log_beta(alpha: np.ndarray) -> np.ndarray:
    """log B(α) = Σ_k log Γ(α_k) − log Γ(Σ_k α_k), over the last axis."""
    return gammaln(alpha).sum(-1) - gammaln(alpha.sum(-1))


@dataclasses.dataclass
class Counts:
    """Count tables of K components: π (K,3), Θ (K,R,3,3), Φ (K,O,3,Kc)."""

    pi: np.ndarray
    theta: np.ndarray
    phi: np.ndarray

    def flat(self) -> np.ndarray:
        k = len(self.pi)
        return np.concatenate([self.pi.reshape(k, -1), self.theta.reshape(k, -1), self.phi.reshape(k, -1)], 1)

    def take(self, idx: np.ndarray) -> Counts:
        return Counts(self.pi[idx], self.theta[idx], self.phi[idx])


def _branches(obs: Sequence[Obs]) -> list[tuple[int, tuple[int, ...]]]:
    """Every (verdict, chosen cell per observation) the item's likelihood sums over."""
    return [(v, cells) for v in range(3) for cells in itertools.product(*(o.cells for o in obs))]


def _check(prior: PriorArrays) -> None:
    if prior.pooled:
        raise ConfigError("the exact recursion needs group_means='fixed' (pooled group means are not conjugate)")


class ExactRecursion:
    """The online exact posterior over items that arrive one by one (§G.3a)."""

    def __init__(self, prior: PriorArrays):
        _check(prior)
        self.prior = prior
        r, (o, _, kc) = prior.n_raters, prior.alpha_phi.shape
        self.counts = Counts(
            np.zeros((1, 3), np.int64), np.zeros((1, r, 3, 3), np.int64), np.zeros((1, o, 3, kc), np.int64)
        )
        self.logw = np.zeros(1)  # normalised: logsumexp(logw) = 0
        self.marg = np.zeros((1, 0, 3))  # (K, n, 3) P(V_i = v | component)
        self.log_evidence = 0.0

    @property
    def n_components(self) -> int:
        return len(self.logw)

    def update(self, obs: Sequence[Obs]) -> np.ndarray:
        """Add one new item; return its verdict posterior given the data so far, (3,)."""
        c, p = self.counts, self.prior
        a_pi = p.alpha_pi + c.pi
        a_th = p.alpha_theta + c.theta
        a_ph = p.alpha_phi + c.phi
        logw, counts, margs = [], [], []
        for v, cells in _branches(obs):
            lw = self.logw + np.log(a_pi[:, v] / a_pi.sum(-1))
            pi, th, ph = c.pi.copy(), c.theta.copy(), c.phi.copy()
            pi[:, v] += 1
            for o, y in zip(obs, cells, strict=True):
                a, n = (a_th, th) if o.family == THETA else (a_ph, ph)
                lw = lw + np.log(a[:, o.owner, v, y] / a[:, o.owner, v].sum(-1))
                n[:, o.owner, v, y] += 1
            logw.append(lw)
            counts.append(Counts(pi, th, ph))
            margs.append(np.concatenate([self.marg, np.broadcast_to(np.eye(3)[v], (len(lw), 1, 3))], 1))
        logw = np.concatenate(logw)
        cat = Counts(*(np.concatenate([getattr(x, f) for x in counts]) for f in ("pi", "theta", "phi")))
        marg = np.concatenate(margs)
        norm = logsumexp(logw)
        self.log_evidence += float(norm)
        self._merge(logw - norm, cat, marg)
        return self.marginals()[-1]

    def _merge(self, logw: np.ndarray, counts: Counts, marg: np.ndarray) -> None:
        keys, first, inv = np.unique(counts.flat(), axis=0, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        w = np.exp(logw)
        wsum = np.bincount(inv, weights=w, minlength=len(keys))
        flat = marg.reshape(len(w), -1)
        merged = np.stack([np.bincount(inv, weights=w * flat[:, j], minlength=len(keys)) for j in range(flat.shape[1])], 1)
        self.marg = (merged / wsum[:, None]).reshape(len(keys), *marg.shape[1:])
        self.logw = np.log(wsum)
        self.counts = counts.take(first)

    def marginals(self) -> np.ndarray:
        """(n, 3) P(V_i = v | D) for every item so far."""
        return np.einsum("k,kiv->iv", np.exp(self.logw), self.marg)

    def posterior_mean(self) -> dict[str, np.ndarray]:
        """Mixture means of π, Θ and Φ."""
        w, c, p = np.exp(self.logw), self.counts, self.prior
        out = {}
        for name, a in (("pi", p.alpha_pi + c.pi), ("theta", p.alpha_theta + c.theta), ("phi", p.alpha_phi + c.phi)):
            mean = a / a.sum(-1, keepdims=True)
            out[name] = np.tensordot(w, mean, axes=1)
        return out

    def sample(self, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """n draws of (π, Θ, Φ) from the exact mixture posterior."""
        k = rng.choice(self.n_components, size=n, p=np.exp(self.logw))
        c, p = self.counts.take(k), self.prior
        return {
            "pi": _dirichlet(p.alpha_pi + c.pi, rng),
            "theta": _dirichlet(p.alpha_theta + c.theta, rng),
            "phi": _dirichlet(p.alpha_phi + c.phi, rng),
        }


def _dirichlet(alpha: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    g = rng.standard_gamma(alpha)
    return g / g.sum(-1, keepdims=True)


def exact_posterior(stream: EncodedStream, prior: PriorArrays) -> ExactRecursion:
    """The exact posterior of a whole stream, late labels folded into their items (the posterior is order-free)."""
    rec = ExactRecursion(prior)
    for obs in stream.by_item():
        rec.update(obs)
    return rec


@dataclasses.dataclass
class Enumeration:
    marginals: np.ndarray  # (n, 3)
    log_evidence: float
    pi_mean: np.ndarray  # (3,)


def enumerate_posterior(items: Sequence[Sequence[Obs]], prior: PriorArrays) -> Enumeration:
    """Brute force over all 3^n verdict assignments (and the cells of set-valued labels), §G.7 test 3."""
    _check(prior)
    a_pi, a_th, a_ph = prior.alpha_pi, prior.alpha_theta, prior.alpha_phi
    base = log_beta(a_pi) + log_beta(a_th).sum() + log_beta(a_ph).sum()
    per_item = [_branches(obs) for obs in items]
    logp, assign, pi_means = [], [], []
    for combo in itertools.product(*per_item):
        n_pi, n_th, n_ph = np.zeros(3), np.zeros_like(a_th), np.zeros_like(a_ph)
        for obs, (v, cells) in zip(items, combo, strict=True):
            n_pi[v] += 1
            for o, y in zip(obs, cells, strict=True):
                (n_th if o.family == THETA else n_ph)[o.owner, v, y] += 1
        logp.append(log_beta(a_pi + n_pi) + log_beta(a_th + n_th).sum() + log_beta(a_ph + n_ph).sum() - base)
        assign.append([v for v, _ in combo])
        pi_means.append((a_pi + n_pi) / (a_pi + n_pi).sum())
    logp = np.asarray(logp)
    ev = logsumexp(logp)
    w = np.exp(logp - ev)
    onehot = np.eye(3)[np.asarray(assign).reshape(len(w), len(items))]  # (M, n, 3)
    return Enumeration(np.einsum("m,miv->iv", w, onehot), float(ev), w @ np.asarray(pi_means))
