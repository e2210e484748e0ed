"""Benchmark of ALGORITHMS.md §B.5: distillation from a noisy expert in a tabular token MDP.

|V| = 3, ε = 0.3, a clean expert that hashes the whole prefix, H ∈ {2, 4, 8, 12, 16, 24},
N = 200 trajectories or student roll-outs, 20 seeds (each seed its own expert). J is exact along
the clean path. The benchmark is made of parts, each a section of the result file:

- ``tabular``: every method of `troupe.algorithms.opd.tabular` with uniform noise, and BC,
  OPD-KL and NE-OPD again when the expert depends on its last 2 tokens and the table is keyed alike;
- ``kernels``: BC and NE-OPD (logit access and majority votes) under each noise kernel (uniform,
  step, cyclic confusion) at ε ∈ {0.3, 0.6}; the confusion kernel loses the mode at ε ≥ 1/2;
- ``nsweep``: N ∈ {50, 200, 1000} for BC, OPD-KL and NE-OPD, and the N tabular BC needs for
  greedy J ≥ 0.9 on a fine grid, whose log is fitted against H (slope −log q expected);
- ``approx``: BC, OPD-KL and NE-OPD with an MLP student over hashed n-gram features, for an
  expert of the last 2 tokens and for the whole-prefix expert (§B.5's caveat);
- ``lm``: the language-model sweep, which lives in ``benchmarks/opd_lm.py`` (see `load_lm`).

Writes ``benchmarks/results/opd.json`` (the sections run now, those of the parts not run kept
from the file as it was, and one top-level ``claims`` list over all of them) and
``benchmarks/results/opd.png``, and prints the tables.

    python benchmarks/opd.py                     # about 4 minutes on 2 busy cores
    python benchmarks/opd.py --parts approx --approx-seeds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

RESULTS = Path(__file__).parent / "results"
# §B.5's expected figures [REF]: (method, H) -> (J at T=1, J greedy); None where it names none.
REFERENCE = {
    ("bc", 8): (0.168, None), ("opd_kl", 8): (0.168, None),
    ("bc", 16): (None, 0.95), ("bc", 24): (None, 0.35), ("opd_kl", 24): (None, 0.05),
    **{("ne_opd", h): (1.0, 1.0) for h in (2, 4, 8, 12, 16, 24)},
}
SWEEP_METHODS = ("bc", "opd_kl", "ne_opd")
KERNEL_METHODS = ("bc", "ne_opd", "ne_opd_vote")
CLOSED_FORM_TOL = 0.02  # how near the seed mean of J at T=1 must be to q^H
EXACT = 1 - 1e-9  # "J = 1.0": every seed succeeds
LOST_MODE_J = 0.01  # "learns the wrong action": greedy J at most this at every H
SLOPE_TOL = 0.25  # relative: the fitted slope of log N_needed on H against -log q

# The "lm" part is the language-model sweep of benchmarks/opd_lm.py, a module that exposes
#     run(args: argparse.Namespace) -> dict     its section of opd.json (JSON-serialisable)
#     claims(section: dict) -> list[dict]        {"claim", "measured", "holds"} entries
# and, if it has options of its own, add_args(parser: argparse.ArgumentParser) -> None.
# Its claims come after those of the built-in parts.
LM_PART = "lm"
LM_MODULE = Path(__file__).parent / "opd_lm.py"


def load_lm() -> ModuleType:
    """benchmarks/opd_lm.py as a module, or exit saying it is missing."""
    if not LM_MODULE.exists():
        raise SystemExit(f"opd.py --parts {LM_PART}: {LM_MODULE} does not exist. The language-model sweep is that "
                         "module (run(args) -> dict, claims(section) -> list); drop lm from --parts until it is there.")
    spec = importlib.util.spec_from_file_location("opd_lm", LM_MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mean_ci(values: list[float]) -> dict[str, float]:
    """Mean and a normal 95% interval over seeds."""
    from troupe.platform.metrics import mean_se

    m, se, _ = mean_se(values)
    return {"mean": m, "lo": m - 1.96 * se, "hi": m + 1.96 * se}


def summarise(raw: dict) -> dict:
    return {m: {h: {k: mean_ci(v) for k, v in cell.items()} for h, cell in per_h.items()} for m, per_h in raw.items()}


def j(summary: dict, method: str, h: int, metric: str) -> float:
    return summary[method][str(h)][metric]["mean"]


def print_j(title: str, summary: dict, hs: list[int], tokens: bool = False) -> None:
    print(f"\n{title}")
    print("method        " + "  ".join(f"H={h:<10d}" for h in hs) + (f"  teacher tokens at H={hs[-1]}" if tokens else ""))
    for m, per_h in summary.items():
        cells = [f"{per_h[str(h)]['j_t1']['mean']:.2f}/{per_h[str(h)]['j_greedy']['mean']:.2f}".ljust(12) for h in hs]
        print(f"{m:<13} " + "  ".join(cells)
              + (f"  {per_h[str(hs[-1])]['teacher_tokens']['mean']:,.0f}" if tokens else ""))


def base_config(args: argparse.Namespace, **changes):
    """The run's `TabularConfig` (ε, N from the command line), with ``changes``."""
    from troupe.algorithms.opd import tabular

    return tabular.TabularConfig(**{"eps": args.eps, "episodes": args.episodes, **changes})


# -- part "tabular" ---------------------------------------------------------------------------------
def run_tabular(args: argparse.Namespace) -> dict:
    from troupe.algorithms.opd import noise, tabular

    cfg, hs = base_config(args), args.horizons
    raw = tabular.sweep(tabular.METHODS, tuple(hs), args.seeds, cfg)
    summary = summarise(raw)
    print_j(f"J at T=1 / greedy, mean over {args.seeds} seeds (N={args.episodes}, eps={args.eps}, |V|={cfg.vocab})",
            summary, hs, tokens=True)
    print("reference (§B.5): noisy expert at T=1 " + ", ".join(
        f"H={h} {noise.success_prob_sampling(args.eps, cfg.vocab, h):.3f}" for h in hs))
    checks = []
    for (m, h), (want_t1, want_g) in REFERENCE.items():
        if m in summary and str(h) in summary[m]:
            checks.append({"method": m, "H": h, "j_t1": j(summary, m, h, "j_t1"), "expected_j_t1": want_t1,
                           "j_greedy": j(summary, m, h, "j_greedy"), "expected_j_greedy": want_g})
    section = {"config": {"tabular_config": dataclasses.asdict(cfg), "seeds": args.seeds, "horizons": hs},
               "summary": summary, "reference_checks": checks, "raw": raw}
    if args.context:
        keyed = summarise(tabular.sweep(SWEEP_METHODS, tuple(hs), args.seeds, dataclasses.replace(cfg, context=args.context)))
        print_j(f"the expert of the last {args.context} tokens, a table keyed alike (N={args.episodes})", keyed, hs)
        section["expert_of_last_tokens"] = {"context": args.context, "summary": keyed}
    return section


def tabular_claims(section: dict) -> list[dict]:
    """§B.5's expected behaviours at N = the run's episodes, on the seed means."""
    s, tc = section["summary"], section["config"]["tabular_config"]
    hs = sorted(int(h) for h in s["ne_opd"])
    q = 1 - tc["eps"] + tc["eps"] / tc["vocab"]
    out = []
    for m, label in (("bc", "BC"), ("opd_kl", "OPD-KL")):
        if m in s:
            dev = max(abs(j(s, m, h, "j_t1") - q ** h) for h in hs)
            out.append({"claim": f"{label} J at T=1 follows (1-eps+eps/|V|)^H at every H (0.168 at H=8; "
                                 f"largest deviation <= {CLOSED_FORM_TOL})",
                        "measured": dev, "holds": bool(dev <= CLOSED_FORM_TOL)})
    low = min(j(s, "ne_opd", h, "j_t1") for h in hs)
    out.append({"claim": "NE-OPD J at T=1 = 1.0 at every H (lowest over H)", "measured": low, "holds": low >= EXACT})
    low = min(j(s, "bc", h, "j_greedy") for h in hs if h <= 12)
    out.append({"claim": "BC greedy J = 1.0 up to H=12 (lowest over H <= 12)", "measured": low, "holds": low >= EXACT})
    top = hs[-1]
    bc_top = j(s, "bc", top, "j_greedy")
    out.append({"claim": f"BC greedy J collapses by H={top} (below 0.5; 0.35 expected at H=24)",
                "measured": bc_top, "holds": bool(bc_top < 0.5)})
    if "opd_kl" in s:
        kl_top = j(s, "opd_kl", top, "j_greedy")
        out.append({"claim": f"OPD-KL with T=1 roll-in is worse than BC at H={top} (greedy J; 0.05 expected)",
                    "measured": kl_top, "holds": bool(kl_top < bc_top)})
    low = min(j(s, "ne_opd", h, "j_greedy") for h in hs)
    out.append({"claim": "NE-OPD greedy J = 1.0 at every H (lowest over H)", "measured": low, "holds": low >= EXACT})
    return out


# -- part "kernels" ---------------------------------------------------------------------------------
def run_kernels(args: argparse.Namespace) -> dict:
    from troupe.algorithms.opd import noise, tabular

    hs, settings = args.horizons, {}
    for kernel in tabular.KERNELS:
        for eps in args.kernel_eps:
            cfg = base_config(args, kernel=kernel, eps=eps)
            margin = tabular.kernel_margin(eps, cfg.nu())
            votes = 0  # the Hoeffding m for the margin
            if margin <= 0:
                # no m finds a lost mode; take as many draws as would resolve the margin's size (or,
                # at a tie, the uniform kernel's number), so that each vote is all but certain
                votes = noise.votes_needed(abs(margin) or 1 - eps, cfg.vocab, max(hs), cfg.delta)
            cfg = dataclasses.replace(cfg, votes=votes)
            summary = summarise(tabular.sweep(KERNEL_METHODS, tuple(hs), args.seeds, cfg))
            name = f"{kernel}, eps={eps}"
            settings[name] = {"kernel": kernel, "eps": eps, "margin": margin,
                              "clean_step_prob": cfg.teacher_rows().diagonal().tolist(),
                              "votes": tabular.votes_per_visit(cfg, max(hs)),
                              "summary": summary}
            print_j(f"kernel {name}: margin {margin:+.3f}, J at T=1 / greedy (N={args.episodes})", summary, hs)
    confusion = base_config(args, kernel="confusion").nu().tolist()
    return {"config": {"eps": args.kernel_eps, "methods": list(KERNEL_METHODS), "seeds": args.seeds, "horizons": hs,
                       "episodes": args.episodes, "confusion": confusion}, "settings": settings}


def kernel_claims(section: dict) -> list[dict]:
    """Mode preservation decides: mode-seeking methods recover π* under every kernel with a
    positive margin and all learn the wrong action where it is lost; BC's T=1 success is q^H."""
    settings = section["settings"].values()
    out = []
    kept = [st for st in settings if st["margin"] > 0]
    if kept:
        hs = sorted(int(h) for h in kept[0]["summary"]["ne_opd"])
        low = min(j(st["summary"], m, h, "j_greedy") for st in kept for m in ("ne_opd", "ne_opd_vote") for h in hs)
        names = "; ".join(f"{st['kernel']} at eps={st['eps']}" for st in kept)
        out.append({"claim": f"under every kernel that preserves the mode ({names}), NE-OPD greedy J = 1.0 at every H, "
                             "with logit access and with majority votes sized by the kernel's margin (lowest)",
                    "measured": low, "holds": bool(low >= EXACT)})
    devs = []
    for st in settings:
        q = st["clean_step_prob"]
        if max(q) - min(q) < 1e-12:  # q^H is BC's T=1 success when every clean action keeps the same mass
            devs += [abs(j(st["summary"], "bc", int(h), "j_t1") - q[0] ** int(h)) for h in st["summary"]["bc"]]
    if devs:
        out.append({"claim": "BC J at T=1 follows q^H under every kernel, q = 1-eps+eps*nu(a*|a*) "
                             f"(largest deviation <= {CLOSED_FORM_TOL})",
                    "measured": max(devs), "holds": bool(max(devs) <= CLOSED_FORM_TOL)})
    for st in settings:
        if st["margin"] <= 0:
            high = max(j(st["summary"], m, int(h), "j_greedy") for m in KERNEL_METHODS for h in st["summary"]["bc"])
            out.append({"claim": f"{st['kernel']} kernel at eps={st['eps']} (margin {st['margin']:.2f} <= 0) loses the mode: "
                                 f"BC, NE-OPD and NE-OPD by majority vote ({st['votes']} draws) learn the wrong action "
                                 f"(greedy J <= {LOST_MODE_J} at every H; highest)",
                        "measured": high, "holds": bool(high <= LOST_MODE_J)})
    return out


# -- part "nsweep" ----------------------------------------------------------------------------------
def run_nsweep(args: argparse.Namespace) -> dict:
    from troupe.algorithms.opd import tabular

    cfg, hs = base_config(args), args.horizons
    sweep = {m: {} for m in SWEEP_METHODS}
    for n in args.sweep_episodes:
        per = summarise(tabular.sweep(SWEEP_METHODS, tuple(hs), args.seeds, dataclasses.replace(cfg, episodes=n)))
        for m in SWEEP_METHODS:
            sweep[m][str(n)] = per[m]
    print("\ngreedy J vs N")
    for m, per_n in sweep.items():
        for n, per_h in per_n.items():
            print(f"{m:<8} N={n:<5} " + "  ".join(f"{per_h[str(h)]['j_greedy']['mean']:.2f}" for h in hs))
    # the smallest N of the sweep at which greedy J reaches 0.9, per method and H
    n_needed = {m: {str(h): next((int(n) for n, per_h in per_n.items() if per_h[str(h)]["j_greedy"]["mean"] >= 0.9),
                                 None) for h in hs} for m, per_n in sweep.items()}
    fine = {str(h): tabular.bc_episodes_needed(h, cfg, experts=args.fit_experts) for h in hs}
    fitted = [(h, n) for h, n in zip(hs, fine.values(), strict=True) if n is not None]
    slope, intercept = np.polyfit([h for h, _ in fitted], np.log([n for _, n in fitted]), 1)
    q = 1 - cfg.eps + cfg.eps / cfg.vocab
    print(f"\nN BC needs for greedy J >= 0.9 ({args.fit_experts} experts): "
          + ", ".join(f"H={h}: {n}" for h, n in fine.items())
          + f"; log N ~ {slope:.3f} H + {intercept:.2f} (-log q = {-math.log(q):.3f})")
    return {"config": {"tabular_config": dataclasses.asdict(cfg), "seeds": args.seeds, "horizons": hs,
                       "sweep_episodes": args.sweep_episodes, "fit_experts": args.fit_experts},
            "episodes_sweep": sweep, "episodes_for_greedy_j_0.9": n_needed,
            "bc_episodes_needed": fine, "fit": {"slope": float(slope), "intercept": float(intercept),
                                                "expected_slope": -math.log(q), "horizons": [h for h, _ in fitted]}}


def nsweep_claims(section: dict) -> list[dict]:
    """BC's coverage problem: the N it needs grows like q^-H."""
    out = []
    tc = section["config"]["tabular_config"]
    q = 1 - tc["eps"] + tc["eps"] / tc["vocab"]
    need = section["episodes_for_greedy_j_0.9"]["bc"]
    hs = sorted(int(h) for h in need)
    beyond = max(section["config"]["sweep_episodes"]) + 1  # not reached within the sweep
    ns = [need[str(h)] if need.get(str(h)) is not None else beyond for h in hs]
    text = ", ".join(f"H={h}: {'>' + str(beyond - 1) if n == beyond else n}" for h, n in zip(hs, ns, strict=True))
    grows = all(a <= b for a, b in zip(ns, ns[1:], strict=False)) and ns[-1] > ns[0]
    out.append({"claim": f"the N BC needs for greedy J >= 0.9 grows with H (like {q:.1f}^-H)",
                "measured": text, "holds": bool(grows)})
    fit = section.get("fit")
    if fit:
        rel = abs(fit["slope"] / fit["expected_slope"] - 1)
        out.append({"claim": f"log of the N BC needs for greedy J >= 0.9 grows with H at slope -log q = "
                             f"{fit['expected_slope']:.3f} (least-squares slope; N on a 2^(1/8) grid, "
                             f"{section['config']['fit_experts']} experts; within {SLOPE_TOL:.0%})",
                    "measured": fit["slope"], "holds": bool(rel <= SLOPE_TOL)})
    return out


# -- part "approx" ----------------------------------------------------------------------------------
def run_approx(args: argparse.Namespace) -> dict:
    from troupe.algorithms.opd import tabular

    approx, hs, summary = tabular.ApproxConfig(), args.horizons, {}

    def run(method: str, h: int, cfg: tabular.TabularConfig, seed: int) -> dict[str, float]:
        return tabular.run_approx(method, h, cfg, seed, approx)

    for k in args.approx_contexts:
        per = summarise(tabular.sweep(tabular.APPROX_METHODS, tuple(hs), args.approx_seeds, base_config(args, context=k), run))
        summary[f"context_{k}"] = per
        who = "the whole prefix" if k == 0 else f"the last {k} tokens"
        print_j(f"MLP student, expert of {who}: J at T=1 / greedy, mean over {args.approx_seeds} seeds", per, hs)
    return {"config": {"approx_config": dataclasses.asdict(approx), "seeds": args.approx_seeds, "horizons": hs,
                       "episodes": args.episodes, "eps": args.eps, "contexts": args.approx_contexts},
            "summary": summary}


def approx_claims(section: dict) -> list[dict]:
    """§B.5's caveat, as measured: with a student that must find the structure, the gap between
    BC and NE-OPD shrinks where the expert generalises across prefixes."""
    s = section["summary"]
    shared = [int(k.split("_")[1]) for k in s if k != "context_0"]
    if "context_0" not in s or not shared:
        return []
    k = min(shared)

    def gap(ctx: str, metric: str) -> float:
        hs = s[ctx]["ne_opd"]
        return float(np.mean([j(s[ctx], "ne_opd", int(h), metric) - j(s[ctx], "bc", int(h), metric) for h in hs]))

    out = []
    for metric, label in (("j_greedy", "greedy"), ("j_t1", "at T=1")):
        g_k, g_0 = gap(f"context_{k}", metric), gap("context_0", metric)
        out.append({"claim": f"caveat, MLP student over hashed n-grams: the NE-OPD minus BC gap in J {label} (mean over H) "
                             f"is smaller for an expert of the last {k} tokens than for the whole-prefix expert",
                    "measured": f"{g_k:.3f} (last {k} tokens) vs {g_0:.3f} (whole prefix)", "holds": bool(g_k < g_0)})
    return out


# -- the parts, the claims and the figure -----------------------------------------------------------
PARTS: dict[str, tuple[Callable[[argparse.Namespace], dict], Callable[[dict], list[dict]]]] = {
    "tabular": (run_tabular, tabular_claims),
    "kernels": (run_kernels, kernel_claims),
    "nsweep": (run_nsweep, nsweep_claims),
    "approx": (run_approx, approx_claims),
}


def part(name: str) -> tuple[Callable[[argparse.Namespace], dict], Callable[[dict], list[dict]]]:
    if name == LM_PART:
        lm = load_lm()
        return lm.run, lm.claims
    return PARTS[name]


def claims(result: dict) -> list[dict]:
    """The top-level claims list: each part's claims on its section, in part order."""
    return [c for name in (*PARTS, LM_PART) if name in result for c in part(name)[1](result[name])]


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(16, 8.5))
    for ax in axes.flat:
        ax.set_axis_off()

    def curves(ax, per_method: dict, metric: str, label: Callable[[str], str], **style) -> None:
        ax.set_axis_on()
        for m, per_h in per_method.items():
            hs = sorted(int(h) for h in per_h)
            ax.plot(hs, [per_h[str(h)][metric]["mean"] for h in hs], label=label(m), **style)
        ax.set(xlabel="horizon H", ylabel="J", ylim=(-0.03, 1.03))

    if "tabular" in result:
        for ax, metric, title in ((axes[0, 0], "j_t1", "success at T=1"), (axes[0, 1], "j_greedy", "success, greedy")):
            curves(ax, result["tabular"]["summary"], metric, str, marker="o")
            ax.set_title(f"tabular: {title} (N={result['tabular']['config']['tabular_config']['episodes']})")
        axes[0, 0].legend(fontsize=8)
    if "nsweep" in result:
        ns = result["nsweep"]
        for m, per_n in ns["episodes_sweep"].items():
            curves(axes[0, 2], {n: per_h for n, per_h in per_n.items()}, "j_greedy", lambda n, m=m: f"{m}, N={n}", marker=".")
        axes[0, 2].set_title("greedy success vs N")
        axes[0, 2].legend(fontsize=7)
        ax = axes[1, 0]
        ax.set_axis_on()
        pts = [(int(h), n) for h, n in ns["bc_episodes_needed"].items() if n is not None]
        ax.semilogy([h for h, _ in pts], [n for _, n in pts], "o", label="measured")
        hs = np.array(sorted(h for h, _ in pts))
        fit, mid = ns["fit"], hs.mean()
        at_mid = fit["intercept"] + fit["slope"] * mid
        ax.semilogy(hs, np.exp(at_mid + fit["slope"] * (hs - mid)), label=f"fit: slope {fit['slope']:.3f}")
        ax.semilogy(hs, np.exp(at_mid + fit["expected_slope"] * (hs - mid)), "--",
                    label=f"slope -log q = {fit['expected_slope']:.3f}")
        ax.set(xlabel="horizon H", ylabel="N", title="N tabular BC needs for greedy J >= 0.9")
        ax.legend(fontsize=8)
    if "kernels" in result:
        for i, (name, st) in enumerate(result["kernels"]["settings"].items()):
            for m, style in (("bc", "--"), ("ne_opd_vote", "-")):  # one colour per kernel and eps
                curves(axes[1, 1], {f"{name}: {m}": st["summary"][m]}, "j_greedy", str, marker=".",
                       linestyle=style, color=f"C{i}")
        axes[1, 1].set_title("greedy success per noise kernel (BC dashed, NE-OPD vote solid)")
        axes[1, 1].legend(fontsize=6)
    if "approx" in result:
        per = {f"{ctx}: {m}": v for ctx, by_m in result["approx"]["summary"].items() for m, v in by_m.items()}
        curves(axes[1, 2], per, "j_greedy", str, marker=".")
        axes[1, 2].set_title("MLP student: greedy success")
        axes[1, 2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_parts(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in (*PARTS, LM_PART)]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a comma list of {', '.join((*PARTS, LM_PART))}")
    return names


def main(argv: list[str] | None = None) -> int:
    from troupe.platform.checkpoint import atomic_write_json

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", type=parse_parts, default=list(PARTS),
                    help=f"comma list of {', '.join((*PARTS, LM_PART))} (default: {','.join(PARTS)})")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--horizons", type=int, nargs="+", default=[2, 4, 8, 12, 16, 24])
    ap.add_argument("--episodes", type=int, default=200)
    ap.add_argument("--eps", type=float, default=0.3)
    ap.add_argument("--context", type=int, default=2,
                    help="tabular: also an expert of the last CONTEXT tokens, a table keyed alike (0 skips it)")
    ap.add_argument("--kernel-eps", type=float, nargs="+", default=[0.3, 0.6])
    ap.add_argument("--sweep-episodes", type=int, nargs="+", default=[50, 200, 1000])
    ap.add_argument("--fit-experts", type=int, default=2000, help="nsweep: experts per N of the fine grid")
    ap.add_argument("--approx-seeds", type=int, default=8)
    ap.add_argument("--approx-contexts", type=int, nargs="+", default=[2, 0])
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder of opd.json and opd.png")
    known, _ = ap.parse_known_args(argv)
    if LM_PART in known.parts and hasattr(lm := load_lm(), "add_args"):
        lm.add_args(ap)
    args = ap.parse_args(argv)
    runs = {name: part(name)[0] for name in (*PARTS, LM_PART) if name in args.parts}  # a missing module stops here

    path = args.out / "opd.json"
    previous = json.loads(path.read_text()) if path.exists() else {}
    result: dict = {"benchmark": "opd"}
    for name in (*PARTS, LM_PART):
        if name in runs:
            t0 = time.perf_counter()
            result[name] = runs[name](args)
            result[name]["wall_s"] = round(time.perf_counter() - t0, 1)
            print(f"part {name}: {result[name]['wall_s']:.0f}s")
        elif name in previous and (name != LM_PART or LM_MODULE.exists()):
            result[name] = previous[name]  # kept from the last run of that part
    result["claims"] = claims(result)
    args.out.mkdir(parents=True, exist_ok=True)
    plot(result, args.out / "opd.png")
    atomic_write_json(path, result)
    print(f"\nwrote {path} and opd.png")
    for c in result["claims"]:
        m = c["measured"]
        print(f"[{'holds' if c['holds'] else 'FAILS'}] {c['claim']}: {m:.4g}" if isinstance(m, float)
              else f"[{'holds' if c['holds'] else 'FAILS'}] {c['claim']}: {m}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
