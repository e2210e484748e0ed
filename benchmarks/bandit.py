"""Benchmark: the §E.7 sweep of batched linear bandits with one bit per batch.

d=5, k=50 arms on the unit sphere, ||theta||=1, sigma=1, T=2^22, B in {16, 64, 256, 1024},
10 seeds, every policy; also T in {2^12, ..., 2^20} for the regret-vs-T slopes and the
noise-free hypercube instances. Cells run as learner–agent actor pairs on a local Ray cluster
(``--layout local`` runs them in this process). Writes ``benchmarks/results/bandit.json``
(figures, claims, wall time) and prints a table.

    python benchmarks/bandit.py                 # the full sweep
    python benchmarks/bandit.py --seeds 2       # a quick look
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

# Reference figures of §E.7 (independent numpy prototype), regret at T=2^22.
REFERENCE = {
    "unquantised": {"16": 12_000},
    "bitpe": {"16": 25_000, "64": 40_000, "256": 109_000, "1024": 402_000},
    "bitpe_safe": {"256": 98_000, "1024": 301_000},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--horizon", type=int, default=2**22)
    ap.add_argument("--horizons-for-slope", type=int, nargs="*", default=[2**12, 2**14, 2**16, 2**18, 2**20])
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[16, 64, 256, 1024])
    ap.add_argument("--policies", nargs="+", default=None, help="default: every policy")
    ap.add_argument("--no-hypercube", action="store_true")
    ap.add_argument("--mode", choices=["closed_form", "exact"], default="closed_form")
    ap.add_argument("--layout", choices=["ray", "local"], default="ray")
    ap.add_argument("--workers", type=int, default=2, help="learner–agent pairs on Ray")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "bandit.json"))
    args = ap.parse_args(argv)

    from troupe.algorithms.bandit.algorithm import BanditConfig, build_cells
    from troupe.algorithms.bandit.sweep import run_local, run_pairs, summarize_sweep
    from troupe.platform.checkpoint import atomic_write_json
    from troupe.platform.config import from_dict, to_dict

    cfg = from_dict(BanditConfig, {
        "sweep": {"seeds": args.seeds, "batch_sizes": args.batch_sizes, "mode": args.mode,
                  "horizons": sorted({*args.horizons_for_slope, args.horizon}),
                  **({"policies": args.policies} if args.policies else {})},
        "hypercube": {"enabled": not args.no_hypercube},
    })
    cells = build_cells(cfg)
    print(f"{len(cells)} cells ({args.layout}, {args.workers if args.layout == 'ray' else 1} worker(s))", flush=True)
    t0 = time.perf_counter()
    if args.layout == "local":
        results = run_local(cells, cfg.policy, cfg.sweep.curve_points)
    else:
        results = _run_on_ray(cells, cfg, args.workers, run_pairs)
    wall = time.perf_counter() - t0
    summary = summarize_sweep(results, cfg.sweep.burn_in, cfg.sweep.small_factor, (cells[0].d, cells[0].k))
    out = {
        "benchmark": "bandit",
        "wall_s": round(wall, 2),
        "cells": len(results),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "layout": args.layout,
        "config": to_dict(cfg),
        "reference_regret_T2^22": REFERENCE,
        "summary": summary,
    }
    out["claims"] = claims(out)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(args.out, out)
    _print_table(summary, wall)
    print(f"wrote {args.out}")
    return 0


def claims(result: dict) -> list[dict]:
    """The top-level claims list: each §E claim the sweep's summary judges, as
    ``{claim, measured, holds}`` (``holds`` is the summary's ``reproduced``)."""
    return [{"claim": c["claim"], "measured": c["measured"], "holds": bool(c["reproduced"])}
            for c in (result.get("summary") or {}).get("claims", [])]


def _run_on_ray(cells, cfg, workers, run_pairs):
    import ray

    from troupe.actors.bandit_agent import BanditAgent
    from troupe.algorithms.bandit.sweep import CellLearner
    from troupe.platform.config import to_dict

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=max(workers, 1), include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
    learners = [ray.remote(CellLearner).options(num_cpus=cfg.sweep.learner_cpus).remote(to_dict(cfg.policy), 600.0)
                for _ in range(workers)]
    agents = [ray.remote(BanditAgent).options(num_cpus=cfg.sweep.agent_cpus).remote() for _ in range(workers)]
    try:
        return run_pairs(cells, learners, agents, cfg.sweep.curve_points, timeout_s=600.0)
    finally:
        for h in learners + agents:
            ray.kill(h)
        if started:
            ray.shutdown()


def _print_table(summary: dict, wall: float) -> None:
    main = summary.get("main")
    if main:
        bs = sorted({r["B"] for r in main["table"]})
        policies = sorted({r["policy"] for r in main["table"]})
        cell = {(r["policy"], r["B"]): r for r in main["table"]}
        print(f"\nregret at T={main['T']} (mean ± s.e.; d={main['d']}, k={main['k']})")
        print(f"{'policy':<12}" + "".join(f"{'B=' + str(b):>22}" for b in bs) + f"{'slope vs B':>12}")
        for p in policies:
            row = ""
            for b in bs:
                r = cell.get((p, b))
                text = f"{r['regret']:,.0f} ± {r['se']:,.0f}" if r else "–"
                row += f"{text:>22}"
            print(f"{p:<12}{row}{main['slope_vs_B'].get(p, float('nan')):>12.2f}")
        print("\nbits used:", {p: {b: round(cell[(p, b)]["bits"]) for b in bs if (p, b) in cell} for p in policies})
        print("best arm eliminated (rate):",
              {p: {b: cell[(p, b)]["best_eliminated_rate"] for b in bs if (p, b) in cell} for p in policies})
        b0 = min(b for (p, b) in cell if p == "bitpe") if ("bitpe", bs[-1]) in cell else bs[0]
        for p in ("unquantised", "bitpe", "bitpe_safe"):
            segs = main.get("local_slopes_vs_T", {}).get(p, {}).get(str(b0))
            if segs:
                print(f"regret-vs-T slope between horizons, {p} B={b0}: "
                      + ", ".join(f"2^{int(t0).bit_length() - 1}→2^{int(t1).bit_length() - 1}: {sl:.2f}"
                                  for t0, t1, sl in segs))
    for c in summary.get("claims", []):
        print(f"[{'yes' if c['reproduced'] else 'no '}] {c['claim']}: {c['measured']:.3g}")
    print(f"wall time {wall:.1f} s")


if __name__ == "__main__":
    sys.exit(main())
