"""ALGORITHMS.md §G.4's baselines, each returning (n, 3) verdict probabilities over (A, B, T).

* majority vote over the human labels (a set-valued label splits its vote over its members);
* Dawid–Skene EM (crowd-kit), humans plus, optionally, the judge's two orders as two workers;
* the LLM judge in one order (J^AB);
* the LLM judge in both orders, naive: agree → that verdict, disagree → T.

Items without the inputs a baseline needs get the uniform distribution, counted in `missing`.
"""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np

from troupe.algorithms.judge.model import PHI, THETA, EncodedStream, T


@dataclasses.dataclass
class BaselineResult:
    probs: np.ndarray  # (n, 3)
    missing: int  # items the baseline had no input for (uniform there)
    skipped_labels: int = 0  # set-valued labels a single-label method cannot read

    @property
    def verdicts(self) -> np.ndarray:
        return self.probs.argmax(-1)


def majority_vote(stream: EncodedStream) -> BaselineResult:
    """Vote shares of the human labels; an exact tie between the top verdicts puts the mass on T."""
    probs = np.full((stream.n_items, 3), 1 / 3)
    missing = 0
    for i, obs in enumerate(stream.by_item()):
        votes = np.zeros(3)
        for o in obs:
            if o.family == THETA:
                votes[list(o.cells)] += 1 / len(o.cells)
        if votes.sum() == 0:
            missing += 1
            continue
        top = np.flatnonzero(np.isclose(votes, votes.max()))
        if len(top) > 1:  # no majority: the comparison is undecided, which is what T says
            probs[i] = np.eye(3)[T]
        else:
            probs[i] = votes / votes.sum()
    return BaselineResult(probs, missing)


def _judge_pairs(stream: EncodedStream) -> list[tuple[int | None, int | None]]:
    """Each item's judge verdicts (J^AB, J^BA), None for an order not observed (unparsed)."""
    out: list[tuple[int | None, int | None]] = []
    for obs in stream.by_item():
        ab = ba = None
        for o in obs:
            if o.family != PHI:
                continue
            if stream.judge_model == "joint":
                abs_, bas = {c // 3 for c in o.cells}, {c % 3 for c in o.cells}
                ab = abs_.pop() if len(abs_) == 1 else None
                ba = bas.pop() if len(bas) == 1 else None
            elif o.owner == 0:
                ab = o.cells[0]
            else:
                ba = o.cells[0]
        out.append((ab, ba))
    return out


def judge_single_order(stream: EncodedStream) -> BaselineResult:
    """The verdict of order AB alone, as a one-hot distribution."""
    probs = np.full((stream.n_items, 3), 1 / 3)
    missing = 0
    for i, (ab, _) in enumerate(_judge_pairs(stream)):
        if ab is None:
            missing += 1
        else:
            probs[i] = np.eye(3)[ab]
    return BaselineResult(probs, missing)


def judge_both_orders(stream: EncodedStream) -> BaselineResult:
    """Both orders: the shared verdict when they agree, T when they disagree; one order alone when the other is missing."""
    probs = np.full((stream.n_items, 3), 1 / 3)
    missing = 0
    for i, (ab, ba) in enumerate(_judge_pairs(stream)):
        if ab is None and ba is None:
            missing += 1
        elif ab is None or ba is None:
            probs[i] = np.eye(3)[ab if ab is not None else ba]
        else:
            probs[i] = np.eye(3)[ab if ab == ba else T]
    return BaselineResult(probs, missing)


def dawid_skene(stream: EncodedStream, include_judge: bool = True, n_iter: int = 100, tol: float = 1e-5) -> BaselineResult:
    """Dawid–Skene EM by crowd-kit over single-valued labels; the judge's orders are workers 'judge:AB', 'judge:BA'."""
    import pandas as pd
    from crowdkit.aggregation import DawidSkene

    rows, skipped = [], 0
    for i, obs in enumerate(stream.by_item()):
        for o in obs:
            if o.family == THETA:
                if o.is_set:
                    skipped += 1
                    continue
                rows.append((i, stream.raters[o.owner], o.cells[0]))
    if include_judge:
        for i, (ab, ba) in enumerate(_judge_pairs(stream)):
            rows += [(i, w, y) for w, y in (("judge:AB", ab), ("judge:BA", ba)) if y is not None]
    probs = np.full((stream.n_items, 3), 1 / 3)
    if not rows:
        return BaselineResult(probs, stream.n_items, skipped)
    df = pd.DataFrame(rows, columns=["task", "worker", "label"])
    with warnings.catch_warnings():
        # crowd-kit 1.4.2 passes pandas keywords (copy=, inplace=) that pandas 3 deprecates; harmless here
        warnings.filterwarnings("ignore", message=".*(copy|inplace) keyword.*")
        ds = DawidSkene(n_iter=n_iter, tol=tol).fit(df)
    p = ds.probas_.reindex(columns=[0, 1, 2], fill_value=0.0)
    probs[p.index.to_numpy()] = p.to_numpy()
    return BaselineResult(probs, stream.n_items - len(p), skipped)

