"""What `troupe run icrm` reports, from its evaluation files alone: §C.4's metrics per model, split
and k, the choice of λ, the claims of the issue's "what it must show", and the plots.

Inputs: ``predictions`` — [model][split][k] → {"mu": [...], "tau": [...]} — and ``truth`` —
[split][k] → {"label": [...], "p_true": [...]}. Calibration (ECE, Brier, NLL) is measured
against ``p_true``, the persona's own probability: the expected metric over label draws, with
far less noise than one draw per query; accuracy is against the side the persona prefers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from troupe.algorithms.icrm import metrics
from troupe.platform.report import save_figure

ENSEMBLE = "ensemble"
SELECTED = "icrm"


def with_derived(predictions: dict[str, Any]) -> dict[str, Any]:
    """``predictions`` plus the ensemble of the static RMs (mean μ of ``static_*``)."""
    out = dict(predictions)
    members = sorted(n for n in predictions if n.startswith("static_"))
    if len(members) > 1:
        first = predictions[members[0]]
        out[ENSEMBLE] = {s: {k: {"mu": list(np.mean([predictions[m][s][k]["mu"] for m in members], 0))}
                             for k in first[s]} for s in first}
    return out


def table(predictions: dict[str, Any], truth: dict[str, Any]) -> dict[str, dict[str, dict[str, dict[str, float]]]]:
    """[model][split][k or "all"] → §C.4's metrics (accuracy, ECE, Brier, NLL, mean confidence);
    "all" pools every k."""
    out: dict[str, Any] = {}
    for name, by_split in predictions.items():
        out[name] = {}
        for split, by_k in by_split.items():
            rows: dict[str, dict[str, float]] = {}
            mus, ps = [], []
            for k, pred in by_k.items():
                mu, p = np.asarray(pred["mu"]), np.asarray(truth[split][str(k)]["p_true"])
                rows[str(k)] = metrics.summary(mu, p)
                if "tau" in pred:
                    rows[str(k)]["tau"] = float(np.mean(pred["tau"]))
                mus.append(mu)
                ps.append(p)
            rows["all"] = metrics.summary(np.concatenate(mus), np.concatenate(ps))
            out[name][split] = rows
    return out


def select_lambda(tab: dict[str, Any], icrm_names: dict[str, float]) -> tuple[str, dict[str, float]]:
    """The ICRM model of the lowest validation ECE (all k pooled), and every candidate's ECE (§C.2 (i))."""
    eces = {name: tab[name]["valid"]["all"]["ece"] for name in icrm_names if name in tab}
    return min(eces, key=lambda n: (eces[n], n)), eces


def _ks(tab_split: dict[str, Any]) -> list[int]:
    return sorted(int(k) for k in tab_split if k != "all")


def under_confidence(mu: np.ndarray, p_true: np.ndarray, bins: int = 15) -> float:
    """Mean over equal-mass bins of |p̄ − 1/2| − |μ̄ − 1/2|: > 0 when μ is closer to 1/2 than the
    frequencies it predicts (under-confident), < 0 when over-confident."""
    m, p = metrics.reliability(mu, p_true, bins)
    return float(np.mean(np.abs(p - 0.5) - np.abs(m - 0.5)))


def claims(tab: dict[str, Any], predictions: dict[str, Any], truth: dict[str, Any], selected: str,
           lam_one: str | None) -> list[dict[str, Any]]:
    """One entry per claim of the issue's "what it must show" that this run measures."""
    out = []
    seen = tab[selected]["seen"]
    ks = _ks(seen)
    lo, hi = ks[0], ks[-1]
    rise = seen[str(hi)]["accuracy"] - seen[str(lo)]["accuracy"]
    curve = [round(seen[str(k)]["accuracy"], 3) for k in ks]
    out.append({"claim": f"ICRM's pairwise accuracy rises with k (seen-split personas, k = {lo} to {hi})",
                "measured": f"{curve} at k = {ks}; {rise:+.3f}", "holds": bool(rise > 0.02)})
    if "static_0" in tab:
        st = tab["static_0"]["seen"]
        flat = st[str(hi)]["accuracy"] - st[str(lo)]["accuracy"]
        out.append({"claim": "the static BT RM stays flat in k",
                    "measured": f"{st[str(lo)]['accuracy']:.3f} -> {st[str(hi)]['accuracy']:.3f} ({flat:+.3f})",
                    "holds": bool(abs(flat) < 0.01 and rise > abs(flat))})
    if "judge" in tab:
        e_icrm, e_judge = tab[selected]["seen"]["all"]["ece"], tab["judge"]["seen"]["all"]["ece"]
        out.append({"claim": "ICRM's ECE (λ tuned on validation) is below the generative judge's",
                    "measured": f"{e_icrm:.4f} vs {e_judge:.4f}", "holds": bool(e_icrm < e_judge)})
    if lam_one is not None:
        mu = np.concatenate([predictions[lam_one]["seen"][k]["mu"] for k in predictions[lam_one]["seen"]])
        p = np.concatenate([truth["seen"][str(k)]["p_true"] for k in predictions[lam_one]["seen"]])
        gap = under_confidence(np.asarray(mu), np.asarray(p))
        widest = float(np.max(np.abs(np.asarray(mu) - 0.5)))
        out.append({"claim": "with λ = 1 and a0 = b0 = 1, μ is visibly under-confident (§C.2: μ* in [1/3, 2/3])",
                    "measured": f"confidence gap {gap:+.3f} (>0: under-confident); max |μ − 1/2| = {widest:.3f} "
                                "(closed form: 1/6)",
                    "holds": bool(gap > 0.02)})
    un = tab[selected].get("unseen")
    if un is not None:
        rise_u = un[str(hi)]["accuracy"] - un[str(lo)]["accuracy"]
        out.append({"claim": "on unseen-direction personas ICRM's accuracy also rises with k (reported either way)",
                    "measured": f"{un[str(lo)]['accuracy']:.3f} -> {un[str(hi)]['accuracy']:.3f} ({rise_u:+.3f})",
                    "holds": bool(rise_u > 0.02)})
    return out


# -- plots ---------------------------------------------------------------------------------------
def plots(tab: dict[str, Any], predictions: dict[str, Any], truth: dict[str, Any], selected: str,
          plots_dir: Path) -> list[str]:
    """Accuracy vs k on each split, the reliability diagram and ECE against λ."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [n for n in (selected, "point", "static_0", ENSEMBLE, "judge") if n in tab]
    label = {selected: f"ICRM ({selected.removeprefix('icrm_')})", "point": "in-context BCE point",
             "static_0": "static BT RM", ENSEMBLE: "static ensemble", "judge": "generative judge"}
    written = []
    for split, title in (("seen", "new personas of the train split"), ("unseen", "unseen-direction personas")):
        fig, ax = plt.subplots(figsize=(5.2, 3.6))
        for i, n in enumerate(shown):
            ks = _ks(tab[n][split])
            ax.plot(ks, [tab[n][split][str(k)]["accuracy"] for k in ks], marker="o", color=f"C{i}", label=label[n])
        ax.set_xlabel("demonstrations in context (k)")
        ax.set_ylabel("pairwise accuracy")
        ax.set_title(f"Accuracy vs k: {title}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        written.append(save_figure(fig, plots_dir / f"accuracy_vs_k_{split}.png"))

    fig, ax = plt.subplots(figsize=(5.2, 4.2))
    ax.plot([0, 1], [0, 1], color="0.6", lw=0.8, ls="--", label="calibrated")
    lam_models = sorted((n for n in tab if n.startswith("icrm_lam")), key=lambda n: -float(n.removeprefix("icrm_lam")))
    lam_one = [lam_models[0]] if lam_models and lam_models[0] != selected else []  # the largest λ: 1 by default
    for i, n in enumerate([selected, *lam_one, *(m for m in shown if m != selected)]):
        mu = np.concatenate([predictions[n]["seen"][k]["mu"] for k in predictions[n]["seen"]])
        p = np.concatenate([truth["seen"][str(k)]["p_true"] for k in predictions[n]["seen"]])
        m, f = metrics.reliability(mu, p)
        name = label.get(n, f"ICRM ({n.removeprefix('icrm_')})")
        ax.plot(m, f, marker=".", color=f"C{i}", label=f"{name}: ECE {tab[n]['seen']['all']['ece']:.3f}")
    ax.set_xlabel("predicted P(a preferred)")
    ax.set_ylabel("persona's P(a preferred), per bin")
    ax.set_title("Reliability (15 equal-mass bins, seen split)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    written.append(save_figure(fig, plots_dir / "reliability.png"))

    if lam_models:
        fig, ax = plt.subplots(figsize=(4.6, 3.2))
        lams = [float(n.removeprefix("icrm_lam")) for n in lam_models]
        ax.plot(lams, [tab[n]["valid"]["all"]["ece"] for n in lam_models], marker="o", color="C0")
        ax.set_xscale("log")
        ax.set_xlabel("KL weight λ")
        ax.set_ylabel("validation ECE")
        ax.set_title("Choosing λ on validation ECE", fontsize=9)
        ax.grid(alpha=0.3)
        written.append(save_figure(fig, plots_dir / "ece_vs_lambda.png"))
    return written


# -- Markdown ------------------------------------------------------------------------------------
def sections(tab: dict[str, Any], selected: str, eces: dict[str, float], claim_list: list[dict[str, Any]],
             written: list[str]) -> list[str]:
    lines = ["## Reward models steered by demonstrations", "",
             f"λ chosen on validation ECE: **{selected}** (validation ECE per λ: "
             + ", ".join(f"{n.removeprefix('icrm_lam')}: {e:.4f}" for n, e in sorted(eces.items())) + ").", "",
             "Accuracy is against the side the persona prefers; ECE (15 equal-mass bins), Brier and NLL are "
             "against the persona's own probability, all k pooled.", ""]
    for split, title in (("seen", "new personas of the train split"), ("unseen", "unseen-direction personas")):
        names = [n for n in tab if split in tab[n]]
        if not names:
            continue
        ks = _ks(tab[names[0]][split])
        lines += [f"### {title}", "",
                  "| model | " + " | ".join(f"acc k={k}" for k in ks) + " | ECE | Brier | NLL |",
                  "|---|" + "---|" * (len(ks) + 3)]
        for n in names:
            t = tab[n][split]
            lines.append(f"| {n} | " + " | ".join(f"{t[str(k)]['accuracy']:.3f}" for k in ks)
                         + f" | {t['all']['ece']:.4f} | {t['all']['brier']:.4f} | {t['all']['nll']:.4f} |")
        lines.append("")
    lines += ["## Claims", "", "| claim | measured | holds |", "|---|---|---|"]
    lines += [f"| {c['claim']} | {c['measured']} | {c['holds']} |" for c in claim_list]
    lines.append("")
    if written:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}](plots/{p})" for p in written]
    return ["\n".join(lines)]


# -- ICRM-RL ---------------------------------------------------------------------------------------
ARM_LABEL = {"icrm": "ICRM steered by a", "static": "static RM", "icrm_b": "ICRM steered by b"}
OWN_PERSONA = {"icrm": "a", "static": "a", "icrm_b": "b"}  # the persona whose gold an arm is trained toward
# data.source=arithmetic: every arm's gold is exact-match accuracy on held-out problems ("exact")
EXACT = "exact"
GREEDY, SAMPLED = "gold", "gold_sampled"  # rl.jsonl's keys: <prefix>/<arm>/<persona>
ARITHMETIC_LABEL = {"icrm": "ICRM (solution pairs of other problems)", "static": "static RM (same pairs)",
                    "rule": "rule verifier"}


def _arithmetic(records: list[dict[str, Any]]) -> bool:
    return any(k.endswith(f"/{EXACT}") for r in records for k in r)


def _label(arm: str, records: list[dict[str, Any]]) -> str:
    return (ARITHMETIC_LABEL if _arithmetic(records) else ARM_LABEL).get(arm, arm)


def has_sampled(records: list[dict[str, Any]]) -> bool:
    """Whether every record holds gold on sampled completions (``rl.eval_samples`` > 0)."""
    return bool(records) and all(any(k.startswith(f"{SAMPLED}/") for k in r) for r in records)


def _own_key(arm: str, rec: dict[str, Any]) -> str:
    """The gold an arm is trained toward: its own persona's, or held-out accuracy; on sampled
    completions where the record has them (the policy's expected gold), else on greedy ones."""
    prefix = SAMPLED if has_sampled([rec]) else GREEDY
    key = f"{prefix}/{arm}/{EXACT}"
    return key if key in rec else f"{prefix}/{arm}/{OWN_PERSONA.get(arm, 'a')}"


def rl_kl_curves(records: list[dict[str, Any]], history: list[dict[str, Any]],
                 first_rl_step: int) -> dict[str, list[tuple[float, float]]]:
    """Per arm, (KL to the start policy, its own persona's gold reward, on sampled completions
    where recorded) at every RL evaluation: the over-optimisation curve (§C.4). The KL is the
    run's k3 estimate ``rl/kl/ref/<arm>`` on the batch of the last step before the evaluation
    (0 before the first); ``first_rl_step`` is the driver step of RL step 0."""
    by_step = {int(r["step"]): r for r in history if "step" in r}
    out: dict[str, list[tuple[float, float]]] = {}
    for rec in records:
        t = int(rec["rl_step"])
        row = by_step.get(first_rl_step + t - 1, {}) if t else {}
        for arm in dict.fromkeys([*OWN_PERSONA, *ARITHMETIC_LABEL]):
            gold = rec.get(_own_key(arm, rec))
            kl = 0.0 if t == 0 else row.get(f"rl/kl/ref/{arm}")
            if gold is not None and kl is not None:
                out.setdefault(arm, []).append((float(kl), float(gold)))
    return out


def rl_kl_plot(curves: dict[str, list[tuple[float, float]]], plots_dir: Path, arithmetic: bool = False,
               sampled: bool = False) -> list[str]:
    """Each arm's own persona's gold reward (``sampled``: on sampled completions) against its KL
    to the start policy."""
    if not any(len(c) > 1 for c in curves.values()):
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    for i, (arm, pts) in enumerate(curves.items()):
        kl, gold = zip(*pts, strict=True)
        label = ARITHMETIC_LABEL.get(arm, arm) if arithmetic else f"{ARM_LABEL.get(arm, arm)} (persona {OWN_PERSONA[arm]})"
        ax.plot(kl, gold, marker="o", color=f"C{i}", label=label)
    ax.set_xlabel("KL(π ‖ π_SFT), k3 estimate on the step's batch")
    how = "sampled" if sampled else "greedy"
    ax.set_ylabel(f"held-out exact-match accuracy ({how})" if arithmetic else f"own persona's gold reward (held-out, {how})")
    ax.set_title("ICRM-RL: gold reward against KL to the start policy", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    return [save_figure(fig, plots_dir / "rl_gold_vs_kl.png")]


def rl_claims(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The RL claims, from the gold evaluations: ICRM-RL above static-RM GRPO on persona a's gold
    reward at the last step, and steerability (each steered policy higher on its own persona)."""
    if len(records) < 2:
        return []
    if _arithmetic(records):
        return arithmetic_rl_claims(records)
    return persona_rl_claims(records, GREEDY) + persona_rl_claims(records, SAMPLED)


SAMPLED_TAG = " (sampled completions)"


def persona_rl_claims(records: list[dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """The persona RL claims on the greedy completions' gold (``gold``) or on the sampled ones'
    (``gold_sampled``; none where the run recorded none)."""
    first, last = records[0], records[-1]
    tag = SAMPLED_TAG if prefix == SAMPLED else ""

    def g(rec: dict[str, Any], arm: str, who: str) -> float | None:
        return rec.get(f"{prefix}/{arm}/{who}")

    out = []
    if g(last, "icrm", "a") is not None and g(last, "static", "a") is not None:
        a, s = g(last, "icrm", "a"), g(last, "static", "a")
        out.append({"claim": "ICRM-RL's policy reaches a higher gold persona reward than static-RM GRPO at the same "
                             f"steps ({last['rl_step']}){tag}",
                    "measured": f"{a:.3f} vs {s:.3f} (start {g(first, 'icrm', 'a'):.3f})", "holds": bool(a > s)})
    if g(last, "icrm_b", "b") is not None and g(last, "icrm", "a") is not None:
        own_a, cross_a = g(last, "icrm", "a"), g(last, "icrm_b", "a")
        own_b, cross_b = g(last, "icrm_b", "b"), g(last, "icrm", "b")
        out.append({"claim": "the policy follows the persona in the reward's context: steered by a it scores higher "
                             f"on a's gold reward than steered by b, and the other way round{tag}",
                    "measured": f"a's gold: {own_a:.3f} (by a) vs {cross_a:.3f} (by b); b's gold: {own_b:.3f} (by b) "
                                f"vs {cross_b:.3f} (by a)",
                    "holds": bool(own_a > cross_a and own_b > cross_b)})
    return out


RULE_GAP = 0.05  # "close to the rule verifier": held-out accuracy within this of its arm's


def arithmetic_rl_claims(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """§C.3 5 read on held-out exact-match accuracy at the last evaluation: the ICRM arm against the
    static RM trained on the same pairs, and how close it comes to the rule verifier."""
    first, last = records[0], records[-1]
    t = last["rl_step"]

    def acc(rec: dict[str, Any], arm: str) -> float | None:
        return rec.get(f"gold/{arm}/{EXACT}")

    out = []
    i, s, r = acc(last, "icrm"), acc(last, "static"), acc(last, "rule")
    if i is not None and s is not None:
        out.append({"claim": f"arithmetic RL: the ICRM-rewarded policy is more accurate on held-out problems than "
                             f"the static-RM-rewarded one at the same steps ({t})",
                    "measured": f"{i:.3f} vs {s:.3f} (start {acc(first, 'icrm'):.3f})", "holds": bool(i > s)})
    if i is not None and r is not None:
        start = acc(first, "rule")
        gain_r, gain_i = r - start, i - acc(first, "icrm")
        share = f"{gain_i / gain_r:.2f} of its gain" if abs(gain_r) > 1e-9 else "no gain of the rule arm"
        # with no gain of the rule arm there is nothing to come close to: it does not hold
        out.append({"claim": f"arithmetic RL: the rule verifier's arm gains held-out accuracy and the "
                             f"ICRM-rewarded policy comes within {RULE_GAP} of it at the same steps ({t})",
                    "measured": f"{i:.3f} vs {r:.3f} (gap {r - i:+.3f}; gains from the start {gain_i:+.3f} vs "
                                f"{gain_r:+.3f}: {share})",
                    "holds": bool(gain_r > 0 and r - i <= RULE_GAP)})
    return out


def rl_plots(records: list[dict[str, Any]], plots_dir: Path) -> list[str]:
    """Gold reward of each persona against the RL step, one plot per persona."""
    if not records:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    steps = [r["rl_step"] for r in records]
    order = [*ARM_LABEL, *ARITHMETIC_LABEL]
    arms = sorted({k.split("/")[1] for r in records for k in r if k.startswith("gold/")}, key=order.index)
    whos = sorted({k.split("/")[2] for r in records for k in r if k.startswith("gold/")})
    sampled = has_sampled(records)
    for who in whos:
        fig, ax = plt.subplots(figsize=(5.2, 3.6))
        for i, arm in enumerate(arms):
            ax.plot(steps, [r[f"gold/{arm}/{who}"] for r in records], marker="o", color=f"C{i}",
                    label=_label(arm, records) + (", greedy" if sampled else ""))
            if sampled:
                ax.plot(steps, [r[f"{SAMPLED}/{arm}/{who}"] for r in records], marker=".", ls="--", color=f"C{i}",
                        label=_label(arm, records) + ", sampled")
        ax.set_xlabel("GRPO step")
        what = "exact-match accuracy" if who == EXACT else f"persona {who}'s gold reward"
        ax.set_ylabel(f"{what} (held-out, {'greedy and sampled' if sampled else 'greedy'})")
        ax.set_title(f"ICRM-RL: {what}", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
        written.append(save_figure(fig, plots_dir / f"rl_gold_{who}.png"))
    return written


def rl_section(records: list[dict[str, Any]]) -> list[str]:
    if not records:
        return []
    keys = [k for k in records[0] if k.startswith("gold/")]
    if _arithmetic(records):
        lines = ["## ICRM-RL", "", "Exact-match accuracy (the task's checker) of each arm's greedy answers to "
                 "held-out problems. Every arm starts from the same SFT policy and trains on the same problems; "
                 "the ICRM arm's reward reads k (correct, incorrect) solution pairs of other problems in each row."]
        head = ["| step | " + " | ".join(_label(k.split("/")[1], records) for k in keys) + " |"]
    else:
        lines = ["## ICRM-RL", "", "Gold persona reward (wᵀφ of the completion's attributes) of each arm's greedy "
                 "completions on held-out prompts."]
        head = ["| step | " + " | ".join(f"{ARM_LABEL.get(k.split('/')[1], k)} on {k.split('/')[2]}" for k in keys)
                + " |"]
    head += ["|---|" + "---|" * len(keys)]
    lines += ["", *head] + [f"| {r['rl_step']} | " + " | ".join(f"{r[k]:.3f}" for k in keys) + " |" for r in records]
    if has_sampled(records):
        sampled = [f"{SAMPLED}/{k.split('/', 1)[1]}" for k in keys]
        lines += ["", "The same, on sampled completions (the rollout temperature, `rl.eval_samples` per prompt): "
                  "the policy's expected gold, which the greedy table moves by whole completions.", "", *head]
        lines += [f"| {r['rl_step']} | " + " | ".join(f"{r[k]:.3f}" for k in sampled) + " |" for r in records]
    claims = arithmetic_rl_claims(records) if _arithmetic(records) and len(records) > 1 else []
    lines += [""] + [f"- {'**holds**' if c['holds'] else '**does not hold**'}: {c['claim']}: {c['measured']}."
                     for c in claims]
    return ["\n".join(lines)]


# -- selection: best-of-N and the steering front (best_of_n.json) ----------------------------------
def selection_claims(sel: dict[str, Any]) -> list[dict[str, Any]]:
    """The selection claims of `ICRM.select`'s record: steering shows in what the model picks."""
    g = sel["gold_a"]
    n = sel["n"][-1]
    a, b = g["ICRM steered by a (r)"][-1], g["ICRM steered by b (r)"][-1]
    out = [{"claim": f"best-of-{n} on persona a's gold reward: ICRM steered by a's demos picks better than "
                     "steered by b's",
            "measured": f"{a:.3f} vs {b:.3f} (gold itself {g['gold itself'][-1]:.3f})", "holds": bool(a > b)}]
    if "static RM (r)" in g:
        s = g["static RM (r)"][-1]
        out.append({"claim": f"best-of-{n} on persona a's gold reward: ICRM steered by a's demos picks better than "
                             "the static RM",
                    "measured": f"{a:.3f} vs {s:.3f}", "holds": bool(a > s)})
    peak = {name: max(c) - c[-1] for name, c in g.items() if name != "gold itself"}
    out.append({"claim": "over-optimisation: best-of-N gold under each proxy keeps rising to the largest N "
                         "(no peak then decline at this N; reported either way)",
                "measured": "drop from peak " + ", ".join(f"{k}: {v:.3f}" for k, v in peak.items()),
                "holds": bool(all(v < 0.02 for v in peak.values()))})
    hv = sel["hypervolume"]
    out.append({"claim": "sweeping the demo mix ρ traces a front whose hypervolume is at least 0.95 of the linear "
                         "scalarisation of the same ICRM steered by each persona alone",
                "measured": f"{hv['mix']:.3f} vs {hv['scalarised']:.3f}",
                "holds": bool(hv["mix"] >= 0.95 * hv["scalarised"])})
    first, last = sel["mix"][0], sel["mix"][-1]
    out.append({"claim": "the demo mix steers the pick: ρ = 0 (a's demos) scores higher on a's gold and ρ = 1 "
                         "(b's demos) higher on b's",
                "measured": f"ρ=0: a {first[0]:.3f}, b {first[1]:.3f}; ρ=1: a {last[0]:.3f}, b {last[1]:.3f}",
                "holds": bool(first[0] > last[0] and last[1] > first[1])})
    return out


def selection_plots(sel: dict[str, Any], plots_dir: Path) -> list[str]:
    """Best-of-N gold against KL (one line per proxy), and the steering front (gold a vs gold b)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.6, 3.6))
    for i, (name, curve) in enumerate(sel["gold_a"].items()):
        ax.plot(sel["kl"], curve, marker="o", ms=3, color=f"C{i}", label=name,
                ls="--" if name == "gold itself" else "-")
    ax.set_xlabel("KL(best-of-N ‖ base) = log N − (N − 1)/N")
    ax.set_ylabel("persona a's gold reward of the pick")
    ax.set_title(f"best-of-N over the evaluation pool ({sel['rows']} prompts)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    written = [save_figure(fig, plots_dir / "best_of_n_gold_vs_kl.png")]

    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    mix, scal = np.asarray(sel["mix"]), np.asarray(sel["scalarised"])
    ax.plot(mix[:, 0], mix[:, 1], marker="o", color="C0", label="ICRM, demo mix ρ")
    ax.plot(scal[:, 0], scal[:, 1], marker="s", color="C1", ls="--", label="scalarised (1−ρ) r_a + ρ r_b")
    for rho, (x, y) in zip(sel["rho"], mix, strict=True):
        if rho in (0.0, 0.5, 1.0):
            ax.annotate(f"ρ={rho:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.scatter(*sel["base"], marker="x", color="k", label="base (N = 1)")
    if sel.get("static"):
        ax.scatter(*sel["static"], marker="^", color="C2", label="static RM")
    ax.set_xlabel("persona a's gold reward")
    ax.set_ylabel("persona b's gold reward")
    ax.set_title(f"steering by demo mix: best of {sel['n'][-1]}, k = {sel['k']}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.02, 0.5))
    written.append(save_figure(fig, plots_dir / "steering_front.png"))
    return written


def selection_section(sel: dict[str, Any]) -> list[str]:
    lines = ["## What the reward models pick", "",
             f"Best-of-N over {sel['n'][-1]} responses of the evaluation pool for each of {sel['rows']} prompts, "
             "scored by persona a's gold reward wᵀφ (KL = log N − (N − 1)/N).", "",
             "| N | KL | " + " | ".join(sel["gold_a"]) + " |", "|---|---|" + "---|" * len(sel["gold_a"])]
    for i, (n, kl) in enumerate(zip(sel["n"], sel["kl"], strict=True)):
        lines.append(f"| {n} | {kl:.2f} | " + " | ".join(f"{c[i]:.3f}" for c in sel["gold_a"].values()) + " |")
    lines += ["", f"Steering: ICRM with round(ρ·{sel['k']}) of its demos from persona b; the hypervolume w.r.t. "
              f"({sel['reference'][0]:.3f}, {sel['reference'][1]:.3f}) is {sel['hypervolume']['mix']:.3f} for the "
              f"mix and {sel['hypervolume']['scalarised']:.3f} for the scalarisation.", "",
              "| ρ | mix: gold a | mix: gold b | scalarised: gold a | scalarised: gold b |", "|---|---|---|---|---|"]
    lines += [f"| {rho:g} | {m[0]:.3f} | {m[1]:.3f} | {s[0]:.3f} | {s[1]:.3f} |"
              for rho, m, s in zip(sel["rho"], sel["mix"], sel["scalarised"], strict=True)]
    return ["\n".join(lines)]
