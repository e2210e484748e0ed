"""Scorer: per-token log-probs of a Batch under a frozen reference policy or a teacher."""

from __future__ import annotations

from typing import Any

import torch

from troupe.actors.base import configure_threads
from troupe.actors.logprobs import score_completions
from troupe.actors.models import load_causal_lm
from troupe.actors.sampling import SamplingConfig
from troupe.platform.batch import Batch


class Scorer:
    """A frozen causal LM that scores completions sampled by another model."""

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu",
                 micro_batch_size: int = 64, chat_template: str | None = None) -> None:
        configure_threads()
        self.device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.model, self.tokenizer = load_causal_lm(model_path, dtype, self.device, chat_template)
        self.model.eval()
        self.micro_batch_size = micro_batch_size

    def logprobs(self, batch: Batch | list[Any], sampling: SamplingConfig | dict | float = 1.0,
                 top_k: int = 0) -> dict[str, torch.Tensor]:
        """``{"logprobs": [B, C]}`` under the distribution ``sampling`` draws from (a
        `SamplingConfig` or a bare temperature: the rollout's, so that the reference's log-probs
        are of the same processed distribution as the policy's), plus ``topk_logprobs``/``topk_ids``
        ``[B, C, k]`` when ``top_k`` (how many log-probs per position, not the sampling top-k)."""
        batch = as_batch(batch).to(self.device)
        out = score_completions(self.model, batch, sampling, self.micro_batch_size, top_k)
        mask = batch["completion_mask"].to(out["logprobs"].dtype)
        out["logprobs"] = out["logprobs"] * mask
        return {k: v.cpu() for k, v in out.items()}


def as_batch(batch: Batch | list[Any]) -> Batch:
    """A Batch from a Batch or a list of Batches/object refs of Batches (one per rollout engine)."""
    if isinstance(batch, Batch):
        return batch
    import ray

    parts = [ray.get(p) if isinstance(p, ray.ObjectRef) else p for p in batch]
    return Batch.concat(parts)
