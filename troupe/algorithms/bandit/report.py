"""Figures and tables of a bandit sweep: regret curves, log–log regret vs B and vs T with fitted
slopes, bits used, the hypercube check, and the Markdown sections of ``report.md``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from troupe.algorithms.bandit.policies import POLICIES
from troupe.algorithms.bandit.sweep import group_results, mean_curve, mean_se

_ORDER = ("unquantised", "bitpe", "bitpe_safe", "sign_bit", "dither", "etc", "linucb")


def _sorted_policies(names: set[str]) -> list[str]:
    return sorted(names, key=lambda p: (_ORDER.index(p) if p in _ORDER else len(_ORDER), p))


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    tmp = path.with_suffix(".tmp.png")
    fig.tight_layout()
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def write_plots(results: list[dict[str, Any]], summary: dict[str, Any], plots_dir: Path) -> list[Path]:
    """PNG files into ``plots_dir``; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plots_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    main = summary.get("main")
    if main:
        at = [r for r in results if r["group"] == "main" and r["horizon"] == main["T"]
              and r["d"] == main["d"] and r["k"] == main["k"]]
        batched = sorted({r["batch"] for r in at if POLICIES[r["policy"]].batched}) or sorted({r["batch"] for r in at})
        policies = _sorted_policies({r["policy"] for r in at})
        # regret curves, one panel per B
        cols = min(len(batched), 4)
        rows_n = math.ceil(len(batched) / cols)
        fig, axes = plt.subplots(rows_n, cols, figsize=(4 * cols, 3.3 * rows_n), squeeze=False)
        for ax, b in zip(axes.flat, batched, strict=False):
            for p in policies:
                g = [r for r in at if r["policy"] == p and (r["batch"] == b or not POLICIES[p].batched)]
                if g:
                    t, reg = mean_curve(g)
                    ax.loglog(t, np.maximum(reg, 1e-9), label=p)
            ax.set_title(f"B={b}, T={main['T']}")
            ax.set_xlabel("pulls t")
            ax.set_ylabel("regret R(t)")
            ax.grid(alpha=0.3, which="both")
        axes.flat[0].legend(fontsize=7)
        for ax in list(axes.flat)[len(batched):]:
            ax.axis("off")
        written.append(_save(fig, plots_dir / "bandit_regret_curves.png"))
        # regret vs B
        fig, ax = plt.subplots(figsize=(6, 4))
        for p in policies:
            pts = sorted((row["B"], row["regret"]) for row in main["table"] if row["policy"] == p)
            if not POLICIES[p].batched and pts:
                ax.axhline(pts[0][1], ls=":", color="grey", label=f"{p} (unbatched)")
                continue
            if pts:
                bs, ms = zip(*pts, strict=True)
                s = main["slope_vs_B"].get(p, math.nan)
                ax.loglog(bs, ms, "o-", label=f"{p} (slope {s:.2f})")
        ax.set_xlabel("batch size B")
        ax.set_ylabel(f"regret at T={main['T']}")
        ax.set_title("regret vs B (log-log, fitted slopes)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        written.append(_save(fig, plots_dir / "bandit_regret_vs_B.png"))
        # regret vs T at the smallest B
        b0 = batched[0]
        fig, ax = plt.subplots(figsize=(6, 4))
        drew = False
        for p in policies:
            sub = [r for r in results if r["group"] == "main" and r["policy"] == p and r["d"] == main["d"]
                   and r["k"] == main["k"] and (r["batch"] == b0 or not POLICIES[p].batched)]
            pts = sorted((t, mean_se(r["regret"] for r in g)[0]) for (t,), g in group_results(sub, ("horizon",)).items())
            if len(pts) > 1:
                ts, ms = zip(*pts, strict=True)
                s = main["slope_vs_T"].get(p, {}).get(str(b0 if POLICIES[p].batched else 1), math.nan)
                ax.loglog(ts, ms, "o-", label=f"{p} (slope {s:.2f})")
                drew = True
            elif pts:  # one horizon: the anytime curve stands in for regret vs T
                t, reg = mean_curve(sub)
                ax.loglog(t, np.maximum(reg, 1e-9), label=p)
                drew = True
        if drew:
            ax.set_xlabel("horizon T")
            ax.set_ylabel("regret")
            ax.set_title(f"regret vs T at B={b0} (log-log, fitted after burn-in)")
            ax.grid(alpha=0.3, which="both")
            ax.legend(fontsize=7)
            written.append(_save(fig, plots_dir / "bandit_regret_vs_T.png"))
        else:
            plt.close(fig)
        # bits used vs B
        fig, ax = plt.subplots(figsize=(6, 4))
        for p in policies:
            pts = sorted((row["B"], row["bits"]) for row in main["table"] if row["policy"] == p and row["bits"] > 0)
            if pts:
                bs, bits = zip(*pts, strict=True)
                ax.loglog(bs, bits, "o-", label=p)
        ax.set_xlabel("batch size B")
        ax.set_ylabel("bits used")
        ax.set_title(f"bits of feedback at T={main['T']}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
        written.append(_save(fig, plots_dir / "bandit_bits_vs_B.png"))
    cube = summary.get("hypercube")
    if cube:
        fig, ax = plt.subplots(figsize=(6, 4))
        for (p, b), g in sorted(group_results(cube["table"], ("policy", "B")).items()):
            g = sorted(g, key=lambda r: r["log2_k"])
            ax.errorbar([r["log2_k"] for r in g], [r["regret_per_B"] for r in g], yerr=[r["se"] for r in g],
                        marker="o", capsize=2, label=f"{p}, B={b}")
        bound = sorted({(r["log2_k"], r["lower_bound_per_B"]) for r in cube["table"]
                        if r.get("lower_bound_per_B") is not None})
        if bound:
            ax.plot(*zip(*bound, strict=True), "k--", lw=1, label="lower bound m·Δmin/2")
        ax.set_yscale("log")
        ax.set_xlabel("log2 k (hypercube dimension m)")
        ax.set_ylabel("regret / B")
        ax.set_title("hypercube instances: regret per batch size vs log k")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        written.append(_save(fig, plots_dir / "bandit_hypercube.png"))
    return written


def _f(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def markdown_sections(summary: dict[str, Any]) -> list[str]:
    """Tables for ``report.md``: claims, regret by policy and B, slopes, the hypercube check."""
    sections = []
    claims = summary.get("claims", [])
    if claims:
        lines = ["## What the sweep shows", "", "| claim | measured | reproduced |", "|---|---|---|"]
        lines += [f"| {c['claim']} | {_f(c['measured'])} | {_f(c['reproduced'])} |" for c in claims]
        sections.append("\n".join(lines))
    main = summary.get("main")
    if main:
        lines = [f"## Regret at T={main['T']} (d={main['d']}, k={main['k']}; mean ± s.e. over seeds)", "",
                 "| policy | B | regret | s.e. | seeds | × unquantised | bits | best arm eliminated | committed to best |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(main["table"], key=lambda r: (r["B"], _ORDER.index(r["policy"])
                                                        if r["policy"] in _ORDER else 99)):
            lines.append(f"| {r['policy']} | {r['B']} | {_f(r['regret'])} | {_f(r['se'])} | {r['n']} | "
                         f"{_f(r['ratio_to_unquantised'])} | {_f(r['bits'])} | {_f(r['best_eliminated_rate'])} | "
                         f"{_f(r['committed_best_rate'])} |")
        sections.append("\n".join(lines))
        lines = ["## Log–log slopes", "", "| policy | regret vs B | excess over unquantised vs B | "
                 "regret vs T (per B) | curve R(t) after burn-in (per B) |", "|---|---|---|---|---|"]
        for p in _sorted_policies(set(main["curve_slope_vs_t"])):
            vt = ", ".join(f"B={b}: {_f(s)}" for b, s in sorted(main["slope_vs_T"].get(p, {}).items(),
                                                                   key=lambda kv: int(kv[0])))
            vc = ", ".join(f"B={b}: {_f(s)}" for b, s in sorted(main["curve_slope_vs_t"][p].items(),
                                                                   key=lambda kv: int(kv[0])))
            lines.append(f"| {p} | {_f(main['slope_vs_B'].get(p))} | {_f(main['excess_slope_vs_B'].get(p))} | "
                         f"{vt or '–'} | {vc or '–'} |")
        local = main.get("local_slopes_vs_T", {})
        spans = sorted({(int(t0), int(t1)) for per_b in local.values() for segs in per_b.values()
                        for t0, t1, _ in segs})
        if spans:
            lines += ["", "Slope between consecutive horizons (√T gives 0.5; once every suboptimal arm is "
                      "eliminated the instance-dependent log T regime gives about 0):", "",
                      "| policy | B | " + " | ".join(f"{t0}→{t1}" for t0, t1 in spans) + " |",
                      "|---|---|" + "---|" * len(spans)]
            for p in _sorted_policies(set(local)):
                for b, segs in sorted(local[p].items(), key=lambda kv: int(kv[0])):
                    got = {(int(t0), int(t1)): sl for t0, t1, sl in segs}
                    lines.append(f"| {p} | {b} | " + " | ".join(_f(got.get(sp)) for sp in spans) + " |")
        for key, label in (("slope_vs_d", "log–log slope of regret vs d"),
                           ("slope_vs_log_k", "log–log slope of regret vs log k")):
            if key in main:
                lines += ["", f"{label}: " + ", ".join(f"{n}: {_f(s)}" for n, s in sorted(main[key].items()))]
        sections.append("\n".join(lines))
    cube = summary.get("hypercube")
    if cube:
        lines = ["## Hypercube (lower-bound) instances: regret / B", "",
                 "| policy | B | log2 k | regret / B | s.e. | bits | lower bound m·Δmin/2 |",
                 "|---|---|---|---|---|---|---|"]
        for r in cube["table"]:
            lines.append(f"| {r['policy']} | {r['B']} | {r['log2_k']} | {_f(r['regret_per_B'])} | {_f(r['se'])} | "
                         f"{_f(r['bits'])} | {_f(r.get('lower_bound_per_B'))} |")
        lines += ["", "Growth with log k: " + ", ".join(
            f"{n}: {'increasing' if v['increasing'] else 'not monotone'} (log-log slope {_f(v['slope_vs_log_k'])})"
            for n, v in cube["growth"].items())]
        sections.append("\n".join(lines))
    return sections

