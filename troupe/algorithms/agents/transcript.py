"""An agent's side of a multi-turn episode as token ids, and the Batch a policy loss trains on.

A `Transcript` holds what one agent saw and wrote in one episode: its first prompt, then every
turn appended to its context (a tool's result, another agent's message) and every completion
it sampled, with the sampling log-probs of its own tokens. `transcripts_to_batch` makes one
learner row per transcript: the first prompt as ``prompt_ids``; everything after it as
``completion_ids``, with ``completion_mask`` 1 on the tokens the agent wrote (the loss's
tokens) and ``completion_attention_mask`` 1 on every token (the model reads them all), so
GRPO or any policy loss trains on the whole episode with one episode-level advantage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from troupe.actors.sampling import left_padded
from troupe.platform.batch import Batch


@dataclasses.dataclass
class Transcript:
    """One agent's tokens in one episode."""

    agent: str
    prompt_ids: list[int] = dataclasses.field(default_factory=list)
    ids: list[int] = dataclasses.field(default_factory=list)  # everything after the first prompt
    produced: list[int] = dataclasses.field(default_factory=list)  # 1 where the agent wrote the token
    logprobs: list[float] = dataclasses.field(default_factory=list)
    completions: list[str] = dataclasses.field(default_factory=list)
    version: int | None = None  # the policy version of the agent's last turn

    @property
    def turns(self) -> int:
        return len(self.completions)

    def context(self) -> list[int]:
        """The ids the agent's next turn continues."""
        return [*self.prompt_ids, *self.ids]

    def add_turn(self, appended: Sequence[int], completion: Sequence[int], logprobs: Sequence[float],
                 text: str, version: int | None = None) -> None:
        """Record one turn: the ids appended to the context before it, then what the agent wrote."""
        if len(completion) != len(logprobs):
            raise ValueError(f"{len(completion)} completion tokens but {len(logprobs)} log-probs")
        if not self.prompt_ids:
            self.prompt_ids = list(appended)
        else:
            self.ids += list(appended)
            self.produced += [0] * len(appended)
            self.logprobs += [0.0] * len(appended)
        self.ids += list(completion)
        self.produced += [1] * len(completion)
        self.logprobs += [float(x) for x in logprobs]
        self.completions.append(text)
        self.version = version


def transcripts_to_batch(transcripts: Sequence[Transcript], rows: Sequence[dict[str, Any]] | None = None,
                         pad_id: int = 0) -> Batch:
    """One learner row per transcript (each must have at least one turn); ``rows`` are the
    per-row objects kept beside it (default: the agent's name)."""
    if not transcripts:
        raise ValueError("no transcripts: an agent that took no turn has nothing to train on")
    empty = [i for i, t in enumerate(transcripts) if not t.turns]
    if empty:
        raise ValueError(f"transcripts {empty} hold no turn; leave them out of the batch")
    width = max(len(t.ids) for t in transcripts)  # every transcript has a turn, so width >= 1

    def right(seqs: list[list[Any]], dtype: torch.dtype, fill: Any = 0) -> torch.Tensor:
        return torch.tensor([[*x, *[fill] * (width - len(x))] for x in seqs], dtype=dtype)

    prompt_ids, prompt_mask = left_padded([t.prompt_ids for t in transcripts], pad_id)  # as the engines pad
    tensors = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": right([t.ids for t in transcripts], torch.long, pad_id),
        "completion_mask": right([t.produced for t in transcripts], torch.long),
        "completion_attention_mask": right([[1] * len(t.ids) for t in transcripts], torch.long),
        "logprobs": right([t.logprobs for t in transcripts], torch.float32, 0.0),
    }
    rows = list(rows) if rows is not None else [{"agent": t.agent} for t in transcripts]
    objects = {"prompt": [""] * len(transcripts),
               "completion": ["\n".join(t.completions) for t in transcripts],
               "row": rows}
    versions = {t.version for t in transcripts}
    meta = {"version": versions.pop() if len(versions) == 1 else None,
            "tokens": int(tensors["completion_mask"].sum())}
    return Batch(tensors, objects, meta)
