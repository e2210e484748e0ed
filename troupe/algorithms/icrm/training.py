"""Fitting ICRM on episodes and reading it out: the inner loop the algorithm's learner and the
benchmark share, and the metrics of §C.4 that need no more than μ and the labels."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from troupe.algorithms.icrm.model import ICRM, episode_batch
from troupe.envs.preferences.episodes import FeatureEpisodes

EpisodeSampler = Callable[[int, np.random.Generator], FeatureEpisodes]


def fit(model: ICRM, sample: EpisodeSampler, steps: int, batch_size: int = 128, lr: float = 3e-3,
        seed: int = 0) -> list[float]:
    """``steps`` Adam steps on §C.2's loss, each on a fresh batch ``sample(batch_size, rng)``; the losses."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    losses = []
    model.train()
    for _ in range(steps):
        batch = episode_batch(sample(batch_size, rng), model.cfg)
        loss = model.loss(model(batch), batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    return losses


@torch.no_grad()
def predict(model: ICRM, episodes: FeatureEpisodes) -> dict[str, np.ndarray]:
    """μ, τ, α, β, r_a, r_b of every episode, as numpy arrays."""
    model.eval()
    out = model(episode_batch(episodes, model.cfg))
    return {k: v.numpy() for k, v in out.items()}


def pairwise_accuracy(mu: np.ndarray, episodes: FeatureEpisodes, against: str = "label") -> float:
    """Share of queries where μ > 1/2 picks the winner: the drawn ``label``, or the persona's own
    preference (``against="p_true"``: a is preferred iff p_true > 1/2), free of the BT draw's noise."""
    truth = episodes.label == 1 if against == "label" else episodes.p_true > 0.5
    return float(np.mean((mu > 0.5) == truth))
