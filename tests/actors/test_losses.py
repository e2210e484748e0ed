"""The policy-loss math against hand-computed values (and trl's helpers where they exist)."""

import math

import pytest
import torch

from troupe.actors.losses import (
    aggregation_weights,
    entropy_from_logits,
    k3_kl,
    policy_objective,
    ppo_clip,
    selective_log_softmax,
)


def test_selective_log_softmax_matches_full_log_softmax_and_trl():
    torch.manual_seed(0)
    logits, idx = torch.randn(2, 5, 11), torch.randint(0, 11, (2, 5))
    want = torch.log_softmax(logits, -1).gather(-1, idx.unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(selective_log_softmax(logits, idx), want, atol=1e-6)
    trl_utils = pytest.importorskip("trl.trainer.utils")
    assert torch.allclose(selective_log_softmax(logits, idx), trl_utils.selective_log_softmax(logits, idx), atol=1e-6)
    # a logsumexp the caller already has gives the same values
    lse = torch.logsumexp(logits, -1)
    assert torch.equal(selective_log_softmax(logits, idx, lse), selective_log_softmax(logits, idx))


def test_entropy_matches_trl_and_uniform_case():
    torch.manual_seed(1)
    logits = torch.randn(3, 4, 7)
    trl_utils = pytest.importorskip("trl.trainer.utils")
    assert torch.allclose(entropy_from_logits(logits), trl_utils.entropy_from_logits(logits), atol=1e-5)
    assert torch.allclose(entropy_from_logits(torch.zeros(1, 8)), torch.tensor([math.log(8)]))
    assert torch.allclose(entropy_from_logits(logits, torch.logsumexp(logits, -1)), entropy_from_logits(logits))


def test_k3_kl_hand_values():
    lp, ref = torch.tensor([0.0, -1.0]), torch.tensor([0.0, -2.0])
    # d = ref - lp = [0, -1]  →  e^d - d - 1 = [0, e^-1]
    assert torch.allclose(k3_kl(lp, ref), torch.tensor([0.0, math.exp(-1)]), atol=1e-7)


def test_ppo_clip_hand_values():
    lp = torch.log(torch.tensor([[1.5, 0.5, 1.0]]))  # ratios 1.5, 0.5, 1.0 against old = 0
    old = torch.zeros(1, 3)
    out = ppo_clip(lp, old, torch.tensor([1.0]), clip_low=0.2, clip_high=0.2)
    # A>0: min(ρ, clip(ρ)) = [1.2, 0.5, 1.0]
    assert torch.allclose(out.per_token, -torch.tensor([[1.2, 0.5, 1.0]]), atol=1e-6)
    assert out.token_metrics["ratio/clip_frac"].tolist() == [[1.0, 0.0, 0.0]]
    out = ppo_clip(lp, old, torch.tensor([-1.0]), clip_low=0.2, clip_high=0.28)
    # A<0: min(-ρ, -clip(ρ)) = -max(ρ, clip(ρ)) = [-1.5, -0.8, -1.0]
    assert torch.allclose(out.per_token, torch.tensor([[1.5, 0.8, 1.0]]), atol=1e-6)


def test_aggregations_hand_values():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    per_token = torch.tensor([[1.0, 3.0, 9.0, 9.0], [2.0, 2.0, 2.0, 6.0]])
    agg = {m: float((aggregation_weights(mask, m) * per_token).sum()) for m in ("grpo", "dapo", "dr_grpo")}
    assert agg["grpo"] == pytest.approx(((1 + 3) / 2 + (2 + 2 + 2 + 6) / 4) / 2)  # mean of sequence means
    assert agg["dapo"] == pytest.approx((1 + 3 + 2 + 2 + 2 + 6) / 6)  # token mean
    assert agg["dr_grpo"] == pytest.approx((1 + 3 + 2 + 2 + 2 + 6) / (2 * 4))  # constant normaliser
    assert float((aggregation_weights(mask, "dr_grpo", max_len=8) * per_token).sum()) == pytest.approx(16 / 16)


def test_global_normalisers_make_shards_add_up_to_the_whole():
    torch.manual_seed(2)
    mask = (torch.rand(6, 5) > 0.3).long()
    mask[:, 0] = 1
    per_token = torch.randn(6, 5)
    for mode in ("grpo", "dapo", "dr_grpo"):
        whole = (aggregation_weights(mask, mode) * per_token).sum()
        norm = {"num_seqs": 6, "num_tokens": int(mask.sum()), "max_len": 5}
        parts = sum((aggregation_weights(mask[s], mode, **norm) * per_token[s]).sum()
                    for s in (slice(0, 2), slice(2, 6)))
        assert torch.allclose(whole, parts, atol=1e-6), mode


def test_objective_on_policy_gradient_is_advantage_weighted_score():
    # At ρ = 1 the PPO-clip gradient equals -A ∇logπ, aggregated.
    lp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    loss, m = policy_objective("ppo_clip", lp, lp.detach(), torch.tensor([2.0]), torch.ones(1, 2), aggregation="dapo")
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1.0, -1.0]]))
    assert m["ratio/clip_frac"] == 0.0


def test_objective_with_kl_requires_reference():
    lp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_objective("ppo_clip", lp, lp, torch.ones(1), torch.ones(1, 2), kl_coef=0.1)
    _, m = policy_objective("ppo_clip", lp, lp, torch.ones(1), torch.ones(1, 2), kl_coef=0.1,
                            ref_logprobs=torch.full((1, 2), -1.0))
    assert m["kl/ref"] == pytest.approx(math.exp(-1))


def test_entropy_bonus_subtracts_coef_times_entropy_aggregated_like_the_policy_loss():
    # At A = 0 the policy term is 0, so the loss is the bonus alone: -c · Σ w·H.
    lp = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    entropy = torch.tensor([[1.0, 2.0, 5.0], [4.0, 7.0, 7.0]])  # masked positions must not count
    zero = torch.zeros(2)
    # grpo: w = m / (|o_i| · N) = [[1/4, 1/4, 0], [1/2, 0, 0]]  →  Σ w·H = 0.25 + 0.5 + 2 = 2.75
    loss, m = policy_objective("reinforce", lp, lp, zero, mask, aggregation="grpo", entropy=entropy, entropy_coef=0.5)
    assert loss.item() == -1.375 and m["loss/entropy"] == -1.375
    # dapo: w = m / Σm = 1/3 on each of the three tokens  →  Σ w·H = 7/3
    loss, _ = policy_objective("reinforce", lp, lp, zero, mask, aggregation="dapo", entropy=entropy, entropy_coef=0.5)
    assert loss.item() == pytest.approx(-0.5 * 7 / 3, abs=1e-7)
    # off by default: the entropy is ignored and nothing is logged for it
    loss, m = policy_objective("reinforce", lp, lp, zero, mask, entropy=entropy)
    assert loss.item() == 0.0 and "loss/entropy" not in m
    with pytest.raises(ValueError, match="entropy"):
        policy_objective("reinforce", lp, lp, zero, mask, entropy_coef=0.1)


def test_entropy_bonus_gradient_raises_the_entropy():
    logits = torch.tensor([[[2.0, 0.0, -1.0]]], requires_grad=True)
    h = entropy_from_logits(logits)
    loss, _ = policy_objective("reinforce", torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(1), torch.ones(1, 1),
                               entropy=h, entropy_coef=1.0)
    loss.backward()
    # a step against the gradient flattens the distribution: the most likely token loses mass
    assert logits.grad[0, 0, 0] > 0 and logits.grad[0, 0, 2] < 0


def test_entropy_of_a_truncated_distribution_counts_only_the_kept_tokens():
    inf = float("inf")
    logits = torch.tensor([[0.0, 0.0, -inf, -inf]], requires_grad=True)
    h = entropy_from_logits(logits)
    assert h.item() == pytest.approx(math.log(2))
    h.sum().backward()
    assert torch.isfinite(logits.grad).all()  # 0 · (-inf) never reaches the gradient
