"""§G.5's metrics of one aggregated stream, and §G.6's claims over many.

Pure functions of verdict probabilities, posterior draws and the stream: accuracy, log-loss and
ECE against the latent truth; Θ and β_ord recovery; the order-bias decision (§G.2); the group
signatures (tie propensity and accuracy per group) with intervals; the Spearman correlation of
posterior entropy with the human labels' disagreement; and `score_stream`, which runs the
baselines (§G.4) on the same stream and gathers everything the run's report shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from troupe.algorithms.judge import baselines
from troupe.algorithms.judge.model import (
    PHI,
    THETA,
    EncodedStream,
    beta_bar,
    cell,
    group_signatures,
    inconsistency,
    order_effect,
)
from troupe.algorithms.judge.smc import RBSMC

METHODS = ("bayesjudge", "dawid_skene", "majority_vote", "llm_single", "llm_both")
LOG_LOSS_FLOOR = 0.01  # every method's probabilities are mixed with this much uniform before the log
BINS = 10


def accuracy(probs: np.ndarray, truth: np.ndarray) -> float:
    """Share of items whose most probable verdict is the true one."""
    return float((np.asarray(probs).argmax(-1) == truth).mean())


def log_loss(probs: np.ndarray, truth: np.ndarray, floor: float = LOG_LOSS_FLOOR) -> float:
    """Mean −log p(truth), p mixed with ``floor`` of the uniform: a one-hot method's miss costs log(3/floor), not ∞."""
    p = (1 - floor) * np.asarray(probs) + floor / 3
    return float(-np.log(p[np.arange(len(truth)), truth]).mean())


def reliability(probs: np.ndarray, truth: np.ndarray, bins: int = BINS) -> dict[str, list[float]]:
    """Per confidence bin (the top probability, equal-width over [1/3, 1]): count, Σ confidence, Σ correct."""
    probs = np.asarray(probs)
    conf = probs.max(-1)
    correct = (probs.argmax(-1) == truth).astype(float)
    edges = np.linspace(1 / 3, 1, bins + 1)
    k = np.clip(np.searchsorted(edges, conf, side="right") - 1, 0, bins - 1)
    return {"count": np.bincount(k, minlength=bins).astype(float).tolist(),
            "conf": np.bincount(k, weights=conf, minlength=bins).tolist(),
            "correct": np.bincount(k, weights=correct, minlength=bins).tolist()}


def ece_from_bins(table: Mapping[str, Sequence[float]]) -> float:
    """ECE = Σ_b (n_b / n) |acc_b − conf_b| from a `reliability` table (tables add up across streams)."""
    n = np.asarray(table["count"])
    if n.sum() == 0:
        return float("nan")
    gap = np.abs(np.asarray(table["correct"]) - np.asarray(table["conf"]))  # n_b |acc_b − conf_b|
    return float(gap.sum() / n.sum())


def ece(probs: np.ndarray, truth: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error of the top verdict's probability."""
    return ece_from_bins(reliability(probs, truth, bins))


def entropy(probs: np.ndarray) -> np.ndarray:
    """(n,) H(V_i | D) in nats."""
    p = np.clip(np.asarray(probs), 1e-300, 1)
    return -(p * np.log(p)).sum(-1)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's ρ (NaN when either side is constant)."""
    from scipy.stats import spearmanr

    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return float("nan")
    return float(spearmanr(x, y).statistic)


def label_disagreement(stream: EncodedStream) -> np.ndarray:
    """(n,) 1 − the largest share of one verdict among each item's human labels (a set label splits its vote)."""
    out = np.zeros(stream.n_items)
    for i, obs in enumerate(stream.by_item()):
        votes = np.zeros(3)
        for o in obs:
            if o.family == THETA:
                votes[list(o.cells)] += 1 / len(o.cells)
        if votes.sum() > 0:
            out[i] = 1 - votes.max() / votes.sum()
    return out


def interval(samples: np.ndarray, level: float = 0.95) -> dict[str, float]:
    """Posterior mean and the central ``level`` interval of scalar draws."""
    lo, hi = np.quantile(samples, [(1 - level) / 2, (1 + level) / 2])
    return {"mean": float(np.mean(samples)), "lo": float(lo), "hi": float(hi)}


def judged_pairs(stream: EncodedStream) -> np.ndarray:
    """(n, 2) each item's observed judge verdicts (J^AB, J^BA) in content space, −1 where not observed."""
    out = np.full((stream.n_items, 2), -1)
    for i, obs in enumerate(stream.by_item()):
        for o in obs:
            if o.family != PHI:
                continue
            if stream.judge_model == "joint":
                ab, ba = {c // 3 for c in o.cells}, {c % 3 for c in o.cells}
                out[i] = [ab.pop() if len(ab) == 1 else -1, ba.pop() if len(ba) == 1 else -1]
            elif len(o.cells) == 1:
                out[i, o.owner] = o.cells[0]
    return out


def empirical_beta(stream: EncodedStream) -> float:
    """The judge's observed β̄: the share of pairs that said "first" in both orders, (A, B), minus the
    share that said "second" in both, (B, A) (Σ_v π̂_v β̂(v) of the empirical pair distribution)."""
    pairs = judged_pairs(stream)
    both = (pairs >= 0).all(-1)
    if not both.any():
        return float("nan")
    c = 3 * pairs[both, 0] + pairs[both, 1]
    return float((c == cell(0, 1)).mean() - (c == cell(1, 0)).mean())


def theta_mae(theta_mean: np.ndarray, raters: Sequence[str], true_theta: Mapping[str, np.ndarray]) -> float:
    """Mean absolute error of the posterior-mean Θ rows of the raters whose true rows are known."""
    errs = [np.abs(theta_mean[k] - np.asarray(true_theta[r])).mean() for k, r in enumerate(raters) if r in true_theta]
    return float(np.mean(errs)) if errs else float("nan")


def baseline_probs(stream: EncodedStream, ds_iterations: int = 100) -> dict[str, np.ndarray]:
    """§G.4's baselines on the stream: (n, 3) verdict probabilities each."""
    return {
        "dawid_skene": baselines.dawid_skene(stream, include_judge=True, n_iter=ds_iterations).probs,
        "majority_vote": baselines.majority_vote(stream).probs,
        "llm_single": baselines.judge_single_order(stream).probs,
        "llm_both": baselines.judge_both_orders(stream).probs,
    }


def score_stream(smc: RBSMC, stream: EncodedStream, truth: np.ndarray | None = None,
                 true_theta: Mapping[str, np.ndarray] | None = None, true_beta: float | None = None,
                 true_groups: Mapping[str, Mapping[str, float]] | None = None, draws: int = 2000,
                 ds_iterations: int = 100, seed: int = 0) -> dict[str, Any]:
    """Every §G.5 metric of one stream aggregated by ``smc``, with the baselines beside BayesJudge.

    ``truth`` (n,) verdict indices (−1: unknown); ``true_theta`` rater name → (3, 3) rows;
    ``true_beta`` the judge's β̄_ord; ``true_groups`` group → {"tie_propensity", "accuracy"}."""
    rng = np.random.default_rng(seed)
    probs = {"bayesjudge": smc.marginals(), "bayesjudge_online": np.asarray(smc.filtered).reshape(-1, 3)}
    probs.update(baseline_probs(stream, ds_iterations))
    out: dict[str, Any] = {"n_items": stream.n_items, "n_events": len(stream.events), "n_raters": len(stream.raters),
                           "groups": list(stream.groups), "counts": dict(stream.counts)}
    known = np.zeros(stream.n_items, bool) if truth is None else np.asarray(truth) >= 0
    out["n_truth"] = int(known.sum())
    methods: dict[str, Any] = {}
    if known.any():
        t = np.asarray(truth)[known]
        for name, p in probs.items():
            p = p[known]
            methods[name] = {"accuracy": accuracy(p, t), "log_loss": log_loss(p, t), "ece": ece(p, t),
                             "reliability": reliability(p, t)}
    out["methods"] = methods
    d = smc.sample(draws, rng)
    bb = beta_bar(d["pi"], d["phi"])
    out["order_bias"] = {**order_effect(bb), "mean": float(bb.mean()), "true": true_beta,
                         "empirical": empirical_beta(stream)}
    if true_beta is not None:
        ob = out["order_bias"]
        ob["error"] = abs(ob["mean"] - true_beta)
        ob["covered"] = bool(ob["lo"] <= true_beta <= ob["hi"])
    out["inconsistency"] = interval(inconsistency(d["pi"], d["phi"]))
    sig = group_signatures(d["pi"], d["theta"], stream.rater_group, len(stream.groups))
    groups: dict[str, Any] = {}
    for k, g in enumerate(stream.groups):
        groups[g] = {key: interval(sig[key][:, k]) for key in ("tie_propensity", "accuracy")}
        if true_groups and g in true_groups:
            for key in ("tie_propensity", "accuracy"):
                groups[g][key]["true"] = float(true_groups[g][key])
    out["group_signatures"] = groups
    if "expert" in stream.groups and "crowd" in stream.groups:
        e, c = stream.groups.index("expert"), stream.groups.index("crowd")
        diff = interval(sig["tie_propensity"][:, c] - sig["tie_propensity"][:, e])
        diff["excludes_zero"] = bool(diff["lo"] > 0 or diff["hi"] < 0)
        if true_groups and {"expert", "crowd"} <= set(true_groups):
            diff["true"] = float(true_groups["crowd"]["tie_propensity"] - true_groups["expert"]["tie_propensity"])
        out["tie_difference"] = diff  # crowd minus expert
    mean = smc.posterior_mean()
    out["theta_mae"] = theta_mae(mean["theta"], stream.raters, true_theta) if true_theta else float("nan")
    out["pi_mean"] = mean["pi"].tolist()
    h, dis = entropy(probs["bayesjudge"]), label_disagreement(stream)
    out["entropy_disagreement"] = {"spearman": spearman(h, dis), "by_level": _entropy_by_level(h, dis)}
    ess = np.asarray(smc.ess_history, float) / smc.n
    out["ess"] = {"particles": smc.n, "min": float(ess.min()) if len(ess) else float("nan"),
                  "median": float(np.median(ess)) if len(ess) else float("nan"),
                  "rejuvenations": int(smc.n_rejuvenations), "trace": _thin(ess, 300)}
    return out


def _entropy_by_level(h: np.ndarray, dis: np.ndarray) -> list[dict[str, float]]:
    """Mean posterior entropy per distinct disagreement level (rounded to 0.01)."""
    levels = np.round(dis, 2)
    return [{"disagreement": float(v), "entropy": float(h[levels == v].mean()), "count": int((levels == v).sum())}
            for v in np.unique(levels)]


def _thin(x: np.ndarray, k: int) -> list[float]:
    if len(x) <= k:
        return x.tolist()
    return x[np.linspace(0, len(x) - 1, k).round().astype(int)].tolist()


def true_group_signatures(pi: np.ndarray, theta: np.ndarray, rater_groups: Sequence[str]) -> dict[str, dict[str, float]]:
    """Each group's true tie propensity and accuracy, averaged over its raters (as `group_signatures`)."""
    names = list(dict.fromkeys(rater_groups))
    idx = np.asarray([names.index(g) for g in rater_groups])
    sig = group_signatures(np.asarray(pi), np.asarray(theta), idx, len(names))
    return {g: {"tie_propensity": float(sig["tie_propensity"][k]), "accuracy": float(sig["accuracy"][k])}
            for k, g in enumerate(names)}
