"""Learners for the batched linear bandit. A learner talks to the agent through a channel
(`troupe.actors.bandit_agent.LocalChannel` or `RemoteChannel`) and never holds a reward:
1-bit learners get bits only; the unquantised baselines are built with a full-feedback agent.

* ``bitpe`` (Algorithm 1): phased elimination over G-optimal designs, every design arm's mean
  estimated from one bit per batch (bisection, then probit MLE), warm-started from the last phase.
* ``bitpe_safe`` (Algorithm 2): halving to a safe arm, then the same phases with each batch
  holding only the pulls the estimate needs and the safe arm in the other slots.
* baselines: ``unquantised`` (the same phases with rewards visible), ``sign_bit`` (fixed
  threshold 0), ``dither`` (non-adaptive dithering over ``[-R, R]``), ``linucb`` (rarely
  switching OFUL with full information, unbatched) and ``etc`` (explore-then-commit on 1-bit means).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Literal

import numpy as np

from troupe.actors.bandit_agent import Batch, BitQuery, BitRule, LocalChannel
from troupe.algorithms.bandit.design import (
    confidence_width,
    g_optimal_design,
    least_squares,
    phase_allocation,
    project_to_span,
    round_design,
)
from troupe.algorithms.bandit.onebit import OneBitMeanEstimator, Refine, bisection_margin
from troupe.platform.config import check


@dataclasses.dataclass
class PolicyParams:
    """What every learner shares: confidence, design tolerance, the 1-bit estimator's knobs."""

    delta: float = 0.05
    eta: float = 0.1  # Frank–Wolfe stops at g <= (1 + eta) d
    support_bound: float = 2.0  # support reduction keeps g <= support_bound * d
    sigma: float | None = None  # the learner's noise scale; None: the environment's
    sigma_floor: float = 1e-3  # noise-free instances: the learner still assumes this much
    reward_bound: float = 1.0  # R, with |<a, theta>| <= R
    refine: Literal["probit", "dither"] = "probit"  # bitpe/bitpe_safe refinement
    rm_sequential: int = 8  # Robbins–Monro bits sent one per round before blocks start
    rm_growth: float = 2.0  # then blocks grow by this factor; 1.0 is one bit per round throughout
    warm_margin: float = 4.0  # warm start: [c - h, c + h], h = warm_margin * width_{l-1} + w
    edge_check: bool = True  # re-localise when every bisection bit points outside the warm interval
    width: Literal["computed", "nominal"] = "computed"  # elimination at 2 * width or at 2 * eps_l
    etc_scale: float = 1.0  # explore-then-commit explores etc_scale * (sigma^2 d)^(1/3) T^(2/3) samples
    oful_lambda: float = 1.0
    max_phases: int = 64

    def __post_init__(self) -> None:
        check(0 < self.delta < 1, "policy.delta", self.delta, "a number in (0, 1)")
        check(self.eta > 0, "policy.eta", self.eta, "> 0")
        check(self.support_bound >= 1, "policy.support_bound", self.support_bound, ">= 1")
        check(self.sigma is None or self.sigma > 0, "policy.sigma", self.sigma, "> 0 or null")
        check(self.sigma_floor > 0, "policy.sigma_floor", self.sigma_floor, "> 0")
        check(self.reward_bound > 0, "policy.reward_bound", self.reward_bound, "> 0")
        check(self.rm_sequential >= 0, "policy.rm_sequential", self.rm_sequential, ">= 0")
        check(self.rm_growth >= 1, "policy.rm_growth", self.rm_growth, ">= 1")
        check(self.warm_margin > 0, "policy.warm_margin", self.warm_margin, "> 0")
        check(self.etc_scale > 0, "policy.etc_scale", self.etc_scale, "> 0")
        check(self.oful_lambda > 0, "policy.oful_lambda", self.oful_lambda, "> 0")
        check(self.max_phases >= 1, "policy.max_phases", self.max_phases, ">= 1")


class BudgetShort(Exception):
    """The next step needs more batches than the horizon has left: commit instead."""


class Policy:
    """A learner: `run` plays the whole horizon through ``channel`` and returns its own record."""

    name: ClassVar[str] = ""
    feedback: ClassVar[str] = "bit"  # "full": needs an agent that returns sample means
    batched: ClassVar[bool] = True  # False: runs with B = 1 whatever the sweep's B
    eliminates: ClassVar[bool] = True  # keeps an active set (so "best arm eliminated" is defined)

    def __init__(self, params: PolicyParams, sigma: float, rng: np.random.Generator) -> None:
        self.p = params
        self.sigma = float(params.sigma if params.sigma is not None else max(sigma, params.sigma_floor))
        self.rng = rng

    def run(self, ch: LocalChannel) -> dict[str, Any]:
        raise NotImplementedError

    @staticmethod
    def commit(ch: LocalChannel, arm: int) -> None:
        """Pull ``arm`` for every batch left."""
        if ch.batches_left > 0:
            ch.pull(Batch((int(arm),), (ch.batch_size,)), ch.batches_left)


@dataclasses.dataclass
class PhaseInput:
    """What a phase's mean estimator gets: the design arms, their pull targets, a warm start."""

    arms: np.ndarray  # arm indices of the design's support
    need: np.ndarray  # N_a, raw samples each estimate should be worth
    phase: int
    k: int
    centers: np.ndarray | None  # previous <theta_hat, a>; None: cold start
    width_prev: float | None


class PhasedElimination(Policy):
    """Phased elimination over G-optimal designs (L&S Alg. 12); subclasses estimate the means."""

    def start_phase(self, ch: LocalChannel) -> int:
        """Work before the first phase; returns the first phase index."""
        return 1

    def estimate(self, ch: LocalChannel, ph: PhaseInput) -> np.ndarray:
        """Mean estimates of the design arms ``ph.arms``, each worth ``ph.need`` raw samples;
        raises `BudgetShort` (before spending) when the horizon cannot fit them."""
        raise NotImplementedError

    def end_phase(self, active: np.ndarray, pred: np.ndarray) -> None:
        """Hook after elimination (``pred``: estimated means of the active arms)."""

    def run(self, ch: LocalChannel) -> dict[str, Any]:
        x_all = ch.arms
        k = x_all.shape[0]
        active = np.arange(k)
        theta: np.ndarray | None = None
        width: float | None = None
        phases = 0
        first = self.start_phase(ch)
        for ell in range(first, first + self.p.max_phases):
            if active.size == 1 or ch.batches_left == 0:
                break
            coords, basis = project_to_span(x_all[active])
            design = g_optimal_design(coords, self.p.eta, self.p.support_bound)
            sup = design.support
            need = phase_allocation(design.pi[sup], coords.shape[1], 2.0**-ell, k, ell, self.p.delta, self.sigma)
            centers = None if theta is None else x_all[active[sup]] @ theta
            try:
                means = self.estimate(ch, PhaseInput(active[sup], need, ell, k, centers, width))
            except BudgetShort:
                break
            phases += 1
            theta_c = least_squares(coords[sup], need.astype(float), means)
            theta = basis.T @ theta_c
            if self.p.width == "computed":
                width = confidence_width(coords[sup], need.astype(float), coords, k, ell, self.p.delta, self.sigma)
            else:
                width = 2.0**-ell
            pred = coords @ theta_c
            # eliminate a when max_b <theta_hat, b - a> > 2 * width
            active = active[pred.max() - pred <= 2 * width]
            self.end_phase(active, x_all[active] @ theta)
        best = int(active[0]) if theta is None else int(active[np.argmax(x_all[active] @ theta)])
        self.commit(ch, best)
        return {"phases": phases, "active": active.tolist(), "commit_arm": best}


class Unquantised(PhasedElimination):
    """Baseline (i): the same phases, with the rewards of each phase visible to the learner."""

    name = "unquantised"
    feedback = "full"

    def estimate(self, ch: LocalChannel, ph: PhaseInput) -> np.ndarray:
        b = ch.batch_size
        total = int(ph.need.sum())
        n_batches = -(-total // b)
        if n_batches > ch.batches_left:
            raise BudgetShort
        counts = ph.need.copy()
        counts[int(np.argmax(counts))] += n_batches * b - total  # fill the last batch; means stay unbiased
        obs = ch.observe(Batch(tuple(int(a) for a in ph.arms), tuple(int(c) for c in counts)))
        means = dict(zip(obs["arms"].tolist(), obs["means"].tolist(), strict=True))
        return np.array([means[int(a)] for a in ph.arms])


class OneBitPhases(PhasedElimination):
    """Phases whose means come from `OneBitMeanEstimator`s, one per design arm, run in rounds."""

    localize: ClassVar[bool] = True
    refine_kind: ClassVar[Refine | None] = None  # None: params.refine
    warm: ClassVar[bool] = True

    def layout(self, arm: int, need: int, b: int) -> tuple[Batch, BitRule, int]:
        """Algorithm 1: all B pulls of the batch on the arm, the rule reads them all."""
        return Batch((arm,), (b,)), BitRule(reads=(0, b)), b

    def make_estimator(self, n: int, need: int, lo: float, hi: float, delta_prime: float) -> OneBitMeanEstimator:
        refine = self.refine_kind or self.p.refine
        return OneBitMeanEstimator(
            sd=self.sigma / math.sqrt(n), n_ratio=need / n, delta_prime=delta_prime, lo=lo, hi=hi,
            bound=self.p.reward_bound, refine=refine, localize=self.localize,
            rm_sequential=self.p.rm_sequential, rm_growth=self.p.rm_growth, edge_check=self.p.edge_check,
            rng=self.rng,
        )

    def estimate(self, ch: LocalChannel, ph: PhaseInput) -> np.ndarray:
        b, big_r = ch.batch_size, self.p.reward_bound
        delta_prime = self.p.delta / (ph.k * ph.phase * (ph.phase + 1))
        plans, ests = [], []
        for i, (arm, need) in enumerate(zip(ph.arms.tolist(), ph.need.tolist(), strict=True)):
            batch, rule, n = self.layout(arm, need, b)
            lo, hi = -big_r, big_r
            if self.warm and ph.centers is not None and ph.width_prev is not None:
                c = float(np.clip(ph.centers[i], -big_r, big_r))
                h = self.p.warm_margin * ph.width_prev + bisection_margin(self.sigma / math.sqrt(n), delta_prime)
                lo, hi = c - h, c + h
            plans.append((batch, rule))
            ests.append(self.make_estimator(n, need, lo, hi, delta_prime))
        if sum(e.planned_bits() for e in ests) > ch.batches_left:
            raise BudgetShort
        run_rounds(ch, plans, ests)
        return np.array([e.estimate for e in ests])


def run_rounds(ch: LocalChannel, plans: list[tuple[Batch, BitRule]], ests: list[OneBitMeanEstimator]) -> None:
    """Drive every estimator to the end; each round sends one query per unfinished estimator."""
    while True:
        live = [i for i, e in enumerate(ests) if not e.done]
        if not live:
            return
        asks = {i: ests[i].ask() for i in live}
        queries = [BitQuery(plans[i][0], plans[i][1], asks[i]) for i in live]
        if sum(q.repeat for q in queries) > ch.batches_left:
            raise BudgetShort
        for i, bits in zip(live, ch.query(queries), strict=True):
            ests[i].tell(bits)


class BitPE(OneBitPhases):
    """Algorithm 1 (BitPE): 1-bit phased elimination with G-optimal designs and warm starts."""

    name = "bitpe"


class BitPESafe(OneBitPhases):
    """Algorithm 2 (BitPE-Safe): halving to a safe arm, warm start, padding with the safe arm."""

    name = "bitpe_safe"

    def start_phase(self, ch: LocalChannel) -> int:
        x = ch.arms
        k, b = x.shape[0], ch.batch_size
        cand = np.arange(k)
        self.halving_batches = 0
        while cand.size > 1 and ch.batches_left > 0:
            coords, _ = project_to_span(x[cand])
            pi = g_optimal_design(coords, self.p.eta, self.p.support_bound).pi
            counts = round_design(pi, b)
            used = np.flatnonzero(counts)
            order = self.rng.permutation(cand.size)
            half = cand.size // 2
            h0, h1 = np.sort(cand[order[:half]]), np.sort(cand[order[half:]])
            batch = Batch(tuple(int(a) for a in cand[used]), tuple(int(c) for c in counts[used]))
            rule = BitRule(reads=(0, b), kind="argmax_half",
                           halves=(tuple(int(a) for a in h0), tuple(int(a) for a in h1)))
            (bit,) = ch.query([BitQuery(batch, rule)])
            cand = h1 if int(bit[0]) else h0
            self.halving_batches += 1
        self.safe = int(cand[0])
        # Each halving step loses at most 2 eps_B: Delta_s <= 2 eps_B ceil(log2 k); start where 2^-l ~ Delta_s.
        log_k = max(1, math.ceil(math.log2(k)))
        d = x.shape[1]
        eps_b = self.sigma * math.sqrt(2 * d * math.log(k * log_k / self.p.delta) / b)
        gap_bound = 2 * eps_b * log_k
        return max(1, math.ceil(math.log2(1 / gap_bound))) if gap_bound < 1 else 1

    def layout(self, arm: int, need: int, b: int) -> tuple[Batch, BitRule, int]:
        n = int(min(b, need))
        if n == b or arm == self.safe:
            return Batch((arm,), (b,)), BitRule(reads=(0, n)), n
        return Batch((arm, self.safe), (n, b - n)), BitRule(reads=(0, n)), n

    def end_phase(self, active: np.ndarray, pred: np.ndarray) -> None:
        self.safe = int(active[np.argmax(pred)])


class SignBit(OneBitPhases):
    """Baseline (ii): the bit is ``1[Z >= 0]`` every batch; means by inverting the probit."""

    name = "sign_bit"
    localize = False
    refine_kind = "fixed"
    warm = False


class NonAdaptiveDither(OneBitPhases):
    """Baseline (iii): dithered thresholds over the whole ``[-R, R]``, no localisation."""

    name = "dither"
    localize = False
    refine_kind = "dither"
    warm = False


class ExploreThenCommit(OneBitPhases):
    """Baseline (v): one G-optimal exploration with 1-bit means, then commit to the best estimate."""

    name = "etc"
    eliminates = False
    warm = False

    def run(self, ch: LocalChannel) -> dict[str, Any]:
        x = ch.arms
        k = x.shape[0]
        coords, basis = project_to_span(x)
        d = coords.shape[1]
        design = g_optimal_design(coords, self.p.eta, self.p.support_bound)
        sup = design.support
        explore = self.p.etc_scale * (self.sigma**2 * d) ** (1 / 3) * ch.horizon ** (2 / 3)
        need = np.maximum(np.ceil(design.pi[sup] * explore), 1).astype(np.int64)
        try:
            means = self.estimate(ch, PhaseInput(sup, need, 1, k, None, None))
            theta = basis.T @ least_squares(coords[sup], need.astype(float), means)
            best = int(np.argmax(x @ theta))
        except BudgetShort:
            best = int(sup[np.argmax(design.pi[sup])])
        self.commit(ch, best)
        return {"phases": 1, "active": [best], "commit_arm": best}


class RarelySwitchingOFUL(Policy):
    """Baseline (iv): OFUL with full information, switching arm only when det(V) doubles.

    beta_t = sigma sqrt(2 log(1/delta) + log(det V_t / lambda^d)) + sqrt(lambda) R
    (Abbasi-Yadkori, Pál, Szepesvári 2011); between switches the same arm is pulled, so the
    whole stretch is one observation of that arm's sample mean.
    """

    name = "linucb"
    feedback = "full"
    batched = False
    eliminates = False

    def run(self, ch: LocalChannel) -> dict[str, Any]:
        x = ch.arms
        d = x.shape[1]
        lam = self.p.oful_lambda
        v = lam * np.eye(d)
        rhs = np.zeros(d)
        switches = 0
        arm = 0
        while ch.batches_left > 0:
            vinv = np.linalg.inv(v)
            theta = vinv @ rhs
            _, logdet = np.linalg.slogdet(v)
            beta = self.sigma * math.sqrt(2 * math.log(1 / self.p.delta) + logdet - d * math.log(lam)) \
                + math.sqrt(lam) * self.p.reward_bound
            lev = np.einsum("ij,jk,ik->i", x, vinv, x)
            arm = int(np.argmax(x @ theta + beta * np.sqrt(lev)))
            # det(V + n a a^T) = det(V) (1 + n ||a||^2_{V^{-1}}) >= 2 det(V)  <=>  n >= 1 / ||a||^2_{V^{-1}}
            n = int(min(max(1, math.ceil(1 / max(lev[arm], 1e-300))), ch.batches_left))
            obs = ch.observe(Batch((arm,), (ch.batch_size,)), n)
            cnt, mean = float(obs["counts"][0]), float(obs["means"][0])
            v += cnt * np.outer(x[arm], x[arm])
            rhs += cnt * mean * x[arm]
            switches += 1
        return {"phases": switches, "active": [arm], "commit_arm": arm}


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (BitPE, BitPESafe, Unquantised, SignBit, NonAdaptiveDither, RarelySwitchingOFUL, ExploreThenCommit)
}
