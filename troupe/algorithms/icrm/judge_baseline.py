"""§C.3's generative judge: a causal LM that reads the demos and the query pair in one prompt and
answers ``A`` or ``B``; P(a ≻ b) is the answer tokens' probability, renormalised over the two.

It is fitted like any SFT judge, by next-token cross-entropy on the answer token over the whole
vocabulary, on the same episodes as the reward models. Unlike ICRM it reads every demo as text
in one sequence, so its context grows with k (a 8-demo episode is about 900 tokens).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from troupe.envs.preferences.episodes import Episode

Tensor = torch.Tensor
ANSWERS = ("A", "B")


def judge_prompt(e: Episode) -> str:
    """The demos as (better, worse) pairs, then the query with its two responses named A and B."""
    lines = [f"better: {d.chosen}\nworse: {d.rejected}" for d in e.demos]
    # The prompt ends in a space and each answer is one letter: one token in any byte-level tokenizer.
    lines.append(f"{e.query.prompt}\nA: {e.query.a}\nB: {e.query.b}\nanswer: ")
    return "\n".join(lines)


def judge_corpus(episodes: Sequence[Episode]) -> list[str]:
    """Texts for a tokenizer that the judge's prompts are written in."""
    return [judge_prompt(e) + ANSWERS[1 - e.query.label] for e in episodes]


class GenerativeJudge(nn.Module):
    """A causal LM judge over episodes: `forward` gives P(A) per episode, `loss` its SFT loss."""

    def __init__(self, lm: Any, tokenizer: Any, max_tokens: int) -> None:
        super().__init__()
        self.lm, self.tokenizer, self.max_tokens = lm, tokenizer, max_tokens
        ids = [tokenizer(a, add_special_tokens=False)["input_ids"] for a in ANSWERS]
        if any(len(i) != 1 for i in ids) or ids[0] == ids[1]:
            raise ValueError(f"the judge's tokenizer writes the answers {ANSWERS} as {ids}; each must be one token")
        self.answer_ids = torch.tensor([i[0] for i in ids])
        # Left padding and left truncation: the last position is always the one before the answer.
        tokenizer.padding_side, tokenizer.truncation_side = "left", "left"

    def answer_logits(self, episodes: Sequence[Episode]) -> Tensor:
        """(n, vocab) next-token logits after each episode's prompt."""
        device = next(self.lm.parameters()).device
        enc = self.tokenizer([judge_prompt(e) for e in episodes], return_tensors="pt", padding=True,
                             truncation=True, max_length=self.max_tokens, add_special_tokens=False).to(device)
        return self.lm(**enc).logits[:, -1].float()

    def forward(self, episodes: Sequence[Episode]) -> dict[str, Tensor]:
        logits = self.answer_logits(episodes)
        pair = logits[:, self.answer_ids.to(logits.device)]
        return {"logits": logits, "mu": torch.softmax(pair, -1)[:, 0]}

    def loss(self, out: dict[str, Tensor], episodes: Sequence[Episode]) -> Tensor:
        target = self.answer_ids[torch.tensor([1 - e.query.label for e in episodes])].to(out["logits"].device)
        return F.cross_entropy(out["logits"], target)
