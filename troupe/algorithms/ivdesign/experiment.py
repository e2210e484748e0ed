"""One adaptive experiment (a *cell*: a population, a method, a seed) and the experimenter actor.

The experimenter never sees the truth. It asks the population for an answer ``(t, y)`` to a
query ``(unit, z)``, updates its GP-IV posterior (rank-1, or a batch recompute when the first
stage and hyperparameters are refitted every ``model.refit_every`` queries), and hands a
snapshot of its posterior over the target CATE back to the population for scoring.
"""

from __future__ import annotations

import dataclasses
import time
import traceback
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

from troupe.algorithms.ivdesign.acquisition import ACQUISITIONS, Candidates, choose
from troupe.algorithms.ivdesign.model import (
    GPIVPosterior,
    ModelConfig,
    Observations,
    ProbitFirstStage,
    batch_posterior,
    fit_hyperparameters,
    fit_hyperparameters_gpytorch,
    grid_of,
    inverse_mills,
    observation_noise,
    truncation_variance,
)
from troupe.envs.iv_population import PopulationInfo
from troupe.platform.config import check

Ask = Callable[[int, int], tuple[int, float]]


@dataclasses.dataclass
class DesignConfig:
    """The query budget of every cell."""

    queries: int = 40  # total, the random initial ones included
    initial: int = 3  # random (unit, z) queries before the first model fit

    def __post_init__(self) -> None:
        check(self.initial >= 1, "design.initial", self.initial, "an integer >= 1")
        check(self.queries > self.initial, "design.queries", self.queries,
              f"an integer > design.initial ({self.initial})")


def stable_id(*parts: Any) -> int:
    """A process-independent 32-bit id (Python's hash() is salted per process)."""
    return zlib.crc32("/".join(str(p) for p in parts).encode())


class Experimenter:
    """The adaptive design loop of one cell, against any ``ask(unit, z_index) -> (t, y)``."""

    def __init__(self, info: PopulationInfo, method: str, seed: int, design: DesignConfig, model: ModelConfig) -> None:
        if method not in ACQUISITIONS:
            raise ValueError(f"unknown method {method!r}; known: {', '.join(ACQUISITIONS)}")
        self.info, self.method, self.seed = info, method, seed
        self.design, self.cfg = design, model
        self.grid, self.pool_g, self.target_g = grid_of(info.X_pool, info.X_target)
        self.z_levels = np.asarray(info.z_levels, float)
        self.first_stage = ProbitFirstStage(info.X_pool, info.z_levels, model.first_stage_basis,
                                            model.first_stage_centres)
        self.initial_hyper = model.initial_hyper(info.X_pool.shape[1])
        self.hyper = self.initial_hyper
        self.names = model.fitted_names()
        self.obs = Observations.empty()
        self.units: list[int] = []
        self.z_index: list[int] = []
        # The initial design is shared by every method of a seed (common random numbers).
        self.rng_initial = np.random.default_rng([seed, 1])
        self.rng_method = np.random.default_rng([seed, 2, stable_id(method)])
        self.post = GPIVPosterior.prior(self.grid, self.hyper, model.tau_mean)
        self.refit_s = 0.0
        self.last_fit: dict[str, float] = {}
        self._cands: Candidates | None = None

    # -- the loop ----------------------------------------------------------------------------
    def start(self, ask: Ask) -> None:
        """The random initial queries, then the first fit."""
        n_units, n_z = len(self.info.X_pool), len(self.z_levels)
        for _ in range(self.design.initial):
            u, k = int(self.rng_initial.integers(n_units)), int(self.rng_initial.integers(n_z))
            t, y = ask(u, k)
            self._append(u, k, t, y)
        self.refit()

    def next_query(self) -> tuple[int, int]:
        """The (unit, z_index) that maximises the method's score."""
        cands = self.candidates()
        scores = ACQUISITIONS[self.method](self.post, cands, self.target_g)
        k = choose(scores, self.rng_method)
        return int(cands.unit[k]), int(cands.z_index[k])

    def observe(self, unit: int, z_index: int, t: int, y: float) -> None:
        """Add one answer: a rank-1 update, or a refit (and batch recompute) when one is due."""
        self._append(unit, z_index, t, y)
        if len(self.obs) % self.cfg.refit_every == 0:
            self.refit()
            return
        x, z = self.info.X_pool[unit : unit + 1], self.z_levels[z_index]
        eta = self.first_stage.eta(x, z)
        lam = float(inverse_mills(eta, t)[0])
        noise = float(observation_noise(self.hyper, eta, np.array([t]))[0])
        self.post.update(int(self.pool_g[unit]), float(t), lam, float(y), noise)

    def query(self, ask: Ask) -> dict[str, Any]:
        """Choose, ask, update; returns what was asked and answered and how long it took."""
        t0 = time.perf_counter()
        unit, k = self.next_query()
        t1 = time.perf_counter()
        t, y = ask(unit, k)
        t2 = time.perf_counter()
        refits_before = self.refit_s
        self.observe(unit, k, t, y)
        t3 = time.perf_counter()
        return {"unit": unit, "z_index": k, "t": t, "y": y, "query_s": (t1 - t0) + (t3 - t2),
                "refit_s": self.refit_s - refits_before}

    # -- model fitting -----------------------------------------------------------------------
    def refit(self) -> None:
        """Refit the first stage (empirical Bayes) and, with enough data, the hyperparameters; recompute."""
        t0 = time.perf_counter()
        n = len(self.obs)
        X = self.info.X_pool[np.asarray(self.units)]
        z, t, y = self.obs.z, self.obs.t, self.obs.y
        self.first_stage.fit(X, z, t)
        eta = self.first_stage.eta(X, z)
        lam = inverse_mills(eta, t)
        v = truncation_variance(eta, t)
        if n >= self.cfg.hyper_min_obs and self.names:
            fit = fit_hyperparameters_gpytorch if self.cfg.backend == "gpytorch" else fit_hyperparameters
            # Seeded by (seed, n) so that replaying the same data reproduces the same fit.
            res = fit(X, t, lam, v, y, self.hyper, self.names, self.cfg.tau_mean, self.cfg.restarts,
                      np.random.default_rng([self.seed, n, 3]), self.initial_hyper, self.cfg.hyperprior_sd)
            self.hyper = res.hyper
            self.last_fit = {"objective": res.objective, "start_objective": res.start_objective}
        prior = GPIVPosterior.prior(self.grid, self.hyper, self.cfg.tau_mean)
        noise = observation_noise(self.hyper, eta, t)
        self.post = batch_posterior(prior, self.obs.g, t, lam, y, noise)
        self._cands = None
        self.refit_s += time.perf_counter() - t0

    def candidates(self) -> Candidates:
        """Every (pool unit, instrument level) with p_hat, lambda_t and noise_t (cached between refits)."""
        if self._cands is None:
            n, K = len(self.info.X_pool), len(self.z_levels)
            unit = np.repeat(np.arange(n), K)
            zi = np.tile(np.arange(K), n)
            eta = self.first_stage.eta(self.info.X_pool[unit], self.z_levels[zi])
            lam = np.column_stack([inverse_mills(eta, 0), inverse_mills(eta, 1)])
            noise = np.column_stack([observation_noise(self.hyper, eta, np.zeros(len(eta))),
                                     observation_noise(self.hyper, eta, np.ones(len(eta)))])
            p1 = self.first_stage.propensity(self.info.X_pool[unit], self.z_levels[zi],
                                             moderated=self.cfg.first_stage_predictive == "moderated")
            self._cands = Candidates(unit, self.pool_g[unit], zi, p1, lam, noise)
        return self._cands

    # -- what is reported --------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """The posterior of the target CATE (mean, marginal variance) and p_hat on pool x levels."""
        mean, cov = self.post.tau_moments(self.target_g)
        p_hat = self.candidates().p1.reshape(len(self.info.X_pool), len(self.z_levels))
        return {"n": len(self.obs), "mean": mean, "var": np.diag(cov).copy(), "p_hat": p_hat}

    def diagnostics(self) -> dict[str, float]:
        p = self.candidates().p1.reshape(len(self.info.X_pool), len(self.z_levels))
        return {"first_stage_effect": float(np.max(p.max(1) - p.min(1))),
                **{f"hyper_{k}": float(v) for k, v in dataclasses.asdict(self.hyper).items()}}

    # -- checkpoints -------------------------------------------------------------------------
    def export(self) -> dict[str, Any]:
        return {"units": list(self.units), "z_index": list(self.z_index), "t": self.obs.t.astype(int).tolist(),
                "y": self.obs.y.tolist(), "rng_method": self.rng_method.bit_generator.state,
                "rng_initial": self.rng_initial.bit_generator.state}

    def replay(self, state: dict[str, Any]) -> None:
        """Rebuild the model from exported data, refitting at the same points as the original run."""
        records = list(zip(state["units"], state["z_index"], state["t"], state["y"], strict=True))
        init, rest = records[: self.design.initial], records[self.design.initial :]
        for u, k, t, y in init:
            self._append(u, k, t, y)
        self.refit()
        for u, k, t, y in rest:
            self.observe(u, k, t, y)
        self.rng_method.bit_generator.state = state["rng_method"]
        self.rng_initial.bit_generator.state = state["rng_initial"]

    def _append(self, unit: int, z_index: int, t: int, y: float) -> None:
        self.units.append(int(unit))
        self.z_index.append(int(z_index))
        self.obs = self.obs.append(int(self.pool_g[unit]), float(self.z_levels[z_index]), int(t), float(y))


@dataclasses.dataclass
class CellSpec:
    """Which population (by label), which method, which seed."""

    population: str
    method: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.population}/{self.method}/{self.seed}"


class IVExperimenterActor:
    """Runs its share of the cells against its population actor; the truth stays over there."""

    def __init__(self, design: DesignConfig, model: ModelConfig, call_timeout_s: float = 60.0) -> None:
        if model.backend == "gpytorch":  # numpy's BLAS already follows OMP_NUM_THREADS; torch needs telling
            from troupe.actors.base import configure_threads

            configure_threads()
        self.design, self.model = design, model
        self.timeout_s = call_timeout_s
        self.population: Any = None
        self.specs: list[CellSpec] = []
        self.cells: dict[str, Experimenter] = {}
        self.failed: dict[str, str] = {}
        self._infos: dict[str, PopulationInfo] = {}

    def attach(self, population: Any, cells: list[CellSpec]) -> int:
        """The population actor to ask, and the cells this experimenter runs."""
        self.population = population
        self.specs = list(cells)
        return len(self.specs)

    def _get(self, ref: Any) -> Any:
        import ray

        return ray.get(ref, timeout=self.timeout_s)

    def _ask(self, spec: CellSpec) -> Ask:
        def ask(unit: int, z_index: int) -> tuple[int, float]:
            return self._get(self.population.query.remote(spec.population, spec.key, spec.seed, unit, z_index))

        return ask

    def _info(self, label: str) -> PopulationInfo:
        if label not in self._infos:
            self._infos[label] = self._get(self.population.info.remote(label))
        return self._infos[label]

    def advance(self, n_until: int) -> dict[str, Any]:
        """Run every live cell up to ``n_until`` observations; returns scored rows and new faults."""
        rows: list[dict[str, Any]] = []
        faults: list[dict[str, str]] = []
        for spec in self.specs:
            if spec.key in self.failed:
                continue
            try:
                rows.extend(self._advance_cell(spec, n_until))
            except Exception as e:  # one failing cell must not stop the others: counted and reported
                self.failed[spec.key] = f"{type(e).__name__}: {e}"
                self.cells.pop(spec.key, None)
                faults.append({"cell": spec.key, "error": self.failed[spec.key],
                               "trace": traceback.format_exc(limit=4)})
        return {"rows": rows, "faults": faults}

    def _advance_cell(self, spec: CellSpec, n_until: int) -> list[dict[str, Any]]:
        ask = self._ask(spec)
        steps: list[dict[str, Any]] = []
        snaps: list[dict[str, Any]] = []
        cell = self.cells.get(spec.key)
        if cell is None:
            cell = Experimenter(self._info(spec.population), spec.method, spec.seed, self.design, self.model)
            t0 = time.perf_counter()
            cell.start(ask)
            self.cells[spec.key] = cell
            steps.append({"unit": -1, "z_index": -1, "t": -1, "y": None,
                          "query_s": time.perf_counter() - t0, "refit_s": cell.refit_s})
            snaps.append(cell.snapshot())
        while len(cell.obs) < min(n_until, self.design.queries):
            steps.append(cell.query(ask))
            snaps.append(cell.snapshot())
        if not snaps:
            return []
        scores = self._get(self.population.score.remote(spec.population, snaps))
        diag = cell.diagnostics()
        rows = []
        for step, snap, score in zip(steps, snaps, scores, strict=True):
            rows.append({"population": spec.population, "method": spec.method, "seed": spec.seed,
                         "n": snap["n"], **score, **step})
        rows[-1].update(diag)
        return rows

    def export(self) -> dict[str, Any]:
        return {"cells": {k: c.export() for k, c in self.cells.items()}, "failed": dict(self.failed)}

    def restore(self, state: dict[str, Any]) -> int:
        """Replay exported cells (and tell the population how often each query was already asked)."""
        self.failed = dict(state.get("failed", {}))
        for spec in self.specs:
            data = state["cells"].get(spec.key)
            if data is None:
                continue
            cell = Experimenter(self._info(spec.population), spec.method, spec.seed, self.design, self.model)
            cell.replay(data)
            self.cells[spec.key] = cell
            self._get(self.population.restore_visits.remote(spec.key, data["units"], data["z_index"]))
        return len(self.cells)
