"""ivdesign: adaptive instrumental-variable design under noncompliance (IVIG and baselines).

A *cell* is one adaptive experiment: a population, a method (``ivig``, ``random``,
``outcome_variance``, ``marginal_variance``, ``target_agnostic_eig``) and a seed. The graph
pairs ``workers.count`` experimenter actors with as many population actors (colocated, one
pair per bundle); each experimenter runs its share of the cells against its population,
which alone holds the true response functions and scores every posterior.

One step = one chunk of queries for every cell: step s takes every cell from its current
number of observations to ``initial + round((s+1) (queries - initial) / run.steps)``, so
``run.steps`` sets how finely the learning curves are logged (1 <= run.steps <=
queries - initial). The random initial queries run in the first step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from troupe.actors.iv_population_actor import IVPopulationActor
from troupe.algorithms.ivdesign.acquisition import ACQUISITIONS
from troupe.algorithms.ivdesign.experiment import CellSpec, DesignConfig, IVExperimenterActor
from troupe.algorithms.ivdesign.model import ModelConfig
from troupe.envs.iv_population import make_population
from troupe.platform.algorithm import Algorithm, Report
from troupe.platform.checkpoint import atomic_write_json
from troupe.platform.config import RunConfig, check
from troupe.platform.errors import ConfigError
from troupe.platform.metrics import mean_se
from troupe.platform.placement import ActorGraph, Role
from troupe.platform.registry import ENVIRONMENTS
from troupe.platform.run import RunContext

BASELINES = ("random", "outcome_variance", "marginal_variance")
WEAK_FITTED_EFFECT = 0.05  # below this largest fitted change of P(t=1) across z, the report warns
log = logging.getLogger(__name__)


@dataclasses.dataclass
class PopulationSpec:
    """A registered IV population (``iv_1d``, ``iv_multilevel``, ``iv_2d``, ``iv_table``) and its parameters."""

    env: str = "iv_1d"
    label: str = ""  # name in metrics and the report; defaults to the env name
    params: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.label = self.label or self.env
        check("/" not in self.label, "cells.populations[].label", self.label, "a name without '/'")


@dataclasses.dataclass
class CellsConfig:
    """Which experiments to run: populations x methods x seeds."""

    populations: list[PopulationSpec] = dataclasses.field(default_factory=lambda: [
        PopulationSpec("iv_1d", "1d_strong", {"target": "strong"}),
        PopulationSpec("iv_1d", "1d_weak", {"target": "weak"}),
    ])
    methods: list[str] = dataclasses.field(default_factory=lambda: ["ivig", *BASELINES])
    seeds: int = 20  # seeds run.seed, run.seed + 1, ...
    rmse_threshold: float = 0.6  # "queries to reach RMSE <= threshold"

    def __post_init__(self) -> None:
        bad = [m for m in self.methods if m not in ACQUISITIONS]
        check(not bad and bool(self.methods), "cells.methods", self.methods, f"names among {', '.join(ACQUISITIONS)}")
        check(len(set(self.methods)) == len(self.methods), "cells.methods", self.methods, "no repeated method")
        check(self.seeds >= 1, "cells.seeds", self.seeds, "an integer >= 1")
        check(bool(self.populations), "cells.populations", self.populations, "at least one population")
        labels = [p.label for p in self.populations]
        check(len(set(labels)) == len(labels), "cells.populations", labels, "distinct labels")


@dataclasses.dataclass
class WorkersConfig:
    """Experimenter/population actor pairs running cells in parallel."""

    count: int = 2
    num_cpus: float = 1.0  # per experimenter
    population_cpus: float = 0.0  # per population actor (it only draws answers and scores)

    def __post_init__(self) -> None:
        check(self.count >= 1, "workers.count", self.count, "an integer >= 1")
        check(self.num_cpus >= 0, "workers.num_cpus", self.num_cpus, "a number >= 0")
        check(self.population_cpus >= 0, "workers.population_cpus", self.population_cpus, "a number >= 0")


@dataclasses.dataclass
class IVDesignConfig:
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=8, eval_every=0, checkpoint_every=0))
    cells: CellsConfig = dataclasses.field(default_factory=CellsConfig)
    design: DesignConfig = dataclasses.field(default_factory=DesignConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    workers: WorkersConfig = dataclasses.field(default_factory=WorkersConfig)

    def __post_init__(self) -> None:
        adaptive = self.design.queries - self.design.initial
        check(1 <= self.run.steps <= adaptive, "run.steps", self.run.steps,
              f"1..{adaptive}: one step is a chunk of the {adaptive} adaptive queries "
              f"(design.queries={self.design.queries} - design.initial={self.design.initial})")


def chunk_end(step: int, steps: int, design: DesignConfig) -> int:
    """Observations every cell has after step ``step`` (0-based) of ``steps``."""
    adaptive = design.queries - design.initial
    return design.initial + round((step + 1) * adaptive / steps)


class IVDesign(Algorithm):
    Config = IVDesignConfig
    summary_line = "adaptive IV design under noncompliance: IVIG vs random/outcome-/marginal-variance queries"

    def __init__(self, config: IVDesignConfig, ctx: RunContext) -> None:
        super().__init__(config, ctx)
        c = config
        # Build every population once here so that bad input fails before any actor exists.
        self.factories: dict[str, tuple[type, dict[str, Any]]] = {}
        for spec in c.cells.populations:
            make_population(spec.env, spec.params)
            self.factories[spec.label] = (ENVIRONMENTS.get(spec.env), dict(spec.params))
        cells = [CellSpec(p.label, m, c.run.seed + i) for i in range(c.cells.seeds)
                 for p in c.cells.populations for m in c.cells.methods]
        # Deterministic shuffle so that every worker gets a mix of populations and methods.
        order = np.random.default_rng(c.run.seed).permutation(len(cells))
        self.cells = [cells[i] for i in order]
        self.n_workers = min(c.workers.count, len(self.cells))
        self.rows: list[dict[str, Any]] = []
        self.faults: list[dict[str, str]] = []
        self.n_done = 0

    # -- the graph -----------------------------------------------------------------------------
    def roles(self) -> list[Role]:
        c = self.config
        return [
            Role("population", IVPopulationActor, count=self.n_workers, num_cpus=c.workers.population_cpus,
                 colocate="cell", kwargs={"populations": self.factories}),
            Role("experimenter", IVExperimenterActor, count=self.n_workers, num_cpus=c.workers.num_cpus,
                 colocate="cell", kwargs={"design": c.design, "model": c.model,
                                          "call_timeout_s": min(self.ctx.call_timeout_s, 120.0)}),
        ]

    def setup(self, graph: ActorGraph) -> None:
        super().setup(graph)
        pops, exps = graph["population"], graph["experimenter"]
        shares = [self.cells[i :: self.n_workers] for i in range(self.n_workers)]
        exps.call_each("attach", [(pops[i], shares[i]) for i in range(self.n_workers)])

    # -- the loop ------------------------------------------------------------------------------
    def step(self, step: int) -> dict[str, float]:
        n_until = chunk_end(step, self.config.run.steps, self.config.design)
        results = self.graph["experimenter"].call("advance", n_until)
        new_faults = [f for r in results for f in r["faults"]]
        for f in new_faults:
            self.ctx.info("ivdesign: cell %s failed: %s", f["cell"], f["error"])
        self.faults.extend(new_faults)
        rows = [row for r in results for row in r["rows"]]
        self.rows.extend(rows)
        # What the report is built from, kept current so that `troupe report` needs no live run.
        atomic_write_json(self.ctx.artifact("cells.json"), self.rows)
        atomic_write_json(self.ctx.artifact("faults.json"), self.faults)
        self.n_done = n_until
        metrics: dict[str, float] = {"queries": float(n_until), "faults": float(len(new_faults))}
        current = [r for r in rows if r["n"] == n_until]
        for (label, method), group in _group(current, ("population", "method")).items():
            for key in ("rmse", "nlpd", "coverage", "brier"):
                metrics[f"{key}/{label}/{method}"] = float(np.mean([r[key] for r in group]))
        timed = [r["query_s"] for r in rows if r["unit"] >= 0]
        if timed:
            metrics["time/query_ms"] = 1000 * float(np.mean(timed))
        return metrics

    def evaluate(self, step: int) -> dict[str, float]:
        """Area under the mean RMSE curve so far (see `area_under_curve`) per population and method."""
        return {f"rmse_auc/{label}/{method}": area_under_curve(ns, mean)
                for (label, method), (ns, mean, _) in mean_curves(self.rows).items()}

    # -- state -----------------------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        states = self.graph["experimenter"].call("export")
        atomic_write_json(ckpt_dir / "ivdesign.json", {"n_done": self.n_done, "rows": self.rows,
                                                        "faults": self.faults, "workers": states})

    def load(self, ckpt_dir: Path) -> None:
        data = json.loads((ckpt_dir / "ivdesign.json").read_text())
        if len(data["workers"]) != self.n_workers:
            raise ConfigError(f"checkpoint {ckpt_dir} holds {len(data['workers'])} workers; this run has "
                              f"{self.n_workers}: resume with the same workers.count")
        self.graph["experimenter"].call_each("restore", [(s,) for s in data["workers"]])
        self.rows, self.faults, self.n_done = data["rows"], data["faults"], data["n_done"]

    # -- the run directory ---------------------------------------------------------------------
    @classmethod
    def report(cls, config: IVDesignConfig, run: RunContext, history: list[dict[str, Any]]) -> Report:
        def read(name: str) -> list[dict[str, Any]]:
            path = run.run_dir / name
            return json.loads(path.read_text()) if path.is_file() else []

        rows = read("cells.json")
        pops = {spec.label: make_population(spec.env, spec.params) for spec in config.cells.populations}
        summary = summarise(rows, config, {label: pop.target_description for label, pop in pops.items()})
        summary["faults_detail"] = read("faults.json")
        truths = {label: pop.truth() for label, pop in pops.items()}
        summary["plots"] = write_plots(rows, config, run.plots_dir, truths)
        summary = finite_or_none(summary)
        return Report(summary, report_tables(summary))


def mean_curves(rows: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(n, mean RMSE, standard error over seeds) per population and method."""
    out = {}
    for key, group in _group(rows, ("population", "method")).items():
        by_n = _group(group, ("n",))
        ns = np.array(sorted(k[0] for k in by_n))
        vals = [[r["rmse"] for r in by_n[(n,)]] for n in ns]
        out[key] = (ns, np.array([np.mean(v) for v in vals]),
                    np.array([np.std(v) / math.sqrt(len(v)) for v in vals]))
    return out


# -- summary ---------------------------------------------------------------------------------
def _group(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in rows:
        out.setdefault(tuple(r[k] for k in keys), []).append(r)
    return out


def _mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error of the finite values."""
    m, se, _ = mean_se(x for x in values if np.isfinite(x))
    return m, se


def cell_curves(rows: list[dict[str, Any]]) -> dict[tuple[str, str, int], dict[int, dict[str, Any]]]:
    """Rows by (population, method, seed), then by number of observations."""
    return {k: {r["n"]: r for r in g} for k, g in _group(rows, ("population", "method", "seed")).items()}


def area_under_curve(ns: np.ndarray, rmse: np.ndarray) -> float:
    """Mean RMSE along the curve: trapezoid area over n = first..last divided by (last - first)."""
    if len(ns) < 2:
        return float(rmse[0]) if len(rmse) else float("nan")
    return float(np.trapezoid(rmse, ns) / (ns[-1] - ns[0]))


def summarise(rows: list[dict[str, Any]], config: IVDesignConfig, targets: dict[str, str]) -> dict[str, Any]:
    """Per population and method: RMSE at the end and at n=10, area under the curve, NLPD, coverage,
    Brier, queries to the RMSE threshold, time per query; and paired IVIG-minus-baseline differences."""
    c = config
    final_n = c.design.queries
    small_n = min(10, final_n)
    curves = cell_curves(rows)
    out: dict[str, Any] = {"queries": final_n, "initial": c.design.initial, "seeds": c.cells.seeds,
                           "methods": list(c.cells.methods), "rmse_threshold": c.cells.rmse_threshold,
                           "populations": {}}
    for spec in c.cells.populations:
        label = spec.label
        per_method: dict[str, Any] = {}
        per_seed: dict[str, dict[int, dict[str, float]]] = {}
        for method in c.cells.methods:
            seeds = {s: cur for (p, m, s), cur in curves.items() if p == label and m == method}
            stats: dict[int, dict[str, float]] = {}
            for s, cur in seeds.items():
                ns = np.array(sorted(cur))
                rm = np.array([cur[n]["rmse"] for n in ns])
                last = cur[ns[-1]]
                reached = ns[rm <= c.cells.rmse_threshold]
                q_times = [cur[n]["query_s"] for n in ns if cur[n]["unit"] >= 0]
                stats[s] = {
                    "complete": float(ns[-1] == final_n),
                    "rmse_final": last["rmse"], "auc": area_under_curve(ns, rm),
                    "rmse_small_n": cur[small_n]["rmse"] if small_n in cur else float("nan"),
                    "nlpd_final": last["nlpd"], "coverage_final": last["coverage"],
                    "brier_final": last.get("brier", float("nan")),
                    "to_threshold": float(reached[0]) if len(reached) else float("inf"),
                    "query_ms": 1000 * float(np.mean(q_times)) if q_times else float("nan"),
                    # largest change of the fitted P(t=1 | x, z) across z: the data's view of relevance
                    "first_stage_effect": float(last.get("first_stage_effect", float("nan"))),
                }
            per_seed[method] = stats
            agg: dict[str, Any] = {"cells": len(stats), "complete": int(sum(v["complete"] for v in stats.values()))}
            for key in ("rmse_final", "auc", "rmse_small_n", "nlpd_final", "coverage_final", "brier_final",
                        "query_ms", "first_stage_effect"):
                agg[key], agg[key + "_se"] = _mean_se([v[key] for v in stats.values()])
            hits = [v["to_threshold"] for v in stats.values()]
            agg["reached_threshold"] = float(np.mean(np.isfinite(hits))) if hits else float("nan")
            # inf (-> None in summary.json) when at most half of the seeds reached the threshold
            agg["to_threshold_median"] = float(np.median(hits)) if hits else float("nan")
            per_method[method] = agg
        paired: dict[str, Any] = {}
        if "ivig" in per_seed:
            for base in (m for m in c.cells.methods if m != "ivig"):
                common = sorted(set(per_seed["ivig"]) & set(per_seed[base]))
                entry: dict[str, float] = {"seeds": len(common)}
                for key in ("rmse_final", "auc", "rmse_small_n"):
                    d = [per_seed["ivig"][s][key] - per_seed[base][s][key] for s in common]
                    entry[key + "_diff"], entry[key + "_diff_se"] = _mean_se(d)
                    entry[key + "_ivig_wins"] = float(np.mean([x < 0 for x in d])) if d else float("nan")
                paired[base] = entry
        effects = [a["first_stage_effect"] for a in per_method.values() if np.isfinite(a["first_stage_effect"])]
        weak = bool(effects) and float(np.mean(effects)) < WEAK_FITTED_EFFECT
        if weak:
            log.warning("ivdesign: %s: the fitted first stage moves P(t=1) by only %.3f across instrument levels; "
                        "the instrument looks weak in the data", label, float(np.mean(effects)))
        out["populations"][label] = {"env": spec.env, "target": targets.get(label, ""), "methods": per_method,
                                     "ivig_minus_baseline": paired, "weak_instrument_in_data": weak}
    out["claims"] = check_claims(out)
    return out


def finite_or_none(obj: Any) -> Any:
    """NaN and infinities become None, so that summary.json is strict JSON."""
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [finite_or_none(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def check_claims(summary: dict[str, Any]) -> dict[str, Any]:
    """Does IVIG have the lowest final RMSE and area under the curve on each population?"""
    claims: dict[str, Any] = {}
    for label, pop in summary["populations"].items():
        methods = pop["methods"]
        if "ivig" not in methods or len(methods) < 2:
            continue
        others = [m for m in methods if m != "ivig"]
        claims[label] = {
            "ivig_lowest_rmse_final": bool(all(methods["ivig"]["rmse_final"] < methods[m]["rmse_final"] for m in others)),
            "ivig_lowest_auc": bool(all(methods["ivig"]["auc"] < methods[m]["auc"] for m in others)),
            "ivig_lowest_rmse_small_n": bool(all(methods["ivig"]["rmse_small_n"] < methods[m]["rmse_small_n"]
                                                 for m in others)),
            "margin_rmse_final_vs_best_baseline": float(
                min(methods[m]["rmse_final"] for m in others) - methods["ivig"]["rmse_final"]),
            "margin_auc_vs_best_baseline": float(min(methods[m]["auc"] for m in others) - methods["ivig"]["auc"]),
        }
    return claims


# -- report ----------------------------------------------------------------------------------
def _f(v: float | None, se: float | None = None, digits: int = 3) -> str:
    if v is None or not np.isfinite(v):
        return "–"
    s = f"{v:.{digits}f}"
    return s + (f" ± {se:.{digits}f}" if se is not None and np.isfinite(se) and se > 0 else "")


def report_tables(summary: dict[str, Any]) -> list[str]:
    """Markdown: one table per population, paired IVIG-vs-baseline differences, the claim check."""
    if not summary.get("populations"):
        return []
    q, seeds = summary["queries"], summary["seeds"]
    lines = ["## Target-CATE accuracy", "",
             f"Mean ± standard error over {seeds} seeds. RMSE of the posterior mean of tau at the target "
             f"units after {q} queries and after 10; AUC = mean RMSE along the curve from n = "
             f"{summary['initial']} to {q}; NLPD (mean marginal) and 90% interval coverage at n = {q}; "
             f"expected first-stage Brier score over pool x instrument levels; median n to reach RMSE <= "
             f"{summary['rmse_threshold']} (– when half the seeds or more never reach it) and the share of "
             "seeds that reach it; ms per query including the refits.", ""]
    for label, pop in summary["populations"].items():
        lines += [f"### {label} ({pop['env']}; target: {pop['target']})", "",
                  f"| method | RMSE@{q} | AUC | RMSE@10 | NLPD | coverage90 | Brier | n to threshold | reached | "
                  "ms/query |", "|---|---|---|---|---|---|---|---|---|---|"]
        for m, a in pop["methods"].items():
            lines.append(f"| {m} | {_f(a['rmse_final'], a['rmse_final_se'])} | {_f(a['auc'], a['auc_se'])} | "
                         f"{_f(a['rmse_small_n'], a['rmse_small_n_se'])} | {_f(a['nlpd_final'])} | "
                         f"{_f(a['coverage_final'], digits=2)} | {_f(a['brier_final'])} | "
                         f"{_f(a['to_threshold_median'], digits=0)} | {_f(a['reached_threshold'], digits=2)} | "
                         f"{_f(a['query_ms'], digits=1)} |")
        if pop["ivig_minus_baseline"]:
            lines += ["", "IVIG minus baseline, paired by seed (negative: IVIG better; wins = share of seeds):", "",
                      f"| baseline | ΔRMSE@{q} | wins | ΔAUC | wins | ΔRMSE@10 | wins |", "|---|---|---|---|---|---|---|"]
            for b, e in pop["ivig_minus_baseline"].items():
                lines.append(f"| {b} | {_f(e['rmse_final_diff'], e['rmse_final_diff_se'])} | "
                             f"{_f(e['rmse_final_ivig_wins'], digits=2)} | {_f(e['auc_diff'], e['auc_diff_se'])} | "
                             f"{_f(e['auc_ivig_wins'], digits=2)} | "
                             f"{_f(e['rmse_small_n_diff'], e['rmse_small_n_diff_se'])} | "
                             f"{_f(e['rmse_small_n_ivig_wins'], digits=2)} |")
        if pop.get("weak_instrument_in_data"):
            lines += ["", f"**Warning:** the fitted first stage moves P(t=1) by less than {WEAK_FITTED_EFFECT} across "
                      "instrument levels: the instrument looks weak in the data, and the CATE is barely identified."]
        lines.append("")
    if summary.get("claims"):
        lines += ["## Claim check", "", "| population | IVIG lowest RMSE@end | IVIG lowest AUC | IVIG lowest RMSE@10 | "
                  "margin RMSE@end | margin AUC |", "|---|---|---|---|---|---|"]
        for label, cl in summary["claims"].items():
            lines.append(f"| {label} | {cl['ivig_lowest_rmse_final']} | {cl['ivig_lowest_auc']} | "
                         f"{cl['ivig_lowest_rmse_small_n']} | {_f(cl['margin_rmse_final_vs_best_baseline'])} | "
                         f"{_f(cl['margin_auc_vs_best_baseline'])} |")
        lines.append("")
    if summary.get("plots"):
        lines += ["## Learning curves and designs", ""] + [f"![{Path(p).stem}](plots/{p})" for p in summary["plots"]]
        lines.append("")
    if summary.get("faults_detail"):
        lines += ["## Failed cells", ""] + [f"- `{f['cell']}`: {f['error']}" for f in summary["faults_detail"]] + [""]
    return ["\n".join(lines)]


def write_plots(rows: list[dict[str, Any]], config: IVDesignConfig, plots_dir: Path,
                truths: dict[str, dict[str, Any]]) -> list[str]:
    """RMSE-vs-queries curves per population, and where each method queried (1-D populations)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    labels = [p.label for p in config.cells.populations]
    methods = list(config.cells.methods)
    colours = {m: f"C{i}" for i, m in enumerate(methods)}
    by_pm = _group(rows, ("population", "method"))
    cols = min(3, len(labels))
    nrows = math.ceil(len(labels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.4 * nrows), squeeze=False)
    for ax, label in zip(axes.flat, labels, strict=False):
        for m in methods:
            by_n = _group(by_pm.get((label, m), []), ("n",))
            if not by_n:
                continue
            ns = np.array(sorted(k[0] for k in by_n))
            vals = [np.array([r["rmse"] for r in by_n[(n,)]]) for n in ns]
            mean = np.array([v.mean() for v in vals])
            se = np.array([v.std() / math.sqrt(len(v)) for v in vals])
            ax.plot(ns, mean, color=colours[m], label=m, lw=1.6 if m == "ivig" else 1.1)
            ax.fill_between(ns, mean - se, mean + se, color=colours[m], alpha=0.15)
        ax.set_title(label, fontsize=9)
        ax.set_xlabel("queries")
        ax.set_ylabel("target-CATE RMSE")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(labels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.tight_layout()
    written.append(_save(fig, plots_dir / "rmse_curves.png", plt))

    one_d = [lb for lb in labels if lb in truths and np.asarray(truths[lb]["X_pool"]).shape[1] == 1]
    if one_d:
        fig, axes = plt.subplots(1, len(one_d), figsize=(4.8 * len(one_d), 3.4), squeeze=False)
        for ax, label in zip(axes.flat, one_d, strict=True):
            tr = truths[label]
            xp = np.asarray(tr["X_pool"])[:, 0]
            ax2 = ax.twinx()
            ax2.plot(xp, np.asarray(tr["propensity"])[:, -1], "k:", lw=1, label="P(t=1 | z=max)")
            ax2.plot(xp, np.asarray(tr["propensity"])[:, 0], "k-.", lw=0.8, label="P(t=1 | z=0)")
            ax2.set_ylim(0, 1)
            ax2.set_ylabel("compliance", fontsize=8)
            xt = np.asarray(tr["X_target"])[:, 0]
            ax.axvspan(xt.min(), xt.max(), color="gold", alpha=0.15, label="target")
            bins = np.linspace(xp.min(), xp.max(), 22)
            for m in methods:
                units = [r["unit"] for r in by_pm.get((label, m), []) if r["unit"] >= 0]
                if units:
                    ax.hist(xp[np.asarray(units)], bins=bins, histtype="step", color=colours[m], label=m,
                            density=True)
            ax.set_title(f"{label}: where each method queried", fontsize=9)
            ax.set_xlabel("x")
            ax.legend(fontsize=6, loc="upper left")
        fig.tight_layout()
        written.append(_save(fig, plots_dir / "query_locations.png", plt))
    return written


def _save(fig: Any, path: Path, plt: Any) -> str:
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path.name
