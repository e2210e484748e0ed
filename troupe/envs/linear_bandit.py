"""Stochastic linear bandit: arms in R^d, an unknown θ, rewards ⟨a, θ⟩ + noise.

Three arm sets:

* ``sphere``: ``k`` arms uniform on the unit sphere (the §E.7 benchmark instance);
* ``hypercube``: the ``k = 2^m`` sign patterns ``s / sqrt(m)`` on the first ``m <= d``
  coordinates, with θ one of them scaled to ``theta_norm`` (the lower-bound instance: the gap
  between neighbouring patterns is ``2 * theta_norm / m``; ``gap`` sets it directly);
* ``file``: a ``k x d`` array from a ``.npy`` or ``.csv`` file.

The environment is gymnasium-style for one pull at a time (`step`), and also pulls whole
batches at once: `pull` draws every reward (exact for any noise), `sample_means` draws the
per-arm averages of a batch in closed form, which is exact only for Gaussian noise and is
refused otherwise. Only the agent that holds the environment sees a reward.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

from troupe.platform.errors import ConfigError, DataError

ARM_SETS = ("sphere", "hypercube", "file")
NOISES = ("gaussian", "rademacher")


def sphere_arms(k: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` points uniform on the unit sphere of R^d (normalised Gaussians)."""
    x = rng.standard_normal((k, d))
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def hypercube_arms(k: int, d: int) -> np.ndarray:
    """All ``k = 2^m`` sign patterns ``s / sqrt(m)`` on the first ``m`` coordinates, zeros after."""
    m = int(round(math.log2(k))) if k >= 1 else -1
    if k < 2 or 2**m != k:
        raise ConfigError(f"env.k={k}: hypercube arms need k = 2^m with m >= 1 (e.g. 2, 4, 8, 16, 32)")
    if m > d:
        raise ConfigError(f"env.k={k} = 2^{m} needs m <= d, but env.d={d}; raise d or lower k")
    bits = (np.arange(k)[:, None] >> np.arange(m)[None, :]) & 1
    arms = np.zeros((k, d))
    arms[:, :m] = (2.0 * bits - 1.0) / math.sqrt(m)
    return arms


def load_arms(path: str | Path) -> np.ndarray:
    """A ``k x d`` arm array from ``.npy`` or ``.csv`` (one arm per row, comma-separated)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"env.path={str(path)!r} does not exist; give a .npy or .csv file of arms")
    if path.suffix == ".npy":
        try:
            arms = np.load(path, allow_pickle=False)
        except ValueError as e:  # an object (ragged) array needs pickle, which we refuse
            raise DataError(f"arm file {str(path)!r}: arms of mixed dimension or a non-numeric array ({e})") from e
    elif path.suffix == ".csv":
        rows = []
        for i, line in enumerate(path.read_text().splitlines()):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            try:
                rows.append([float(x) for x in line.split(",")])
            except ValueError as e:
                raise DataError(f"arm file {str(path)!r}, line {i + 1}: not a row of numbers: {line!r}") from e
        if rows and any(len(r) != len(rows[0]) for r in rows):
            bad = next(j for j, r in enumerate(rows) if len(r) != len(rows[0]))
            raise DataError(
                f"arm file {str(path)!r}: arms of mixed dimension: arm {bad} has {len(rows[bad])} "
                f"coordinates, arm 0 has {len(rows[0])}; every row must have the same length d"
            )
        arms = np.asarray(rows, dtype=float)
    else:
        raise ConfigError(f"env.path={str(path)!r}: expected a .npy or .csv file")
    return check_arms(arms, source=str(path))


def check_arms(arms: Any, source: str = "arms") -> np.ndarray:
    """A finite ``k x d`` float array with every ``||a|| <= 1``, or a `DataError` naming the arm."""
    if isinstance(arms, list | tuple) and arms and len({len(np.atleast_1d(a)) for a in arms}) > 1:
        lengths = [len(np.atleast_1d(a)) for a in arms]
        bad = next(j for j, n in enumerate(lengths) if n != lengths[0])
        raise DataError(f"{source}: arms of mixed dimension: arm {bad} has {lengths[bad]} coordinates, "
                        f"arm 0 has {lengths[0]}")
    arr = np.asarray(arms, dtype=float)
    if arr.ndim != 2 or arr.shape[0] < 1 or arr.shape[1] < 1:
        raise DataError(f"{source}: expected a k x d array of arms, got shape {arr.shape}")
    bad_rows = np.flatnonzero(~np.isfinite(arr).all(axis=1))
    if bad_rows.size:
        raise DataError(f"{source}: arm {bad_rows[0]} has a non-finite coordinate: {arr[bad_rows[0]].tolist()}")
    norms = np.linalg.norm(arr, axis=1)
    if norms.max() > 1 + 1e-9:
        j = int(norms.argmax())
        raise DataError(f"{source}: arm {j} has norm {norms[j]:.6g} > 1; the setting needs ||a|| <= 1 "
                        f"(divide the arms by their largest norm)")
    return arr


class LinearBanditEnv(gymnasium.Env):
    """A stochastic linear bandit with ``k`` arms in R^d; the action is an arm index.

    The observation is the (fixed) arm matrix, which is all a learner may know of the
    instance; the reward of arm ``a`` is ``<a, theta> + sigma * eta``.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        arms: str | np.ndarray | list = "sphere",
        d: int = 5,
        k: int = 50,
        theta: list[float] | np.ndarray | None = None,
        theta_norm: float = 1.0,
        noise: str = "gaussian",
        sigma: float = 1.0,
        path: str | None = None,
        instance_seed: int = 0,
        horizon: int | None = None,
        gap: float | None = None,
    ) -> None:
        super().__init__()
        if noise not in NOISES:
            raise ConfigError(f"env.noise={noise!r}: expected one of {', '.join(NOISES)}")
        if not (math.isfinite(sigma) and sigma >= 0):
            raise ConfigError(f"env.sigma={sigma!r}: expected a finite number >= 0")
        if horizon is not None and horizon < 1:
            raise ConfigError(f"env.horizon={horizon!r}: expected an integer >= 1 or None")
        rng = np.random.default_rng([int(instance_seed), 0x5EED])
        self.arms = self._make_arms(arms, d, k, path, rng)
        self.k, self.d = self.arms.shape
        if gap is not None:
            theta_norm = self._norm_for_gap(gap, arms)
        self.theta = self._make_theta(theta, theta_norm, arms, rng)
        self.noise = noise
        self.sigma = float(sigma)
        self.horizon = horizon
        self.means = self.arms @ self.theta
        self.best_arm = int(np.argmax(self.means))
        self.gaps = self.means[self.best_arm] - self.means
        self.action_space = spaces.Discrete(self.k)
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(self.k, self.d), dtype=np.float64)
        self.t = 0

    # -- the instance ---------------------------------------------------------------
    def _make_arms(self, arms: Any, d: int, k: int, path: str | None, rng: np.random.Generator) -> np.ndarray:
        if not isinstance(arms, str):
            return check_arms(arms)
        if arms not in ARM_SETS:
            raise ConfigError(f"env.arms={arms!r}: expected one of {', '.join(ARM_SETS)} (or an array)")
        if arms == "file":
            if not path:
                raise ConfigError("env.arms='file' needs env.path: a .npy or .csv file with one arm per row")
            return load_arms(path)
        if d < 1 or k < 1:
            raise ConfigError(f"env.d={d}, env.k={k}: both must be integers >= 1")
        return sphere_arms(k, d, rng) if arms == "sphere" else hypercube_arms(k, d)

    def _norm_for_gap(self, gap: float, kind: Any) -> float:
        """Hypercube: the theta norm whose smallest gap (one flipped sign) is ``gap``: ``gap * m / 2``."""
        if not (isinstance(kind, str) and kind == "hypercube"):
            raise ConfigError(f"env.gap={gap!r} applies to hypercube arms only (env.arms={kind!r}); "
                              f"use env.theta_norm instead")
        m = int(round(math.log2(self.k)))
        norm = gap * m / 2
        if not (gap > 0 and norm <= 1):
            raise ConfigError(f"env.gap={gap!r} with k=2^{m}: needs 0 < gap <= 2/m = {2 / m:.4g} "
                              f"(theta norm gap*m/2 must stay <= 1)")
        return norm

    def _make_theta(self, theta: Any, theta_norm: float, kind: Any, rng: np.random.Generator) -> np.ndarray:
        if theta is not None:
            th = np.asarray(theta, dtype=float).reshape(-1)
            if th.shape != (self.d,):
                raise ConfigError(f"env.theta has {th.size} coordinates; the arms have d={self.d}")
            if not np.isfinite(th).all():
                raise ConfigError(f"env.theta={th.tolist()} has a non-finite coordinate")
        else:
            if not (math.isfinite(theta_norm) and theta_norm > 0):
                raise ConfigError(f"env.theta_norm={theta_norm!r}: theta must have a positive norm "
                                  f"(a zero-norm theta makes every arm optimal); use e.g. 1.0")
            if isinstance(kind, str) and kind == "hypercube":
                # θ points at one sign pattern, so that pattern is the unique best arm.
                th = self.arms[int(rng.integers(self.k))].copy()
            else:
                th = rng.standard_normal(self.d)
            th *= theta_norm / np.linalg.norm(th)
        norm = float(np.linalg.norm(th))
        if norm == 0.0:
            raise ConfigError("env.theta has zero norm: every arm would be optimal and regret is always 0; "
                              "give a non-zero theta")
        if np.abs(self.arms @ th).max() > 1 + 1e-9:
            raise ConfigError(f"env.theta (norm {norm:.4g}) gives |<a, theta>| > 1 for some arm; "
                              f"the setting needs |<a, theta>| <= 1 (scale theta down)")
        return th

    # -- gymnasium -----------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Restart the clock and (with ``seed``) the noise stream; the instance stays fixed."""
        super().reset(seed=seed)
        self.t = 0
        return self.arms.copy(), {"k": self.k, "d": self.d}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Pull one arm: ``(arms, reward, terminated=False, truncated, {"gap": ...})``."""
        if not self.action_space.contains(action):
            raise DataError(f"action {action!r} is not an arm index in [0, {self.k})")
        reward = float(self.pull(np.array([int(action)]))[0])
        self.t += 1
        truncated = self.horizon is not None and self.t >= self.horizon
        return self.arms.copy(), reward, False, truncated, {"gap": float(self.gaps[int(action)])}

    # -- batches -------------------------------------------------------------------
    def _noise(self, size: int | tuple[int, ...]) -> np.ndarray:
        if self.noise == "gaussian":
            return self.sigma * self.np_random.standard_normal(size)
        # ±sigma: bounded, sigma-sub-Gaussian, variance sigma^2
        return self.sigma * (2.0 * self.np_random.integers(0, 2, size=size) - 1.0)

    def pull(self, arm_indices: np.ndarray) -> np.ndarray:
        """One reward per entry of ``arm_indices`` (any shape): the exact per-pull simulation."""
        idx = np.asarray(arm_indices, dtype=np.int64)
        rewards = self.means[idx] + self._noise(idx.shape)
        return check_rewards(rewards)

    def sample_means(self, arm_indices: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Average reward of ``counts[i]`` pulls of arm ``arm_indices[i]``, drawn in closed form.

        Batch mean of n Gaussian pulls ~ N(mu_a, sigma^2 / n): exact for Gaussian noise only.
        """
        if self.noise != "gaussian":
            raise ConfigError(f"closed-form batch means are exact only for Gaussian noise, not env.noise="
                              f"{self.noise!r}; use the exact per-pull mode (sweep.mode=exact)")
        idx = np.asarray(arm_indices, dtype=np.int64)
        n = np.asarray(counts, dtype=float)
        if (n < 1).any():
            raise DataError(f"sample_means: every count must be >= 1, got {n.min():g}")
        z = self.means[idx] + self.sigma / np.sqrt(n) * self.np_random.standard_normal(idx.shape)
        return check_rewards(z)


def check_rewards(rewards: np.ndarray) -> np.ndarray:
    """Rewards are finite, or a `DataError` names the first bad value and where it is."""
    finite = np.isfinite(rewards)
    if not finite.all():
        j = int(np.flatnonzero(~finite.reshape(-1))[0])
        raise DataError(f"non-finite reward {float(rewards.reshape(-1)[j])!r} at position {j}: check the instance "
                        f"(theta, arms) and env.sigma")
    return rewards


