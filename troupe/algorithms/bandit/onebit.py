"""Estimating a mean from one bit per batch (§E.2).

Each batch the agent averages ``n`` pulls of one arm, ``Z ~ N(mu, sd^2)`` with ``sd = sigma/sqrt(n)``,
and returns ``1[Z >= tau]`` for a threshold the learner chose. `OneBitMeanEstimator` is an
ask/tell state machine, so a learner can run one per arm and send all their thresholds to the
agent in one round:

1. localisation by noisy bisection on ``[lo, hi]`` until ``hi - lo <= 4w``,
   ``w = sd * sqrt(2 log(2/delta'))``;
2. refinement, one of
   * ``probit``: Robbins–Monro thresholds, then the probit maximum-likelihood estimate;
   * ``dither``: thresholds uniform on the widened interval, ``mu_hat = lo' + (hi'-lo') * mean(bits)``;
   * ``fixed``: a fixed threshold (the sign bit when it is 0), inverted through the Gaussian cdf.

Without localisation (``localize=False``) refinement starts from the whole ``[-R, R]``.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from scipy.optimize import brentq
from scipy.special import log_ndtr, ndtri

Refine = Literal["probit", "dither", "fixed"]
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


# Bisection margin: w = sd * sqrt(2 log(2/delta')), so P(|Z - mu| > w) <= delta'
def bisection_margin(sd: float, delta_prime: float) -> float:
    return sd * math.sqrt(2 * math.log(2 / delta_prime))


# Refinement length: m = ceil(pi/2 * n_need/n + 2 log(2/delta'))
def probit_bits(n_need: float, n: float, delta_prime: float) -> int:
    return int(math.ceil(math.pi / 2 * n_need / n + 2 * math.log(2 / delta_prime)))


# Dithering to variance sigma^2/n_need: (hi-lo)^2/(4m) <= sd^2 * n/n_need  =>  m = ceil((hi-lo)^2 n_need / (4 n sd^2))
def dither_bits(width: float, sd: float, n_need: float, n: float) -> int:
    return max(1, int(math.ceil(width**2 * n_need / (4 * n * sd**2))))


# Robbins–Monro: tau_{k+1} = clip(tau_k + sd sqrt(2 pi) (b_k - 1/2) / k, lo, hi)
def robbins_monro_step(tau: float, bit: int, k: int, sd: float, lo: float, hi: float) -> float:
    return float(min(max(tau + sd * math.sqrt(2 * math.pi) * (bit - 0.5) / k, lo), hi))


def _inverse_mills(x: np.ndarray) -> np.ndarray:
    """phi(x) / Phi(x), stable for very negative x."""
    return np.exp(-0.5 * x * x - _LOG_SQRT_2PI - log_ndtr(x))


# Probit log-likelihood: sum_k b_k log Phi((mu - tau_k)/sd) + (1 - b_k) log Phi((tau_k - mu)/sd)
def probit_loglik(mu: float, thresholds: np.ndarray, bits: np.ndarray, sd: float) -> float:
    u = (mu - np.asarray(thresholds, dtype=float)) / sd
    b = np.asarray(bits, dtype=float)
    return float(np.sum(b * log_ndtr(u) + (1 - b) * log_ndtr(-u)))


def probit_mle(thresholds: np.ndarray, bits: np.ndarray, sd: float, lo: float, hi: float) -> float:
    """The maximiser of the probit log-likelihood on ``[lo, hi]`` (it is concave in ``mu``)."""
    tau = np.asarray(thresholds, dtype=float)
    b = np.asarray(bits, dtype=float)
    if tau.size == 0:
        return 0.5 * (lo + hi)
    uniq, inv = np.unique(tau, return_inverse=True)
    ones = np.bincount(inv, weights=b, minlength=uniq.size)
    zeros = np.bincount(inv, weights=1 - b, minlength=uniq.size)

    def score(mu: float) -> float:  # d loglik / d mu, times sd; decreasing in mu
        u = (mu - uniq) / sd
        return float(np.sum(ones * _inverse_mills(u) - zeros * _inverse_mills(-u)))

    if score(lo) <= 0:
        return float(lo)
    if score(hi) >= 0:
        return float(hi)
    return float(brentq(score, lo, hi, xtol=1e-12 * max(1.0, hi - lo), maxiter=200))


# Subtractive dithering: tau ~ U[lo, hi] gives E[bit] = (Z - lo)/(hi - lo) for Z in [lo, hi]
def dither_estimate(bits: np.ndarray, lo: float, hi: float) -> float:
    return float(lo + (hi - lo) * np.mean(bits))


# Fixed threshold: P(bit) = Phi((mu - tau)/sd)  =>  mu_hat = tau + sd * Phi^{-1}(p_hat)
def fixed_threshold_estimate(bits: np.ndarray, tau: float, sd: float, bound: float) -> float:
    m = len(bits)
    p = float(np.clip(np.mean(bits), 1 / (2 * m), 1 - 1 / (2 * m)))
    return float(np.clip(tau + sd * ndtri(p), -bound, bound))


class OneBitMeanEstimator:
    """Ask/tell estimator of ``mu`` from threshold bits on ``Z ~ N(mu, sd^2)``.

    ``n_ratio = n_need / n``: the precision wanted is that of ``n_need`` raw samples, while
    each bit sees an average of ``n``. ``[lo, hi]`` is the starting interval (cold: ``[-R, R]``;
    warm: the previous estimate plus and minus a margin); ``bound = R`` caps every interval.
    """

    def __init__(
        self,
        sd: float,
        n_ratio: float,
        delta_prime: float,
        lo: float,
        hi: float,
        bound: float = 1.0,
        refine: Refine = "probit",
        localize: bool = True,
        fixed_threshold: float = 0.0,
        rm_sequential: int = 8,
        rm_growth: float = 2.0,
        edge_check: bool = True,
        rng: np.random.Generator | None = None,
    ) -> None:
        if not sd > 0:
            raise ValueError(f"sd={sd}: the per-batch noise scale must be > 0")
        if not 0 < delta_prime < 1:
            raise ValueError(f"delta'={delta_prime}: expected a number in (0, 1)")
        if refine not in ("probit", "dither", "fixed"):
            raise ValueError(f"refine={refine!r}: expected 'probit', 'dither' or 'fixed'")
        if rm_growth < 1:
            raise ValueError(f"rm_growth={rm_growth}: expected >= 1 (1 is one bit per round)")
        self.sd, self.n_ratio, self.delta_prime = float(sd), float(n_ratio), float(delta_prime)
        self.bound = float(bound)
        self.lo, self.hi = max(float(lo), -self.bound), min(float(hi), self.bound)
        if self.lo >= self.hi:
            self.lo, self.hi = -self.bound, self.bound
        self.init_lo, self.init_hi = self.lo, self.hi
        self.w = bisection_margin(self.sd, self.delta_prime)
        self.refine, self.fixed_threshold = refine, float(fixed_threshold)
        self.rm_sequential, self.rm_growth = int(rm_sequential), float(rm_growth)
        self.edge_check = edge_check
        self.rng = rng if rng is not None else np.random.default_rng(0)
        self._thresholds: list[np.ndarray] = []
        self._bits: list[np.ndarray] = []
        self.localize_steps = 0
        self._raised = self._lowered = False
        self._edge: str | None = None
        self._stage = "localize" if localize else "refine_start"
        self._advance()

    # -- the state machine -----------------------------------------------------------
    @property
    def done(self) -> bool:
        return self._stage == "done"

    @property
    def localizing(self) -> bool:
        """Still in (or back in) the bisection stage."""
        return self._stage in ("localize", "edge")

    @property
    def bits_used(self) -> int:
        return int(sum(b.size for b in self._bits))

    def ask(self) -> np.ndarray:
        """Thresholds for the next round (one bit each); empty once done."""
        if self._stage == "localize":
            return np.array([0.5 * (self.lo + self.hi)])
        if self._stage == "edge":
            return np.array([self.lo if self._edge == "lo" else self.hi])
        if self._stage == "refine":
            if self.refine == "probit":
                left = self.m - self._refined
                if self._refined < self.rm_sequential:
                    size = 1
                else:
                    size = max(1, int(self._refined * (self.rm_growth - 1)))
                return np.full(min(size, left), self._tau)
            return self._planned  # dither and fixed: every threshold at once
        return np.empty(0)

    def tell(self, bits: np.ndarray) -> None:
        """The bits the agent returned for the last `ask`, in order."""
        th = self.ask()
        bits = np.asarray(bits, dtype=np.int8).reshape(-1)
        if bits.size != th.size:
            raise ValueError(f"got {bits.size} bits for {th.size} thresholds")
        self._thresholds.append(th)
        self._bits.append(bits)
        if self._stage == "localize":
            self.localize_steps += 1
            mid = th[0]
            if bits[0]:  # Z >= mid, so mu >= mid - w unless |Z - mu| > w
                self.lo, self._raised = max(self.lo, mid - self.w), True
            else:
                self.hi, self._lowered = min(self.hi, mid + self.w), True
        elif self._stage == "edge":
            self._after_edge(int(bits[0]))
        elif self._stage == "refine":
            if self.refine == "probit":
                for b in bits:
                    self._refined += 1
                    self._tau = robbins_monro_step(self._tau, int(b), self._refined, self.sd, self.lo, self.hi)
            else:
                self._refined += bits.size
        self._advance()

    def _advance(self) -> None:
        if self._stage == "localize" and self.hi - self.lo <= 4 * self.w:
            self._stage = "refine_start"
            if self.edge_check and self.localize_steps > 0:
                # Every bit said "below" (or "above"): mu may lie outside the warm-start interval.
                if not self._raised and self.init_lo > -self.bound:
                    self._stage, self._edge = "edge", "lo"
                elif not self._lowered and self.init_hi < self.bound:
                    self._stage, self._edge = "edge", "hi"
        if self._stage == "refine_start":
            self._start_refine()
        if self._stage == "refine" and self._refined >= self.m:
            self._stage = "done"

    def _after_edge(self, bit: int) -> None:
        h = self.init_hi - self.init_lo
        if self._edge == "lo" and bit == 0:  # Z < lo: look further down
            self.init_lo, self.init_hi = max(-self.bound, self.init_lo - 2 * h), self.init_lo + self.w
        elif self._edge == "hi" and bit == 1:  # Z >= hi: look further up
            self.init_lo, self.init_hi = self.init_hi - self.w, min(self.bound, self.init_hi + 2 * h)
        else:
            self._stage = "refine_start"
            return
        self.lo, self.hi = self.init_lo, self.init_hi
        self._raised = self._lowered = False
        self._stage = "localize"

    def _start_refine(self) -> None:
        self._stage, self._refined = "refine", 0
        if self.refine == "probit":
            self.m = probit_bits(self.n_ratio, 1.0, self.delta_prime)
            self._tau = 0.5 * (self.lo + self.hi)
        elif self.refine == "dither":
            self.dlo, self.dhi = self.lo - self.w, self.hi + self.w
            self.m = dither_bits(self.dhi - self.dlo, self.sd, self.n_ratio, 1.0)
            self._planned = self.rng.uniform(self.dlo, self.dhi, size=self.m)
        else:
            self.m = probit_bits(self.n_ratio, 1.0, self.delta_prime)
            self._planned = np.full(self.m, self.fixed_threshold)

    # -- planning and the estimate ---------------------------------------------------
    def planned_bits(self) -> int:
        """Bits still to come if localisation needs no edge check (an upper bound for planning)."""
        if self._stage == "done":
            return 0
        if self._stage == "refine":
            return self.m - self._refined
        steps = 0
        width = self.hi - self.lo
        while width > 4 * self.w:  # each step: width -> width/2 + w
            width = width / 2 + self.w
            steps += 1
        if self.refine == "dither":
            rest = dither_bits(width + 2 * self.w, self.sd, self.n_ratio, 1.0)
        else:
            rest = probit_bits(self.n_ratio, 1.0, self.delta_prime)
        return steps + rest + (1 if self._stage == "edge" else 0)

    @property
    def estimate(self) -> float:
        """The mean estimate once `done`."""
        if not self.done:
            raise RuntimeError("the estimate is ready only once every planned bit has been told")
        if self.refine == "dither":
            return dither_estimate(np.concatenate(self._bits)[-self.m:], self.dlo, self.dhi)
        if self.refine == "fixed":
            bits = np.concatenate(self._bits)[-self.m:]
            return fixed_threshold_estimate(bits, self.fixed_threshold, self.sd, self.bound)
        # Every bit, localisation included, is a valid term of the same likelihood.
        return probit_mle(np.concatenate(self._thresholds), np.concatenate(self._bits), self.sd, self.lo, self.hi)
