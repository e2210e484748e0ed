"""Sampling parameters shared by every rollout backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from troupe.platform.config import check


@dataclasses.dataclass
class SamplingConfig:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    # Also applied before a token is drawn, in this order (`troupe.actors.logit_processing`):
    # repetition penalty, temperature, min-p, top-k, top-p; log-probs are those of the result.
    top_k: int = 0  # the k most likely tokens; 0 = off
    min_p: float = 0.0  # tokens with p >= min_p · p_max; 0 = off
    repetition_penalty: float = 1.0  # CTRL's, on prompt and generated tokens; 1 = off
    max_new_tokens: int = 32
    stop: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        check(self.temperature >= 0, "rollout.sampling.temperature", self.temperature, "a number >= 0 (0 = greedy)")
        check(0 < self.top_p <= 1, "rollout.sampling.top_p", self.top_p, "a number in (0, 1]")
        check(self.top_k >= 0, "rollout.sampling.top_k", self.top_k, "an integer >= 0 (0 = off)")
        check(0 <= self.min_p <= 1, "rollout.sampling.min_p", self.min_p, "a number in [0, 1] (0 = off)")
        check(self.repetition_penalty > 0, "rollout.sampling.repetition_penalty", self.repetition_penalty,
              "a number > 0 (1 = off; > 1 discourages repeats)")
        check(self.max_new_tokens >= 1, "rollout.sampling.max_new_tokens", self.max_new_tokens, "an integer >= 1")

    def greedy(self) -> SamplingConfig:
        return dataclasses.replace(self, temperature=0.0)


def sampling_and_rows(sampling: SamplingConfig | dict, prompts: Sequence[str],
                      rows: Sequence[dict] | None) -> SamplingConfig:
    """The checks every backend's ``generate`` starts with; returns the sampling config."""
    if rows is not None and len(rows) != len(prompts):
        raise ValueError(f"generate: {len(rows)} rows for {len(prompts)} prompts")
    return SamplingConfig(**sampling) if isinstance(sampling, dict) else sampling


def prompt_messages(prompt: str, row: Mapping[str, Any] | None = None) -> list[dict[str, str]]:
    """The chat turns of a prompt: its row's ``"messages"`` when it has them, else one user turn."""
    turns = row.get("messages") if row else None
    return list(turns) if turns else [{"role": "user", "content": prompt}]


def chat_format(tokenizer: Any, prompts: Sequence[str], chat: bool = True,
                rows: Sequence[Mapping[str, Any]] | None = None) -> list[str]:
    """The prompts as the model sees them: each row's chat turns (`prompt_messages`) in the
    tokenizer's chat template, ending with the assistant's generation prompt. Without a
    template (or with ``chat=False``) a prompt is its plain text."""
    if not chat or tokenizer.chat_template is None:
        return list(prompts)
    rows = rows if rows is not None else [None] * len(prompts)
    return [tokenizer.apply_chat_template(prompt_messages(p, r), tokenize=False, add_generation_prompt=True)
            for p, r in zip(prompts, rows, strict=True)]


def check_option_letters(option_letters: list[str] | None, prompts: list[str]) -> None:
    if option_letters is not None and len(option_letters) != len(prompts):
        raise ValueError(f"generate: {len(option_letters)} option_letters for {len(prompts)} prompts")


def letter_token_id(tokenizer: Any, letter: str) -> int:
    """The token a completion starting with ``letter`` begins with."""
    ids = tokenizer(letter, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"option letter {letter!r} is {len(ids)} tokens for this tokenizer; expected exactly 1")
    return ids[0]
