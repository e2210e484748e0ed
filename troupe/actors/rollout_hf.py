"""Rollout engine on transformers: batched sampling on CPU (or one GPU), the reference backend.

``generate(prompts, sampling) → Batch`` with prompt and completion token ids, masks, the
per-token log-probs of the sampled tokens under the sampling distribution, and texts;
``load_weights(update)`` swaps in a learner's published weights by version (the transport that
made the update installs it with `install_state` or `install_adapter`). A vision-language
model also takes each row's ``"frames"`` (see `troupe.actors.vision`).
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from troupe.actors.base import configure_threads
from troupe.actors.logit_processing import is_identity, process_logits, prompt_tokens, seen_tokens
from troupe.actors.losses import selective_log_softmax
from troupe.actors.models import chat_template_text, load_causal_lm
from troupe.actors.sampling import (
    SamplingConfig,
    chat_format,
    check_option_letters,
    left_padded,
    letter_token_id,
    sampling_and_rows,
    turn_prompts,
)
from troupe.actors.transport import lora as lora_transport
from troupe.actors.transport import object_store
from troupe.actors.transport.base import WeightUpdate
from troupe.actors.vision import VideoLayout, is_vision_model, video_inputs, video_prompts, vision_token_ids
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError
from troupe.platform.registry import TRANSPORTS


class HFRolloutEngine:
    """A causal LM that samples completions; one per rollout rank."""

    def __init__(self, model_path: str, dtype: str = "float32", device: str = "cpu", chat: bool = True,
                 seed: int = 0, chat_template: str | None = None) -> None:
        configure_threads()
        self.device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        self.model, self.tokenizer = load_causal_lm(model_path, dtype, self.device, chat_template)
        self.model.eval()
        self.video_layout = VideoLayout.of(self.model.config, model_path) if is_vision_model(self.model.config) else None
        # A sampled vision placeholder would be read as a video slot when the learner re-scores
        # the response (one token more than the video has features): never sample one. Log-probs
        # stay those of the unrestricted policy, as the learner computes them; a trained model
        # puts next to no mass on these tokens.
        self.never_sample = vision_token_ids(self.tokenizer) if self.video_layout is not None else []
        self.chat = chat
        self.seed = seed
        # The engine's own random stream, not torch's global one: draws do not depend on what
        # else runs in the process (fused roles, threads), and a seeded call draws the same
        # tokens as ``torch.manual_seed(seed)`` before a sampling ``generate`` would.
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.version = 0

    @classmethod
    def config_kwargs(cls, cfg: Any) -> dict[str, Any]:
        """The constructor arguments taken from an algorithm's config (all but ``model_path``)."""
        return {"dtype": cfg.model.dtype, "seed": cfg.run.seed, "device": cfg.model.device,
                "chat_template": chat_template_text(getattr(cfg.model, "chat_template", None))}

    def format_prompts(self, prompts: list[str], rows: list[dict] | None = None) -> list[str]:
        return chat_format(self.tokenizer, prompts, self.chat, rows)

    @torch.no_grad()
    def generate(self, prompts: list[str], sampling: SamplingConfig | dict, rows: list[dict] | None = None,
                 seed: int | None = None, option_letters: list[str] | None = None) -> Batch:
        """Sample one completion per prompt (repeat a prompt G times for a group).

        With ``option_letters`` (one string of letters per prompt, e.g. ``"ABCD"``) the Batch
        also holds ``option_logprobs`` ``[B, max letters]``: the policy's log-probs (temperature
        1, before any sampling transform) of each letter as the first completion token, padded
        with -inf. Multiple-choice rewards read answer confidences from it at no extra cost.

        On a vision-language model a row's ``"frames"`` (``uint8 [F, H, W, 3]``) is a video shown
        before the prompt's text; the Batch then also holds ``pixel_values_videos`` ``[B, N, D]``
        and ``video_grid_thw`` ``[B, 3]``, from which the learner and scorers recompute the
        same log-probs.
        """
        sampling = sampling_and_rows(sampling, prompts, rows)
        check_option_letters(option_letters, prompts)
        t0 = time.perf_counter()
        shown, video = self._with_videos(prompts, rows)
        # A row's chat turns are its prompt, except where its video placeholders were put into the text.
        enc = {k: v.to(self.device) for k, v in self._encode(shown, None if video else rows).items()}
        return self._sample(enc, prompts, rows, sampling, seed, option_letters, video, t0)

    @torch.no_grad()
    def generate_turns(self, contexts: list[list[int] | None], messages: list[list[dict]],
                       sampling: SamplingConfig | dict, seed: int | None = None) -> Batch:
        """One turn of many multi-turn conversations, token in, token out.

        Row i continues ``contexts[i]`` (the token ids the conversation holds so far: its first
        prompt, then every completion and every turn appended; None or [] for a first turn) with
        the chat turns ``messages[i]`` (role/content dicts, e.g. a tool's result as a ``user``
        turn) in this tokenizer's chat template, then samples the agent's next turn. Working on
        ids, never re-tokenized text, keeps the conversation the learner re-scores identical to
        the one sampled. The Batch is `generate`'s, with ``prompt_ids`` the whole context, plus
        objects ``appended_ids`` (the ids this call added before sampling) and ``context_ids``."""
        sampling = sampling_and_rows(sampling, messages, None)
        t0 = time.perf_counter()
        tok = self.tokenizer
        full, appended = turn_prompts(tok, contexts, messages, self.chat)
        ids, mask = left_padded(full, tok.pad_token_id)
        enc = {"input_ids": ids.to(self.device), "attention_mask": mask.to(self.device)}
        prompts = [turns[-1]["content"] if turns else "" for turns in messages]
        batch = self._sample(enc, prompts, None, sampling, seed, None, {}, t0)
        batch["appended_ids"] = appended
        batch["context_ids"] = full
        return batch

    def _sample(self, enc: dict[str, torch.Tensor], prompts: list[str], rows: list[dict] | None,
                sampling: SamplingConfig, seed: int | None, option_letters: list[str] | None,
                video: dict[str, torch.Tensor], t0: float) -> Batch:
        """Sample from the encoded prompts ``enc`` (left-padded ids and mask) and build the Batch."""
        tok = self.tokenizer
        model_inputs = dict(enc)
        if video:
            model_inputs.update(video_inputs(self.model.config, enc["input_ids"],
                                             **{k: v.to(self.device) for k, v in video.items()}))
        if seed is not None:
            self.generator.manual_seed(seed)
        greedy = sampling.temperature == 0
        gen_kwargs: dict[str, Any] = dict(
            max_new_tokens=sampling.max_new_tokens,
            # Sampling is the last logits processor (`DrawFrom`); `generate` takes its one token.
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            # transformers' own penalty and warpers stay off (a model's generation_config may set
            # them): `SamplingProcessor` applies the whole sampling config.
            repetition_penalty=1.0,
        )
        processors: list[Any] = []
        if not is_identity(sampling):
            processors.append(SamplingProcessor(sampling, enc["input_ids"], enc["attention_mask"]))
        if not greedy:
            processors.append(DrawFrom(self.generator))
        if processors:
            gen_kwargs.update(logits_processor=processors)
        if sampling.stop:
            gen_kwargs.update(stop_strings=list(sampling.stop), tokenizer=tok)
        if self.never_sample:
            gen_kwargs.update(suppress_tokens=self.never_sample)
        out = self.model.generate(**model_inputs, **gen_kwargs)
        P = enc["input_ids"].shape[1]
        completion = out.sequences[:, P:]
        logits = torch.stack(out.logits, 1).float()  # raw logits, [B, C, V]
        option_lp = (option_logprobs(logits[:, 0], self._letter_ids(option_letters))
                     if option_letters is not None else None)
        # The log-probs of the distribution sampled from: the raw logits processed again, all
        # positions at once. In place and gather − logsumexp: no scaled copy and no full
        # log-softmax, each as large as the logits.
        if not is_identity(sampling):
            seen = (seen_tokens(enc["input_ids"], enc["attention_mask"], completion, logits.shape[-1])
                    if sampling.repetition_penalty != 1.0 else None)
            logits = process_logits(logits, sampling, seen, keep=completion, inplace=True)
        logprobs = selective_log_softmax(logits, completion)
        mask = completion_mask(completion, tok.eos_token_id, tok.pad_token_id)
        texts = self._decode(completion, mask, sampling.stop)
        n_tokens = int(mask.sum())
        tensors = {
            "prompt_ids": enc["input_ids"].cpu(),
            "prompt_mask": enc["attention_mask"].cpu(),
            "completion_ids": completion.cpu(),
            "completion_mask": mask.cpu(),
            "logprobs": (logprobs * mask).cpu(),
        }
        if option_lp is not None:
            tensors["option_logprobs"] = option_lp.cpu()
        tensors.update(video)
        batch = Batch(
            tensors,
            {"prompt": list(prompts), "completion": texts, "row": rows or [{} for _ in prompts]},
            {"version": self.version, "gen_s": time.perf_counter() - t0, "tokens": n_tokens},
        )
        return batch

    def _encode(self, prompts: list[str], rows: list[dict] | None = None) -> dict[str, torch.Tensor]:
        """Left-padded ids and mask of the chat-formatted prompts (a row's ``"messages"``, when it
        has them, are its prompt). A group repeats its prompt G times: each distinct prompt is
        formatted and tokenized once (the chat template costs more than a small model's forward
        pass), and the rows are gathered from those."""
        keys = [(p, _turns_key(r)) for p, r in zip(prompts, rows or [None] * len(prompts), strict=True)]
        where: dict[tuple, int] = {}
        distinct: list[int] = []  # the first position of each distinct prompt
        for i, key in enumerate(keys):
            if key not in where:
                where[key] = len(distinct)
                distinct.append(i)
        enc = self.tokenizer(self.format_prompts([prompts[i] for i in distinct],
                                                 [rows[i] for i in distinct] if rows else None),
                             return_tensors="pt", padding=True, add_special_tokens=False)
        if len(distinct) == len(prompts):
            return dict(enc)
        index = torch.tensor([where[key] for key in keys])
        return {k: v.index_select(0, index) for k, v in enc.items()}

    def _with_videos(self, prompts: list[str], rows: list[dict] | None) -> tuple[list[str], dict[str, torch.Tensor]]:
        """The prompts with their rows' video placeholders, and the video tensors ({} without videos)."""
        frames = [r.get("frames") for r in rows] if rows else []
        if all(f is None for f in frames):
            return list(prompts), {}
        if self.video_layout is None:
            if any(isinstance(f, np.ndarray) for f in frames):
                raise ConfigError("rows carry pixel frames but the policy is a text-only model; use a "
                                  "vision-language model (e.g. model.path=tiny-vl)")
            return list(prompts), {}  # frames already rendered into the prompt text
        return video_prompts(list(prompts), frames, self.video_layout)

    def _letter_ids(self, option_letters: list[str]) -> list[list[int]]:
        return [[letter_token_id(self.tokenizer, c) for c in letters] for letters in option_letters]

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
        """Install a learner's published weights with the transport that made them; returns the new version."""
        TRANSPORTS.get(update.kind).receive(self, update)
        self.version = update.version
        return self.version

    def install_state(self, state: Mapping[str, torch.Tensor]) -> None:
        """Full weights by name. Inference only: CPU weights may point at the update's buffer instead of a copy."""
        object_store.install(self.model, state, share=True)

    def install_adapter(self, adapter: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> None:
        """A peft LoRA adapter and its ``LoraConfig`` arguments (the model is wrapped on first use)."""
        self.model = lora_transport.install_adapter(self.model, adapter, config)

    def get_version(self) -> int:
        return self.version

    def info(self) -> dict[str, Any]:
        return {"backend": "hf", "device": self.device, "version": self.version, "vision": self.video_layout is not None,
                "threads": torch.get_num_threads(), "niceness": os.getpriority(os.PRIO_PROCESS, 0),
                **dataclasses.asdict(SamplingConfig())}


class SamplingProcessor:
    """`process_logits` as a transformers logits processor: the distribution `generate` draws
    each token from. The repetition penalty counts the prompt's tokens (not its left padding)
    and those generated so far."""

    def __init__(self, sampling: SamplingConfig, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> None:
        self.sampling = sampling
        self.prompt_len = prompt_ids.shape[1]
        self.prompt_ids, self.prompt_mask = prompt_ids, prompt_mask
        self.in_prompt: torch.Tensor | None = None  # [B, V], on the first call (V is the logits')

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        seen = None
        if self.sampling.repetition_penalty != 1.0:
            if self.in_prompt is None:
                self.in_prompt = prompt_tokens(self.prompt_ids, self.prompt_mask, scores.shape[-1])
            seen = self.in_prompt.scatter(1, input_ids[:, self.prompt_len:], True)
        # Never in place: `generate` keeps ``scores`` as the raw logits it returns.
        return process_logits(scores, self.sampling, seen)


class DrawFrom:
    """The last logits processor of a sampled ``generate``: one token drawn from the softmax of
    the scores, as ``generate(do_sample=True)`` draws it, but from ``generator``; the scores
    come back -inf everywhere else, so ``generate``'s argmax takes the drawn token."""

    def __init__(self, generator: torch.Generator) -> None:
        self.generator = generator

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores, dim=-1)
        token = torch.multinomial(probs, num_samples=1, generator=self.generator)
        return torch.full_like(scores, float("-inf")).scatter_(1, token, 0.0)


def option_logprobs(first_logits: torch.Tensor, letter_ids: list[list[int]]) -> torch.Tensor:
    """``[B, max letters]`` log-softmax (over the whole vocabulary) of each row's letters at the
    first completion position; -inf pads rows with fewer letters."""
    logp = torch.log_softmax(first_logits.float(), -1)
    width = max((len(ids) for ids in letter_ids), default=0)
    out = torch.full((len(letter_ids), width), float("-inf"))
    for i, ids in enumerate(letter_ids):
        out[i, : len(ids)] = logp[i, ids].cpu()
    return out


def completion_mask(completion: torch.Tensor, eos_id: int | None, pad_id: int | None) -> torch.Tensor:
    """1 for generated tokens up to and including the first EOS; 0 for the padding after a
    sequence finished (by EOS or a stop string)."""
    B, C = completion.shape
    dev = completion.device  # the engine's: every tensor here lives where generate left the ids
    idx = torch.arange(C, device=dev).expand(B, C)
    mask = torch.ones_like(completion, dtype=torch.long)
    if eos_id is not None:
        is_eos = completion == eos_id
        first = torch.where(is_eos.any(1), is_eos.float().argmax(1), torch.full((B,), C, device=dev))
        mask &= (idx <= first.unsqueeze(1)).long()
    if pad_id is not None and pad_id != eos_id:
        # Trailing pads follow a stop-string finish; a pad sampled mid-text is kept.
        not_pad = (completion != pad_id).long()
        last_real = torch.where(not_pad.any(1), C - 1 - not_pad.flip(1).argmax(1),
                                torch.full((B,), -1, device=dev))
        mask &= (idx <= last_real.unsqueeze(1)).long()
    return mask


def _turns_key(row: dict | None) -> tuple:
    """What, beside its text, tells one prompt from another: its row's chat turns (none for a plain prompt)."""
    turns = row.get("messages") if row else None
    return tuple((t["role"], t["content"]) for t in turns) if turns else ()
