"""A user's own prompts: ``task.name=jsonl task.train=train.jsonl task.eval=eval.jsonl``.

Each line of both files is a JSON object with at least ``"prompt"`` and ``"answer"``; any
other field reaches the checker as a keyword. SFT fits the training rows before RL.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from troupe.envs.datasets import PromptDataset
from troupe.envs.task import Task, check_dataset_file, load_rows
from troupe.platform.config import check, registered
from troupe.platform.registry import REWARDS


class JsonlTask(Task):
    """RL prompts sampled from ``train``; the held-out set is the first rows of ``eval``."""

    @dataclasses.dataclass
    class Config(Task.Config):
        name: str = "jsonl"
        train: str | None = None  # JSONL rows {"prompt", "answer"}: RL prompts and the SFT corpus
        eval: str | None = None  # JSONL rows {"prompt", "answer"}: the held-out set
        reward: str = registered("exact_match", REWARDS)  # the checker: a registered reward or "module:function"

        def __post_init__(self) -> None:
            for key in ("train", "eval"):
                check(getattr(self, key) is not None, f"task.{key}", None, 'the path of a JSONL file of '
                      '{"prompt", "answer"} rows')

        def validate(self) -> None:
            for key in ("train", "eval"):
                check_dataset_file(getattr(self, key), f"task.{key}")

    def train_rows(self, n: int, rng: np.random.Generator) -> list[dict]:
        return self._train.sample(n, rng)

    def eval_rows(self, n: int) -> list[dict]:
        return load_rows(self.config.eval, "task.eval").rows[:n]

    def checker(self) -> str:
        return self.config.reward

    @functools.cached_property
    def _train(self) -> PromptDataset:
        return load_rows(self.config.train, "task.train")


def exact_match(completion: str, answer: object, **_: object) -> float:
    """1 when the completion, stripped of surrounding whitespace, equals the answer, else 0."""
    return float(completion.strip() == str(answer).strip())
