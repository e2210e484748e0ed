"""The ``comm`` run's numbers, from its logged episodes alone: every policy's accuracy and cost,
the selector against §D.3's baselines and two oracles, the failure stages, and §D.5's claims as
they come out on the LM task.

A logged episode (a line of ``comm/logs.jsonl``) holds its step records under every action;
`step_table` turns a split of them into matrices over steps × actions, as the simulator's
`LoggedSteps` are, so `troupe.algorithms.comm.selector` runs on them unchanged.

Two oracles bound the selector. The *hindsight* oracle picks, per step, an action that
succeeded; it also collects the steps that E got right by a lucky guess, which no feature
foretells. The *latent* oracle knows each step's latent facts (does E's view hold the key, is M
right, does the raw slice's key fall within E's budget, the raw length and the step type) and
takes the action with the best measured success in that cell: the analogue of the simulator's
per-instance oracle, and the one claim 5 is judged against.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from troupe.algorithms.comm import selector as sel
from troupe.algorithms.comm.lm import ACTIONS, FEATURES, logged_features
from troupe.envs.split_context import cryptic_message, plain_message

STAGES = ("externalisation", "misleading", "absorption", "closure")
LAMBDAS = np.concatenate([[0.0], np.logspace(-4, 0, 41)])  # tax is in token-equivalents per step
BOOTSTRAP = 1000
DOMINANCE_TOL = 1e-9


@dataclasses.dataclass
class StepTable:
    """A split's logged steps (rows) under every action (columns, `ACTIONS`)."""

    z: np.ndarray  # [n, len(FEATURES)]
    success: np.ndarray  # [n, A] bool
    tax: np.ndarray  # [n, A]
    stage: np.ndarray  # [n, A] object: a stage name, or None on success
    episode: np.ndarray  # [n] the episode each step belongs to (for joint success and the bootstrap)
    cell: list[tuple]  # [n] the latent cell (see the module docstring)
    raw_length: np.ndarray  # [n]
    step_type: np.ndarray  # [n]
    skipped: int  # episodes left out: a fork of theirs failed

    @property
    def n(self) -> int:
        return len(self.episode)


def step_table(rows: list[dict[str, Any]]) -> StepTable:
    z, success, tax, stage, episode, cell, raw, stype = [], [], [], [], [], [], [], []
    skipped = 0
    for e, row in enumerate(rows):
        recs = row["records"]
        if any(recs.get(a) is None for a in ACTIONS):
            skipped += 1
            continue
        for t in range(len(recs["none"])):
            per = {a: recs[a][t] for a in ACTIONS}
            r = per["none"]
            z.append(logged_features(per))
            success.append([per[a]["success"] for a in ACTIONS])
            tax.append([per[a]["tax"] for a in ACTIONS])
            stage.append([per[a]["stage"] for a in ACTIONS])
            episode.append(e)
            cell.append((r["local_has_key"], r["m_right"], r["raw_key_visible"], r["raw_length"], r["step_type"]))
            raw.append(r["raw_length"])
            stype.append(r["step_type"])
    A = len(ACTIONS)
    return StepTable(np.array(z, dtype=float).reshape(-1, len(FEATURES)), np.array(success, dtype=bool).reshape(-1, A),
                     np.array(tax, dtype=float).reshape(-1, A), np.array(stage, dtype=object).reshape(-1, A),
                     np.array(episode, dtype=int), cell, np.array(raw, dtype=int), np.array(stype, dtype=object),
                     skipped)


def _subset(tab: StepTable, keep: np.ndarray) -> StepTable:
    return StepTable(tab.z[keep], tab.success[keep], tab.tax[keep], tab.stage[keep], tab.episode[keep],
                     [c for c, k in zip(tab.cell, keep, strict=True) if k], tab.raw_length[keep], tab.step_type[keep],
                     tab.skipped)


def action_taxes(row: dict[str, Any]) -> list[list[float]]:
    """[steps, actions] realised taxes of one logged episode."""
    recs = row["records"]
    return [[recs[a][t]["tax"] for a in ACTIONS] for t in range(len(recs["none"]))]


def joint_accuracy(success: np.ndarray, episode: np.ndarray) -> float:
    """The share of episodes whose every step succeeded (§D.4's task success)."""
    eps = np.unique(episode)
    return float(np.mean([success[episode == e].all() for e in eps])) if len(eps) else float("nan")


def bootstrap_ci(values: np.ndarray, episode: np.ndarray, rng: np.random.Generator,
                 n: int = BOOTSTRAP) -> list[float]:
    """95% interval of the mean of per-step ``values``, resampling whole episodes."""
    eps = np.unique(episode)
    if len(eps) < 2:
        return [float("nan"), float("nan")]
    sums = np.array([values[episode == e].sum() for e in eps])
    counts = np.array([(episode == e).sum() for e in eps])
    idx = rng.integers(0, len(eps), (n, len(eps)))
    means = sums[idx].sum(1) / counts[idx].sum(1)
    return [float(np.quantile(means, 0.025)), float(np.quantile(means, 0.975))]


def stage_shares(tab: StepTable) -> dict[str, dict[str, float]]:
    """Each action's failures by first failing stage (shares of its failed steps)."""
    out = {}
    for j, a in enumerate(ACTIONS):
        fails = ~tab.success[:, j]
        n = int(fails.sum())
        out[a] = {"failed_steps": n, **{s: float((tab.stage[fails, j] == s).sum() / n) if n else 0.0 for s in STAGES}}
    return out


def contrast(tab: StepTable, a: str, b: str, rng: np.random.Generator, n: int = BOOTSTRAP) -> dict[str, Any]:
    """acc(a) − acc(b) on the same steps, with a 95% interval resampling whole episodes."""
    d = tab.success[:, ACTIONS.index(a)].astype(float) - tab.success[:, ACTIONS.index(b)].astype(float)
    return {"diff": float(d.mean()) if tab.n else float("nan"), "ci95": bootstrap_ci(d, tab.episode, rng, n),
            "steps": tab.n}


def best_value_samples(tab: StepTable, rng: np.random.Generator, n: int = BOOTSTRAP) -> np.ndarray:
    """Bootstrap draws (resampling episodes) of the best fixed action's accuracy."""
    eps = np.unique(tab.episode)
    sums = np.stack([tab.success[tab.episode == e].sum(0) for e in eps])  # [episodes, A]
    counts = np.array([(tab.episode == e).sum() for e in eps])
    idx = rng.integers(0, len(eps), (n, len(eps)))
    return (sums[idx].sum(1) / counts[idx].sum(1)[:, None]).max(1)


# -- oracles --------------------------------------------------------------------------------------
def latent_oracle(tab: StepTable, lams: np.ndarray) -> sel.Frontier:
    """Per latent cell, the action with the best measured success − λ·tax (see the module docstring)."""
    cells = sorted(set(tab.cell), key=str)
    index = {c: i for i, c in enumerate(cells)}
    ids = np.array([index[c] for c in tab.cell])
    acc_c = np.stack([tab.success[ids == i].mean(0) for i in range(len(cells))])  # [cells, A]
    tax_c = np.stack([tab.tax[ids == i].mean(0) for i in range(len(cells))])
    n_c = np.bincount(ids, minlength=len(cells))

    def point(lam: float) -> tuple[float, float]:
        choice = sel.decide(acc_c, tax_c, lam)
        rows = np.arange(len(cells))
        return float((acc_c[rows, choice] * n_c).sum() / n_c.sum()), float((tax_c[rows, choice] * n_c).sum() / n_c.sum())

    pts = [point(lam) for lam in lams]
    return sel.Frontier(np.asarray(lams, dtype=float), np.array([a for a, _ in pts]), np.array([c for _, c in pts]))


# -- one regime ---------------------------------------------------------------------------------------
def fixed_table(tab: StepTable, rng: np.random.Generator) -> dict[str, dict[str, Any]]:
    out = {}
    for j, a in enumerate(ACTIONS):
        s = tab.success[:, j].astype(float)
        out[a] = {"accuracy": float(s.mean()) if tab.n else float("nan"), "ci95": bootstrap_ci(s, tab.episode, rng),
                  "joint_accuracy": joint_accuracy(tab.success[:, j], tab.episode),
                  "mean_tax": float(tab.tax[:, j].mean()) if tab.n else float("nan")}
    return out


def best_action(fixed: dict[str, dict[str, Any]]) -> tuple[str, float]:
    a = max(fixed, key=lambda k: fixed[k]["accuracy"])
    return a, fixed[a]["accuracy"]


def regime_result(train: StepTable, test: StepTable, upstream: dict[str, StepTable], live_lambda: float,
                  seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    models = sel.fit_outcome_models(train.z, train.success, seed=seed)
    q_hat = models.predict(test.z)
    outcomes, taxes = test.success.astype(float), test.tax
    learned = sel.selector_frontier(q_hat, outcomes, taxes, LAMBDAS)
    hindsight = sel.oracle_frontier(outcomes, taxes, LAMBDAS)
    latent = latent_oracle(test, LAMBDAS)
    fixed_acc, fixed_cost = sel.fixed_points(outcomes, taxes)
    e_suff, m_conf = test.z[:, FEATURES.index("self_sufficiency")], test.z[:, FEATURES.index("m_confidence")]
    rules = sel.baselines(outcomes, taxes, e_suff, m_conf, ACTIONS.index("plain"), ACTIONS.index("none"),
                          learned.cost, rng)
    threshold, sender = rules["threshold_self_sufficiency"], rules["sender_relative"]
    random_acc, random_cost = rules["random"].accuracy, rules["random"].cost
    dom_fixed = sel.dominates(learned, fixed_cost, fixed_acc, DOMINANCE_TOL)
    beats_random = sel.dominates(learned, random_cost, random_acc, DOMINANCE_TOL)
    random_margin = sel.accuracy_at(learned.cost, learned.accuracy, random_cost) - random_acc
    regret = sel.regret_at_matched_cost(learned, latent)
    regret_h = sel.regret_at_matched_cost(learned, hindsight)
    cost_max = float(max(fixed_cost.max(), 1e-9))
    choice = sel.decide(q_hat, taxes, live_lambda)
    rows = np.arange(test.n)
    at_live = {"lambda": live_lambda, "accuracy": float(outcomes[rows, choice].mean()),
               "joint_accuracy": joint_accuracy(test.success[rows, choice], test.episode),
               "mean_tax": float(taxes[rows, choice].mean()),
               "action_shares": {a: float((choice == j).mean()) for j, a in enumerate(ACTIONS)}}
    brier = ((q_hat - outcomes) ** 2).mean(0)
    long_raw, short_raw = test.raw_length == test.raw_length.max(), test.raw_length == test.raw_length.min()
    return {
        "train_steps": train.n, "test_steps": test.n, "skipped_episodes": {"train": train.skipped, "test": test.skipped},
        "features": list(FEATURES), "actions": list(ACTIONS), "lambdas": LAMBDAS.tolist(),
        "fixed": fixed_table(test, rng),
        "fixed_long_raw": fixed_table(_subset(test, long_raw), rng),
        "fixed_short_raw": fixed_table(_subset(test, short_raw), rng),
        "raw_lengths": {"long": int(test.raw_length.max()), "short": int(test.raw_length.min())},
        "upstream": {k: fixed_table(v, rng) for k, v in upstream.items()},
        "upstream_stages": {k: stage_shares(v) for k, v in upstream.items()},
        "contrasts": {
            "plain_minus_raw_long": contrast(_subset(test, long_raw), "plain", "raw", rng),
            "cryptic_minus_raw_short": contrast(_subset(test, short_raw), "cryptic", "raw", rng),
            "plain_minus_none": contrast(test, "plain", "none", rng)},
        "frontiers": {"selector": learned.to_dict(), "latent_oracle": latent.to_dict(),
                      "hindsight_oracle": hindsight.to_dict(), "threshold_self_sufficiency": threshold.to_dict(),
                      "sender_relative": sender.to_dict(),
                      "random_at_selector_costs": {"cost": random_cost.tolist(), "accuracy": random_acc.tolist()}},
        "frontier_area_normalised_cost": {
            name: sel.frontier_area(f.cost, f.accuracy, cost_max)
            for name, f in (("selector", learned), ("latent_oracle", latent), ("hindsight_oracle", hindsight),
                            ("threshold_self_sufficiency", threshold), ("sender_relative", sender))},
        "cost_axis_max": cost_max,
        "regret_to_latent_oracle": {"max": float(np.nanmax(regret)), "mean": float(np.nanmean(regret))},
        "regret_to_hindsight_oracle": {"max": float(np.nanmax(regret_h)), "mean": float(np.nanmean(regret_h))},
        "dominates_fixed": {a: bool(dom_fixed[i]) for i, a in enumerate(ACTIONS)},
        "dominates_random_at_matched_cost": bool(beats_random.all()),
        "min_margin_over_random": float(np.nanmin(random_margin)),
        "selector_at_live_lambda": at_live,
        "brier_on_test": {a: float(brier[i]) for i, a in enumerate(ACTIONS)},
        "stages": stage_shares(test),
        "stages_by_step_type": {t: stage_shares(_subset(test, test.step_type == t)) for t in np.unique(test.step_type)},
        "selector_model": models,
    }


def analyse(rows: list[dict[str, Any]], config: Any, seed: int = 0) -> dict[str, Any]:
    """Every regime's result (`regime_result`) from the logged episodes."""
    out: dict[str, Any] = {"regimes": {}, "logged_episodes": len(rows)}
    upstream_tables: dict[str, dict[str, StepTable]] = {}
    for regime in config.task.regimes:
        part = [r for r in rows if r["regime"] == regime]
        train = step_table([r for r in part if r["split"] == "train"])
        test = step_table([r for r in part if r["split"] == "test"])
        upstream = {r["split"] for r in part if r["split"].startswith("upstream_")}
        ups = {s: step_table([r for r in part if r["split"] == s]) for s in sorted(upstream)}
        upstream_tables[regime] = ups
        if train.n == 0 or test.n == 0:
            continue
        out["regimes"][regime] = regime_result(train, test, ups, config.comm.live_lambda, seed)
        out["regimes"][regime]["q"] = dict(config.task.regimes[regime])
        out["regimes"][regime]["agent_skill"] = agent_skill([r for r in part if r["split"] == "test"])
    add_upstream_gains(out, upstream_tables, seed)
    return out


def agent_skill(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """What each agent does well, from its logged steps: how often M's message or code is exactly
    the reference form of its belief; how often E's restated key is right when the content holds it (per kind),
    when its view alone holds it, and how often it acts right once its belief is right."""
    recs = {a: [r for row in rows for r in (row["records"].get(a) or [])] for a in ACTIONS}

    def rate(xs: list[bool]) -> dict[str, Any]:
        return {"rate": float(np.mean(xs)) if xs else float("nan"), "n": len(xs)}

    out: dict[str, Any] = {}
    for kind, write in (("plain", plain_message), ("cryptic", cryptic_message)):
        out[f"main_writes_{kind}"] = rate([r["content"] == write((r["key"], r["m_belief"])) for r in recs[kind]])
    for kind in ("plain", "cryptic", "raw"):
        # the content E read holds the key's true fact
        held = [r for r in recs[kind] if r["externalised"] and (kind != "raw" or r["raw_key_visible"])]
        out[f"executor_absorbs_{kind}"] = rate([r["belief_right"] for r in held])
    out["executor_reads_its_view"] = rate([r["belief_right"] for r in recs["none"] if r["local_has_key"]])
    out["executor_abstains_without_key"] = rate([r["probe"]["text"].strip().endswith("?")
                                                 for r in recs["none"] if not r["local_has_key"]])
    out["executor_acts_on_right_belief"] = rate([r["success"] for a in ACTIONS for r in recs[a] if r["belief_right"]])
    return out


def live_summary(records: list[list[dict[str, Any]] | None], logged: list[dict[str, Any]]) -> dict[str, Any]:
    """The live selector's accuracy and cost, and how often its action and outcome match the logs
    (the fork of the same action on the same step)."""
    succ, tax, agree_outcome, n_failed, eps = [], [], [], 0, []
    for e, (recs, row) in enumerate(zip(records, logged, strict=True)):
        if recs is None:
            n_failed += 1
            continue
        for r in recs:
            succ.append(r["success"])
            tax.append(r["tax"])
            eps.append(e)
            logged_r = (row["records"].get(r["action"]) or [None] * (r["t"] + 1))[r["t"]]
            if logged_r is not None:
                agree_outcome.append(logged_r["success"] == r["success"])
    succ_a = np.array(succ, dtype=bool)
    actions = [r["action"] for recs in records if recs for r in recs]
    return {"accuracy": float(succ_a.mean()) if len(succ_a) else float("nan"),
            "joint_accuracy": joint_accuracy(succ_a, np.array(eps)),
            "mean_tax": float(np.mean(tax)) if tax else float("nan"),
            "action_shares": {a: actions.count(a) / max(len(actions), 1) for a in ACTIONS},
            "outcome_agrees_with_logged_fork": float(np.mean(agree_outcome)) if agree_outcome else float("nan"),
            "failed_episodes": n_failed, "steps": len(succ)}


def typical_tax(taxes: np.ndarray) -> np.ndarray:
    """Mean tax per action over logged steps ([..., A] → [A])."""
    return np.asarray(taxes, dtype=float).reshape(-1, len(ACTIONS)).mean(0)


# -- claims ----------------------------------------------------------------------------------------
def _ci(c: dict[str, Any]) -> str:
    lo, hi = c["ci95"]
    return f"{c['diff']:+.3f} [{lo:+.3f}, {hi:+.3f}]"


def claims(results: dict[str, Any], config: Any) -> list[dict[str, Any]]:
    """§D.5's claims 1–6 as they come out on the LM task (each with what it was measured on)."""
    R = results["regimes"]
    out: list[dict[str, Any]] = []
    weak, strong = R.get("weak_local"), R.get("strong_local")
    if weak is None or strong is None:
        return [{"claim": "the weak-local and strong-local regimes", "measured": f"regimes run: {sorted(R)}",
                 "holds": False}]
    lens = weak["raw_lengths"]
    budget = config.task.budget
    c1 = weak["contrasts"]["plain_minus_raw_long"]
    out.append({"claim": f"1. a compressed (plain) message beats the raw slice when the slice exceeds E's budget: "
                         f"acc(plain) - acc(raw), weak-local, raw slice {lens['long']} facts against a budget of "
                         f"{budget}", "measured": _ci(c1), "holds": bool(c1["ci95"][0] > 0)})
    c2 = weak["contrasts"]["cryptic_minus_raw_short"]
    out.append({"claim": f"2. the Bayes-sufficient cryptic message is worse than the raw slice for the bounded "
                         f"executor when the slice fits its budget: acc(cryptic) - acc(raw), weak-local, raw slice "
                         f"{lens['short']} facts", "measured": _ci(c2), "holds": bool(c2["ci95"][1] < 0)})
    g = results.get("upstream_gains")
    if g:
        out.append({"claim": f"3. a stronger main agent (q_M {g['q_M'][0]:g} -> {g['q_M'][1]:g}, best fixed action) "
                             "helps more when the local view is weak: weak-local gain - strong-local gain",
                    "measured": (f"weak-local {g['weak_local']['low']:.3f}->{g['weak_local']['high']:.3f}, "
                                 f"strong-local {g['strong_local']['low']:.3f}->{g['strong_local']['high']:.3f}; "
                                 f"difference of gains {g['diff']:+.3f} [{g['ci95'][0]:+.3f}, {g['ci95'][1]:+.3f}]"),
                    "holds": bool(g["ci95"][0] > 0)})
    else:
        out.append({"claim": "3. a stronger main agent helps more when the local view is weak",
                    "measured": "not run (comm.upstream_episodes=0 or task.upstream_q_M has fewer than 2 values)",
                    "holds": False})
    w4, s4 = weak["contrasts"]["plain_minus_none"], strong["contrasts"]["plain_minus_none"]
    out.append({"claim": "4. always sending the plain message against always none: up in weak-local, down in "
                         "strong-local", "measured": f"weak-local {_ci(w4)}, strong-local {_ci(s4)}",
                "holds": bool(w4["ci95"][0] > 0 and s4["ci95"][1] < 0)})
    parts, ok = [], True
    target = config.comm.regret_target
    for name, r in (("weak-local", weak), ("strong-local", strong)):
        dom = sum(r["dominates_fixed"].values())
        regret = r["regret_to_latent_oracle"]["max"]
        parts.append(f"{name}: dominates {dom}/{len(r['dominates_fixed'])} fixed, random "
                     f"{'yes' if r['dominates_random_at_matched_cost'] else 'no'} (least margin "
                     f"{r['min_margin_over_random']:+.3f}), max regret to the latent oracle "
                     f"{regret:.3f} (to hindsight {r['regret_to_hindsight_oracle']['max']:.3f})")
        ok = ok and dom == len(r["dominates_fixed"]) and r["dominates_random_at_matched_cost"] and regret <= target
    out.append({"claim": "5. the selector's frontier is above every fixed policy and random at matched cost, within "
                         f"{target} of the latent oracle at matched cost (both regimes)", "measured": "; ".join(parts),
                "holds": bool(ok)})
    cryp = weak["stages"]["cryptic"]
    low = min(weak["upstream_stages"], key=lambda k: float(k.split("_")[1])) if weak["upstream_stages"] else None
    weak_m = weak["upstream_stages"][low]["plain"] if low else strong["stages"]["plain"]
    by_type = weak["stages_by_step_type"]
    closure = {t: by_type[t]["plain"]["closure"] for t in by_type}
    six = [("cryptic message, weak-local: absorption", cryp["absorption"], cryp["failed_steps"]),
           (f"weak M ({low or 'strong-local'}), plain message: externalisation + misleading",
            weak_m["externalisation"] + weak_m["misleading"], weak_m["failed_steps"])]
    ok6 = all(share > 0.5 and n > 0 for _, share, n in six)
    closure_txt = ", ".join(f"{t} {v:.3f}" for t, v in closure.items())
    ok6 = ok6 and closure.get("next", 0.0) > closure.get("copy", 1.0)
    out.append({"claim": "6. failures are dominated (> half) by absorption for cryptic messages and by "
                         "externalisation plus misleading content for a weak M; closure is the larger share where "
                         "acting is harder (the LM task's closure knob: 'next' steps, where E computes the action, "
                         "against 'copy' steps)",
                "measured": "; ".join(f"{k} {v:.3f} of {n} failures" for k, v, n in six)
                            + f"; closure share of plain-message failures by step type: {closure_txt}",
                "holds": bool(ok6)})
    return out


def add_upstream_gains(results: dict[str, Any], tables: dict[str, dict[str, StepTable]], seed: int = 0) -> None:
    """Claim 3's gains (see `claims`), from the upstream splits' step tables per regime."""
    rng = np.random.default_rng(seed + 3)
    if not {"weak_local", "strong_local"} <= set(tables):
        return
    qs = sorted({float(k.split("_")[1]) for k in tables["weak_local"]})
    if len(qs) < 2:
        return
    lo, hi = f"upstream_{qs[0]:g}", f"upstream_{qs[-1]:g}"
    out: dict[str, Any] = {"q_M": [qs[0], qs[-1]]}
    draws = {}
    for regime in ("weak_local", "strong_local"):
        t_lo, t_hi = tables[regime].get(lo), tables[regime].get(hi)
        if t_lo is None or t_hi is None or t_lo.n == 0 or t_hi.n == 0:
            return
        b_lo, b_hi = t_lo.success.mean(0).max(), t_hi.success.mean(0).max()
        out[regime] = {"low": float(b_lo), "high": float(b_hi), "gain": float(b_hi - b_lo),
                       "best_low": ACTIONS[int(t_lo.success.mean(0).argmax())],
                       "best_high": ACTIONS[int(t_hi.success.mean(0).argmax())]}
        draws[regime] = best_value_samples(t_hi, rng) - best_value_samples(t_lo, rng)
    d = draws["weak_local"] - draws["strong_local"]
    out["diff"] = out["weak_local"]["gain"] - out["strong_local"]["gain"]
    out["ci95"] = [float(np.quantile(d, 0.025)), float(np.quantile(d, 0.975))]
    results["upstream_gains"] = out


# -- the report -------------------------------------------------------------------------------------
POLICY_TITLES = {"none": "always none", "plain": "always plain message", "cryptic": "always cryptic code",
                 "raw": "always raw slice"}


def summary(results: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {"claims_holding": sum(c["holds"] for c in results.get("claims", [])),
                         "claims": len(results.get("claims", []))}
    for regime, r in results["regimes"].items():
        for a, v in r["fixed"].items():
            s[f"{regime}/{a}/accuracy"] = v["accuracy"]
        s[f"{regime}/selector/accuracy"] = r["selector_at_live_lambda"]["accuracy"]
        if "live" in r:
            s[f"{regime}/live/accuracy"] = r["live"]["accuracy"]
    return s


def sections(results: dict[str, Any], config: Any, prepared: dict[str, Any]) -> list[str]:
    lines = ["## Communication result", ""]
    lam = config.comm.live_lambda
    for regime in [k for k in config.task.regimes if k in results["regimes"]]:
        r = results["regimes"][regime]
        q = r["q"]
        lines += [f"### {regime.replace('_', '-')} (q_L {q['q_L']:g}, q_M {q['q_M']:g} per episode on average; "
                  f"{r['test_steps']} test steps, {r['train_steps']} logged for the selector)", "",
                  "| policy | step accuracy [95% CI] | joint accuracy | mean tax (token-equivalents) |",
                  "|---|---|---|---|"]
        for a in ACTIONS:
            v = r["fixed"][a]
            lo, hi = v["ci95"]
            lines.append(f"| {POLICY_TITLES[a]} | {v['accuracy']:.3f} [{lo:.3f}, {hi:.3f}] | "
                         f"{v['joint_accuracy']:.3f} | {v['mean_tax']:.1f} |")
        at = r["selector_at_live_lambda"]
        lines.append(f"| selector, λ={lam:g}, on the logs | {at['accuracy']:.3f} | {at['joint_accuracy']:.3f} | "
                     f"{at['mean_tax']:.1f} |")
        if "live" in r:
            lv = r["live"]
            lines.append(f"| selector, λ={lam:g}, live in the graph | {lv['accuracy']:.3f} | "
                         f"{lv['joint_accuracy']:.3f} | {lv['mean_tax']:.1f} |")
        lines += ["", f"Actions the selector takes at λ={lam:g}: "
                  + ", ".join(f"{a} {at['action_shares'][a]:.2f}" for a in ACTIONS) + "."]
        if "live" in r:
            lines.append(f"Live, each step's outcome equals its logged fork's on "
                         f"{r['live']['outcome_agrees_with_logged_fork']:.3f} of steps.")
        lines += ["", "Failure stages (shares of each policy's failed steps):", "",
                  "| policy | failed steps | " + " | ".join(STAGES) + " |", "|---|---|" + "---|" * len(STAGES)]
        for a in ACTIONS:
            st = r["stages"][a]
            lines.append(f"| {POLICY_TITLES[a]} | {st['failed_steps']} | "
                         + " | ".join(f"{st[s]:.2f}" for s in STAGES) + " |")
        skill = r.get("agent_skill")
        if skill:
            def pct(k: str, skill: dict = skill) -> str:
                return f"{skill[k]['rate']:.2f} (n={skill[k]['n']})"

            lines += ["", f"What the agents do: M writes its belief exactly as a plain message {pct('main_writes_plain')}"
                      f" and as the code {pct('main_writes_cryptic')}; E restates the key right when the content "
                      f"it reads holds it: plain {pct('executor_absorbs_plain')}, cryptic "
                      f"{pct('executor_absorbs_cryptic')}, raw {pct('executor_absorbs_raw')}; from its view alone "
                      f"{pct('executor_reads_its_view')}; says it does not know when its view lacks the key "
                      f"{pct('executor_abstains_without_key')}; acts right on a right belief "
                      f"{pct('executor_acts_on_right_belief')}."]
        area = r["frontier_area_normalised_cost"]
        lines += ["", "Frontier area (normalised cost): " + ", ".join(f"{k} {v:.3f}" for k, v in area.items()) + ".",
                  ""]
    lines += ["### Claims of §D.5 on the LM task", "", "| claim | measured | holds |", "|---|---|---|"]
    for c in results.get("claims", []):
        lines.append(f"| {c['claim']} | {c['measured']} | {'yes' if c['holds'] else 'no'} |")
    lines += ["", "The latent oracle knows each step's hidden facts (whether E's view holds the key, whether M is "
              "right, where the raw slice's key falls) and takes the best measured action in that cell; the "
              "hindsight oracle picks an action that succeeded, lucky guesses included."]
    sft = {role: prepared.get(role, {}) for role in ("main", "executor")}
    if any(sft.values()):
        lines += ["", "Agents: " + "; ".join(f"{role} `{v.get('model_path', '?')}` (SFT {v.get('sft', '?')}, "
                                             f"{v.get('sft_steps', '?')} steps)" for role, v in sft.items()) + "."]
    return ["\n".join(lines)]


# -- plots --------------------------------------------------------------------------------------------
STYLE = {"selector": ("learned selector", "C0", "-"), "latent_oracle": ("latent oracle", "k", "--"),
         "hindsight_oracle": ("hindsight oracle", "0.6", ":"),
         "threshold_self_sufficiency": ("threshold on E's self-assessment", "C2", "-."),
         "sender_relative": ("sender-relative (M's confidence)", "C3", ":")}


def plot_all(results: dict[str, Any], plots: Path) -> list[Path]:
    paths = []
    for regime, r in results["regimes"].items():
        paths.append(plot_frontier(regime, r, plots / f"comm_frontier_{regime}.png"))
    if results["regimes"]:
        paths.append(plot_stages(results, plots / "comm_failure_stages.png"))
    return paths


def plot_frontier(regime: str, r: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8.5, 4.2))
    for name, (label, color, ls) in STYLE.items():
        f = r["frontiers"][name]
        if name in ("selector", "latent_oracle", "hindsight_oracle"):
            xs, ys = sel.envelope(np.array(f["cost"]), np.array(f["accuracy"]))
        else:
            order = np.argsort(f["cost"], kind="stable")
            xs, ys = np.array(f["cost"])[order], np.array(f["accuracy"])[order]
        ax.plot(xs, ys, color=color, ls=ls, label=label, marker="." if len(xs) < 3 else None)
    rnd = r["frontiers"]["random_at_selector_costs"]
    order = np.argsort(rnd["cost"])
    ax.plot(np.array(rnd["cost"])[order], np.array(rnd["accuracy"])[order], color="C7", lw=1,
            label="random at matched cost")
    for i, a in enumerate(ACTIONS):
        v = r["fixed"][a]
        ax.scatter(v["mean_tax"], v["accuracy"], marker="s", color=f"C{4 + i}", zorder=3, label=POLICY_TITLES[a])
    ax.set(xlabel="mean protocol tax per step (token-equivalents)", ylabel="step accuracy on the test episodes",
           title=f"{regime.replace('_', '-')}: accuracy-cost frontier, {r['test_steps']} test steps")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_stages(results: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    regimes = list(results["regimes"])
    fig, axes = plt.subplots(1, len(regimes), figsize=(4.2 * len(regimes) + 2, 3.8), sharey=True, squeeze=False)
    for ax, regime in zip(axes[0], regimes, strict=True):
        st = results["regimes"][regime]["stages"]
        bottom = np.zeros(len(ACTIONS))
        for i, s in enumerate(STAGES):
            vals = np.array([st[a][s] for a in ACTIONS])
            ax.bar(range(len(ACTIONS)), vals, bottom=bottom, color=f"C{i}", label=s)
            bottom += vals
        ax.set_xticks(range(len(ACTIONS)), [f"{a}\n({st[a]['failed_steps']})" for a in ACTIONS])
        ax.set(title=regime.replace("_", "-"), xlabel="action (failed steps)")
    axes[0][0].set_ylabel("share of the failed steps")
    axes[0][-1].legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False,
                       title="first failing stage")
    fig.suptitle("Where each action's failures start (§D.1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
