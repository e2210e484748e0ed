"""Advantage estimators: ``rewards [N]``, ``group_ids [N]`` (and keyword fields an estimator
names, e.g. BPO's ``is_anchor``) → ``advantages [N]``; registered as ``troupe.advantages`` entry points."""

from __future__ import annotations

import torch


def _group_stats(rewards: torch.Tensor, group_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-row mean, unbiased std and size of the row's group."""
    _, inv, counts = torch.unique(group_ids, return_inverse=True, return_counts=True)
    r = rewards.to(torch.float64)
    sums = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inv, r)
    means = sums / counts
    sq = torch.zeros(len(counts), dtype=torch.float64).index_add_(0, inv, (r - means[inv]) ** 2)
    std = torch.sqrt(sq / (counts - 1).clamp(min=1))
    return means[inv], std[inv], counts[inv].to(torch.float64)


def grpo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    # GRPO: A_i = (r_i - mean(r)) / (std(r) + eps), std with Bessel's correction
    mean, std, _ = _group_stats(rewards, group_ids)
    return ((rewards.to(torch.float64) - mean) / (std + eps)).to(torch.float32)


def dr_grpo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    # Dr.GRPO: A_i = r_i - mean(r)
    mean, _, _ = _group_stats(rewards, group_ids)
    return (rewards.to(torch.float64) - mean).to(torch.float32)


def rloo_advantage(rewards: torch.Tensor, group_ids: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    # RLOO: A_i = r_i - mean_{j != i}(r_j) = G/(G-1) (r_i - mean(r))
    mean, _, n = _group_stats(rewards, group_ids)
    return ((rewards.to(torch.float64) - mean) * n / (n - 1).clamp(min=1)).to(torch.float32)
