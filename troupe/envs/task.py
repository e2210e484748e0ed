"""The LLM-task contract: prompts with answers, a held-out set, an exact checker, an SFT corpus.

A task is a class with its own config dataclass, registered by name in the entry-point group
``troupe.tasks`` or named by import path (``task.name=mypkg.tasks:Sorting``). The ``task``
config section is that class's ``Config``: ``task.name`` picks the class, the other keys are
its fields. A new task copies this shape::

    class Sorting(Task):
        @dataclasses.dataclass
        class Config(Task.Config):
            name: str = "sorting"
            length: int = 5

        def train_rows(self, n, rng):
            return [self.row(rng) for _ in range(n)]

        def eval_rows(self, n):
            rng = np.random.default_rng(12345)
            return [self.row(rng) for _ in range(n)]

        def checker(self):
            return "exact_match"  # or "mypkg.tasks:sorted_exact"

Building a task only keeps its config: files are read when rows are first asked for, so a
config can ask its task for the checker without any I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from troupe.envs.datasets import FORMATS, LOCAL_KINDS, PromptDataset, is_local, prompt_rows, read_table
from troupe.platform.config import to_dict
from troupe.platform.errors import DataError
from troupe.platform.registry import TASKS

if TYPE_CHECKING:
    from troupe.algorithms.sft import SFTTask


class Task:
    """An LLM task. A subclass defines `Config`, `train_rows`, `eval_rows` and `checker`."""

    @dataclasses.dataclass
    class Config:
        """The ``task`` config section; ``name`` is the task's registered name or import path."""

        name: str = ""

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        """``Task(config)``, or ``Task(field=value, ...)`` for its ``Config`` built from keywords."""
        if config is None:
            config = self.Config(**overrides)
        elif overrides:
            config = dataclasses.replace(config, **overrides)
        self.config = config

    def train_rows(self, n: int, rng: np.random.Generator) -> list[dict]:
        """``n`` training rows, each at least ``{"prompt", "answer"}``; every field reaches the checker.
        A row's ``"messages"`` (chat turns ``{"role", "content"}``), when it has them, are what the
        model is shown through its chat template, with ``"prompt"`` their plain-text fallback."""
        raise NotImplementedError

    def eval_rows(self, n: int) -> list[dict]:
        """The held-out set: up to ``n`` rows, the same on every call and in every run of this config."""
        raise NotImplementedError

    def checker(self) -> str:
        """The exact checker: a registered reward or ``"module:function"``, called as
        ``fn(completion=..., **row)`` and returning 1.0 for a right answer, 0.0 otherwise."""
        raise NotImplementedError

    def sft_task(self) -> SFTTask:
        """What supervised fine-tuning fits before RL (``sample`` and ``corpus``): the training rows."""
        return TrainRowsSFT(self.train_rows)

    def cache_key(self) -> dict[str, Any]:
        """Everything that shapes the SFT checkpoint, which keys its cache: the whole config."""
        return to_dict(self.config)


class TrainRowsSFT:
    """A task's training rows as an `SFTTask`: SFT fits them and the tokenizer learns their text."""

    def __init__(self, rows: Callable[[int, np.random.Generator], list[dict]]) -> None:
        self.rows = rows

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        if split != "train":
            raise ValueError(f"SFT samples the 'train' split, got {split!r}")
        return self.rows(n, rng)

    def corpus(self, n: int = 4000, seed: int = 0) -> list[str]:
        return [f"{r['prompt']}\n{r['answer']}" for r in self.rows(n, np.random.default_rng(seed))]


def build_task(config: Task.Config) -> Task:
    """The task that ``config.name`` names (a registered task or ``"module:Class"``), built on ``config``."""
    return TASKS.resolve(config.name, "task.name")(config)


def load_rows(path: str, key: str, split: str = "train", subset: str | None = None,
              fields: dict[str, str] | None = None, system_prompt: str | None = None,
              split_key: str = "task.split") -> PromptDataset:
    """The dataset at ``path`` (a local file or folder, or a hub id: see `troupe.envs.datasets`)
    as ``{"prompt", "answer", "messages", ...}`` rows; errors name the config ``key``."""
    try:
        return prompt_rows(read_table(path, split, subset, split_key), path, fields, system_prompt)
    except DataError as e:
        raise DataError(f"{key}={path!r}: {e}") from None


def check_dataset_file(path: str | None, key: str, hub: bool = False) -> None:
    """A configured dataset must exist, in a format the loader reads: checked in the driver,
    naming the config key. With ``hub``, a name that is no local path is a hub dataset id,
    checked when it loads."""
    from pathlib import Path

    from troupe.platform.errors import ConfigError

    if path is None:
        return
    p = Path(path).expanduser()
    kinds = LOCAL_KINDS + (", or a hub dataset id" if hub else "")
    if p.is_file() and p.suffix.lower() not in FORMATS:
        raise ConfigError(f"{key}: dataset file {str(path)!r} has an unknown format "
                          f"{p.suffix or '(no suffix)'!r}; accepted: {kinds}")
    if not (p.exists() or (hub and not is_local(path))):
        raise ConfigError(f"{key}: dataset file {str(path)!r} does not exist; give {kinds}, whose rows have "
                          "'prompt' and 'answer'")
