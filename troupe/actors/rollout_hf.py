"""Rollout engine on transformers: batched sampling on CPU (or one GPU), the reference backend.

``generate(prompts, sampling) → Batch`` with prompt and completion token ids, masks, the
per-token log-probs of the sampled tokens under the sampling distribution, and texts;
``load_weights(update)`` swaps in a learner's published weights by version.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import torch

from troupe.actors.base import configure_threads
from troupe.actors.losses import selective_log_softmax
from troupe.actors.models import load_causal_lm
from troupe.actors.sampling import SamplingConfig, chat_format, sampling_and_rows
from troupe.actors.transport import lora as lora_transport
from troupe.actors.transport import object_store
from troupe.actors.transport.base import WeightUpdate
from troupe.platform.batch import Batch


class HFRolloutEngine:
    """A causal LM that samples completions; one per rollout rank."""

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu", chat: bool = True,
                 seed: int = 0) -> None:
        configure_threads()
        self.device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.model, self.tokenizer = load_causal_lm(model_path, dtype, self.device)
        self.model.eval()
        self.chat = chat
        self.seed = seed
        self.version = 0

    def format_prompts(self, prompts: list[str]) -> list[str]:
        return chat_format(self.tokenizer, prompts, self.chat)

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling: SamplingConfig | dict, rows: list[dict] | None = None,
                 seed: int | None = None) -> Batch:
        """Sample one completion per prompt (repeat a prompt G times for a group)."""
        sampling = sampling_and_rows(sampling, prompts, rows)
        t0 = time.perf_counter()
        tok = self.tokenizer
        enc = tok(self.format_prompts(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
        enc = {k: v.to(self.device) for k, v in enc.items()}
        if seed is not None:
            torch.manual_seed(seed)
        greedy = sampling.temperature == 0
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            do_sample=not greedy,
            return_dict_in_generate=True,
            output_logits=True,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        if not greedy:
            gen_kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        if sampling.stop:
            gen_kwargs.update(stop_strings=list(sampling.stop), tokenizer=tok)
        out = self.model.generate(**enc, **gen_kwargs)
        P = enc["input_ids"].shape[1]
        completion = out.sequences[:, P:]
        logits = torch.stack(out.logits, 1).float()  # raw logits, [B, C, V]
        # In place and gather − logsumexp: no scaled copy and no full log-softmax, each as large as the logits.
        if not greedy:
            logits.div_(sampling.temperature)
        logprobs = selective_log_softmax(logits, completion)
        mask = completion_mask(completion, tok.eos_token_id, tok.pad_token_id)
        texts = self._decode(completion, mask, sampling.stop)
        n_tokens = int(mask.sum())
        batch = Batch(
            {
                "prompt_ids": enc["input_ids"].cpu(),
                "prompt_mask": enc["attention_mask"].cpu(),
                "completion_ids": completion.cpu(),
                "completion_mask": mask.cpu(),
                "logprobs": (logprobs * mask).cpu(),
            },
            {"prompt": list(prompts), "completion": texts, "row": rows or [{} for _ in prompts]},
            {"version": self.version, "gen_s": time.perf_counter() - t0, "tokens": n_tokens},
        )
        return batch

    def _decode(self, completion: torch.Tensor, mask: torch.Tensor, stop: list[str]) -> list[str]:
        texts = []
        for ids, m in zip(completion.tolist(), mask.tolist(), strict=True):
            text = self.tokenizer.decode([i for i, keep in zip(ids, m, strict=True) if keep], skip_special_tokens=True)
            for s in stop:  # the stop string itself is not part of the answer
                cut = text.find(s)
                if cut >= 0:
                    text = text[:cut]
            texts.append(text)
        return texts

    def load_weights(self, update: WeightUpdate) -> int:
        """Install a learner's published weights; returns the new version."""
        if update.kind == "lora":
            self.model = lora_transport.receive(self.model, update)
        else:
            object_store.receive(self.model, update)
        self.version = update.version
        return self.version

    def get_version(self) -> int:
        return self.version

    def info(self) -> dict[str, Any]:
        return {"backend": "hf", "device": self.device, "version": self.version,
                "threads": torch.get_num_threads(), **dataclasses.asdict(SamplingConfig())}


def completion_mask(completion: torch.Tensor, eos_id: int | None, pad_id: int | None) -> torch.Tensor:
    """1 for generated tokens up to and including the first EOS; 0 for the padding after a
    sequence finished (by EOS or a stop string)."""
    B, C = completion.shape
    idx = torch.arange(C).expand(B, C)
    mask = torch.ones_like(completion, dtype=torch.long)
    if eos_id is not None:
        is_eos = completion == eos_id
        first = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((B,), C))
        mask &= (idx <= first.unsqueeze(1)).long()
    if pad_id is not None and pad_id != eos_id:
        # Trailing pads follow a stop-string finish; a pad sampled mid-text is kept.
        not_pad = (completion != pad_id).long()
        last_real = torch.where(not_pad.any(1), C - 1 - not_pad.flip(1).argmax(1), torch.full((B,), -1))
        mask &= (idx <= last_real.unsqueeze(1)).long()
    return mask
