"""The distribution a rollout samples from, as pure functions of the raw logits.

`process_logits` turns a causal LM's logits into those of the distribution the engines draw
tokens from, in vLLM's order: repetition penalty, temperature, min-p, top-k, top-p (each
truncation renormalises what the previous ones kept), then the hf engine's ε-greedy mixture
(``explore``: (1 − ε)·1[argmax] + ε·p, an exploring roll-in whose log-probs stay exact). The hf engine samples through it, its
log-probs are the log-softmax of its output, and the learner and the scorers recompute them with
it (`troupe.actors.logprobs`), so π_old, π and π_ref are log-probs of one processed distribution.

Truncation (top-k, top-p, min-p) keeps a set of tokens at each position. The learner does not
receive the engine's sets (one per position, as large as the vocabulary): it recomputes the set
from its own logits with the same rule, which gives the engine's set whenever its logits are the
engine's (π_old recomputed by the learner, or the first minibatch step) and the set of the
current policy otherwise, the distribution the next rollout would sample from. The set is held
fixed in the backward pass (it is piecewise constant in the weights), so the gradient is that of
log π over the kept tokens. The sampled token is always kept: it was in the engine's set, and a
learner or reference whose own set drops it (after some updates, or another model) would give a
log-prob of -inf and an infinite importance ratio or KL.
"""

from __future__ import annotations

from typing import Any

import torch

from troupe.actors.sampling import SamplingConfig


def as_sampling(sampling: SamplingConfig | dict[str, Any] | float | None) -> SamplingConfig:
    """A `SamplingConfig` from itself, its dict, or a bare temperature (None: temperature 1)."""
    if isinstance(sampling, SamplingConfig):
        return sampling
    if isinstance(sampling, dict):
        return SamplingConfig(**sampling)
    return SamplingConfig(temperature=1.0 if sampling is None else float(sampling))


def truncates(sampling: SamplingConfig) -> bool:
    """Whether sampling keeps only some tokens (top-k, top-p or min-p; never when greedy)."""
    return sampling.temperature > 0 and (sampling.top_k > 0 or sampling.top_p < 1.0 or sampling.min_p > 0)


def epsilon_greedy(logits: torch.Tensor, explore: float) -> torch.Tensor:
    """Logits of (1 − ε)·1[token = argmax] + ε·softmax(logits): the most likely token with
    probability 1 − ε, else a draw from the distribution (ε = ``explore``). -inf stays -inf."""
    logp = torch.log_softmax(logits, -1)
    if explore >= 1.0:
        return logp
    top = logits.argmax(-1, keepdim=True)
    mixed = logp + torch.log(torch.as_tensor(explore, dtype=logp.dtype, device=logp.device))
    log_rest = torch.log1p(torch.as_tensor(-explore, dtype=logp.dtype, device=logp.device))
    at_top = torch.logaddexp(mixed.gather(-1, top), log_rest)
    return mixed.scatter(-1, top, at_top)


def is_identity(sampling: SamplingConfig) -> bool:
    """Whether `process_logits` leaves the logits as they are."""
    return (sampling.repetition_penalty == 1.0 and sampling.temperature in (0.0, 1.0)
            and not truncates(sampling) and not sampling.explore)


def prompt_tokens(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool ``[B, V]``: the tokens of each prompt, its left padding not counted."""
    ids = prompt_ids.masked_fill(prompt_mask == 0, vocab_size).clamp(max=vocab_size)
    seen = torch.zeros(ids.shape[0], vocab_size + 1, dtype=torch.bool, device=ids.device)
    return seen.scatter_(1, ids, True)[:, :vocab_size]  # column V absorbs padding and ids past the head


def seen_tokens(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor, completion_ids: torch.Tensor,
                vocab_size: int) -> torch.Tensor:
    """bool ``[B, C, V]``: the tokens the repetition penalty applies to at each completion
    position, those of the prompt and those generated before it (as vLLM counts them)."""
    B, C = completion_ids.shape
    pos = torch.arange(C, device=completion_ids.device)
    first = torch.full((B, vocab_size + 1), C, dtype=torch.long, device=completion_ids.device)
    first.scatter_reduce_(1, completion_ids.clamp(max=vocab_size), pos.expand(B, C), reduce="amin")
    earlier = first[:, :vocab_size].unsqueeze(1) < pos.view(1, C, 1)  # first seen before position t
    return earlier | prompt_tokens(prompt_ids, prompt_mask, vocab_size).unsqueeze(1)


def penalise_repeats(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's repetition penalty on the ``seen`` tokens: z / penalty where z > 0, z · penalty otherwise."""
    return torch.where(seen, torch.where(logits > 0, logits / penalty, logits * penalty), logits)


@torch.no_grad()
def dropped_tokens(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor | None:
    """bool, the shape of ``logits`` (already tempered): the tokens min-p, top-k and top-p remove,
    in that order; None when none of them is on. The most likely token always stays."""
    drop = None
    if sampling.min_p > 0:  # p < min_p · p_max; renormalising later never changes these ratios
        probs = torch.softmax(logits, -1)
        drop = probs < sampling.min_p * probs.amax(-1, keepdim=True)
    if 0 < sampling.top_k < logits.shape[-1]:  # below the k-th largest logit (ties kept)
        kth = logits.topk(sampling.top_k, dim=-1).values[..., -1:]
        drop = logits < kth if drop is None else drop | (logits < kth)
    if sampling.top_p < 1.0:  # the smallest tokens whose mass, renormalised over the kept ones, is <= 1 - top_p
        kept = logits if drop is None else logits.masked_fill(drop, float("-inf"))
        ordered, order = kept.sort(dim=-1)  # ascending
        below = ordered.softmax(-1).cumsum(-1) <= 1 - sampling.top_p
        below[..., -1] = False
        by_p = torch.zeros_like(below).scatter_(-1, order, below)
        drop = by_p if drop is None else drop | by_p
    return drop


def process_logits(logits: torch.Tensor, sampling: SamplingConfig, seen: torch.Tensor | None = None,
                   keep: torch.Tensor | None = None, inplace: bool = False) -> torch.Tensor:
    """The logits of the distribution ``sampling`` draws from: ``[..., V]`` in, the same shape
    out, -inf for the tokens truncation removes; its log-softmax at a sampled token is that
    token's log-prob under the sampling distribution.

    ``seen`` (bool, the shape of ``logits``; `seen_tokens`) marks what the repetition penalty
    applies to. ``keep`` (``[...]`` token ids) is never removed: the sampled token (see the module
    docstring). Greedy (temperature 0) applies the penalty only, as greedy decoding does.
    ``inplace`` may overwrite ``logits`` (a caller's own copy, with no autograd graph).
    """
    z = logits
    if sampling.repetition_penalty != 1.0:
        if seen is None:
            raise ValueError("rollout.sampling.repetition_penalty != 1 needs the tokens seen so far (seen_tokens)")
        z = penalise_repeats(z, seen, sampling.repetition_penalty)
        inplace = True  # a fresh tensor now
    if sampling.temperature == 0:
        return z
    if sampling.temperature != 1.0:
        z = z.div_(sampling.temperature) if inplace else z / sampling.temperature
        inplace = True
    drop = dropped_tokens(z, sampling)
    if drop is not None:
        if keep is not None:
            drop.scatter_(-1, keep.unsqueeze(-1), False)
        z = z.masked_fill_(drop, float("-inf")) if inplace else z.masked_fill(drop, float("-inf"))
    return epsilon_greedy(z, sampling.explore) if sampling.explore else z
