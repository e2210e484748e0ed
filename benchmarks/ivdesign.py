"""Benchmark of `ivdesign`: IVIG against random, outcome-variance and marginal-variance queries.

Part 1 runs seeds x methods x populations through the driver (in parallel on Ray):
the 1-D population of ALGORITHMS.md §F.6 with the target inside (x >= 0.5) and outside
(x <= -0.5) the strong-compliance region, the multi-level instrument, the 2-D covariates and
the semi-synthetic tables (IHDP- and 401(k)-shaped). Part 2 times one query as the pool grows
(n = 50..400 units) and as observations accumulate, for the rank-1 update against two batch
recomputes of the posterior. Results go to benchmarks/results/ivdesign.json.

    python benchmarks/ivdesign.py                 # 20 seeds: 7-12 minutes on 2 cores (load-dependent)
    python benchmarks/ivdesign.py --seeds 3 --quick
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")  # one BLAS thread per process: the workers are the parallelism

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent
REFERENCE_RMSE_AT_40 = {"random": 0.94, "outcome_variance": 0.92, "marginal_variance": 0.82, "ivig": 0.50}
POPULATIONS = [
    {"env": "iv_1d", "label": "1d_strong", "params": {"target": "strong"}},
    {"env": "iv_1d", "label": "1d_weak", "params": {"target": "weak"}},
    {"env": "iv_multilevel", "label": "multilevel", "params": {"target": "strong"}},
    {"env": "iv_2d", "label": "2d", "params": {"target": "strong"}},
    {"env": "iv_table", "label": "ihdp_like", "params": {"table": "ihdp", "pool": 500}},
    {"env": "iv_table", "label": "401k_like", "params": {"table": "401k", "pool": 500}},
]


def run_comparison(seeds: int, queries: int, populations: list[dict], workers: int, out: Path) -> dict:
    import troupe.algorithms.ivdesign  # noqa: F401  (registers the algorithm)
    from troupe.algorithms.ivdesign.algorithm import IVDesignConfig
    from troupe.platform.config import from_dict
    from troupe.platform.driver import Run

    cfg = from_dict(IVDesignConfig, {
        "run": {"steps": 8 if queries - 3 >= 8 else queries - 3, "seed": 0, "eval_every": 0,
                "checkpoint_every": 0, "progress": True, "num_cpus": workers},
        "cells": {"populations": populations, "seeds": seeds,
                  "methods": ["ivig", "random", "outcome_variance", "marginal_variance"]},
        "design": {"queries": queries, "initial": 3},
        "workers": {"count": workers, "num_cpus": 1.0},
    })
    t0 = time.perf_counter()
    shutil.rmtree(out, ignore_errors=True)  # a previous comparison's run there: start afresh
    with Run("ivdesign", config=cfg, out=out) as run:
        summary = run.run()
    summary["wall_s"] = time.perf_counter() - t0
    return summary


def time_queries(sizes: list[int], observations: list[int], repeats: int = 5) -> dict:
    """Seconds per query: IVIG over every candidate, then the posterior update three ways."""
    from troupe.algorithms.ivdesign.acquisition import ivig_scores
    from troupe.algorithms.ivdesign.experiment import DesignConfig, Experimenter
    from troupe.algorithms.ivdesign.model import GPIVPosterior, ModelConfig, batch_posterior, design_matrix
    from troupe.envs.iv_population import IV1D

    def best_of(fn, k=repeats):
        times = []
        for _ in range(k):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return float(np.min(times))

    def measure(pop, n_obs: int, refits: bool) -> dict:
        cfg = ModelConfig(refit_every=5 if refits else 10**9, restarts=2)
        ex = Experimenter(pop.info(), "random", 0, DesignConfig(queries=n_obs + 1, initial=3), cfg)
        rng = np.random.default_rng(0)

        def ask(u, k):
            return pop.draw(u, k, rng)

        ex.start(ask)
        refit_time = ex.refit_s
        while len(ex.obs) < n_obs:
            ex.query(ask)
        refit_time = ex.refit_s - refit_time
        post, cands = ex.post, ex.candidates()
        eta = ex.first_stage.eta(pop.X_pool[np.asarray(ex.units)], ex.obs.z)
        from troupe.algorithms.ivdesign.model import inverse_mills, observation_noise

        lam, noise = inverse_mills(eta, ex.obs.t), observation_noise(ex.hyper, eta, ex.obs.t)
        prior = GPIVPosterior.prior(ex.grid, ex.hyper, cfg.tau_mean)
        g, t, y = ex.obs.g, ex.obs.t, ex.obs.y
        scratch = post.copy()
        acq = best_of(lambda: ivig_scores(post, cands, ex.target_g))
        rank1 = best_of(lambda: scratch.update(int(g[-1]), t[-1], lam[-1], y[-1], noise[-1]))
        batch_fn = best_of(lambda: batch_posterior(prior, g, t, lam, y, noise), k=max(2, repeats // 2))

        def precision_form():
            H = design_matrix(g, t, lam, prior.m)
            P = np.linalg.inv(prior.cov + 1e-9 * np.eye(len(prior.cov))) + H.T @ (H / noise[:, None])
            np.linalg.inv(P)

        batch_prec = best_of(precision_form, k=2)
        return {"dim": len(post.mean), "acquisition_s": acq, "rank1_update_s": rank1,
                "batch_function_space_s": batch_fn, "batch_precision_s": batch_prec,
                "query_rank1_s": acq + rank1, "query_batch_precision_s": acq + batch_prec,
                "refit_s_per_query": refit_time / max(1, n_obs - 3) if refits else None}

    target = list(np.linspace(0.5, 2.0, 16))  # a fixed target of 16 units while the pool grows
    by_pool = {}
    for n in sizes:
        by_pool[n] = measure(IV1D(grid_size=n, target_points=target), 40, refits=True)
        print(f"  pool n={n:4d}: " + ", ".join(f"{k}={v * 1e3:.2f}ms" for k, v in by_pool[n].items()
                                               if k.endswith("_s") and v is not None), flush=True)
    by_obs = {}
    for n_obs in observations:
        by_obs[n_obs] = measure(IV1D(), n_obs, refits=False)
        print(f"  observations N={n_obs:4d}: " + ", ".join(f"{k}={v * 1e3:.2f}ms" for k, v in by_obs[n_obs].items()
                                                        if k.endswith("_s") and v is not None), flush=True)

    def slope(table: dict, key: str) -> float:
        xs = np.log(list(table))
        ys = np.log([row[key] for row in table.values()])
        return float(np.polyfit(xs, ys, 1)[0])

    keys = ("acquisition_s", "rank1_update_s", "batch_function_space_s", "batch_precision_s", "query_rank1_s",
            "query_batch_precision_s")
    return {
        "what": "seconds per query, best of repeats; IVIG over every (unit, z) candidate, then the posterior "
                "update by rank-1 Kalman step, by a batch recompute in function space (O(N D^2 + N^3)) and by a "
                "batch recompute in precision form (O(D^3)); D = 2 x (pool units + target units) + 1. "
                "by_pool_size: iv_1d with grid_size = n and a fixed 16-unit target, after 40 observations with EB "
                "refits every 5 (refit_s_per_query amortises them). by_observations: the 41-unit pool after N "
                "observations (rank-1 updates only).",
        "by_pool_size": {str(k): v for k, v in by_pool.items()},
        "by_observations": {str(k): v for k, v in by_obs.items()},
        "loglog_slope_vs_pool_size": {k: slope(by_pool, k) for k in keys},
        "loglog_slope_vs_observations": {k: slope(by_obs, k) for k in keys},
    }


def print_table(summary: dict) -> None:
    q = summary["queries"]
    print(f"\nTarget-CATE RMSE@{q} / AUC / RMSE@10 (mean over {summary['seeds']} seeds)")
    for label, pop in summary["populations"].items():
        print(f"\n{label}  (target: {pop['target']})")
        print(f"  {'method':18s} {'RMSE@' + str(q):>14s} {'AUC':>14s} {'RMSE@10':>8s} {'cov90':>6s} {'Brier':>6s}")
        for m, a in pop["methods"].items():
            print(f"  {m:18s} {a['rmse_final']:7.3f}±{a['rmse_final_se']:.3f} {a['auc']:7.3f}±{a['auc_se']:.3f} "
                  f"{a['rmse_small_n']:8.3f} {a['coverage_final']:6.2f} {a['brier_final']:6.3f}")
    print("\nclaims:", {k: (v["ivig_lowest_rmse_final"], v["ivig_lowest_auc"]) for k, v in summary["claims"].items()})


def claims(result: dict) -> list[dict]:
    """The top-level claims list: per population, §F.6's IVIG has the lowest target-CATE RMSE
    at the last query and the lowest area under the RMSE curve (``measured``: the best
    baseline's figure minus IVIG's, > 0 when IVIG is lowest); and IVIG's RMSE margin is larger
    with the target where compliance is strong than where it is weak."""
    comp = result.get("comparison") or {}
    q = comp.get("queries")
    out = []
    for pop, c in (comp.get("claims") or {}).items():
        out.append({"claim": f"{pop}: IVIG has the lowest target-CATE RMSE@{q} of all methods",
                    "measured": c["margin_rmse_final_vs_best_baseline"], "holds": bool(c["ivig_lowest_rmse_final"])})
        out.append({"claim": f"{pop}: IVIG has the lowest area under the RMSE curve of all methods",
                    "measured": c["margin_auc_vs_best_baseline"], "holds": bool(c["ivig_lowest_auc"])})
    pops = comp.get("claims") or {}
    if "1d_strong" in pops and "1d_weak" in pops:
        gap = (pops["1d_strong"]["margin_rmse_final_vs_best_baseline"]
               - pops["1d_weak"]["margin_rmse_final_vs_best_baseline"])
        out.append({"claim": "IVIG's RMSE margin over the best baseline is larger with the target where compliance "
                             "is strong (1d_strong) than where it is weak (1d_weak)",
                    "measured": gap, "holds": bool(gap > 0)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--queries", type=int, default=40)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="only the 1-D populations, and a short timing study")
    ap.add_argument("--out", default=str(ROOT / "results" / "ivdesign.json"))
    args = ap.parse_args()

    from troupe.platform.checkpoint import atomic_write_json

    pops = POPULATIONS[:2] if args.quick else POPULATIONS
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    t0 = time.perf_counter()
    print("timing study ...", flush=True)
    timing = time_queries([50, 100] if args.quick else [50, 100, 200, 400],
                          [50, 100] if args.quick else [50, 100, 200, 400])
    print(f"comparison: {args.seeds} seeds x 4 methods x {len(pops)} populations, {args.queries} queries ...", flush=True)
    run_dir = Path("runs") / f"bench-ivdesign-{time.strftime('%Y%m%d-%H%M%S')}"
    summary = run_comparison(args.seeds, args.queries, pops, args.workers, run_dir)
    print_table(summary)
    result = {
        "benchmark": "ivdesign",
        "started": started,
        "wall_s": round(time.perf_counter() - t0, 1),
        "size": {"seeds": args.seeds, "methods": summary["methods"], "populations": [p["label"] for p in pops],
                 "queries": args.queries, "initial": 3, "workers": args.workers},
        "machine": {"cpus": os.cpu_count(), "load_avg_at_end": os.getloadavg(), "python": platform.python_version()},
        "reference_rmse_at_40_1d_strong": REFERENCE_RMSE_AT_40,
        "comparison": {k: summary[k] for k in ("queries", "seeds", "populations", "claims", "faults")
                       if k in summary},
        "comparison_wall_s": round(summary["wall_s"], 1),
        "run_dir": str(run_dir),
        "timing": timing,
    }
    result["claims"] = claims(result)
    atomic_write_json(args.out, result)
    print(f"\nwrote {args.out} ({result['wall_s']:.0f}s)")


if __name__ == "__main__":
    main()
