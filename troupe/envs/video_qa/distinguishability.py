"""Can a view be told from the original clip without reading the order? (ALGORITHMS.md §A.2)

BPO's SENS reward on a shuffled or reversed clip is meant to pay for reading temporal
evidence. If a view differs from an original in statistics that say nothing about order (how
many frames each object is seen in, whether its appearances are contiguous, how often each
token occurs, how many frames are blank), a policy can satisfy SENS by detecting the view
instead: "non-contiguous → change the answer". `view_distinguishability` measures that: a
gradient-boosted classifier on such non-temporal features of original clips and their views,
cross-validated by clip, with its held-out accuracy and AUC. Near 0.5 the views are
indistinguishable; BPO prints the figures in its report and warns above chance.

scikit-learn (a dependency) is imported when the check runs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from troupe.envs.video_qa.items import SymbolicFrames, VideoItem
from troupe.envs.video_qa.synthetic import SYNTH_QTYPES, VideoQATask
from troupe.envs.video_qa.views import apply_view
from troupe.platform.errors import DataError

MAX_OBJECTS = 4


def _runs(frames: Sequence[int]) -> int:
    """Maximal runs of consecutive frame indices in an ascending list."""
    return sum(1 for i, t in enumerate(frames) if i == 0 or t != frames[i - 1] + 1)


def nontemporal_features(item: VideoItem, names: Sequence[str]) -> np.ndarray:
    """Features of a symbolic clip that carry no order of events: the question type; each
    object's frame count and number of contiguous runs (sorted, so not tied to a name); how
    many objects are contiguous; blank frames, blank runs and the longest blank run; the
    histogram of objects per frame; how many neighbouring frames share an object or are
    identical; and each name's token count. ``names`` fixes the order of the token counts."""
    if not isinstance(item.frames, SymbolicFrames):
        raise DataError(f"item {item.item_id!r}: the distinguishability check reads symbolic frames")
    frames = item.frames.frames
    seen: dict[str, list[int]] = {}
    for t, objs in enumerate(frames):
        for o in objs:
            seen.setdefault(o.name, []).append(t)
    counts = sorted((len(v) for v in seen.values()), reverse=True)
    runs = sorted((_runs(v) for v in seen.values()), reverse=True)
    pad = [0] * MAX_OBJECTS
    blank = [t for t, objs in enumerate(frames) if not objs]
    longest, cur = 0, 0
    for objs in frames:
        cur = cur + 1 if not objs else 0
        longest = max(longest, cur)
    per_frame = np.bincount([len(objs) for objs in frames], minlength=MAX_OBJECTS + 1)[: MAX_OBJECTS + 1]
    contents = [{(o.name, o.x, o.y) for o in objs} for objs in frames]
    shared = sum(bool({c[0] for c in a} & {c[0] for c in b}) for a, b in zip(contents, contents[1:], strict=False))
    same = sum(a == b for a, b in zip(contents, contents[1:], strict=False))
    tokens = [sum(o.name == nm for objs in frames for o in objs) for nm in names]
    qtype = [float(item.qtype == q) for q in SYNTH_QTYPES]
    return np.array([*qtype, len(seen), *(counts + pad)[:MAX_OBJECTS], *(runs + pad)[:MAX_OBJECTS],
                     sum(r == 1 for r in runs), float(all(r == 1 for r in runs)), len(blank), _runs(blank),
                     longest, *per_frame, shared, same, *tokens], dtype=np.float64)


def view_distinguishability(task: VideoQATask, n: int = 2000, views: Sequence[str] = ("shuffle", "reverse"),
                            seed: int = 0, margin: float = 0.02, folds: int = 3) -> dict[str, Any]:
    """How well non-temporal features tell each view from the original, on ``n`` training clips.

    Every clip contributes its original and its view (each rendered once, as a policy would
    see it: `VideoQATask.perceive`); a classifier is fitted on `nontemporal_features` with
    ``folds``-fold cross-validation grouped by clip, and scored on held-out rows. Returns
    ``{"clips": n, "views": {view: {"accuracy", "auc", "half_width", "distinguishable"}},
    "distinguishable": [views]}``: ``half_width`` is the 95% binomial half-width of an accuracy
    of 0.5 on the ``2n`` rows; a view is distinguishable when its accuracy exceeds
    0.5 + ``half_width`` + ``margin``.
    """
    from sklearn.ensemble import HistGradientBoostingClassifier
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import GroupKFold
    from threadpoolctl import threadpool_limits

    if n < 2 * folds:
        raise DataError(f"view_distinguishability: n={n} clips; expected at least {2 * folds}")
    c = task.config
    names = [f"{col} {sh}" for col in c.colours for sh in c.shapes]
    rng = np.random.default_rng(seed)
    items = task.sample_items(n, "train", rng)
    out: dict[str, Any] = {"clips": n, "views": {}, "distinguishable": []}
    for view in views:
        x, y, groups = [], [], []
        for k, item in enumerate(items):
            for label, shown in ((0, item), (1, apply_view(item, view, rng))):
                x.append(nontemporal_features(task.perceive(shown, rng), names))
                y.append(label)
                groups.append(k)
        xa, ya = np.stack(x), np.array(y)
        proba = np.zeros(len(ya))
        # One thread: a few thousand rows gain nothing from more, and on a busy machine the
        # thread pool's contention makes each fit several times slower.
        with threadpool_limits(1):
            for train, test in GroupKFold(n_splits=folds).split(xa, ya, groups):
                clf = HistGradientBoostingClassifier(max_iter=60, random_state=seed).fit(xa[train], ya[train])
                proba[test] = clf.predict_proba(xa[test])[:, 1]
        acc = float(np.mean((proba > 0.5) == ya))
        half = 1.96 * math.sqrt(0.25 / len(ya))
        res = {"accuracy": acc, "auc": float(roc_auc_score(ya, proba)), "half_width": half,
               "distinguishable": bool(acc > 0.5 + half + margin)}
        out["views"][view] = res
        if res["distinguishable"]:
            out["distinguishable"].append(view)
    return out


def describe(check: dict[str, Any]) -> list[str]:
    """Report lines: each view's figures, and a warning for each distinguishable view."""
    lines = []
    for view, r in check["views"].items():
        lines.append(f"{view}: held-out accuracy {r['accuracy']:.3f} (chance 0.5 ± {r['half_width']:.3f}), "
                     f"AUC {r['auc']:.3f}" + (" → DISTINGUISHABLE" if r["distinguishable"] else ""))
    for view in check["distinguishable"]:
        lines.append(f"WARNING: the {view} view can be told from the original by non-temporal features "
                     f"(accuracy {check['views'][view]['accuracy']:.2f} on {check['clips']} clips): a SENS reward on "
                     f"it can be earned without reading the order (e.g. task.layout=spans breaks contiguity "
                     f"under shuffle); task.layout=flicker keeps these statistics.")
    return lines
