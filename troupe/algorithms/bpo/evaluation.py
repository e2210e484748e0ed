"""BPO's evaluation (§A.4): per-item records from greedy answers on the original view, a null
copy and the item's counterfactual views; metrics over records; bootstrap 95% intervals over
items.

A record is a plain dict so it can be written as JSON lines and re-read by `troupe report`:
``{"item_id", "qtype", "group", "hard", "temporal", "orig": answer, "gold": answer, "correct": bool,
"null_abst": bool, "stab": [unchanged, ...], "sens": [sensed, ...]}``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from troupe.envs.video_qa.items import ABST, INVALID, LETTERS, TEMPORAL_QTYPES

METRICS = ("macro_acc", "macro_groups", "temporal_hard_acc", "abstain_f1", "stability", "sensitivity",
           "false_abstention")
METRIC_TITLES = {
    "macro_acc": "macro accuracy",
    "macro_groups": "macro accuracy (3 groups)",
    "temporal_hard_acc": "temporal-hard accuracy",
    "abstain_f1": "abstention F1",
    "stability": "stability (STAB views)",
    "sensitivity": "sensitivity (SENS views)",
    "false_abstention": "false abstention (originals)",
}


def item_record(item: Any, orig: int, conf_orig: np.ndarray, null_answer: int,
                views: Sequence[tuple[str, int, np.ndarray]], conf_drop: float = 0.3) -> dict[str, Any]:
    """One test item's outcomes. ``views`` holds ``(label, answer, letter probs)`` per probe;
    a SENS probe counts as sensed when the answer changed or the original answer's
    confidence dropped by more than ``conf_drop``; a FLIP probe (in ``sens`` too) only when
    the answer moved to the other of two options."""
    stab, sens = [], []
    for label, answer, conf in views:
        if label == "STAB":
            stab.append(bool(answer == orig))
        elif label == "SENS":
            dropped = orig >= 0 and float(conf_orig[orig] - conf[orig]) > conf_drop
            sens.append(bool(answer != orig or dropped))
        elif label == "FLIP":
            sens.append(bool(orig in (0, 1) and answer == 1 - orig))
    # Macro accuracy averages over question types on the synthetic task, over benchmarks on real data.
    group = item.qtype if getattr(item, "source", "synthetic") == "synthetic" else item.source
    return {"item_id": item.item_id, "qtype": item.qtype, "group": group, "hard": bool(item.hard),
            "temporal": item.qtype in TEMPORAL_QTYPES, "orig": int(orig), "gold": int(item.answer),
            "correct": bool(orig == item.answer), "null_abst": bool(null_answer == ABST), "stab": stab, "sens": sens}


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else float("nan")


def behaviour_metrics(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """The §A.4 metrics of a set of records (NaN where a metric has no items).

    ``macro_acc`` averages the accuracy of each group a record names: each question type on the
    synthetic task (five there), each benchmark on real data. ``macro_groups`` is the linear
    benchmark's reading (§A.5): the mean over three groups, non-temporal items, temporal items
    that follow the cue and temporal-hard items (groups without items left out; on real data,
    where every temporal item is hard, two groups)."""
    by_type: dict[str, list[bool]] = {}
    for r in records:
        by_type.setdefault(r.get("group", r["qtype"]), []).append(r["correct"])
    # Abstention probes: each item's null copy is a positive, its original a negative.
    tp = sum(r["null_abst"] for r in records)
    fn = len(records) - tp
    fp = sum(r["orig"] == ABST for r in records)
    groups = [[r["correct"] for r in records if not r["temporal"]],
              [r["correct"] for r in records if r["temporal"] and not r["hard"]],
              [r["correct"] for r in records if r["hard"]]]
    return {
        "macro_acc": _mean([_mean(v) for v in by_type.values()]),
        "macro_groups": _mean([_mean(g) for g in groups if g]),
        "temporal_hard_acc": _mean([r["correct"] for r in records if r["hard"]]),
        "abstain_f1": 2 * tp / (2 * tp + fp + fn) if (tp + fp + fn) else float("nan"),
        "stability": _mean([x for r in records for x in r["stab"]]),
        "sensitivity": _mean([x for r in records for x in r["sens"]]),
        "false_abstention": _mean([r["orig"] == ABST for r in records]),
    }


def accuracy_by_type(records_by_seed: Sequence[Sequence[dict[str, Any]]], hard_only: bool = False,
                     ) -> dict[str, dict[str, float]]:
    """Accuracy of each question type (of its temporal-hard items with ``hard_only``), pooled
    over seeds, with its item count."""
    by: dict[str, list[bool]] = {}
    for records in records_by_seed:
        for r in records:
            if not hard_only or r["hard"]:  # records without a hard flag count when all items do
                by.setdefault(r["qtype"], []).append(r["correct"])
    return {q: {"value": sum(v) / len(v), "n": len(v)} for q, v in sorted(by.items())}


def answer_shares(records_by_seed: Sequence[Sequence[dict[str, Any]]], gold: bool = False,
                  ) -> dict[str, dict[str, float]]:
    """Per question type, the share of items answered with each option letter (``abstain`` and
    ``invalid`` for the rest), pooled over seeds; with ``gold`` the gold answers' shares
    (records written before they kept the gold are left out). An arm answering a type with
    fewer options than its gold uses has collapsed onto an answer prior, which accuracy alone
    does not show (BPO's counting on the tiny LM: docs/bpo.md)."""
    by: dict[str, list[int]] = {}
    for records in records_by_seed:
        for r in records:
            if not gold or "gold" in r:
                by.setdefault(r["qtype"], []).append(r["gold"] if gold else r["orig"])

    def name(a: int) -> str:
        return "abstain" if a == ABST else "invalid" if a == INVALID else LETTERS[a]

    return {q: {name(a): v.count(a) / len(v) for a in sorted(set(v), key=lambda a: (a < 0, a))}
            for q, v in sorted(by.items())}


def hard_by_type(records_by_seed: Sequence[Sequence[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Temporal-hard accuracy of each type: the two temporal types can move apart (one read
    from the frames while the other follows the cue)."""
    return accuracy_by_type(records_by_seed, hard_only=True)


def bootstrap(records: Sequence[dict[str, Any]], n_resamples: int = 1000, seed: int = 0,
              metrics: Callable[[Sequence[dict[str, Any]]], dict[str, float]] = behaviour_metrics,
              ) -> dict[str, dict[str, float]]:
    """Each metric's value and percentile 95% interval over items resampled with replacement
    (an item carries its probes with it)."""
    rng = np.random.default_rng(seed)
    point = metrics(records)
    draws: dict[str, list[float]] = {k: [] for k in point}
    n = len(records)
    for _ in range(n_resamples):
        sample = [records[i] for i in rng.integers(0, n, n)]
        for k, v in metrics(sample).items():
            draws[k].append(v)
    out = {}
    for k, v in point.items():
        arr = np.array([x for x in draws[k] if not np.isnan(x)])
        lo, hi = (np.percentile(arr, [2.5, 97.5]) if len(arr) else (float("nan"), float("nan")))
        out[k] = {"value": v, "lo": float(lo), "hi": float(hi)}
    return out


def pooled_bootstrap(records_by_seed: Sequence[Sequence[dict[str, Any]]], n_resamples: int = 1000,
                     seed: int = 0) -> dict[str, dict[str, float]]:
    """Intervals over seeds and items together: each resample draws items within every seed
    and averages the seeds' metrics (the seed-to-seed spread enters through the mean)."""
    rng = np.random.default_rng(seed)
    point = {k: float(np.mean([behaviour_metrics(r)[k] for r in records_by_seed])) for k in METRICS}
    draws: dict[str, list[float]] = {k: [] for k in METRICS}
    for _ in range(n_resamples):
        per_seed = [behaviour_metrics([r[i] for i in rng.integers(0, len(r), len(r))]) for r in records_by_seed]
        for k in METRICS:
            draws[k].append(float(np.nanmean([m[k] for m in per_seed])))
    return {k: {"value": point[k], "lo": float(np.percentile(draws[k], 2.5)),
                "hi": float(np.percentile(draws[k], 97.5))} for k in METRICS}


def fmt_ci(ci: dict[str, float] | None) -> str:
    if not ci or np.isnan(ci["value"]):
        return "–"
    return f"{ci['value']:.3f} [{ci['lo']:.2f}, {ci['hi']:.2f}]"


def separated(a: dict[str, float], b: dict[str, float]) -> bool:
    """True when interval ``a`` lies wholly above interval ``b``."""
    return a["lo"] > b["hi"]
