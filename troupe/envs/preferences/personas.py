"""ALGORITHMS.md §C.5's synthetic personas, in numbers.

* Responses: features φ(y) ∈ R^d, d = 8, drawn N(0, I).
* Personas: unit w ∈ R^d. Train personas have support on the first ``seen_dims`` coordinates
  (§C.5: coords 1–6); test personas put at least ``unseen_mass`` of their squared weight on the
  others (coords 7–8): directions no train persona uses, though a linear map reaches them.
* Labels: Bradley–Terry, P(a ≻ b) = σ(β0 wᵀ(φ_a − φ_b)); β0 = 3, and 0.7 for ambiguous personas.
* Episodes (§C.2): a persona, k demos labelled by it (drawn from BT, shown as (chosen, rejected)),
  and a query pair labelled by it.

Train personas share a direction (``shared``, an assumption of this generator): w ∝ shared·u + z
with u the unit vector of equal weights on the seen coordinates and z ~ N(0, I) there. Without a
shared part the mean persona is zero and a context-free model is at chance by construction; with
it, k = 0 has the accuracy of the pooled persona (§C.5's "k=0 ≈ pooled-persona accuracy").
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.special import expit

from troupe.envs.preferences.episodes import FeatureEpisodes, demo_slots, draw_k
from troupe.platform.errors import ConfigError

SPLITS = ("train", "test")


@dataclasses.dataclass(frozen=True)
class PersonaConfig:
    """§C.5's generator; errors name the key ``personas.<field>``."""

    dim: int = 8  # d: response features
    seen_dims: int = 6  # train personas live on coords 0..seen_dims-1
    unseen_mass: float = 0.5  # test personas: least share of Σw² on the unseen coords
    beta0: float = 3.0  # BT sharpness; §C.5 also uses 0.7 ("ambiguous")
    shared: float = 1.5  # ASM: weight of the direction every train persona shares (0: none)
    max_demos: int = 32  # K_max of §C.1

    def __post_init__(self) -> None:
        if not (isinstance(self.dim, int) and self.dim >= 2):
            raise ConfigError(f"personas.dim={self.dim!r}: expected an integer >= 2")
        if not (isinstance(self.seen_dims, int) and 1 <= self.seen_dims < self.dim):
            raise ConfigError(f"personas.seen_dims={self.seen_dims!r}: expected an integer in 1..dim-1 "
                              f"({self.dim - 1}), so that test personas have unseen directions")
        if not 0.0 < self.unseen_mass <= 1.0:
            raise ConfigError(f"personas.unseen_mass={self.unseen_mass!r}: expected a share in (0, 1]")
        if not self.beta0 > 0:
            raise ConfigError(f"personas.beta0={self.beta0!r}: expected a sharpness > 0")
        if not self.shared >= 0:
            raise ConfigError(f"personas.shared={self.shared!r}: expected a weight >= 0")
        if not (isinstance(self.max_demos, int) and self.max_demos >= 0):
            raise ConfigError(f"personas.max_demos={self.max_demos!r}: expected an integer >= 0")


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def sample_personas(cfg: PersonaConfig, n: int, split: str, rng: np.random.Generator) -> np.ndarray:
    """(n, d) unit personas of ``split``: ``train`` on the seen coords, ``test`` with a share of Σw² in
    [unseen_mass, 1] (uniform) on the unseen ones and the rest drawn like a train persona."""
    if split not in SPLITS:
        raise ConfigError(f"personas split {split!r}: expected one of {SPLITS}")
    s = cfg.seen_dims
    u = np.full(s, 1 / np.sqrt(s))
    seen = _unit(cfg.shared * u + rng.standard_normal((n, s)))
    if split == "train":
        return np.concatenate([seen, np.zeros((n, cfg.dim - s))], 1)
    mass = rng.uniform(cfg.unseen_mass, 1.0, size=(n, 1))
    unseen = _unit(rng.standard_normal((n, cfg.dim - s)))
    return np.concatenate([np.sqrt(1 - mass) * seen, np.sqrt(mass) * unseen], 1)


def check_personas(cfg: PersonaConfig, personas: np.ndarray) -> np.ndarray:
    """``personas`` as a float (m, d) array of unit rows, or a ConfigError naming the bad one."""
    w = np.asarray(personas, dtype=float)
    if w.ndim == 1:
        w = w[None]
    if w.ndim != 2 or w.shape[1] != cfg.dim:
        raise ConfigError(f"a persona has {w.shape[-1] if w.ndim else 0} weights but the responses have "
                          f"personas.dim={cfg.dim} features; give personas of shape (m, {cfg.dim}) (got "
                          f"{w.shape})")
    norms = np.linalg.norm(w, axis=1)
    bad = np.flatnonzero(~np.isclose(norms, 1.0, atol=1e-6))
    if bad.size:
        raise ConfigError(f"persona {int(bad[0])} has norm {norms[bad[0]]:.4g}; personas are unit vectors: "
                          "divide it by its norm")
    return w


def bt_probability(w: np.ndarray, phi_a: np.ndarray, phi_b: np.ndarray, beta0: float) -> np.ndarray:
    # §C.5: P(a ≻ b) = σ(β0 wᵀ(φ_a − φ_b)), rowwise
    return expit(beta0 * np.einsum("...d,...d->...", w, phi_a - phi_b))


def sample_feature_episodes(cfg: PersonaConfig, personas: np.ndarray, n: int, rng: np.random.Generator,
                            k: int | tuple[int, int] | None = None) -> FeatureEpisodes:
    """n episodes, each of a persona drawn uniformly from ``personas``, with ``k`` demos (an int, or
    ``(lo, hi)`` uniform; default ``(0, max_demos)``) and one query, every label drawn from BT."""
    w_all = check_personas(cfg, personas)
    ks = draw_k(n, (0, cfg.max_demos) if k is None else k, rng)
    capacity = max(int(ks.max(initial=0)), 1)  # one slot at least, so k=0 batches keep their shape
    who = rng.integers(len(w_all), size=n)
    w = w_all[who]
    d = cfg.dim
    da, db = rng.standard_normal((2, n, capacity, d))
    p_demo = bt_probability(w[:, None, :], da, db, cfg.beta0)
    a_won = rng.random((n, capacity)) < p_demo
    mask = demo_slots(ks, capacity)
    chosen = np.where(a_won[..., None], da, db) * mask[..., None]
    rejected = np.where(a_won[..., None], db, da) * mask[..., None]
    qa, qb = rng.standard_normal((2, n, d))
    p = bt_probability(w, qa, qb, cfg.beta0)
    label = (rng.random(n) < p).astype(np.int64)
    return FeatureEpisodes(chosen, rejected, mask, (a_won & mask).astype(np.int64), qa, qb, label, p, who)
