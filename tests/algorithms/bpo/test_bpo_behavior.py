"""BPO's math (ALGORITHMS.md §A.6 items 2–7): rewards, parser, advantage invariants, unbiasedness."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from troupe.algorithms.bpo.behavior import (
    TypeEMA,
    ar_cf,
    ar_literal,
    behavior_reward,
    behaviour_met,
    counterfactual_baselines,
    criterion,
    letter_probs,
    mixed_mean,
    mixed_meanstd,
)
from troupe.envs.video_qa.items import ABST, INVALID, parse_answer
from troupe.platform.errors import DataError
from troupe.platform.registry import ADVANTAGES, REWARDS


# -- confidences and rewards -------------------------------------------------------------------
def test_letter_probs_renormalise_over_the_items_options():
    lp = torch.tensor([math.log(0.2), math.log(0.1), math.log(0.1), float("-inf")])
    p = letter_probs(lp, 3)
    assert torch.allclose(p, torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))
    assert float(p.sum()) == pytest.approx(1.0)


@pytest.mark.parametrize("answer,conf,expected", [(0, 0.7, 0.3), (0, 1.0, 0.0), (1, 0.7, 1.0), (ABST, 0.7, 1.0),
                                                  (INVALID, 0.7, 0.0)])
def test_sens_reward(answer, conf, expected):
    r = criterion("SENS", answer, gold=0, conf_gold=conf, c_fa=0.5)
    assert r == pytest.approx(expected)
    assert 0.0 <= r <= 1.0


def test_orig_stab_abst_rewards():
    assert criterion("ORIG", 2, 2, 0.3, c_fa=0.5) == 1.0
    assert criterion("STAB", 1, 2, 0.3, c_fa=0.5) == 0.0
    assert criterion("STAB", ABST, 2, 0.3, c_fa=0.5) == -0.5
    assert criterion("ABST", ABST, 2, 0.3, c_fa=0.5) == 1.0
    assert criterion("ABST", 2, 2, 0.3, c_fa=0.5) == 0.0
    for label in ("ORIG", "STAB", "SENS", "ABST", "FLIP"):
        assert criterion(label, INVALID, 0, 0.5, c_fa=0.5) == 0.0
    met = [behaviour_met(lab, a, 1) for lab, a in (("ORIG", 1), ("STAB", 0), ("SENS", 0), ("SENS", 1),
                                                      ("ABST", ABST), ("FLIP", 0), ("FLIP", ABST))]
    assert met == [True, False, True, False, True, True, False]
    # FLIP: the other of two options earns 1, a* earns 0, abstaining costs c_fa.
    assert criterion("FLIP", 1, 0, 0.9, c_fa=0.5) == 1.0 and criterion("FLIP", 0, 1, 0.9, c_fa=0.5) == 1.0
    assert criterion("FLIP", 0, 0, 0.9, c_fa=0.5) == 0.0
    assert criterion("FLIP", ABST, 0, 0.9, c_fa=0.5) == -0.5
    with pytest.raises(DataError, match="FLIP needs two answer options"):
        behavior_reward("A", "FLIP", 0, 4, c_fa=0.5, r_fmt=0.1)
    with pytest.raises(DataError, match="MAYBE"):
        criterion("MAYBE", 0, 0, 0.5, c_fa=0.5)


def test_behavior_reward_reads_confidence_and_format():
    lp = torch.log(torch.tensor([0.6, 0.3, 0.1]))
    out = behavior_reward("A", "ORIG", gold=0, num_options=3, option_logprobs=lp, c_fa=0.5, r_fmt=0.1)
    assert out == pytest.approx({"reward": 1.1, "answer": 0.0, "conf_gold": 0.6})
    out = behavior_reward("the answer is A", "ORIG", gold=0, num_options=3, option_logprobs=lp, c_fa=0.5, r_fmt=0.1)
    assert out["reward"] == pytest.approx(1.0)  # right answer, no format bonus
    out = behavior_reward("A", "SENS", gold=0, num_options=3, option_logprobs=lp, c_fa=0.5, r_fmt=0.1)
    assert out["reward"] == pytest.approx(0.4)
    assert REWARDS.get("bpo_behavior") is behavior_reward


# -- parser ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("B", 1), ("(B)", 1), ("B.", 1), ("Answer: C", 2), ("B then C", 1), ("D", ABST),
    ("Cannot be determined from the video", ABST), ("can't tell", ABST), ("unknown", ABST),
    ("not enough information", ABST), ("", INVALID), ("zzz", INVALID), ("E", INVALID), ("BAD", INVALID),
])
def test_parse_answer(text, expected):
    assert parse_answer(text, 4) == expected  # A–C are options, D is the abstain option


# -- advantages -----------------------------------------------------------------------------------
def _pack(rewards, anchors, gids=None):
    r = torch.tensor(rewards, dtype=torch.float32)
    a = torch.tensor(anchors, dtype=torch.bool)
    g = torch.zeros(len(r), dtype=torch.long) if gids is None else torch.tensor(gids)
    return r, a, g


def test_equal_rewards_give_zero_advantages():
    r, a, g = _pack([0.7] * 10, [1, 1, 0, 0, 0] * 2, [0] * 5 + [1] * 5)
    assert torch.all(ar_literal(r, g, is_anchor=a) == 0)
    assert torch.all(mixed_mean(r, g) == 0)
    assert torch.all(mixed_meanstd(r, g) == 0)


def test_ar_literal_values():
    r, a, g = _pack([1.0, 0.0, 0.5, 1.0], [1, 1, 0, 0])
    adv = ar_literal(r, g, is_anchor=a)
    assert adv.tolist() == pytest.approx([1.0, -1.0, 0.0, 0.5])  # anchors: leave-one-out; views: r - mean(anchors)


def test_ar_cf_is_zero_when_the_view_repeats_the_anchor_answer():
    # Anchors answered 0 (gold); the SENS view answered 0 with the same confidence.
    labels = ["ORIG", "ORIG", "SENS", "STAB", "ABST"]
    answers = torch.tensor([0, 0, 0, 0, 0])
    gold = torch.zeros(5, dtype=torch.long)
    conf = torch.tensor([0.9, 0.9, 0.8, 0.9, 0.9])
    rewards = torch.tensor([criterion(lab, int(x), 0, float(c), c_fa=0.5) for lab, x, c in zip(labels, answers, conf, strict=True)])
    g, a = torch.zeros(5, dtype=torch.long), torch.tensor([True, True, False, False, False])
    cf = counterfactual_baselines(g, a, labels, answers, gold, conf, c_fa=0.5)
    adv = ar_cf(rewards, g, is_anchor=a, cf_baseline=cf)
    assert adv[2:].tolist() == pytest.approx([0.0, 0.0, 0.0])
    assert adv[:2].tolist() == pytest.approx([0.0, 0.0])


def test_counterfactual_baseline_matches_the_scalar_criterion():
    rng = np.random.default_rng(0)
    n_packs, size = 20, 5
    size = 6
    labels = [("ORIG", "ORIG", "STAB", "SENS", "ABST", "FLIP")[i % size] for i in range(n_packs * size)]
    g = torch.arange(n_packs).repeat_interleave(size)
    a = torch.tensor([lab == "ORIG" for lab in labels])
    gold = torch.tensor(rng.integers(0, 2, n_packs)).repeat_interleave(size)  # two options (FLIP's domain)
    answers = torch.tensor(rng.choice([0, 1, ABST, INVALID], n_packs * size))
    conf = torch.tensor(rng.uniform(0, 1, n_packs * size))
    cf = counterfactual_baselines(g, a, labels, answers, gold, conf, c_fa=0.5)
    for i in range(n_packs * size):
        if a[i]:
            assert math.isnan(cf[i])
            continue
        anchors = [k for k in range(n_packs * size) if g[k] == g[i] and a[k]]
        want = np.mean([criterion(labels[i], int(answers[k]), int(gold[i]), float(conf[i]), c_fa=0.5) for k in anchors])
        assert float(cf[i]) == pytest.approx(want)


def test_constant_shift_leaves_anchor_relative_advantages_unchanged():
    rng = np.random.default_rng(1)
    r = torch.tensor(rng.uniform(-1, 1, 15), dtype=torch.float32)
    g = torch.arange(3).repeat_interleave(5)
    a = torch.tensor([True, True, False, False, False] * 3)
    cf = torch.tensor(rng.uniform(0, 1, 15))
    ema = torch.tensor(rng.uniform(0, 1, 15))
    for fn, kw in ((ar_literal, {}), (ar_cf, {"cf_baseline": cf})):
        base = fn(r, g, is_anchor=a, **kw)
        shifted_kw = {k: v + 3.0 for k, v in kw.items()}
        assert torch.allclose(fn(r + 3.0, g, is_anchor=a, **shifted_kw), base, atol=1e-5)
    # One anchor per pack: the caller's moving average is the anchor baseline.
    a1 = torch.tensor([True, False, False, False, False] * 3)
    base = ar_literal(r, g, is_anchor=a1, anchor_baseline=ema)
    assert torch.allclose(ar_literal(r + 3.0, g, is_anchor=a1, anchor_baseline=ema + 3.0), base, atol=1e-5)
    with pytest.raises(ValueError, match="anchor_baseline"):
        ar_literal(r, g, is_anchor=a1)


def test_pack_advantages_are_registered():
    for name in ("ar_cf", "ar_literal", "mixed_mean", "mixed_meanstd"):
        assert callable(ADVANTAGES.get(name))


def test_type_ema():
    ema = TypeEMA(decay=0.5)
    a = torch.tensor([True, True, False])
    first = ema.baseline(["t", "t", "t"], torch.tensor([1.0, 0.0, 5.0]), a)
    assert first.tolist() == [0.5, 0.5, 0.5]
    second = ema.baseline(["t", "s", "s"], torch.tensor([0.0, 1.0, 0.0]), torch.tensor([True, True, False]))
    assert second.tolist() == [0.5, 1.0, 1.0]
    assert ema.values == {"t": 0.25, "s": 1.0}
    other = TypeEMA()
    other.load(ema.state())
    assert other.values == ema.values and other.decay == 0.5


# -- unbiasedness on a tabular toy (§A.6.5) --------------------------------------------------------
@pytest.mark.parametrize("mode", ["ar_literal", "ar_cf"])
@pytest.mark.parametrize("label", ["SENS", "STAB", "ABST"])
def test_anchor_relative_advantages_are_unbiased(mode, label):
    """E[A ∇log π_v(o)] = E[r ∇log π_v(o)] for the view response, and the same for the anchors,
    over 10^5 packs of 2 anchors + 1 view response in a 3-action toy (gold, wrong, abstain)."""
    rng = np.random.default_rng(7)
    n = 100_000
    actions = np.array([0, 1, ABST])
    pi0 = np.array([0.5, 0.3, 0.2])  # policy on the original view
    piv = np.array([0.4, 0.35, 0.25])  # policy on the counterfactual view
    c = 0.4  # c_v(a*), detached: fixed for the view
    anchors = rng.choice(3, size=(n, 2), p=pi0)
    view = rng.choice(3, size=n, p=piv)
    ids = np.stack([anchors[:, 0], anchors[:, 1], view], 1).reshape(-1)
    labels = ["ORIG", "ORIG", label] * n
    answers = torch.tensor(actions[ids])
    gold = torch.zeros(3 * n, dtype=torch.long)
    conf = torch.full((3 * n,), c, dtype=torch.float64)
    rewards = torch.tensor([0.0] * (3 * n), dtype=torch.float64)
    r_table = {lab: np.array([criterion(lab, int(x), 0, c, c_fa=0.5) for x in actions]) for lab in ("ORIG", label)}
    rewards = torch.tensor(np.stack([r_table["ORIG"][anchors[:, 0]], r_table["ORIG"][anchors[:, 1]],
                                     r_table[label][view]], 1).reshape(-1))
    g = torch.arange(n).repeat_interleave(3)
    is_anchor = torch.tensor([True, True, False] * n)
    if mode == "ar_cf":
        cf = counterfactual_baselines(g, is_anchor, labels, answers, gold, conf, c_fa=0.5)
        adv = ar_cf(rewards, g, is_anchor=is_anchor, cf_baseline=cf).double().numpy().reshape(n, 3)
    else:
        adv = ar_literal(rewards, g, is_anchor=is_anchor).double().numpy().reshape(n, 3)

    def check(policy, chosen, a, r_of_action):
        # ∇_θ log softmax(θ)[a] = e_a − π; exact E[r ∇log π] = Σ_a π(a) r(a) (e_a − π).
        score = np.eye(3)[chosen] - policy
        est = (a[:, None] * score).mean(0)
        exact = sum(policy[k] * r_of_action[k] * (np.eye(3)[k] - policy) for k in range(3))
        se = (a[:, None] * score).std(0) / np.sqrt(len(a))
        assert np.all(np.abs(est - exact) < 4.5 * se + 1e-4), (est, exact, se)

    check(piv, view, adv[:, 2], r_table[label])
    check(pi0, anchors[:, 0], adv[:, 0], r_table["ORIG"])


def test_dr_grpo_loss_is_grpo_times_a_constant_for_equal_lengths_and_its_advantage_is_r_minus_mean():
    from troupe.actors.losses import aggregation_weights

    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0]])
    per_token = torch.randn(3, 4)
    dr = (aggregation_weights(mask, "dr_grpo", max_len=8) * per_token).sum()
    grpo = (aggregation_weights(mask, "grpo") * per_token).sum()
    assert float(dr) == pytest.approx(float(grpo) * 3 / 8, rel=1e-5)
    r, g = torch.tensor([1.0, 0.0, 0.5, 2.0]), torch.tensor([0, 0, 1, 1])
    assert ADVANTAGES.get("dr_grpo")(r, g).tolist() == pytest.approx([0.5, -0.5, -0.75, 0.75])
