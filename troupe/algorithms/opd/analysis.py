"""The OPD run's results from its files: the table, §B's claims, the plots and the report text."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from troupe.platform.report import save_figure

LABEL = {"bc": "BC (noisy trajectories)", "clean_bc": "BC, clean teacher (oracle)", "seq_kd": "sequence KD",
         "gkd_fkl": "GKD forward KL", "gkd_rkl": "GKD reverse KL", "gkd_jsd": "GKD JSD", "tm_opd": "OPD, sampled RKL",
         "ne_opd_hard": "NE-OPD hard", "ne_opd_tl": "NE-OPD teacher-likelihood", "ne_opd_rkl": "NE-OPD RKL",
         "ne_opd_vote": "NE-OPD majority vote"}
NE = ("ne_opd_hard", "ne_opd_tl", "ne_opd_rkl", "ne_opd_vote")
BASELINES = ("bc", "tm_opd", "gkd_fkl", "gkd_rkl", "gkd_jsd")  # the methods §B expects to fall with H


def interval(values: list[float], resamples: int, groups: list[str] | None = None, seed: int = 0) -> dict[str, float]:
    """Mean and a 95% bootstrap interval over the prompts: rows of one prompt (``groups``) are
    averaged first and resampled together."""
    v = np.asarray(values, dtype=float)
    if len(v) == 0:
        return {"mean": float("nan"), "lo": float("nan"), "hi": float("nan")}
    if groups is not None:
        keys = sorted(set(groups))
        v = np.array([np.mean([x for x, g in zip(values, groups, strict=True) if g == k]) for k in keys])
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, len(v), (resamples, len(v)))].mean(1)
    return {"mean": float(v.mean()), "lo": float(np.quantile(means, 0.025)), "hi": float(np.quantile(means, 0.975))}


TARGET = 0.9  # "examples needed": teacher tokens spent by the first evaluation at this greedy success


def tokens_to_target(history: list[dict[str, Any]], arm: str, target: float = TARGET) -> float | None:
    """Teacher tokens ``arm`` had used by its first evaluation with greedy success >= ``target``
    (None when it never got there)."""
    tokens = 0.0
    for row in history:
        tokens = row.get(f"{arm}/teacher_tokens", tokens)
        if row.get(f"eval/{arm}/greedy", 0.0) >= target:
            return tokens
    return None


def table(config: Any, record: dict[str, Any], usage: dict[str, float] | None = None,
          history: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """``{"arms": {arm: {method, horizon, greedy, t1, greedy_steps, t1_steps}}, "teacher_t1": {H: ...}}``."""
    b = config.eval.bootstrap
    prompts = record.get("prompts", {})
    arms = {}
    for arm, method, h in config.arms():
        got = record["arms"].get(arm)
        if got is None:
            continue
        g = prompts.get(str(h))
        arms[arm] = {"method": method, "horizon": h,
                     "greedy": interval(got["greedy"]["success"], b, g), "t1": interval(got["t1"]["success"], b, g),
                     "greedy_steps": float(np.mean(got["greedy"]["steps"])), "t1_steps": float(np.mean(got["t1"]["steps"])),
                     "teacher_tokens": (usage or {}).get(arm),
                     "tokens_to_target": tokens_to_target(history or [], arm)}
    teacher = {h: interval(v, b, prompts.get(h)) for h, v in record.get("teacher_t1", {}).items()}
    clean = {h: interval(v, b, prompts.get(h)) for h, v in record.get("teacher_clean_greedy", {}).items()}
    return {"step": record.get("step"), "arms": arms, "teacher_t1": teacher, "teacher_clean_greedy": clean}


def _cell(tab: dict[str, Any], method: str, h: int) -> dict[str, Any] | None:
    return tab["arms"].get(f"{method}_h{h}")


def claims(config: Any, tab: dict[str, Any]) -> list[dict[str, Any]]:
    """§B's direction on the language model, each claim measured on this run's arms."""
    hs = sorted(config.opd.horizons)
    methods = config.opd.methods
    out = []
    ne = next((m for m in NE if m in methods), None)
    if ne is not None:
        vals = [_cell(tab, ne, h)["greedy"]["mean"] for h in hs]
        out.append({"claim": f"{LABEL[ne]}'s greedy success stays >= 0.9 at every horizon",
                    "measured": ", ".join(f"H={h}: {v:.3f}" for h, v in zip(hs, vals, strict=True)),
                    "holds": bool(min(vals) >= 0.9)})
    for base in (m for m in BASELINES if m in methods):
        first, last = _cell(tab, base, hs[0]), _cell(tab, base, hs[-1])
        falls = len(hs) > 1 and last["greedy"]["mean"] < first["greedy"]["mean"]
        text = f"{LABEL[base]}'s greedy success falls as H grows"
        measured = f"H={hs[0]}: {first['greedy']['mean']:.3f}, H={hs[-1]}: {last['greedy']['mean']:.3f}"
        if ne is not None:
            top = _cell(tab, ne, hs[-1])["greedy"]
            apart = top["lo"] > last["greedy"]["hi"]
            text += f", with {LABEL[ne]}'s interval above it at H={hs[-1]}"
            measured += (f"; at H={hs[-1]} {ne} [{top['lo']:.3f}, {top['hi']:.3f}] vs "
                         f"[{last['greedy']['lo']:.3f}, {last['greedy']['hi']:.3f}]")
            falls = falls and apart
        out.append({"claim": text, "measured": measured, "holds": bool(falls)})
    if "bc" in methods and tab["teacher_t1"]:
        gaps = []
        for h in hs:
            bc, teacher = _cell(tab, "bc", h)["t1"], tab["teacher_t1"][str(h)]
            gaps.append((h, bc["mean"], teacher["mean"], bc["lo"] <= teacher["hi"] and teacher["lo"] <= bc["hi"]))
        out.append({"claim": "at T=1, BC tracks the noisy teacher's own success (95% intervals overlap at every H)",
                    "measured": "; ".join(f"H={h}: BC {b:.3f}, teacher {t:.3f}" for h, b, t, _ in gaps),
                    "holds": bool(all(o for *_, o in gaps))})
    return out


def plots(config: Any, tab: dict[str, Any], plots_dir: Path) -> list[str]:
    """Success against the horizon, greedy and at T=1 (one plot each), with 95% intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hs = sorted(config.opd.horizons)
    written = []
    for mode, title in (("greedy", "greedy decoding"), ("t1", "sampling at T=1")):
        fig, ax = plt.subplots(figsize=(5.2, 3.6))
        for i, m in enumerate(config.opd.methods):
            cells = [_cell(tab, m, h)[mode] for h in hs]
            mean = np.array([c["mean"] for c in cells])
            err = np.array([[c["mean"] - c["lo"] for c in cells], [c["hi"] - c["mean"] for c in cells]])
            ax.errorbar(hs, mean, yerr=err, marker="o", capsize=3, color=f"C{i}", label=LABEL.get(m, m))
        if mode == "t1" and tab["teacher_t1"]:
            ax.plot(hs, [tab["teacher_t1"][str(h)]["mean"] for h in hs], color="0.4", ls="--", marker="x",
                    label="noisy teacher itself")
        ax.set_xlabel("horizon H (steps per chain)")
        ax.set_ylabel("held-out success (whole chain right)")
        ax.set_ylim(-0.03, 1.03)
        ax.set_xticks(hs)
        ax.set_title(f"Success vs horizon, {title}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        written.append(save_figure(fig, plots_dir / f"success_vs_h_{mode}.png"))
    return written


def _ci(c: dict[str, float]) -> str:
    return f"{c['mean']:.3f} [{c['lo']:.3f}, {c['hi']:.3f}]"


def sections(config: Any, tab: dict[str, Any], claim_list: list[dict[str, Any]], prepared: dict[str, Any],
             plot_names: list[str]) -> list[str]:
    t = config.teacher
    noise = t.noise
    kernel = noise.kernel + (f" (k={noise.top_k})" if noise.kernel == "topk" else "")
    fitted = prepared.get("teacher")
    who = (f"an embedded LM SFT-fitted on clean chains ({fitted.get('sft_steps')} steps, `{fitted.get('model_path')}`)"
           if fitted else f"`{t.path}`")
    lines = ["## OPD under a noisy teacher", "",
             f"Chains of kind `{config.task.kind}`; teacher {who} with ε = {noise.eps} of the `{kernel}` kernel; "
             f"every arm starts from `{prepared.get('model_path', '?')}` and gets "
             + ", ".join(f"{v} teacher tokens at H={h}" for h, v in prepared.get("budget", {}).items())
             + f" ({config.opd.prompts_per_step} roll-ins a step, {config.opd.updates_per_step} updates a step, "
             f"{config.run.steps} steps). Held-out success at step {tab['step']}, 95% bootstrap intervals over "
             f"{config.eval.num_prompts} held-out prompts.", "",
             f"| method | H | greedy | T=1 | steps right (greedy) | teacher tokens | tokens to greedy ≥ {TARGET} |",
             "|---|---|---|---|---|---|---|"]
    for c in tab["arms"].values():
        tokens, needed = c["teacher_tokens"], c.get("tokens_to_target")
        lines.append(f"| {LABEL.get(c['method'], c['method'])} | {c['horizon']} | {_ci(c['greedy'])} | {_ci(c['t1'])} | "
                     f"{c['greedy_steps']:.3f} | {'–' if tokens is None else int(tokens)} | "
                     f"{'not reached' if needed is None else int(needed)} |")
    for h, c in tab["teacher_t1"].items():
        lines.append(f"| the noisy teacher itself | {h} | – | {_ci(c)} | – | – | – |")
    for h, c in tab.get("teacher_clean_greedy", {}).items():
        lines.append(f"| the clean teacher, greedy (ε = 0) | {h} | {_ci(c)} | – | – | – | – |")
    if "ne_opd_vote" in config.opd.methods:
        lines += ["", "Sample access draws " + ", ".join(f"m = {m} at H={h}" for h, m in prepared.get("votes", {}).items())
                  + " per position (§B.2's Hoeffding number unless `teacher.votes` is set)."]
    lines += ["", "### Claims", "", "| claim | measured | holds |", "|---|---|---|"]
    lines += [f"| {c['claim']} | {c['measured']} | {'yes' if c['holds'] else 'no'} |" for c in claim_list]
    lines += ["", "Plots: " + ", ".join(f"`plots/{p}`" for p in plot_names)]
    return ["\n".join(lines)]
