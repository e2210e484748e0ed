"""Policy losses and their aggregation, as pure functions over per-token tensors.

A policy loss maps per-token log-probs to a per-token loss; `aggregation_weights` turns it
into one scalar. Aggregation uses batch-wide counts carried in ``Batch.meta`` so that N DDP
ranks, each with a shard, produce exactly the gradient of one rank holding the whole batch.
"""

from __future__ import annotations

from typing import Any

import torch

from troupe.platform.registry import POLICY_LOSSES

AGGREGATIONS = ("grpo", "dr_grpo", "dapo")


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, lse: torch.Tensor | None = None) -> torch.Tensor:
    """log softmax(logits)[index] without materialising the full log-softmax; ``lse``, when the
    caller has it (for the entropy too), is logsumexp(logits)."""
    # log p_i = z_i - logsumexp(z)
    if lse is None:
        lse = torch.logsumexp(logits, dim=-1)
    return logits.gather(-1, index.unsqueeze(-1)).squeeze(-1) - lse


def entropy_from_logits(logits: torch.Tensor, lse: torch.Tensor | None = None) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) z; ``lse``, when the caller has it, is logsumexp(z)."""
    if lse is None:
        lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse.unsqueeze(-1))
    return lse - (p * logits).sum(-1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1 (always >= 0)."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


def aggregation_weights(
    mask: torch.Tensor, mode: str, num_seqs: int | None = None, num_tokens: int | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Per-token weights w with loss = sum(w * per_token_loss).

    GRPO:    1/G sum_i 1/|o_i| sum_t        → w = m / (|o_i| · N)
    DAPO:    token mean over the batch      → w = m / sum(m)
    Dr.GRPO: constant normaliser N · L_max  → w = m / (N · L_max)
    ``num_seqs``/``num_tokens``/``max_len`` are batch-wide (default: this tensor's own).
    """
    m = mask.to(torch.float32)
    n = float(num_seqs if num_seqs is not None else m.shape[0])
    if mode == "grpo":
        lengths = m.sum(-1, keepdim=True).clamp(min=1.0)
        return m / lengths / n
    if mode == "dapo":
        total = float(num_tokens if num_tokens is not None else m.sum().item())
        return m / max(total, 1.0)
    if mode == "dr_grpo":
        length = float(max_len if max_len is not None else m.shape[-1])
        return m / (n * length)
    raise ValueError(f"unknown aggregation {mode!r}; expected one of {AGGREGATIONS}")


@POLICY_LOSSES.register("ppo_clip")
def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    **_: Any,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """-min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A) per token; ``advantages`` is [B] or [B, T]."""
    adv = advantages if advantages.dim() == logprobs.dim() else advantages.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv
    loss = -torch.min(unclipped, clipped)
    return loss, {"clipped": (clipped < unclipped).float(), "ratio": ratio.detach()}


@POLICY_LOSSES.register("reinforce")
def reinforce(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, **_: Any
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Importance-weighted policy gradient -ρ·A with ρ = π/π_old (no clipping)."""
    adv = advantages if advantages.dim() == logprobs.dim() else advantages.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    return -ratio * adv, {"clipped": torch.zeros_like(ratio), "ratio": ratio.detach()}


def policy_objective(
    loss_name: str,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    aggregation: str = "grpo",
    kl_coef: float = 0.0,
    ref_logprobs: torch.Tensor | None = None,
    num_seqs: int | None = None,
    num_tokens: int | None = None,
    max_len: int | None = None,
    **loss_kwargs: Any,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss: aggregate(policy loss + β·k3 KL) and its diagnostics."""
    per_token, extra = POLICY_LOSSES.get(loss_name)(logprobs, old_logprobs, advantages, **loss_kwargs)
    w = aggregation_weights(mask, aggregation, num_seqs, num_tokens, max_len)
    m = mask.to(per_token.dtype)
    denom = m.sum().clamp(min=1.0)
    metrics: dict[str, float] = {
        "loss/policy": float((w * per_token).sum().detach()),
        "ratio/clip_frac": float((extra["clipped"] * m).sum() / denom),
        "ratio/mean": float((extra["ratio"] * m).sum() / denom),
    }
    total = per_token
    if kl_coef or ref_logprobs is not None:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs in the batch (a reference scorer)")
        kl = k3_kl(logprobs, ref_logprobs)
        metrics["kl/ref"] = float((kl.detach() * m).sum() / denom)
        total = per_token + kl_coef * kl
    return (w * total).sum(), metrics
