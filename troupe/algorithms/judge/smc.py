"""ALGORITHMS.md §G.3(b): Rao–Blackwellised SMC with assumed-density (product-Dirichlet) states.

Each of N particles holds Dirichlet pseudo-counts for π, every Θ_r row and every Φ row, and the
verdict it sampled for every item (particle learning, Carvalho et al. 2010). On each comparison:

1. w_j(v) = E_j[π_v] Π_obs E_j[row_obs(v)[cells]], L_j = Σ_v w_j(v) (closed form);
2. report P̂(V_n = v) = Σ_j W_j w_j(v)/L_j, before any sampling (the RB estimate);
3. resample ∝ W_j L_j (resample-move), systematic;
4. propagate: v ~ w_j/L_j (and a cell of each set-valued label ∝ its row), +1 on the rows hit;
5. when the ESS of the resampling weights is below N/2, a collapsed-Gibbs rejuvenation sweep over
   the last L items' verdicts (each item's counts removed, v redrawn from its full conditional).

Resampling at every step collapses the ancestry of old verdicts (at n = 1500 every particle shares
item 0's), which inflates the seed-to-seed spread of Θ's posterior; `sweep_every=k` (beyond §G.3,
off by default) also redraws `window` random older verdicts every k items.

A late label on an old item is a new observation on that item's stored per-particle verdict:
resample ∝ its likelihood, add its counts, and rejuvenate that item with the window when the ESS
drops. `marginal(i)` is the RB smoothing estimate Σ_j W_j p_j(V_i | everything else).

With adf=True the filter is deterministic: instead of sampling v, every row the comparison touches
is replaced by the moment-matched Dirichlet of its 2- or 3-component mixture (adf.moment_match);
late labels reuse the item's stored responsibilities. A deterministic filter needs one state, so
n_particles is ignored there.

Pooled group means (JudgePrior.group_means="pooled") set each rater's prior row to
s_g·m̂_g[v,·], with m̂_g the shared-Dirichlet posterior mean over the group's counts in that particle.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from troupe.algorithms.judge.adf import moment_match
from troupe.algorithms.judge.model import THETA, EncodedStream, Obs, PriorArrays
from troupe.platform.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class SMCConfig:
    n_particles: int = 500
    adf: bool = False
    ess_threshold: float = 0.5  # rejuvenate when ESS < ess_threshold · N
    window: int = 50  # L: the items a rejuvenation sweep redraws
    rejuvenate: bool = True
    # beyond §G.3: every k items, also redraw `window` random older verdicts; resampling at every step
    # collapses the ancestry of old verdicts (all particles share item 0's), which no ESS test sees
    sweep_every: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_particles < 1:
            raise ConfigError(f"judge.n_particles={self.n_particles}: expected >= 1")
        if not 0 <= self.ess_threshold <= 1:
            raise ConfigError(f"judge.ess_threshold={self.ess_threshold}: expected a fraction in [0, 1]")
        if self.window < 1:
            raise ConfigError(f"judge.window={self.window}: expected >= 1")
        if self.sweep_every is not None and self.sweep_every < 1:
            raise ConfigError(f"judge.sweep_every={self.sweep_every}: expected >= 1 or None")


@dataclasses.dataclass
class StepResult:
    item: int
    rb: np.ndarray  # (3,) the Rao–Blackwellised verdict posterior of the item
    plain: np.ndarray  # (3,) the plain particle average of the sampled verdicts (ADF: = rb)
    ess: float  # of the resampling weights, before resampling
    rejuvenated: bool


def systematic_resample(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    n = len(weights)
    positions = (rng.random() + np.arange(n)) / n
    return np.minimum(np.searchsorted(np.cumsum(weights), positions), n - 1)


def _draw(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One categorical draw per row of probs (N, K), unnormalised."""
    c = np.cumsum(probs, -1)
    u = rng.random(len(probs)) * c[:, -1]
    return np.minimum((c < u[:, None]).sum(-1), probs.shape[-1] - 1)


class RBSMC:
    """The online BayesJudge posterior (§G.3b), vectorised over particles."""

    def __init__(self, prior: PriorArrays, config: SMCConfig = SMCConfig()):
        self.prior, self.config = prior, config
        self.rng = np.random.default_rng(config.seed)
        self.n = 1 if config.adf else config.n_particles
        r, (o, _, kc), g = prior.n_raters, prior.alpha_phi.shape, len(prior.group_s)
        self.n_pi = np.zeros((self.n, 3))
        self.n_theta = np.zeros((self.n, r, 3, 3))
        self.n_phi = np.zeros((self.n, o, 3, kc))
        self.group_sum = np.zeros((self.n, g, 3, 3))  # Σ_{r∈g} counts, for pooled group means
        self.logw = np.full(self.n, -np.log(self.n))
        self.V = np.zeros((self.n, 16), np.int8)  # sampled verdict of each item per particle
        self.Y = np.zeros((self.n, 16), np.int8)  # sampled cell of each set-valued observation
        self.n_set = 0
        self.items: list[list[tuple[Obs, int]]] = []  # per item: (obs, its Y column or -1)
        self.resp: list[np.ndarray] = []  # ADF: each item's responsibilities
        self.filtered: list[np.ndarray] = []
        self.ess_history: list[float] = []
        self.n_rejuvenations = 0
        self._ar = np.arange(self.n)

    # -- rows --------------------------------------------------------------------------------------
    def _theta_alpha(self, r: int) -> np.ndarray:
        """(N, 3, 3) pseudo-counts of rater r's rows."""
        p = self.prior
        g = p.rater_group[r]
        if p.pooled:
            s = self.group_sum[:, g]
            m = (p.hyper_strength * p.group_m[g] + s) / (p.hyper_strength + s.sum(-1, keepdims=True))
            return np.maximum(p.group_s[g] * m + self.n_theta[:, r], 1e-12)
        return np.maximum(p.alpha_theta[r] + self.n_theta[:, r], 1e-12)

    def _alpha(self, o: Obs) -> np.ndarray:
        if o.family == THETA:
            return self._theta_alpha(o.owner)
        return np.maximum(self.prior.alpha_phi[o.owner] + self.n_phi[:, o.owner], 1e-12)

    def _pi_mean(self) -> np.ndarray:
        a = self.prior.alpha_pi + self.n_pi
        return a / a.sum(-1, keepdims=True)

    def _lik(self, obs: Sequence[Obs]) -> np.ndarray:
        """(N, 3) Π_obs E[Σ_{c∈cells} row(v)[c]]: the exact predictive, since no row is hit twice."""
        out = np.ones((self.n, 3))
        for o in obs:
            a = self._alpha(o)
            out *= a[..., list(o.cells)].sum(-1) / a.sum(-1)
        return out

    def predictive(self, obs: Sequence[Obs]) -> np.ndarray:
        """(N, 3) w_j(v) = E_j[π_v] Π_obs E_j[row_obs(v)[cells]], the one-step predictive of §G.3(a)."""
        return self._pi_mean() * self._lik(obs)

    def _bump(self, o: Obs, v: np.ndarray, y: np.ndarray | int, delta: float | np.ndarray) -> None:
        if o.family == THETA:
            self.n_theta[self._ar, o.owner, v, y] += delta
            self.group_sum[self._ar, self.prior.rater_group[o.owner], v, y] += delta
        else:
            self.n_phi[self._ar, o.owner, v, y] += delta

    def _add_item(self, i: int, v: np.ndarray, sign: int) -> None:
        self.n_pi[self._ar, v] += sign
        for o, col in self.items[i]:
            self._bump(o, v, self.Y[:, col] if col >= 0 else o.cells[0], sign)

    def _add_obs(self, i: int, obs: Sequence[Obs], v: np.ndarray) -> None:
        """Record obs on item i and add their counts at verdicts v, drawing the cell of set-valued labels."""
        for o in obs:
            col = -1
            if o.is_set:
                col = self.n_set
                self.n_set += 1
                self.Y = _grow(self.Y, self.n_set)
                a = self._alpha(o)[self._ar, v][:, list(o.cells)]
                self.Y[:, col] = np.asarray(o.cells)[_draw(a, self.rng)]
            self.items[i].append((o, col))
            self._bump(o, v, self.Y[:, col] if col >= 0 else o.cells[0], 1)

    def _resample(self, logw: np.ndarray) -> tuple[float, np.ndarray]:
        w = np.exp(logw - logw.max())
        w /= w.sum()
        ess = float(1.0 / (w * w).sum())
        idx = systematic_resample(w, self.rng)
        for name in ("n_pi", "n_theta", "n_phi", "group_sum", "V", "Y"):
            setattr(self, name, getattr(self, name)[idx])
        self.logw = np.full(self.n, -np.log(self.n))
        self.ess_history.append(ess)
        return ess, idx

    # -- updates -----------------------------------------------------------------------------------
    def update(self, item: int, obs: Sequence[Obs], late: bool = False) -> StepResult:
        """One arrival: a new item (late=False, item == number of items so far) or late labels on an old one."""
        if late:
            if not 0 <= item < len(self.items):
                raise ValueError(f"late labels for item {item}: only {len(self.items)} items have arrived")
            return self._late_adf(item, obs) if self.config.adf else self._late(item, obs)
        if item != len(self.items):
            raise ValueError(f"new item {item}: expected item {len(self.items)} (items arrive in order)")
        self.items.append([])
        return self._new_adf(item, obs) if self.config.adf else self._new(item, obs)

    def _new(self, i: int, obs: Sequence[Obs]) -> StepResult:
        w = self.predictive(obs)
        lik = w.sum(-1)
        weights = np.exp(self.logw - self.logw.max())
        rb = (weights[:, None] * w / lik[:, None]).sum(0) / weights.sum()
        self.filtered.append(rb)
        ess, idx = self._resample(self.logw + np.log(lik))
        v = _draw(w[idx], self.rng)
        self.V = _grow(self.V, i + 1)
        self.V[:, i] = v
        self.n_pi[self._ar, v] += 1
        self._add_obs(i, obs, v)
        plain = np.bincount(v, minlength=3) / self.n
        rejuvenated = self._maybe_rejuvenate(ess, ())
        every = self.config.sweep_every
        if every is not None and (i + 1) % every == 0:
            for j in self.rng.choice(i + 1, size=min(self.config.window, i + 1), replace=False):
                self.gibbs(int(j))
        return StepResult(i, rb, plain, ess, rejuvenated)

    def _late(self, i: int, obs: Sequence[Obs]) -> StepResult:
        v = self.V[:, i].astype(np.int64)
        lik = self._lik(obs)[self._ar, v]
        ess, _ = self._resample(self.logw + np.log(lik))
        self._add_obs(i, obs, self.V[:, i].astype(np.int64))
        rejuvenated = self._maybe_rejuvenate(ess, (i,))
        rb = self.marginal(i)
        return StepResult(i, rb, np.bincount(self.V[:, i], minlength=3) / self.n, ess, rejuvenated)

    def _maybe_rejuvenate(self, ess: float, extra: Sequence[int]) -> bool:
        cfg = self.config
        if not cfg.rejuvenate or ess >= cfg.ess_threshold * self.n:
            return False
        lo = max(0, len(self.items) - cfg.window)
        for i in sorted(set(range(lo, len(self.items))) | set(extra)):
            self.gibbs(i)
        self.n_rejuvenations += 1
        return True

    def _conditional(self, i: int) -> np.ndarray:
        """(N, 3) each particle's full conditional of V_i (its counts must be removed)."""
        return self.predictive([o for o, _ in self.items[i]])

    def gibbs(self, i: int) -> None:
        """Redraw item i's verdict (and its set-valued labels' cells) from the collapsed full conditional."""
        v = self.V[:, i].astype(np.int64)
        self._add_item(i, v, -1)
        v = _draw(self._conditional(i), self.rng)
        self.V[:, i] = v
        for o, col in self.items[i]:
            if col >= 0:
                a = self._alpha(o)[self._ar, v][:, list(o.cells)]
                self.Y[:, col] = np.asarray(o.cells)[_draw(a, self.rng)]
        self._add_item(i, v, +1)

    def marginal(self, i: int) -> np.ndarray:
        """(3,) the RB smoothing estimate Σ_j W_j p_j(V_i | all else); ADF: the same conditional under the
        cavity state, the item's expected counts r_i(v) taken out of the rows it touched."""
        if self.config.adf:
            return self._adf_marginal(i)
        v = self.V[:, i].astype(np.int64)
        self._add_item(i, v, -1)
        c = self._conditional(i)
        self._add_item(i, v, +1)
        w = np.exp(self.logw - self.logw.max())
        return (w[:, None] * c / c.sum(-1, keepdims=True)).sum(0) / w.sum()

    def marginals(self) -> np.ndarray:
        """(n, 3) smoothing estimates for every item."""
        return np.asarray([self.marginal(i) for i in range(len(self.items))]).reshape(-1, 3)

    # -- ADF ---------------------------------------------------------------------------------------
    def _match_row(self, o: Obs, resp: np.ndarray) -> None:
        """Replace each row (owner, u) by the moment match of (1 − r_u) Dir(a_u) + r_u Σ_c q_u(c) Dir(a_u + e_c)."""
        a = self._alpha(o)[0]  # (3, K)
        k = a.shape[-1]
        cells = list(o.cells)
        q = a[:, cells] / a[:, cells].sum(-1, keepdims=True)  # (3, |cells|)
        comps = np.concatenate([a[:, None, :], a[:, None, :] + np.eye(k)[cells][None]], 1)
        weights = np.concatenate([(1 - resp)[:, None], resp[:, None] * q], 1)
        delta = moment_match(comps, weights) - a
        for u in range(3):
            self._bump(o, np.zeros(1, np.int64) + u, np.arange(k)[None, :], delta[u][None, :])

    def _adf_marginal(self, i: int) -> np.ndarray:
        r, obs = self.resp[i], [o for o, _ in self.items[i]]
        saved = [a.copy() for a in (self.n_pi, self.n_theta, self.n_phi, self.group_sum)]
        self.n_pi[0] -= r
        for o in obs:
            a = self._alpha(o)[0]
            cells = list(o.cells)
            delta = np.zeros_like(a)
            delta[:, cells] = -r[:, None] * a[:, cells] / a[:, cells].sum(-1, keepdims=True)
            self._bump(o, np.arange(3)[:, None], np.arange(a.shape[-1])[None, :], delta)
        c = self.predictive(obs)[0]
        self.n_pi, self.n_theta, self.n_phi, self.group_sum = saved
        return c / c.sum()

    def _new_adf(self, i: int, obs: Sequence[Obs]) -> StepResult:
        w = self.predictive(obs)[0]
        r = w / w.sum()
        a_pi = self.prior.alpha_pi + self.n_pi[0]
        self.n_pi[0] = moment_match(a_pi[None] + np.eye(3), r) - self.prior.alpha_pi
        for o in obs:
            self._match_row(o, r)
            self.items[i].append((o, -1))
        self.resp.append(r)
        self.filtered.append(r)
        self.ess_history.append(1.0)
        return StepResult(i, r, r, 1.0, False)

    def _late_adf(self, i: int, obs: Sequence[Obs]) -> StepResult:
        r = self.resp[i] * self._lik(obs)[0]
        r = r / r.sum()
        for o in obs:
            self._match_row(o, r)
            self.items[i].append((o, -1))
        self.resp[i] = r
        self.ess_history.append(1.0)
        return StepResult(i, r, r, 1.0, False)

    # -- posterior summaries -----------------------------------------------------------------------
    def alphas(self) -> dict[str, np.ndarray]:
        """Every particle's pseudo-counts: π (N,3), Θ (N,R,3,3), Φ (N,O,3,K)."""
        theta = np.stack([self._theta_alpha(r) for r in range(self.prior.n_raters)], 1)
        return {
            "pi": self.prior.alpha_pi + self.n_pi,
            "theta": theta.reshape(self.n, -1, 3, 3),
            "phi": np.maximum(self.prior.alpha_phi + self.n_phi, 1e-12),
        }

    def weights(self) -> np.ndarray:
        w = np.exp(self.logw - self.logw.max())
        return w / w.sum()

    def posterior_mean(self) -> dict[str, np.ndarray]:
        """Particle-mixture means of π, Θ and Φ."""
        w = self.weights()
        return {k: np.tensordot(w, a / a.sum(-1, keepdims=True), axes=1) for k, a in self.alphas().items()}

    def sample(self, n: int, rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
        """n draws of (π, Θ, Φ) from the particle mixture of product-Dirichlets."""
        rng = rng if rng is not None else self.rng
        j = rng.choice(self.n, size=n, p=self.weights())
        out = {}
        for k, a in self.alphas().items():
            g = rng.standard_gamma(a[j])
            out[k] = g / g.sum(-1, keepdims=True)
        return out


def _grow(a: np.ndarray, need: int) -> np.ndarray:
    if need <= a.shape[1]:
        return a
    return np.concatenate([a, np.zeros((a.shape[0], max(need, 2 * a.shape[1]) - a.shape[1]), a.dtype)], 1)


def run_smc(stream: EncodedStream, prior: PriorArrays, config: SMCConfig = SMCConfig()) -> RBSMC:
    """Stream every event through a fresh filter, in arrival order."""
    smc = RBSMC(prior, config)
    for e in stream.events:
        smc.update(e.item, e.obs, late=e.late)
    return smc
