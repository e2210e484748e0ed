"""The learning-rate schedule, as a pure function of the optimizer step (transformers' rules)."""

from __future__ import annotations

import math

LR_SCHEDULES = ("constant", "linear", "cosine")


def lr_factor(step: int, schedule: str = "constant", warmup_steps: int = 0, total_steps: int | None = None,
              min_lr_ratio: float = 0.0) -> float:
    """The learning rate of optimizer step ``step`` (0 for the first) as a fraction of
    ``learner.lr``: a linear warm-up from 0 over ``warmup_steps``, then constant, or a linear or
    cosine decay to ``min_lr_ratio`` at ``total_steps``, where it stays."""
    if step < warmup_steps:
        return step / warmup_steps  # warm-up: s / W (the first step has lr 0, as in transformers)
    if schedule == "constant":
        return 1.0
    if total_steps is None:
        raise ValueError(f"learning-rate schedule {schedule!r} needs total_steps")
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    if schedule == "linear":
        decay = 1.0 - progress
    elif schedule == "cosine":
        decay = 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine: (1 + cos(π·progress)) / 2
    else:
        raise ValueError(f"unknown learning-rate schedule {schedule!r}; expected one of {LR_SCHEDULES}")
    return min_lr_ratio + (1.0 - min_lr_ratio) * decay
