"""Sampling parameters shared by every rollout backend."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from troupe.platform.config import check


@dataclasses.dataclass
class SamplingConfig:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    max_new_tokens: int = 32
    stop: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        check(self.temperature >= 0, "rollout.temperature", self.temperature, "a number >= 0 (0 = greedy)")
        check(0 < self.top_p <= 1, "rollout.top_p", self.top_p, "a number in (0, 1]")
        check(self.max_new_tokens >= 1, "rollout.max_new_tokens", self.max_new_tokens, "an integer >= 1")

    def greedy(self) -> SamplingConfig:
        return dataclasses.replace(self, temperature=0.0)


def sampling_and_rows(sampling: SamplingConfig | dict, prompts: Sequence[str],
                      rows: Sequence[dict] | None) -> SamplingConfig:
    """The checks every backend's ``generate`` starts with; returns the sampling config."""
    if rows is not None and len(rows) != len(prompts):
        raise ValueError(f"generate: {len(rows)} rows for {len(prompts)} prompts")
    return SamplingConfig(**sampling) if isinstance(sampling, dict) else sampling


def chat_format(tokenizer: Any, prompts: Sequence[str], chat: bool = True) -> list[str]:
    """The prompts as the model sees them: one user turn in the tokenizer's chat template."""
    if not chat or tokenizer.chat_template is None:
        return list(prompts)
    return [tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in prompts]


def check_option_letters(option_letters: list[str] | None, prompts: list[str]) -> None:
    if option_letters is not None and len(option_letters) != len(prompts):
        raise ValueError(f"generate: {len(option_letters)} option_letters for {len(prompts)} prompts")


def letter_token_id(tokenizer: Any, letter: str) -> int:
    """The token a completion starting with ``letter`` begins with."""
    ids = tokenizer(letter, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"option letter {letter!r} is {len(ids)} tokens for this tokenizer; expected exactly 1")
    return ids[0]
