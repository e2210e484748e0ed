"""Per-token log-probs of completions under a causal LM: the one computation shared by the
learner, the reference scorer and the teacher scorer, so that they agree to the last bit."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from troupe.actors.logit_processing import as_sampling, is_identity, process_logits, seen_tokens
from troupe.actors.losses import entropy_from_logits, selective_log_softmax
from troupe.actors.sampling import SamplingConfig
from troupe.platform.batch import Batch


def positions_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids for left-padded rows: 0 at the first real token (as `generate` numbers them)."""
    pos = attention_mask.long().cumsum(-1) - 1
    return pos.clamp(min=0)


def completion_forward(
    model: Any, batch: Batch, sampling: SamplingConfig | dict | float | None = 1.0, with_entropy: bool = False,
    top_k: int = 0, entropy_grad: bool = False, with_distribution: bool = False,
) -> dict[str, torch.Tensor]:
    """Log-probs ``[B, C]`` of ``completion_ids`` given ``prompt_ids`` under the distribution
    ``sampling`` draws from (a `SamplingConfig`, or a bare temperature; see
    `troupe.actors.logit_processing`), and, on request, its entropy (a metric without a graph
    unless ``entropy_grad``), its ``top_k`` most likely log-probs at every completion position and,
    with ``with_distribution``, its whole log-distribution ``[B, C, V]`` (what distillation
    losses compare with a teacher's).
    A batch with ``pixel_values_videos``/``video_grid_thw`` (see `troupe.actors.vision`) feeds its
    videos too."""
    batch.require("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", who="completion_forward")
    p_ids, p_mask = batch["prompt_ids"], batch["prompt_mask"]
    c_ids, c_mask = batch["completion_ids"], batch["completion_mask"]
    input_ids = torch.cat([p_ids, c_ids], 1)
    # A multi-turn episode's completion holds tokens the model reads but did not write (a tool's
    # result, another agent's message): they are attended to (completion_attention_mask) and
    # left out of the loss (completion_mask).
    attn = torch.cat([p_mask, batch.get("completion_attention_mask", c_mask)], 1)
    extra = {}
    if "video_grid_thw" in batch:
        from troupe.actors.vision import video_inputs

        config = getattr(model, "module", model).config  # DDP hides the config
        extra = video_inputs(config, input_ids, batch["pixel_values_videos"], batch["video_grid_thw"])
    if not extra:  # text only: positions skip the left padding, as generate numbers them
        extra = {"position_ids": positions_from_mask(attn)}
    out = model(input_ids=input_ids, attention_mask=attn, use_cache=False, **extra)
    P = p_ids.shape[1]
    logits = out.logits[:, P - 1 : -1].float()
    sampling = as_sampling(sampling)
    if not is_identity(sampling):
        seen = (seen_tokens(p_ids, p_mask, c_ids, logits.shape[-1]) if sampling.repetition_penalty != 1.0
                else None)
        logits = process_logits(logits, sampling, seen, keep=c_ids)
    lse = torch.logsumexp(logits, dim=-1)  # once, for the log-probs and the entropy
    result = {"logprobs": selective_log_softmax(logits, c_ids, lse)}
    if with_entropy:
        with contextlib.nullcontext() if entropy_grad else torch.no_grad():  # a metric, unless the loss uses it
            result["entropy"] = entropy_from_logits(logits, lse)
    if with_distribution:
        result["distribution"] = logits - lse.unsqueeze(-1)
    if top_k:
        lp = torch.log_softmax(logits, -1)
        vals, idx = lp.topk(top_k, dim=-1)
        result["topk_logprobs"], result["topk_ids"] = vals, idx
    return result


@torch.no_grad()
def score_completions(model: Any, batch: Batch, sampling: SamplingConfig | dict | float | None = 1.0,
                      micro_batch_size: int = 64, top_k: int = 0, with_distribution: bool = False,
                      ) -> dict[str, torch.Tensor]:
    """`completion_forward` without gradients, in micro-batches, concatenated."""
    sampling = as_sampling(sampling)
    parts = [completion_forward(model, mb, sampling, top_k=top_k, with_distribution=with_distribution)
             for mb in batch.chunks(micro_batch_size)]
    return {k: torch.cat([p[k] for p in parts], 0) for k in parts[0]}
