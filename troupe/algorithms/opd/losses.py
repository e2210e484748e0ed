"""Distillation losses at one position, as pure functions over logits ``[..., V]``.

The student's distribution is ``softmax(student_logits)``; the teacher's is given by its
log-probs ``[..., V]`` (a scorer returns those, top-k renormalised when the vocabulary is large).
Every function returns the per-position value ``[...]``; the caller masks and aggregates.

Two families (ALGORITHMS.md §B.1–B.2):

- distribution matching, minimised by the student equal to the teacher: GKD's generalised
  JSD (β = 0 forward KL(T‖S), β = 1 reverse KL(S‖T)), and the sampled reverse KL of on-policy
  distillation (`sampled_rkl_advantage`);
- mode seeking, minimised by a point mass on the teacher's mode, which under a noisy teacher
  is the clean action: hard-target cross-entropy and the teacher-likelihood loss
  E_{a~π}[-log π̃(a)] = KL(π‖π̃) + H(π), reverse KL without the student-entropy bonus.
"""

from __future__ import annotations

import torch

from troupe.platform.errors import RegistryError
from troupe.platform.registry import DISTILL_LOSSES


def generalized_jsd(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor, beta: float = 0.5) -> torch.Tensor:
    """β·KL(T‖M) + (1-β)·KL(S‖M) with M = β·T + (1-β)·S; β = 0 is KL(T‖S), β = 1 is KL(S‖T)."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta={beta}: expected a number in [0, 1]")
    s = torch.log_softmax(student_logits, -1)
    t = torch.log_softmax(teacher_logprobs, -1)  # renormalises a top-k teacher; a no-op otherwise
    if beta == 0.0:
        return _kl(t, s)
    if beta == 1.0:
        return _kl(s, t)
    b = torch.tensor(beta, dtype=s.dtype, device=s.device)
    m = torch.logsumexp(torch.stack([s + torch.log1p(-b), t + torch.log(b)]), 0)
    return beta * _kl(t, m) + (1 - beta) * _kl(s, m)


def reverse_kl(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """KL(π‖π̃), exact over the vocabulary."""
    return _kl(torch.log_softmax(student_logits, -1), torch.log_softmax(teacher_logprobs, -1))


def teacher_likelihood(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """E_{a~π}[-log π̃(a)], exact over the vocabulary: minimised by a point mass on argmax π̃."""
    p = torch.softmax(student_logits, -1)
    t = torch.log_softmax(teacher_logprobs, -1)
    # 0 · (-inf) where the teacher excludes a token the student also excludes: count it as 0.
    return -(p * t.clamp(min=torch.finfo(t.dtype).min)).sum(-1)


def hard_target_ce(student_logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """-log π(argmax π̃): cross-entropy to the teacher's mode."""
    target = teacher_logprobs.argmax(-1, keepdim=True)
    return -torch.log_softmax(student_logits, -1).gather(-1, target).squeeze(-1)


# It reads the teacher's mode alone, so a point mass on a teacher's tokens is target enough: the
# distillation learner takes ``target_ids`` for a loss so marked, by whatever name it is given.
hard_target_ce.mode_only = True  # type: ignore[attr-defined]


def ne_loss(name: str, student_logits: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """The distillation loss ``name`` at every position: a registered one (``hard``, ``tl``,
    ``rkl``, ``jsd``; entry-point group ``troupe.distill_losses``) or a ``"module:function"``."""
    try:
        fn = DISTILL_LOSSES.resolve(name, "opd.ne_loss")
    except RegistryError as e:
        raise ValueError(str(e)) from None
    return fn(student_logits, teacher_logprobs)


def sampled_rkl_advantage(student_logprobs: torch.Tensor, teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token advantage of sampled reverse-KL distillation: log π̃(a) - log π(a) at the
    sampled tokens. Its expectation under the student is -KL(π‖π̃)."""
    return teacher_logprobs - student_logprobs


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p‖q) from log-probs, with 0·log 0 = 0."""
    p = log_p.exp()
    # Mask the difference, not the product: 0·(-inf) would make the gradient NaN.
    diff = torch.where(p > 0, log_p - log_q, torch.zeros_like(p))
    return (p * diff).sum(-1)
