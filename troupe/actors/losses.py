"""Policy losses and their aggregation, as pure functions over per-token tensors.

A policy loss maps per-token log-probs to a `PolicyLossOutput`; its own hyperparameters are
its keyword arguments, filled from ``learner.loss_kwargs``. An aggregation (``grpo``,
``dr_grpo``, ``dapo``) gives the per-token weights that turn it into one scalar. Both are
registered as entry points (``troupe.losses``, ``troupe.aggregations``). Aggregation uses
batch-wide counts, so that N DDP ranks, each with a shard, produce exactly the gradient of one
rank holding the whole batch.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import torch

from troupe.platform.errors import ConfigError
from troupe.platform.registry import AGGREGATIONS, POLICY_LOSSES


def selective_log_softmax(logits: torch.Tensor, index: torch.Tensor, lse: torch.Tensor | None = None) -> torch.Tensor:
    """log softmax(logits)[index] without materialising the full log-softmax; ``lse``, when the
    caller has it (for the entropy too), is logsumexp(logits)."""
    # log p_i = z_i - logsumexp(z)
    if lse is None:
        lse = torch.logsumexp(logits, dim=-1)
    return logits.gather(-1, index.unsqueeze(-1)).squeeze(-1) - lse


def entropy_from_logits(logits: torch.Tensor, lse: torch.Tensor | None = None) -> torch.Tensor:
    """H = logsumexp(z) - sum softmax(z) z; ``lse``, when the caller has it, is logsumexp(z).
    Tokens a truncated distribution removed (z = -inf, p = 0) add nothing."""
    if lse is None:
        lse = torch.logsumexp(logits, dim=-1)
    p = torch.exp(logits - lse.unsqueeze(-1))
    if torch.isneginf(logits).any():  # 0 · (-inf) is NaN, in the value and in its gradient
        logits = logits.masked_fill(p == 0, 0.0)
    return lse - (p * logits).sum(-1)


def k3_kl(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi || pi_ref): exp(ref - logp) - (ref - logp) - 1 (always >= 0)."""
    d = ref_logprobs - logprobs
    return torch.exp(d) - d - 1


@dataclasses.dataclass
class PolicyLossOutput:
    """What a policy loss returns: the per-token loss (the shape of ``logprobs``), and per-token
    diagnostics that the learner averages over the completion tokens and logs under their key."""

    per_token: torch.Tensor
    token_metrics: dict[str, torch.Tensor] = dataclasses.field(default_factory=dict)


# -- aggregations: per-token weights w with loss = sum(w * per_token_loss) -------------------
# ``num_seqs``/``num_tokens``/``max_len`` are batch-wide, so N DDP ranks give one rank's gradient.
def grpo_weights(mask: torch.Tensor, num_seqs: int, num_tokens: int, max_len: int) -> torch.Tensor:
    # GRPO: 1/G sum_i 1/|o_i| sum_t  →  w = m / (|o_i| · N)
    m = mask.to(torch.float32)
    return m / m.sum(-1, keepdim=True).clamp(min=1.0) / float(num_seqs)


def dapo_weights(mask: torch.Tensor, num_seqs: int, num_tokens: int, max_len: int) -> torch.Tensor:
    # DAPO: token mean over the batch  →  w = m / sum(m)
    return mask.to(torch.float32) / max(float(num_tokens), 1.0)


def dr_grpo_weights(mask: torch.Tensor, num_seqs: int, num_tokens: int, max_len: int) -> torch.Tensor:
    # Dr.GRPO: constant normaliser N · L_max  →  w = m / (N · L_max)
    return mask.to(torch.float32) / (float(num_seqs) * float(max_len))


def aggregation_weights(
    mask: torch.Tensor, mode: str, num_seqs: int | None = None, num_tokens: int | None = None,
    max_len: int | None = None,
) -> torch.Tensor:
    """Per-token weights of the registered aggregation ``mode``; the batch-wide counts default
    to this tensor's own."""
    return AGGREGATIONS.get(mode)(
        mask, num_seqs=int(num_seqs if num_seqs is not None else mask.shape[0]),
        num_tokens=int(num_tokens if num_tokens is not None else mask.sum().item()),
        max_len=int(max_len if max_len is not None else mask.shape[-1]))


# -- policy losses: (logprobs, old_logprobs, advantages, **own hyperparameters) → PolicyLossOutput
def ppo_clip(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.2,  # DAPO's clip-higher raises this (e.g. 0.28)
) -> PolicyLossOutput:
    """-min(ρA, clip(ρ, 1-ε_low, 1+ε_high)A) per token; ``advantages`` is [B] or [B, T]."""
    adv = advantages if advantages.dim() == logprobs.dim() else advantages.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high) * adv
    return PolicyLossOutput(-torch.min(unclipped, clipped),
                            {"ratio/clip_frac": (clipped < unclipped).float(), "ratio/mean": ratio.detach()})


def reinforce(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor) -> PolicyLossOutput:
    """Importance-weighted policy gradient -ρ·A with ρ = π/π_old (no clipping)."""
    adv = advantages if advantages.dim() == logprobs.dim() else advantages.unsqueeze(-1)
    ratio = torch.exp(logprobs - old_logprobs)
    return PolicyLossOutput(-ratio * adv, {"ratio/clip_frac": torch.zeros_like(ratio), "ratio/mean": ratio.detach()})


def truncated_is_weights(proximal_logprobs: torch.Tensor, behaviour_logprobs: torch.Tensor, cap: float,
                         mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token importance weights π_prox/π_behaviour, truncated at ``cap``, without gradient, 0
    where ``mask`` is 0: from the policy that sampled the batch (the engines' log-probs) to the
    learner's own before the update (its recomputed log-probs)."""
    # Decoupled PPO / TIS: w_t = min(π_prox(a_t) / π_behav(a_t), C)
    w = torch.exp(proximal_logprobs.detach() - behaviour_logprobs.detach()).clamp(max=cap)
    return w if mask is None else w * mask.to(w.dtype)


def check_loss_kwargs(loss_name: str, loss_kwargs: dict[str, Any], key: str = "learner.loss_kwargs") -> None:
    """Every key of ``loss_kwargs`` must be a hyperparameter of the loss: a typo fails in the
    driver, naming the loss and what it takes."""
    fn = POLICY_LOSSES.resolve(loss_name, "learner.loss")
    params = inspect.signature(fn).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    own = list(params)[3:]  # after (logprobs, old_logprobs, advantages)
    unknown = sorted(set(loss_kwargs) - set(own))
    if unknown:
        raise ConfigError(f"{key} has {unknown} but the policy loss {loss_name!r} takes "
                          f"{own or 'no hyperparameters'}")


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
    loss_kwargs: dict[str, Any] | None = None,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The scalar loss: aggregate(w · policy loss + β·k3 KL - c·H), with c = ``entropy_coef``, H
    the per-token ``entropy`` of the policy and w the per-token ``is_weights`` (1 when not
    given: see `truncated_is_weights`), and its diagnostics."""
    out = POLICY_LOSSES.get(loss_name)(logprobs, old_logprobs, advantages, **(loss_kwargs or {}))
    if not isinstance(out, PolicyLossOutput) or out.per_token.shape != logprobs.shape:
        got = (f"a per-token loss of shape {tuple(out.per_token.shape)}" if isinstance(out, PolicyLossOutput)
               else type(out).__name__)
        raise TypeError(f"policy loss {loss_name!r} returned {got}; it must return "
                        f"troupe.actors.losses.PolicyLossOutput(per_token=<tensor of shape {tuple(logprobs.shape)}>, "
                        "token_metrics={...})")
    per_token = out.per_token
    w = aggregation_weights(mask, aggregation, num_seqs, num_tokens, max_len)
    m = mask.to(per_token.dtype)
    denom = m.sum().clamp(min=1.0)
    token_metrics = dict(out.token_metrics)
    if is_weights is not None:
        per_token = per_token * is_weights
        token_metrics["is/weight_mean"] = is_weights
    metrics: dict[str, float] = {"loss/policy": float((w * per_token).sum().detach())}
    for k, v in token_metrics.items():
        metrics[k] = float((v.detach() * m).sum() / denom)
    total = per_token
    if kl_coef or ref_logprobs is not None:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs in the batch (a reference scorer)")
        kl = k3_kl(logprobs, ref_logprobs)
        metrics["kl/ref"] = float((kl.detach() * m).sum() / denom)
        total = per_token + kl_coef * kl
    if entropy_coef:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs the per-token entropy (completion_forward(with_entropy=True))")
        # Entropy bonus: -c · H, aggregated with the same weights as the policy loss.
        metrics["loss/entropy"] = float((w * entropy).sum().detach()) * -entropy_coef
        total = total - entropy_coef * entropy
    return (w * total).sum(), metrics
