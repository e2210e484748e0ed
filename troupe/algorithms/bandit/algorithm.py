"""`bandit`: batched stochastic linear bandits with one bit of feedback per batch.

A run is a sweep: every cell (policy × seed × B × T × d × k, plus the hypercube lower-bound
instances) is one learner–agent pair, where the agent alone sees rewards and the learner gets
one bit per batch. One step runs one chunk of cells on the pairs; `finalize` turns the cells
into regret curves, log–log slopes of regret vs B and vs T, bits used, the rate of eliminating
the best arm, and a check of each claim of §E.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from troupe.actors.bandit_agent import BanditAgent
from troupe.algorithms.bandit.policies import POLICIES, PolicyParams
from troupe.algorithms.bandit.report import markdown_sections, write_plots
from troupe.algorithms.bandit.sweep import (
    Cell,
    CellLearner,
    check_grid,
    group_results,
    mean_se,
    run_local,
    run_pairs,
    summarize_sweep,
)
from troupe.envs.linear_bandit import load_arms
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.checkpoint import atomic_write_json, atomic_write_text
from troupe.platform.config import RunConfig, check, to_dict
from troupe.platform.errors import ConfigError
from troupe.platform.placement import Role

if TYPE_CHECKING:
    from troupe.platform.run import RunContext


@dataclasses.dataclass
class InstanceConfig:
    """The bandit instance of the main sweep (d and k come from the sweep's lists)."""

    arms: Literal["sphere", "hypercube", "file"] = "sphere"
    path: str | None = None  # arms="file": a .npy or .csv, one arm per row
    theta_norm: float = 1.0
    noise: Literal["gaussian", "rademacher"] = "gaussian"
    sigma: float = 1.0

    def __post_init__(self) -> None:
        check(self.theta_norm > 0 and math.isfinite(self.theta_norm), "env.theta_norm", self.theta_norm,
              "a finite number > 0 (a zero-norm theta makes every arm optimal)")
        check(self.sigma >= 0 and math.isfinite(self.sigma), "env.sigma", self.sigma, "a finite number >= 0")
        check(self.arms != "file" or bool(self.path), "env.path", self.path, "a .npy or .csv file when env.arms=file")


@dataclasses.dataclass
class SweepConfig:
    """The grid of the main sweep and how it runs."""

    policies: list[str] = dataclasses.field(default_factory=lambda: list(POLICIES))
    seeds: int = 10
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [16, 64, 256, 1024])
    horizons: list[int] = dataclasses.field(default_factory=lambda: [2**12, 2**14, 2**16, 2**18, 2**20, 2**22])
    dims: list[int] = dataclasses.field(default_factory=lambda: [5])
    arm_counts: list[int] = dataclasses.field(default_factory=lambda: [50])
    mode: Literal["closed_form", "exact"] = "closed_form"
    layout: Literal["ray", "local"] = "ray"  # local: every cell in the driver process (debugging)
    workers: int = 2  # learner–agent pairs
    learner_cpus: float = 0.9
    agent_cpus: float = 0.1
    curve_points: int = 48
    burn_in: float = 1 / 1024  # slopes vs T use t >= burn_in * T_max
    small_factor: float = 3.0  # "within a small factor of unquantised" means at most this ratio

    def __post_init__(self) -> None:
        unknown = [p for p in self.policies if p not in POLICIES]
        if unknown or not self.policies:
            raise ConfigError(f"config key 'sweep.policies' = {self.policies!r}: unknown {unknown}; "
                              f"choose from {', '.join(POLICIES)}")
        check(self.seeds >= 1, "sweep.seeds", self.seeds, "an integer >= 1")
        check(bool(self.batch_sizes) and bool(self.horizons), "sweep.batch_sizes/horizons",
              (self.batch_sizes, self.horizons), "non-empty lists")
        check_grid(self.batch_sizes, self.horizons)
        check(all(d >= 1 for d in self.dims) and bool(self.dims), "sweep.dims", self.dims, "integers >= 1")
        check(all(k >= 1 for k in self.arm_counts) and bool(self.arm_counts), "sweep.arm_counts",
              self.arm_counts, "integers >= 1")
        check(self.workers >= 1, "sweep.workers", self.workers, "an integer >= 1")
        check(self.learner_cpus > 0 and self.agent_cpus > 0, "sweep.learner_cpus/agent_cpus",
              (self.learner_cpus, self.agent_cpus), "> 0")
        check(self.curve_points >= 2, "sweep.curve_points", self.curve_points, "an integer >= 2")
        check(0 < self.burn_in <= 1, "sweep.burn_in", self.burn_in, "a fraction in (0, 1]")


@dataclasses.dataclass
class HypercubeConfig:
    """Lower-bound instances: k = 2^m sign patterns in R^d, noise-free by default."""

    enabled: bool = True
    d: int = 5
    log2_k: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 3, 4, 5])
    batch_sizes: list[int] = dataclasses.field(default_factory=lambda: [16, 256])
    horizon: int = 2**20
    sigma: float = 0.0
    gap: float = 0.4  # smallest gap, the same for every k, so the bound B * m * gap / 2 grows with m
    seeds: int = 5
    policies: list[str] = dataclasses.field(default_factory=lambda: ["unquantised", "bitpe", "bitpe_safe"])

    def __post_init__(self) -> None:
        if not self.enabled:
            return
        check(bool(self.log2_k) and all(1 <= m <= self.d for m in self.log2_k), "hypercube.log2_k",
              self.log2_k, f"integers m with 1 <= m <= hypercube.d={self.d}")
        check(self.seeds >= 1, "hypercube.seeds", self.seeds, "an integer >= 1")
        check(self.sigma >= 0, "hypercube.sigma", self.sigma, ">= 0")
        check(0 < self.gap <= 2 / max(self.log2_k), "hypercube.gap", self.gap,
              f"a number in (0, 2/max(log2_k)] = (0, {2 / max(self.log2_k):.3g}] so that |<a, theta>| <= 1")
        unknown = [p for p in self.policies if p not in POLICIES]
        check(not unknown and bool(self.policies), "hypercube.policies", self.policies,
              f"names from {', '.join(POLICIES)}")
        check_grid(self.batch_sizes, [self.horizon])


@dataclasses.dataclass
class BanditConfig:
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=10, eval_every=0, checkpoint_every=5))
    env: InstanceConfig = dataclasses.field(default_factory=InstanceConfig)
    sweep: SweepConfig = dataclasses.field(default_factory=SweepConfig)
    hypercube: HypercubeConfig = dataclasses.field(default_factory=HypercubeConfig)
    policy: PolicyParams = dataclasses.field(default_factory=PolicyParams)

    def __post_init__(self) -> None:
        if self.env.arms == "hypercube":
            for d in self.sweep.dims:
                for k in self.sweep.arm_counts:
                    m = k.bit_length() - 1
                    check(k >= 2 and 2**m == k and m <= d, "sweep.arm_counts", self.sweep.arm_counts,
                          f"powers of two 2^m with 1 <= m <= d={d} for env.arms=hypercube")
        if self.sweep.mode == "closed_form" and self.env.noise != "gaussian":
            raise ConfigError(f"sweep.mode='closed_form' simulates batch means as Gaussians, exact only for "
                              f"Gaussian noise; env.noise={self.env.noise!r} needs sweep.mode=exact")


def build_cells(cfg: BanditConfig) -> list[Cell]:
    """Every cell of the sweep, seeds outermost so that each chunk adds seeds to every setting."""
    sw, env, base = cfg.sweep, cfg.env, cfg.run.seed
    shapes = [(d, k) for d in sw.dims for k in sw.arm_counts]
    if env.arms == "file":
        k, d = load_arms(env.path).shape
        shapes = [(d, k)]
    cells: list[Cell] = []
    seen: set[Cell] = set()
    for s in range(sw.seeds):
        for t in sw.horizons:
            for d, k in shapes:
                for b in sw.batch_sizes:
                    for p in sw.policies:
                        # an unbatched policy does not depend on B: one cell, recorded with B = 1
                        cell = Cell(p, base + s, b if POLICIES[p].batched else 1, t, d, k, arms=env.arms,
                                    sigma=env.sigma, theta_norm=env.theta_norm, noise=env.noise,
                                    path=env.path, mode=sw.mode)
                        if cell not in seen:
                            seen.add(cell)
                            cells.append(cell)
        hc = cfg.hypercube
        if hc.enabled and s < hc.seeds:
            for m in hc.log2_k:
                for b in hc.batch_sizes:
                    for p in hc.policies:
                        cells.append(Cell(p, base + s, b if POLICIES[p].batched else 1, hc.horizon, hc.d, 2**m,
                                          group="hypercube", arms="hypercube", sigma=hc.sigma, mode="closed_form",
                                          gap=hc.gap))
    return cells


class BanditAlgorithm(Algorithm):
    """1-bit batched linear bandits: the §E.7 sweep as a graph of learner–agent pairs."""

    Config = BanditConfig
    summary_line = "batched linear bandits with one bit of feedback per batch (BitPE, BitPE-Safe, baselines)"

    def __init__(self, config: BanditConfig, ctx: RunContext) -> None:
        super().__init__(config, ctx)
        self.cells = build_cells(config)
        self.results: list[dict[str, Any]] = []

    def roles(self) -> list[Role]:
        sw = self.config.sweep
        if sw.layout == "local":
            return []
        pairs = min(sw.workers, max(1, len(self.cells)))
        params = to_dict(self.config.policy)
        return [
            Role("learner", CellLearner, count=pairs, num_cpus=sw.learner_cpus, colocate="pairs",
                 kwargs={"params": params, "call_timeout_s": self.ctx.call_timeout_s}),
            Role("agent", BanditAgent, count=pairs, num_cpus=sw.agent_cpus, colocate="pairs"),
        ]

    def _chunk(self, step: int) -> list[Cell]:
        per_step = math.ceil(len(self.cells) / max(1, self.config.run.steps))
        return self.cells[step * per_step:(step + 1) * per_step]

    def step(self, step: int) -> dict[str, float]:
        chunk = [c for c in self._chunk(step) if c not in self._done_cells()]
        t0 = time.perf_counter()
        if chunk:
            if self.config.sweep.layout == "local":
                new = run_local(chunk, self.config.policy, self.config.sweep.curve_points)
            else:
                new = run_pairs(chunk, self.graph["learner"].handles, self.graph["agent"].handles,
                                self.config.sweep.curve_points, self.ctx.call_timeout_s)
            self.results.extend(new)
            self._write_cells()
        wall = time.perf_counter() - t0
        metrics: dict[str, float] = {"sweep/cells_done": float(len(self.results)),
                                     "sweep/cells_total": float(len(self.cells)),
                                     "sweep/cells_per_s": len(chunk) / wall if chunk and wall > 0 else 0.0}
        metrics.update(self._running_regret())
        return metrics

    def _done_cells(self) -> set[Cell]:
        return {Cell(**{f.name: r[f.name] for f in dataclasses.fields(Cell)}) for r in self.results}

    def _running_regret(self) -> dict[str, float]:
        """Mean regret so far at the largest horizon, one family per B (``regret_B16/bitpe``)."""
        main = [r for r in self.results if r["group"] == "main"]
        if not main:
            return {}
        t_max = max(r["horizon"] for r in main)
        out = {}
        for (p, b), g in group_results([r for r in main if r["horizon"] == t_max], ("policy", "batch")).items():
            out[f"regret_B{b}/{p}"] = mean_se(r["regret"] for r in g)[0]
        return out

    # -- state ---------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        atomic_write_json(Path(ckpt_dir) / "bandit_cells.json", {"results": self.results})

    def load(self, ckpt_dir: Path) -> None:
        self.results = json.loads((Path(ckpt_dir) / "bandit_cells.json").read_text())["results"]

    # -- the run directory -------------------------------------------------------------
    def _write_cells(self) -> None:
        """Every finished cell, one JSON line each: what the report is built from."""
        atomic_write_text(self.ctx.artifact("cells.jsonl"),
                          "".join(json.dumps(r, sort_keys=True) + "\n" for r in self.results))

    @classmethod
    def report(cls, config: BanditConfig, run: RunContext, history: list[dict[str, Any]]) -> Report:
        path = run.run_dir / "cells.jsonl"
        results = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
        cells = build_cells(config)
        done = {Cell(**{f.name: r[f.name] for f in dataclasses.fields(Cell)}) for r in results}
        main = [c for c in cells if c.group == "main"]
        shape = (main[0].d, main[0].k) if main else None
        summary = summarize_sweep(results, config.sweep.burn_in, config.sweep.small_factor, shape)
        summary["cells_missing"] = len(cells) - len(done & set(cells))
        summary["sweep_wall_s"] = round(sum(r.get("time/step_s", 0.0) for r in history), 2)
        if results:
            summary["plots"] = [p.name for p in write_plots(results, summary, run.plots_dir)]
        head = [f"## Sweep\n\n{summary.get('cells', 0)} cells run, {summary.get('cells_missing', 0)} missing "
                f"(raise run.steps or rerun with --resume to finish them); per-cell records in `cells.jsonl`."]
        plots = [f"![{name}](plots/{name})" for name in summary.get("plots", [])]
        tail = ["## Sweep plots\n\n" + "\n".join(plots)] if plots else []
        return Report(summary, head + markdown_sections(summary) + tail)
