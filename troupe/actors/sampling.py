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
    # ε-greedy, applied last: with probability 1 − ε the most likely token of the distribution
    # above, else a draw from it; log-probs are the mixture's. 0 = off; needs temperature > 0.
    explore: float = 0.0
    max_new_tokens: int = 32
    stop: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        check(self.temperature >= 0, "rollout.sampling.temperature", self.temperature, "a number >= 0 (0 = greedy)")
        check(0 < self.top_p <= 1, "rollout.sampling.top_p", self.top_p, "a number in (0, 1]")
        check(self.top_k >= 0, "rollout.sampling.top_k", self.top_k, "an integer >= 0 (0 = off)")
        check(0 <= self.min_p <= 1, "rollout.sampling.min_p", self.min_p, "a number in [0, 1] (0 = off)")
        check(self.repetition_penalty > 0, "rollout.sampling.repetition_penalty", self.repetition_penalty,
              "a number > 0 (1 = off; > 1 discourages repeats)")
        check(0 <= self.explore <= 1, "rollout.sampling.explore", self.explore, "a probability in [0, 1] (0 = off)")
        check(self.explore == 0 or self.temperature > 0, "rollout.sampling.explore", self.explore,
              "0 when greedy: ε-greedy draws with probability ε from the tempered distribution, so set "
              "rollout.sampling.temperature > 0 (1: the model's own)")
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


_PROBE_USER, _PROBE_AGENT = "troupe-probe-user", "troupe-probe-agent"


def continuation_text(tokenizer: Any, turns: Sequence[Mapping[str, str]], ended: bool) -> str:
    """The text that follows an agent's completion when ``turns`` (role/content dicts) join the
    conversation: the rest of the agent's turn (its template's end-of-turn text, less the EOS
    token the completion already ended with when ``ended``), the new turns in the chat template,
    and the generation prompt of the agent's next turn. Found from the template itself, on a
    probe conversation, so any template that renders a conversation as the prefix of its
    continuation works (ChatML, Llama 3, ...). Without a template the turns' texts follow as they are."""
    if tokenizer.chat_template is None:
        return "".join(t["content"] for t in turns)
    for t in turns:
        if set(t) - {"role", "content"} or "role" not in t or "content" not in t:
            raise ValueError(f"a chat turn is a dict with 'role' and 'content'; got {dict(t)!r}")
    probe = [{"role": "user", "content": _PROBE_USER}, {"role": "assistant", "content": _PROBE_AGENT}]
    base = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
    whole = tokenizer.apply_chat_template([*probe, *turns], tokenize=False, add_generation_prompt=True)
    if not whole.startswith(base) or _PROBE_AGENT not in base:
        raise ValueError("this chat template does not render a conversation as the prefix of its continuation, "
                         "so multi-turn episodes cannot extend token ids; set model.chat_template to one that does")
    end = base[base.rindex(_PROBE_AGENT) + len(_PROBE_AGENT):]  # e.g. "<|im_end|>\n"
    eos = tokenizer.eos_token or ""
    if ended and eos and end.startswith(eos):
        end = end[len(eos):]
    return end + whole[len(base):]


def turn_prompts(tokenizer: Any, contexts: Sequence[Sequence[int] | None],
                 messages: Sequence[Sequence[Mapping[str, str]]], chat: bool = True) -> tuple[list[list[int]], list[list[int]]]:
    """The whole prompt ids of each conversation's next turn, and the ids added to it: a first
    turn (no context) is its messages in the chat template with the generation prompt; a later
    one is its context followed by `continuation_text` of its messages. Every engine's
    ``generate_turns`` builds its prompts here, so the backends agree token for token."""
    if len(contexts) != len(messages):
        raise ValueError(f"generate_turns: {len(contexts)} contexts for {len(messages)} message lists")
    full, appended = [], []
    for ctx, turns in zip(contexts, messages, strict=True):
        if not ctx:
            text = (tokenizer.apply_chat_template(list(turns), tokenize=False, add_generation_prompt=True)
                    if chat and tokenizer.chat_template else "".join(t["content"] for t in turns))
            add = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            full.append(add)
        else:
            ended = ctx[-1] == tokenizer.eos_token_id
            add = list(tokenizer(continuation_text(tokenizer, list(turns), ended), add_special_tokens=False)["input_ids"])
            full.append([*ctx, *add])
        appended.append(add)
    return full, appended


def left_padded(seqs: Sequence[Sequence[int]], pad_id: int | None) -> tuple[Any, Any]:
    """Left-padded ``[B, T]`` ids and attention mask of token-id prompts (as generate takes them)."""
    import torch

    width = max(len(x) for x in seqs)
    pad = pad_id if pad_id is not None else 0
    ids = torch.tensor([[pad] * (width - len(x)) + list(x) for x in seqs])
    mask = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in seqs])
    return ids, mask


def check_option_letters(option_letters: list[str] | None, prompts: list[str]) -> None:
    if option_letters is not None and len(option_letters) != len(prompts):
        raise ValueError(f"generate: {len(option_letters)} option_letters for {len(prompts)} prompts")


def letter_token_id(tokenizer: Any, letter: str) -> int:
    """The token a completion starting with ``letter`` begins with."""
    ids = tokenizer(letter, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ValueError(f"option letter {letter!r} is {len(ids)} tokens for this tokenizer; expected exactly 1")
    return ids[0]
