"""Toy label streams small enough for the exact recursion (§G.7)."""

import numpy as np
import pytest

from troupe.algorithms.judge.model import Comparison, HumanLabel, JudgePair

SETS = (frozenset("AT"), frozenset("BT"), frozenset("AB"))


def make_toy(n=5, raters=2, seed=0, set_labels=False, judge=True, per_item=None):
    """n comparisons; rater k is in group 'expert' for k == 0 else 'crowd'; labels drawn leaning on a hidden verdict."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        v = "ABT"[rng.choice(3, p=[0.4, 0.4, 0.2])]
        who = range(raters) if per_item is None else sorted(rng.choice(raters, per_item, replace=False))
        labels = []
        for k in who:
            y = v if rng.random() < 0.7 else "ABT"[rng.integers(3)]
            lab = SETS[rng.integers(3)] if set_labels and rng.random() < 0.3 else y
            labels.append(HumanLabel(f"r{k}", lab, "expert" if k == 0 else "crowd"))
        pair = None
        if judge:
            ab = v if rng.random() < 0.7 else "A"  # a judge leaning to the first position
            ba = v if rng.random() < 0.7 else "B"
            pair = JudgePair(ab, ba)
        out.append(Comparison(f"c{i}", tuple(labels), pair, (f"a{i}", f"b{i}")))
    return out


@pytest.fixture
def toy():
    return make_toy
