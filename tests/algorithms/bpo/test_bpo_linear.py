"""§A.5's softmax-linear benchmark: clips, views, features, the SFT start, and the claim at a
small scale."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from troupe.algorithms.bpo import linear as L
from troupe.algorithms.bpo.algorithm import claim_check
from troupe.algorithms.bpo.evaluation import behaviour_metrics, pooled_bootstrap
from troupe.platform.errors import ConfigError


def first_x_before_y(frames: np.ndarray) -> bool:
    xs, ys = np.flatnonzero(frames == L.X), np.flatnonzero(frames == L.Y)
    return xs[0] < ys[0]


def test_temporal_clips_carry_their_answer_and_the_shortcut_at_the_configured_rate():
    cfg = L.LinearConfig(cue_strength=0.85)
    rng = np.random.default_rng(0)
    clips = [L.train_clip(rng, cfg) for _ in range(4000)]
    temporal = [c for c in clips if c.qtype == "temporal"]
    assert 0.45 < len(temporal) / len(clips) < 0.55
    follows = 0
    for c in temporal:
        n_x, n_y = int((c.frames == L.X).sum()), int((c.frames == L.Y).sum())
        assert (n_x, n_y) in {(3, 1), (1, 3)}
        assert first_x_before_y(c.frames) == (c.gold == L.YES)
        follows += (n_x > n_y) == (c.gold == L.YES)
        assert c.hard == ((n_x > n_y) != (c.gold == L.YES))
    assert abs(follows / len(temporal) - 0.85) < 0.03
    for c in clips:
        if c.qtype == "static":
            assert ((c.frames == L.X).any()) == (c.gold == L.YES)


def test_test_set_is_half_shortcut_broken_and_fixed_by_its_seed():
    cfg = L.LinearConfig(test_items=200)
    a, b = L.test_set(cfg), L.test_set(cfg)
    assert all(np.array_equal(x.frames, y.frames) for x, y in zip(a, b, strict=True))
    temporal = [c for c in a if c.qtype == "temporal"]
    assert Counter(c.hard for c in temporal) == {True: 50, False: 50}


def test_views_and_their_labels():
    rng = np.random.default_rng(1)
    clip = L.Clip(np.array([L.X, 3, L.Y, -1, L.X, 4, L.X, -1]), "temporal", L.YES)
    for _ in range(20):
        s = L.view(clip, "shuffle", rng)
        assert sorted(s.tolist()) == sorted(clip.frames.tolist())
    assert not (L.view(clip, "mask", rng) == L.X).any()
    assert (L.view(clip, "mask", rng) != L.BLANK).sum() == 3
    assert (L.view(clip, "blank", rng) == L.BLANK).all()
    assert [L.label(clip, v) for v in L.VIEWS] == ["SENS", "SENS", "ABST"]
    static_yes = L.Clip(np.array([L.X, -1, -1, -1, -1, -1, -1, -1]), "static", L.YES)
    static_no = L.Clip(np.array([2, -1, -1, -1, -1, -1, -1, -1]), "static", L.NO)
    assert [L.label(static_yes, v) for v in L.VIEWS] == ["STAB", "SENS", "ABST"]
    assert L.label(static_no, "mask") == "STAB"  # nothing to mask
    assert L.label(static_no, "mask", mask_without_x="SENS") == "SENS"
    with pytest.raises(ConfigError, match="view 'reverse'"):
        L.view(clip, "reverse", rng)


def test_features_exact():
    rng = np.random.default_rng(0)
    frames = np.array([L.Y, L.X, 3, -1, L.X, -1, L.X, -1])
    assert L.features(frames, rng, 0.0).tolist() == [-1.0, 1.0, 1.0, 5 / 8, 1.0]
    assert L.features(frames, rng, 1.0)[0] == 1.0  # always flipped
    assert L.features(np.full(8, L.BLANK), rng, 1.0).tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]
    assert L.features(np.array([L.X, -1, -1, -1, -1, -1, -1, -1]), rng, 1.0)[0] == 0.0  # no Y: no order


def test_sft_start_follows_the_shortcut_exactly():
    cfg = L.LinearConfig(test_items=200)
    records = L.evaluate(None, cfg)
    clips = L.test_set(cfg)
    by = {g: [r["correct"] for r in records if r["group"] == g] for g in ("static", "temporal", "temporal_hard")}
    assert all(by["temporal"]) and not any(by["temporal_hard"])  # 1.5 on the shortcut beats 0.3 on order
    # Static weights start at zero: yes and no tie and the argmax takes yes.
    assert np.mean(by["static"]) == np.mean([c.gold == L.YES for c in clips if c.qtype == "static"])
    m = behaviour_metrics(records)
    assert m["abstain_f1"] == 0.0 and m["false_abstention"] == 0.0
    assert m["temporal_hard_acc"] == 0.0


def test_reinforce_step_moves_the_taken_action_up_when_its_advantage_is_positive():
    cfg = L.LinearConfig()
    policy = L.LinearPolicy(cfg)
    phi = torch.tensor([[1.0, -1.0, 1.0, 0.5, 1.0]], dtype=torch.float64)
    q = torch.tensor([1])
    before = policy.log_probs(phi, q).detach()
    opt = torch.optim.SGD([policy.weights], lr=cfg.lr)
    loss = -(torch.tensor([1.0], dtype=torch.float64) * policy.log_probs(phi, q)[:, 0]).mean()
    loss.backward()
    grad = policy.weights.grad[1].clone()
    p = before.exp()[0]
    # d log π(yes) / dW[a] = (1[a = yes] − π(a)) φ
    expected = torch.stack([(float(a == 0) - p[a]) * phi[0] for a in range(3)])
    assert torch.allclose(-grad, expected)
    opt.step()
    assert policy.log_probs(phi, q)[0, 0] > before[0, 0]


def test_unknown_arm_and_bad_config_are_named():
    with pytest.raises(ConfigError, match="linear arm 'ppo'"):
        L.train("ppo", L.LinearConfig(steps=1), 0)
    with pytest.raises(ConfigError, match="linear.cue_strength"):
        L.LinearConfig(cue_strength=1.5)
    with pytest.raises(ConfigError, match="linear.mask_without_x"):
        L.LinearConfig(mask_without_x="ABST")


@pytest.mark.timeout(300)
def test_bpo_beats_grpo_on_temporal_hard_and_abstention_at_small_scale():
    """§A.5's claim with §A.5's training (300 steps of 32 prompts) and 2 seeds: BPO above GRPO
    on temporal-hard accuracy and abstention F1 with intervals apart, macro accuracy not lower."""
    cfg = L.LinearConfig(test_items=300)
    out = L.run(["grpo", "bpo"], seeds=[0, 1], cfg=cfg)
    arms = {arm: {"metrics": pooled_bootstrap(out["records"][arm], 200)} for arm in ("sft", "grpo", "bpo")}
    check = claim_check(arms)
    assert check["temporal_hard"] and check["abstain_f1"] and check["macro_not_lower"], check["lines"]
    assert arms["grpo"]["metrics"]["temporal_hard_acc"]["value"] == 0.0  # GRPO keeps the shortcut
