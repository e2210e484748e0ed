"""Benchmark of `bpo`: BPO against its baselines on the synthetic counterfactual video-QA task.

Part 1 trains every arm of §A.3 from one SFT checkpoint, side by side in one run per seed:
budget-matched GRPO, GRPO with 2x rollouts, Aug-GRPO, BPO (AR-cf), BPO with random views,
and BPO under each other advantage mode (AR-literal, mixed-mean, mixed-meanstd). Intervals
pool seeds and items (each resample draws items within every seed).
Part 2 sweeps the pack size (2, 4, 8) for GRPO and BPO at the same budget, and size 2 with
`bpo.rotate_slots` (a one-view pack otherwise never holds the null view); ``--packs`` picks cells.
Part 3 sweeps the spurious cue's strength (0.6 .. 0.95): where does BPO's temporal-hard gain
appear, and where does GRPO learn the order by itself?
Part 4 sweeps §A.5's noisy perception of order (``task.order_noise``: a rendering shows the
clip backwards with that probability; 0.2 by default, below the cue's 0.85) to 0.1 and 0.3, and
0.3 against a cue of 0.95; it also trains `bpo_flip`, where a reversed order/direction clip must
take the other answer (SENS accepts any move off a*).
Part 5 runs GRPO and BPO on the pixel rendering through the tiny vision-language model
(preset `vl-cpu`: 112 px frames, one vision token per grid cell), 200 test items.
Part "linear" is §A.5's own benchmark (`troupe.algorithms.bpo.linear`): a softmax-linear
policy that sees a clip only through five features, trained by REINFORCE with the same
rewards and advantage estimators, 5 seeds, every arm; then the mask label of items without
X, the batch-size sweep of §A.5 (2, 4, 8 prompts) and the cue-strength sweep. About ten
minutes in all.
Part "small" asks §A.2's reason for the anchor-relative advantage, stability at small packs,
on the linear policy: AR-cf (BPO's default) against AR-literal and mixed-mean at batches of 2,
4 and 8 prompts, clips of 6 and 12 frames and temporal shares of 0.3 and 0.7, 8 seeds each,
counting the seeds that end at the shortcut (temporal-hard accuracy below 0.25: the cue answers
every hard item wrong, and the SFT start is at 0.00). About 25 minutes.
Part "small_lm" asks it on the tiny LM: the same three modes at 2, 4 and 8 prompts a step, the
default clip and question mix, 3 seeds, a seed at the shortcut when its order-hard accuracy
ends below 0.25 (the LM stays at chance on direction under every arm). About 35 minutes with
``--set run.eval_every=400`` (the evaluation of three arms dominates a step of 2 prompts).
Each seed fits its own SFT checkpoint (``model.sft.seed``) before its RL arms. Results go to
benchmarks/results/bpo.json (parts not run keep their saved figures; the sections measured on
the task before its redesign sit under ``former_task``, and no claim is read from them); every
figure is as measured.

    python benchmarks/bpo.py --sweep-seeds 2 --set run.eval_every=200   # all parts: about 2 h on 2 cores
    python benchmarks/bpo.py --seeds 1 --sweep-seeds 1 --steps 100   # a quick look
    python benchmarks/bpo.py --parts main --main-arms grpo,grpo_2x,bpo   # the claim alone, 3 seeds
    python benchmarks/bpo.py --parts main --main-arms grpo,grpo_2x,bpo --steps 800 --set run.eval_every=100 \
        --main-key main_800                          # the same, twice as long, kept beside it
    python benchmarks/bpo.py --parts noise --set eval.num_prompts=600  # more temporal-hard items
    python benchmarks/bpo.py --parts linear        # §A.5's softmax-linear benchmark only
    python benchmarks/bpo.py --parts small         # small packs: which advantage collapses
    python benchmarks/bpo.py --parts small_lm      # the same question on the tiny LM, 3 seeds
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent
ARMS_MAIN = ["grpo", "grpo_2x", "aug_grpo", "bpo", "bpo_random", "bpo_ar_literal", "bpo_mixed_mean",
             "bpo_mixed_meanstd"]
PACKS = {"2": {"anchors": 1, "num_views": 1, "per_view": 1}, "4": {"anchors": 1, "num_views": 3, "per_view": 1},
         "8": {"anchors": 2, "num_views": 3, "per_view": 2},
         # A one-view pack holds only §A.2's first slot (STAB-or-SENS) and never the null view;
         # rotating the slots over a step's prompts gives abstention a share of the views.
         "2-rotated": {"anchors": 1, "num_views": 1, "per_view": 1, "rotate_slots": True}}
CUES = [0.6, 0.75, 0.85, 0.95]
# (order_noise, cue_strength) around the default (0.2, 0.85), §A.5's setting and part 1's: frames
# more reliable than the cue, less reliable at the same cue, and less reliable against a stronger one.
NOISY = [(0.1, 0.85), (0.3, 0.85), (0.3, 0.95)]
NOISE_ARMS = ["grpo", "bpo", "bpo_flip"]  # bpo_flip: reversed order/direction clips demand the other answer
LINEAR_ARMS = ["grpo", "grpo_2x", "aug_grpo", "bpo", "bpo_ar_literal", "bpo_mixed_mean", "bpo_mixed_meanstd"]
LINEAR_BATCHES = [2, 4, 8]
LINEAR_SEEDS = 5
# Small packs (§A.2's stability reason): AR-cf (bpo's default) against the other two modes.
SMALL_ARMS = ["bpo", "bpo_ar_literal", "bpo_mixed_mean"]
SMALL_BATCHES = [2, 4, 8]
SMALL_FRAMES = [6, 12]  # clip lengths beside the default 8 of the batch sweep
SMALL_MIXES = [0.3, 0.7]  # shares of temporal items
SMALL_SEEDS = 8
COLLAPSE = 0.25  # temporal-hard accuracy below this: at the shortcut (the cue gets 0 on hard items)
# §A.5's expected figures [REF], for the side-by-side table.
LINEAR_EXPECTED = {"sft": {"macro_acc": 0.50}, "grpo": {"macro_acc": 0.67, "temporal_hard_acc": 0.00, "abstain_f1": 0.00},
                   "bpo": {"macro_acc": 0.73, "temporal_hard_acc": 0.40, "abstain_f1": 0.93}}
# Sections measured on the synthetic task before its redesign (contiguous spans, no order noise),
# kept as that record; no claim is read from them.
FORMER = "former_task"
METRICS = ("macro_acc", "temporal_hard_acc", "abstain_f1", "stability", "sensitivity", "false_abstention")


def train(out: Path, arms: list[str], seed: int, steps: int | None, overrides: list[str],
          preset: str | None = None) -> dict[str, Any]:
    """One run of `bpo` with ``arms``; returns each arm's final eval records and the SFT's."""
    from troupe.platform.driver import Run

    # Each seed fits its own SFT checkpoint (model.sft.seed), so seeds differ in the start, not only in RL.
    ov = [f"bpo.arms=[{','.join(arms)}]", f"run.seed={seed}", f"model.sft.seed={seed}", "run.checkpoint_every=0",
          "run.progress=false",
          f"run.num_cpus={max(4, 2 * len(arms))}", *overrides]
    if steps is not None:
        ov.append(f"run.steps={steps}")
    shutil.rmtree(out, ignore_errors=True)  # a previous result there would mix into this one's evaluations
    t0 = time.perf_counter()
    with Run("bpo", preset=preset, overrides=ov, out=out) as run:
        summary = run.run()
    records, curves = eval_curves(out, arms)
    return {"records": records, "curves": curves, "wall_s": time.perf_counter() - t0, "claim": summary.get("claim"),
            "steps": summary.get("steps"), "train_by_type": train_by_type(out, arms)}


def train_by_type(out: Path, arms: list[str]) -> dict[str, dict[str, dict[str, float]]]:
    """Per arm and question type, the mean over training steps of the anchors' accuracy and of
    the type's share of the advantage mass (where each arm's update comes from; over the steps
    with an update, |A| > 0)."""
    from troupe.platform.metrics import read_metrics

    rows = read_metrics(out / "metrics.jsonl")
    result: dict[str, dict[str, dict[str, float]]] = {}
    for arm in arms:
        for family in ("train_acc", "adv_share"):
            vals: dict[str, list[float]] = {}
            for row in rows:
                if family == "adv_share" and not row.get(f"adv_abs/{arm}"):
                    continue
                for k, v in row.items():
                    if k.startswith(f"{family}_") and k.endswith(f"/{arm}") and isinstance(v, int | float):
                        vals.setdefault(k[len(family) + 1: -len(arm) - 1], []).append(float(v))
            for q, xs in vals.items():
                result.setdefault(arm, {}).setdefault(q, {})[family] = sum(xs) / len(xs)
    return result


def eval_curves(out: Path, arms: list[str]) -> tuple[dict[str, list[dict]], dict[str, list[dict]]]:
    """A run directory's final eval records per arm (and the SFT's, its first evaluation), and
    each arm's temporal-hard accuracy at every evaluation, by type: an end point can sit in a
    trough, and on pixels the order reading switches on and off between evaluations."""
    from troupe.algorithms.bpo.evaluation import hard_by_type

    records, curves = {}, {}
    for arm in arms:
        files = sorted((out / "eval" / arm).glob("step_*.jsonl"))
        evals = [[json.loads(x) for x in f.read_text().splitlines()] for f in files]
        records[arm] = evals[-1]
        records.setdefault("sft", evals[0])
        curves[arm] = []
        for f, recs in zip(files, evals, strict=True):
            hard = [r["correct"] for r in recs if r["hard"]]
            curves[arm].append({"step": int(f.stem.removeprefix("step_")), "temporal_hard_acc": sum(hard) / len(hard),
                                **{q: v["value"] for q, v in hard_by_type([recs]).items()}})
    return records, curves


def table(records_by_seed: dict[str, list[list[dict]]], n_boot: int) -> dict[str, Any]:
    """Per arm: pooled value and 95% interval of each metric, and the per-seed values."""
    from troupe.algorithms.bpo.evaluation import (
        accuracy_by_type,
        answer_shares,
        behaviour_metrics,
        hard_by_type,
        pooled_bootstrap,
    )

    out = {}
    for arm, per_seed in records_by_seed.items():
        out[arm] = {"pooled": pooled_bootstrap(per_seed, n_boot),
                    "per_seed": [behaviour_metrics(r) for r in per_seed],
                    "hard_by_type": hard_by_type(per_seed), "accuracy_by_type": accuracy_by_type(per_seed),
                    # a seed that collapses a type onto one answer shows here, not in its accuracy
                    "answers_by_type_per_seed": [answer_shares([r]) for r in per_seed],
                    # which seeds moved which type: a pooled gain can be one seed's
                    "hard_by_type_per_seed": [{q: v["value"] for q, v in hard_by_type([r]).items()}
                                              for r in per_seed]}
    return out


def print_table(title: str, rows: dict[str, Any]) -> None:
    from troupe.algorithms.bpo.evaluation import fmt_ci

    print(f"\n{title}")
    print(f"{'policy':<20}" + "".join(f"{m:>26}" for m in METRICS))
    for arm, r in rows.items():
        print(f"{arm:<20}" + "".join(f"{fmt_ci(r['pooled'][m]):>26}" for m in METRICS))


def verdict(rows: dict[str, Any]) -> dict[str, Any]:
    """The run report's claim check on the pooled intervals, under the JSON's key names."""
    from troupe.algorithms.bpo.algorithm import claim_check

    sft = rows["sft"]["pooled"] if "sft" in rows else None
    c = claim_check({arm: {"metrics": r["pooled"]} for arm, r in rows.items() if arm != "sft"}, sft)
    out = {"temporal_hard_separated": c["temporal_hard"], "abstain_f1_separated": c["abstain_f1"],
           "macro_not_lower": c["macro_not_lower"]}
    if "grpo_2x_closes_gap" in c:
        out["grpo_2x_closes_gap"] = c["grpo_2x_closes_gap"]
    if "grpo_macro_over_sft" in c:
        out["grpo_macro_over_sft"] = c["grpo_macro_over_sft"]
    out["claim_holds"] = c["holds"]
    return out


def _cells(result: dict[str, Any], label: str = "") -> list[tuple[str, dict[str, Any]]]:
    """``(label, part)`` of every part of a result that holds arms and a verdict, in order."""
    out = []
    for key, part in result.items():
        if not isinstance(part, dict) or key in ("runs", "claims", FORMER):
            continue
        name = f"{label}/{key}" if label else key
        if "verdict" in part and "arms" in part:
            out.append((name, part))
        else:
            out.extend(_cells(part, name))
    return out


def claims(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The top-level claims list: per part of the result (the main comparison, each sweep cell,
    pixels, the linear benchmark's parts), §A's claim against budget-matched GRPO as its
    verdict judges it. ``measured`` is the gap between the pooled 95% intervals: BPO's lower
    end minus GRPO's upper end where BPO must be higher (apart when > 0), BPO's upper end
    minus GRPO's lower end for macro accuracy (not lower when >= 0)."""
    out = []
    for name, part in _cells(result):
        v, arms = part["verdict"], part["arms"]
        b, g = arms["bpo"]["pooled"], arms["grpo"]["pooled"]
        parts = [("temporal_hard_acc", "temporal_hard_separated", "temporal-hard accuracy above GRPO's"),
                 ("abstain_f1", "abstain_f1_separated", "abstention F1 above GRPO's")]
        for metric, key, text in parts:
            out.append({"claim": f"{name}: BPO {text} (95% intervals apart)",
                        "measured": b[metric]["lo"] - g[metric]["hi"], "holds": bool(v[key])})
        out.append({"claim": f"{name}: BPO macro accuracy not lower than GRPO's (GRPO's interval not wholly above)",
                    "measured": b["macro_acc"]["hi"] - g["macro_acc"]["lo"], "holds": bool(v["macro_not_lower"])})
        for metric, closes in (v.get("grpo_2x_closes_gap") or {}).items():
            g2 = arms["grpo_2x"]["pooled"][metric]
            out.append({"claim": f"{name}: GRPO with 2x rollouts does not close BPO's gap on {metric} "
                                 "(gains follow view sets, not rollout count)",
                        "measured": b[metric]["lo"] - g2["hi"], "holds": not closes})
        n = sum(bool(v[k]) for k in ("temporal_hard_separated", "abstain_f1_separated", "macro_not_lower"))
        out.append({"claim": f"{name}: BPO beats budget-matched GRPO (all three of the above)",
                    "measured": f"{n} of 3 hold", "holds": bool(v["claim_holds"])})
        if "sft" in arms:  # §A.5's expected figures have GRPO above SFT on macro accuracy (0.50 -> 0.67)
            gap = g["macro_acc"]["lo"] - arms["sft"]["pooled"]["macro_acc"]["hi"]
            # The verdict's flag where it has one (the run report's test); records before it, the gap.
            out.append({"claim": f"{name}: GRPO raises macro accuracy over the SFT start (95% intervals apart)",
                        "measured": gap, "holds": bool(v.get("grpo_macro_over_sft", gap > 0))})
        out += over_eval_claims(name, part.get("curves"))
        out += adv_order_claims(name, arms)
    return out + small_claims(result.get("small_packs") or {}) + small_claims(result.get("small_packs_lm") or {},
                                                                           "tiny LM")


def adv_order_claims(name: str, arms: dict[str, Any]) -> list[dict[str, Any]]:
    """§A.5's order of the advantage modes on macro accuracy, AR-cf >= mixed-mean >= AR-literal,
    one claim per step of it, for a part that trained all three. Point estimates: §A.5 gives
    points, and its own risk list expects AR-literal may not beat mixed-mean."""
    modes = {"AR-cf": "bpo", "mixed-mean": "bpo_mixed_mean", "AR-literal": "bpo_ar_literal"}
    if not all(arm in arms for arm in modes.values()):
        return []
    v = {label: arms[arm]["pooled"]["macro_acc"]["value"] for label, arm in modes.items()}
    measured = " / ".join(f"{label} {x:.3f}" for label, x in v.items())
    return [{"claim": f"{name}: macro accuracy by advantage mode in §A.5's order, {hi} >= {lo}",
             "measured": measured, "holds": bool(v[hi] >= v[lo])}
            for hi, lo in (("AR-cf", "mixed-mean"), ("mixed-mean", "AR-literal"))]


def over_evals(curves: dict[str, Any] | None) -> dict[str, list[float]]:
    """Per arm, each seed's temporal-hard accuracy averaged over its evaluations after step 0
    (the SFT start's): a measure no single end point decides, since BPO's swings between reading
    the order and following the cue (docs/bpo.md). Empty for curves of another shape (the
    linear benchmark's reward curves)."""
    out: dict[str, list[float]] = {}
    for arm, per_seed in (curves or {}).items():
        if isinstance(per_seed, list) and all(isinstance(c, list) for c in per_seed):
            out[arm] = [mean_after_start(seed, "temporal_hard_acc") for seed in per_seed]
    return out


def mean_after_start(curve: list[dict[str, Any]], key: str) -> float:
    """``key`` of one run's evaluations averaged over those after step 0 (the SFT start's)."""
    return float(np.mean([c[key] for c in curve if c["step"] > 0]))


def over_eval_claims(name: str, curves: dict[str, Any] | None) -> list[dict[str, Any]]:
    """BPO against each GRPO arm on temporal-hard accuracy averaged over evaluations, paired by
    seed (one SFT start per seed): holds when BPO is above in every seed. ``measured`` gives
    every seed's difference, since three seeds make no interval."""
    means = over_evals(curves)
    out = []
    for other in ("grpo", "grpo_2x"):
        if "bpo" not in means or other not in means:
            continue
        diff = [b - g for b, g in zip(means["bpo"], means[other], strict=True)]
        out.append({"claim": f"{name}: BPO temporal-hard accuracy averaged over every evaluation above "
                             f"{other.replace('grpo_2x', 'GRPO 2x').replace('grpo', 'GRPO')}'s in every seed",
                    "measured": "per seed " + ", ".join(f"{d:+.3f}" for d in diff)
                                + f" (BPO {np.mean(means['bpo']):.3f}, {other} {np.mean(means[other]):.3f})",
                    "holds": all(d > 0 for d in diff)})
    return out


def linear_part(n_boot: int, save_partial: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """§A.5's softmax-linear benchmark: every arm at batch 32, then the batch and cue sweeps."""
    from troupe.algorithms.bpo import linear

    seeds = list(range(LINEAR_SEEDS))
    cfg = linear.LinearConfig()
    part: dict[str, Any] = {"config": vars(cfg), "seeds": seeds, "expected": LINEAR_EXPECTED}
    t = time.perf_counter()
    out = linear.run(LINEAR_ARMS, seeds, cfg)
    rows = table(out["records"], n_boot)
    part["main"] = {"arms": rows, "verdict": verdict(rows), "weights_seed0": out["weights"], "curves": out["curves"],
                    "wall_s": time.perf_counter() - t}
    print_table(f"Linear (§A.5): batch {cfg.batch_prompts}, {cfg.steps} steps, {len(seeds)} seeds", rows)
    print("  expected (§A.5):", LINEAR_EXPECTED)
    print(json.dumps(part["main"]["verdict"], indent=1))
    save_partial(part)
    # The mask view of a static item without X is a no-op: STAB by default; SENS reads §A.5's
    # "mask-X (SENS)" literally.
    c = linear.LinearConfig(mask_without_x="SENS")
    rows = table(linear.run(["grpo", "bpo"], seeds, c)["records"], n_boot)
    part["mask_without_x_sens"] = {"arms": rows, "verdict": verdict(rows)}
    print_table("Linear (§A.5): mask view of X-absent items SENS", rows)
    save_partial(part)
    part["batch_sweep"] = {}
    for bs in LINEAR_BATCHES:
        c = linear.LinearConfig(batch_prompts=bs)
        rows = table(linear.run(["grpo", "bpo", "bpo_ar_literal", "bpo_mixed_mean"], seeds, c)["records"], n_boot)
        part["batch_sweep"][str(bs)] = {"arms": rows, "verdict": verdict(rows)}
        print_table(f"Linear (§A.5): batch {bs}", rows)
        save_partial(part)
    part["cue_sweep"] = {}
    for cue in CUES:
        c = linear.LinearConfig(cue_strength=cue)
        rows = table(linear.run(["grpo", "bpo"], seeds, c)["records"], n_boot)
        part["cue_sweep"][str(cue)] = {"arms": rows, "verdict": verdict(rows)}
        print_table(f"Linear (§A.5): cue strength {cue} (order read right {1 - c.order_noise:.2f})", rows)
        save_partial(part)
    part["wall_s"] = time.perf_counter() - t
    return part


def small_packs_part(save_partial: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Per cell (batch, clip length, temporal share) and arm: each seed's temporal-hard accuracy
    and how many seeds end at the shortcut (``collapsed``); the SFT start's beside them."""
    from troupe.algorithms.bpo import linear
    from troupe.algorithms.bpo.evaluation import behaviour_metrics

    part: dict[str, Any] = {"arms": SMALL_ARMS, "seeds": SMALL_SEEDS, "collapse_below": COLLAPSE, "cells": {}}
    t = time.perf_counter()
    for bs in SMALL_BATCHES:
        for frames in SMALL_FRAMES:
            for mix in SMALL_MIXES:
                cfg = linear.LinearConfig(batch_prompts=bs, num_frames=frames, temporal_share=mix)
                out = linear.run(SMALL_ARMS, range(SMALL_SEEDS), cfg)
                cell: dict[str, Any] = {"batch_prompts": bs, "num_frames": frames, "temporal_share": mix}
                for arm in ["sft", *SMALL_ARMS]:
                    per_seed = [behaviour_metrics(r) for r in out["records"][arm]]
                    hard = [m["temporal_hard_acc"] for m in per_seed]
                    cell[arm] = {"temporal_hard_acc": hard, "collapsed": sum(h < COLLAPSE for h in hard),
                                 "macro_acc": [m["macro_acc"] for m in per_seed]}
                key = f"batch{bs}-frames{frames}-temporal{mix}"
                part["cells"][key] = cell
                print(f"small packs, {key}: collapsed seeds of {SMALL_SEEDS}: "
                      + ", ".join(f"{arm} {cell[arm]['collapsed']}" for arm in SMALL_ARMS)
                      + f" (sft {cell['sft']['collapsed']}); median temporal-hard "
                      + ", ".join(f"{arm} {float(np.median(cell[arm]['temporal_hard_acc'])):.2f}"
                                  for arm in SMALL_ARMS), flush=True)
                save_partial(part)
    count_collapsed(part)
    part["wall_s"] = time.perf_counter() - t
    return part


def count_collapsed(part: dict[str, Any]) -> None:
    """Seeds at the shortcut per advantage mode, over every cell and per batch size."""
    cells = part["cells"].values()
    part["collapsed_total"] = {arm: sum(c[arm]["collapsed"] for c in cells) for arm in SMALL_ARMS}
    part["collapsed_by_batch"] = {str(bs): {arm: sum(c[arm]["collapsed"] for c in cells if c["batch_prompts"] == bs)
                                            for arm in SMALL_ARMS} for bs in SMALL_BATCHES}


def small_lm_part(go: Callable[..., dict[str, Any]], seeds: int,
                  save_partial: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """The small-pack question on the tiny LM: AR-cf against AR-literal and mixed-mean at 2, 4
    and 8 prompts a step (the default clip length and question mix), ``seeds`` seeds each. A
    seed is at the shortcut when its order-hard accuracy at the end is below `COLLAPSE` (every
    LM arm stays at chance on direction, so order is where the shortcut is left or not); the
    mean over every evaluation is kept beside it, since BPO's order-hard accuracy swings."""
    from troupe.algorithms.bpo.evaluation import hard_by_type

    part: dict[str, Any] = {"arms": SMALL_ARMS, "seeds": seeds, "collapse_below": COLLAPSE,
                            "measure": "temporal_order hard accuracy at the last evaluation", "cells": {}}
    t = time.perf_counter()
    for bs in SMALL_BATCHES:
        runs = [go(f"small-lm-batch{bs}-s{s}", SMALL_ARMS, s, [f"bpo.prompts_per_step={bs}"]) for s in range(seeds)]
        cell: dict[str, Any] = {"batch_prompts": bs, "wall_s": [r["wall_s"] for r in runs]}
        for arm in ["sft", *SMALL_ARMS]:
            order = [hard_by_type([r["records"][arm]])["temporal_order"]["value"] for r in runs]
            cell[arm] = {"order_hard_acc": order, "collapsed": sum(o < COLLAPSE for o in order)}
            if arm != "sft":
                cell[arm]["order_hard_mean_over_evals"] = [  # the evaluations after step 0 (the SFT start's)
                    mean_after_start(r["curves"][arm], "temporal_order") for r in runs]
        part["cells"][f"batch{bs}"] = cell
        print(f"small packs, tiny LM, batch {bs}: collapsed seeds of {seeds}: "
              + ", ".join(f"{arm} {cell[arm]['collapsed']}" for arm in SMALL_ARMS)
              + "; order-hard at the end " + ", ".join(f"{arm} {np.round(cell[arm]['order_hard_acc'], 2).tolist()}"
                                                      for arm in SMALL_ARMS), flush=True)
        save_partial(part)
    count_collapsed(part)
    part["wall_s"] = time.perf_counter() - t
    return part


def small_claims(part: dict[str, Any], where: str = "linear policy") -> list[dict[str, Any]]:
    """§A.2: AR-cf is the most stable at small packs (no more seeds end at the shortcut than
    under either other mode), over every cell and at each batch size."""
    if "collapsed_total" not in part:
        return []
    n = len(part["cells"]) * part["seeds"]
    out = []
    for label, counts, runs in [("all cells", part["collapsed_total"], n),
                                *[(f"batch {bs}", c, n // len(part["collapsed_by_batch"]))
                                  for bs, c in part["collapsed_by_batch"].items()]]:
        others = min(counts["bpo_ar_literal"], counts["bpo_mixed_mean"])
        out.append({"claim": f"small packs, {where}, {label}: no more seeds end at the shortcut under AR-cf "
                             "than under AR-literal or mixed-mean",
                    "measured": f"seeds at the shortcut of {runs}: AR-cf {counts['bpo']}, "
                                f"AR-literal {counts['bpo_ar_literal']}, mixed-mean {counts['bpo_mixed_mean']}",
                    "holds": counts["bpo"] <= others})
    return out


# Every part main() runs, in the order it runs them.
PARTS = ("linear", "small", "main", "small_lm", "pack", "cue", "noise", "pixels")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--sweep-seeds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None, help="RL steps per run (default: the config's)")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--parts", default="linear,main,pack,cue,noise,pixels",
                    help=f"comma list of {', '.join(PARTS)}")
    ap.add_argument("--packs", default=",".join(PACKS), help=f"part pack's cells, a comma list of {', '.join(PACKS)}")
    ap.add_argument("--main-arms", default=",".join(ARMS_MAIN),
                    help="part main's arms (default: every baseline; grpo,grpo_2x,bpo for the claim alone)")
    ap.add_argument("--main-key", default="main",
                    help="part main's section of the JSON (another name keeps the default-length run beside it)")
    ap.add_argument("--work", default="/tmp/troupe-bench-bpo", help="run directories go here")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run, after each part's own (e.g. eval.num_prompts=600)")
    ap.add_argument("--out", default=str(ROOT / "results" / "bpo.json"))
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    if unknown := sorted(parts - set(PARTS)):
        ap.error(f"--parts: unknown {', '.join(unknown)}; the parts are {', '.join(PARTS)}")
    if unknown := sorted(set(args.packs.split(",")) - set(PACKS)):
        ap.error(f"--packs: unknown {', '.join(unknown)}; the cells are {', '.join(PACKS)}")
    work = Path(args.work)
    out = Path(args.out)
    # Parts not run this time keep their saved figures (and the settings they were run with).
    result: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    run_info = {"machine": {"platform": platform.platform(), "python": platform.python_version()},
                "seeds": args.seeds, "sweep_seeds": args.sweep_seeds, "steps": args.steps, "set": args.set}
    result.setdefault("runs", {})
    t_all = time.perf_counter()

    def record_key() -> str:
        cells = f"[{args.packs}]" if "pack" in done and args.packs != ",".join(PACKS) else ""
        return ",".join(sorted(done)) + cells

    def go(name: str, arms: list[str], seed: int, overrides: list[str], preset: str | None = None) -> dict[str, Any]:
        return train(work / name, arms, seed, args.steps, [*overrides, *args.set], preset)

    done: set[str] = set()  # the parts this invocation has saved figures of

    def save(part: str | None = None) -> None:  # after every part: an interrupted run keeps what it measured
        # The run's record is keyed by the parts it saved, so an interrupted run names no part it never wrote.
        if part and part not in done:
            result["runs"].pop(record_key(), None)  # the key before this part joined it
            done.add(part)
        if done:
            result["runs"][record_key()] = {**run_info, "wall_s": time.perf_counter() - t_all}
        result["claims"] = claims(result)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1) + "\n")
        tmp.replace(out)

    if "linear" in parts:
        def keep_linear(part: dict[str, Any]) -> None:
            result["linear"] = part
            save("linear")

        keep_linear(linear_part(args.bootstrap, keep_linear))

    if "small" in parts:
        def keep_small(part: dict[str, Any]) -> None:
            result["small_packs"] = part
            save("small")

        keep_small(small_packs_part(keep_small))
        for c in small_claims(result["small_packs"]):
            print(f"  {c['claim']}: {c['measured']} ({'holds' if c['holds'] else 'does not hold'})")

    if args.main_key != "main" and not args.main_key.startswith("main_"):
        ap.error(f"--main-key {args.main_key!r}: 'main' or a name starting 'main_' (others are the sections of other parts)")
    main_arms = args.main_arms.split(",")
    from troupe.algorithms.bpo.config import ARMS  # the baselines and the diagnostic arms

    unknown = sorted(set(main_arms) - set(ARMS))
    if unknown or "grpo" not in main_arms or "bpo" not in main_arms:
        ap.error(f"--main-arms {args.main_arms!r}: a comma list of {','.join(ARMS)} holding grpo and bpo")
    main_runs: list[dict] = []
    if "main" in parts:
        for s in range(args.seeds):
            main_runs.append(go(f"main-s{s}", main_arms, s, []))
            print(f"main seed {s}: {main_runs[-1]['wall_s']:.0f}s", flush=True)
        by_arm = {arm: [r["records"][arm] for r in main_runs] for arm in ["sft", *main_arms]}
        rows = table(by_arm, args.bootstrap)
        print_table("Part 1: every arm, pooled over seeds and items", rows)
        curves = {arm: [r["curves"][arm] for r in main_runs] for arm in main_arms}
        result[args.main_key] = {"arms": rows, "verdict": verdict(rows), "steps": args.steps, "curves": curves,
                                 "train_by_type_per_seed": [r["train_by_type"] for r in main_runs],
                                 "wall_s": [r["wall_s"] for r in main_runs]}
        print(json.dumps(result[args.main_key]["verdict"], indent=1))
        save("main")

    if "small_lm" in parts:
        def keep_small_lm(part: dict[str, Any]) -> None:
            result["small_packs_lm"] = part
            save("small_lm")

        keep_small_lm(small_lm_part(go, args.seeds, keep_small_lm))
        for c in small_claims(result["small_packs_lm"], "tiny LM"):
            print(f"  {c['claim']}: {c['measured']} ({'holds' if c['holds'] else 'does not hold'})")

    if "pack" in parts:
        result.setdefault("pack_sweep", {})  # cells not run this time keep their saved figures
        for size in args.packs.split(","):
            shape = PACKS[size]
            ov = [f"bpo.{k}={v}" for k, v in shape.items()]
            runs = [go(f"pack{size}-s{s}", ["grpo", "bpo"], s, ov) for s in range(args.sweep_seeds)]
            rows = table({arm: [r["records"][arm] for r in runs] for arm in ("grpo", "bpo")}, args.bootstrap)
            result["pack_sweep"][str(size)] = {"shape": shape, "arms": rows, "verdict": verdict(rows)}
            print_table(f"Part 2: pack size {size} {shape}", rows)
            save("pack")

    if "cue" in parts:
        result["cue_sweep"] = {}
        # Overrides that leave a run's end point as it is (evaluations draw no training randomness).
        outcome_sets = [s for s in args.set if not s.startswith("run.eval_every=")]
        # The default cell is part 1's comparison (arms train independently), whether part 1 ran
        # now, under the same overrides, or was saved and no override here changes an outcome.
        main_fits = "main" in result and (bool(main_runs and args.main_key == "main") or not outcome_sets)
        for cue in CUES:
            if cue == 0.85 and main_fits:
                rows = {arm: result["main"]["arms"][arm] for arm in ("sft", "grpo", "bpo")}
                result["cue_sweep"][str(cue)] = {"arms": rows, "verdict": verdict(rows), "from": "main"}
                print_table(f"Part 3: cue strength {cue} (part 1's arms)", rows)
                continue
            runs = [go(f"cue{cue}-s{s}", ["grpo", "bpo"], s, [f"task.cue_strength={cue}"])
                    for s in range(args.sweep_seeds)]
            rows = table({arm: [r["records"][arm] for r in runs] for arm in ("sft", "grpo", "bpo")}, args.bootstrap)
            result["cue_sweep"][str(cue)] = {"arms": rows, "verdict": verdict(rows)}
            print_table(f"Part 3: cue strength {cue}", rows)
            save("cue")

    if "noise" in parts:
        result["noise_sweep"] = {}
        for noise, cue in NOISY:
            ov = [f"task.order_noise={noise}", f"task.cue_strength={cue}"]
            runs = [go(f"noise{noise}-cue{cue}-s{s}", NOISE_ARMS, s, ov)
                    for s in range(args.sweep_seeds)]
            rows = table({arm: [r["records"][arm] for r in runs] for arm in ("sft", *NOISE_ARMS)}, args.bootstrap)
            result["noise_sweep"][f"noise{noise}-cue{cue}"] = {"order_noise": noise, "cue_strength": cue,
                                                              "arms": rows, "verdict": verdict(rows)}
            print_table(f"Part 4: order noise {noise}, cue strength {cue}", rows)
            for arm, r in rows.items():
                print(f"  {arm:<6} temporal-hard by type: {r['hard_by_type']}")
            save("noise")

    if "pixels" in parts:
        runs = [go(f"pixels-s{s}", ["grpo", "bpo"], s, ["eval.num_prompts=200"], preset="vl-cpu")
                for s in range(args.sweep_seeds)]
        rows = table({arm: [r["records"][arm] for r in runs] for arm in ("sft", "grpo", "bpo")}, args.bootstrap)
        result["pixels"] = {"preset": "vl-cpu", "arms": rows, "verdict": verdict(rows),
                            "curves": {arm: [r["curves"][arm] for r in runs] for arm in ("grpo", "bpo")},
                            "train_by_type_per_seed": [r["train_by_type"] for r in runs],
                            "wall_s": [r["wall_s"] for r in runs]}
        print_table("Part 5: pixel rendering, tiny vision-language model (vl-cpu)", rows)
        save("pixels")

    save()
    print(f"\nwrote {out} ({time.perf_counter() - t_all:.0f}s)")


if __name__ == "__main__":
    main()
