"""§G.4's baselines on hand-built streams with known answers, and their ranking on §G.6's stream."""

import numpy as np
import pytest

from troupe.algorithms.judge import baselines as BL
from troupe.algorithms.judge import model as M
from troupe.algorithms.judge.model import Comparison, HumanLabel, JudgePair
from troupe.envs.judge_streams import SyntheticConfig, synthetic_stream


def labels(*ys):
    return tuple(HumanLabel(f"r{k}", y, "crowd") for k, y in enumerate(ys))


def enc(comps, **kw):
    return M.encode_stream(comps, **kw)


def test_majority_vote_shares_ties_and_set_labels():
    s = enc([
        Comparison("a", labels("A", "A", "B")),
        Comparison("b", labels("A", "B")),
        Comparison("c", labels(frozenset("AT"), "A")),
        Comparison("d", (), JudgePair("A", "A")),
    ])
    r = BL.majority_vote(s)
    assert np.allclose(r.probs[0], [2 / 3, 1 / 3, 0])
    assert np.allclose(r.probs[1], [0, 0, 1])  # no majority: T
    assert np.allclose(r.probs[2], [0.75, 0, 0.25])
    assert np.allclose(r.probs[3], 1 / 3) and r.missing == 1


@pytest.mark.parametrize("judge_model", ["joint", "factorised"])
def test_judge_baselines_read_one_or_both_orders(judge_model):
    pairs = [("A", "A"), ("A", "B"), ("T", "T"), (None, "B"), (None, None)]
    s = enc([Comparison(f"c{k}", (), JudgePair(*p)) for k, p in enumerate(pairs)], judge_model=judge_model)
    single, both = BL.judge_single_order(s), BL.judge_both_orders(s)
    assert single.verdicts[:3].tolist() == [0, 0, 2] and single.missing == 2
    assert both.verdicts[:4].tolist() == [0, 2, 2, 1]  # agree → verdict, disagree → T, one order alone
    assert np.allclose(both.probs[4], 1 / 3) and both.missing == 1


def test_dawid_skene_recovers_unanimous_labels_and_counts_set_labels():
    comps = [Comparison(f"c{k}", labels(y, y, y), JudgePair(y, y)) for k, y in enumerate("ABTAB")]
    comps.append(Comparison("s", labels(frozenset("AB"), "A", "A")))
    r = BL.dawid_skene(enc(comps))
    assert r.verdicts.tolist() == [0, 1, 2, 0, 1, 0]
    assert r.skipped_labels == 1 and r.missing == 0
    assert r.probs[:5].max(-1).min() > 0.99


def test_on_the_g6_stream_aggregators_beat_a_single_judge_call():
    st = synthetic_stream(SyntheticConfig(n=300, seed=5))
    s = enc(st.comparisons)
    acc = {f.__name__: (f(s).verdicts == st.verdicts).mean()
           for f in (BL.majority_vote, BL.dawid_skene, BL.judge_single_order)}
    assert acc["dawid_skene"] >= acc["majority_vote"] > acc["judge_single_order"]
