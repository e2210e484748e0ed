"""A user's own prompts: ``task.name=dataset task.train=SOURCE task.eval=SOURCE``.

A source is a local JSONL, JSON, CSV or Parquet file, a folder written by
``datasets.Dataset.save_to_disk``, or a hub dataset id (``task.split``/``task.eval_split`` pick
its splits, ``task.subset`` its configuration), all read by the ``datasets`` library. Each row
has a prompt and an answer; ``task.fields.prompt=question task.fields.answer=solution`` reads
them from other columns, and every other field reaches the checker as a keyword. A prompt is a
string or a list of chat turns ``{"role", "content"}``; ``task.system_prompt`` adds a system
turn to every row without one (see `troupe.envs.datasets` for the chat rows). ``jsonl`` is the
same task under the name it had when it read JSONL files only.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from troupe.envs.datasets import PromptDataset
from troupe.envs.task import Task, check_dataset_file, load_rows
from troupe.platform.config import check, registered, to_dict
from troupe.platform.registry import REWARDS

SOURCE = "a .jsonl, .json, .csv or .parquet file, a save_to_disk folder or a hub dataset id"


class DatasetTask(Task):
    """RL prompts sampled from ``train``; the held-out set is the first rows of ``eval``."""

    @dataclasses.dataclass
    class Config(Task.Config):
        name: str = "dataset"
        train: str | None = None  # rows {prompt, answer}: RL prompts and the SFT corpus (a file, folder or hub id)
        eval: str | None = None  # rows {prompt, answer}: the held-out set
        reward: str = registered("exact_match", REWARDS)  # the checker: a registered reward or "module:function"
        split: str = "train"  # the split of `train` in a hub dataset or a saved DatasetDict
        eval_split: str = "test"  # the split of `eval`, likewise
        subset: str | None = None  # a hub dataset's configuration name (e.g. "main" of openai/gsm8k)
        fields: dict[str, str] = dataclasses.field(default_factory=dict)  # troupe field -> column
        system_prompt: str | None = None  # a system turn before every prompt that has none

        def __post_init__(self) -> None:
            for key in ("train", "eval"):
                check(getattr(self, key) is not None, f"task.{key}", None, SOURCE)
            for field, column in self.fields.items():
                check(bool(field) and isinstance(column, str) and bool(column), f"task.fields.{field}", column,
                      "a column name of the dataset")

        def validate(self) -> None:
            for key in ("train", "eval"):
                check_dataset_file(getattr(self, key), f"task.{key}", hub=True)

    def train_rows(self, n: int, rng: np.random.Generator) -> list[dict]:
        return self._train.sample(n, rng)

    def eval_rows(self, n: int) -> list[dict]:
        return self._eval.rows[:n]

    def checker(self) -> str:
        return self.config.reward

    def cache_key(self) -> dict[str, Any]:
        # The fields added after the task read JSONL only are left out at their defaults: the
        # SFT checkpoints fitted on a jsonl task keep their keys.
        key = to_dict(self.config)
        for f in dataclasses.fields(self.Config):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if f.name in _ADDED and key[f.name] == default:
                del key[f.name]
        return key

    @functools.cached_property
    def _train(self) -> PromptDataset:
        c = self.config
        return load_rows(c.train, "task.train", c.split, c.subset, c.fields, c.system_prompt, "task.split")

    @functools.cached_property
    def _eval(self) -> PromptDataset:
        c = self.config
        return load_rows(c.eval, "task.eval", c.eval_split, c.subset, c.fields, c.system_prompt, "task.eval_split")


_ADDED = ("split", "eval_split", "subset", "fields", "system_prompt")


def exact_match(completion: str, answer: object, **_: object) -> float:
    """1 when the completion, stripped of surrounding whitespace, equals the answer, else 0."""
    return float(completion.strip() == str(answer).strip())
