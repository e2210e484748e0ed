"""Synthetic video QA as a multiple-choice LLM task (``task.name=video_qa``).

Each row is one synthetic clip on its original view, prompted as BPO prompts the tiny LM
(`VideoQATask.prompt`: question, lettered options, symbolic frames) and rendered once as a
policy perceives it (`VideoQATask.perceive`: backwards with probability ``order_noise``); the
answer is the gold option letter, checked by `option_letter`.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from troupe.envs.task import Task
from troupe.envs.video_qa.items import LETTERS, VideoItem, parse_answer
from troupe.envs.video_qa.synthetic import VideoQAConfig, VideoQATask


class VideoQAChoiceTask(Task):
    """Questions of the synthetic counterfactual video-QA environment, answered by letter."""

    @dataclasses.dataclass
    class Config(VideoQAConfig, Task.Config):
        name: str = "video_qa"
        # As in BPO's task: with questions about varying objects the tiny LM stays at chance.
        fixed_queries: bool = True
        eval_seed: int = 12345  # draws the held-out items

    def train_rows(self, n: int, rng: np.random.Generator) -> list[dict]:
        return [self.row(it, rng) for it in self.env.sample_items(n, "train", rng)]

    def eval_rows(self, n: int) -> list[dict]:
        rng = np.random.default_rng(self.config.eval_seed)  # the same renderings every call
        return [self.row(it, rng) for it in self.env.eval_items(n, self.config.eval_seed)]

    def checker(self) -> str:
        return "option_letter"

    def row(self, item: VideoItem, rng: np.random.Generator | None = None) -> dict:
        """The prompt (one rendering, drawn with ``rng``; the clip as it is without one), the
        gold letter, and what the checker and the metrics need."""
        shown = item if rng is None else self.env.perceive(item, rng)
        return {"prompt": self.env.prompt(shown), "answer": item.gold_letter, "num_options": len(item.options),
                "qtype": item.qtype, "hard": item.hard, "item_id": item.item_id}

    @functools.cached_property
    def env(self) -> VideoQATask:
        return VideoQATask(self.config)


def option_letter(completion: str, answer: str, num_options: int, **_: object) -> float:
    """1 when the option the completion chose (`parse_answer`) is the one lettered ``answer``, else 0."""
    return float(parse_answer(completion, int(num_options)) == LETTERS.index(str(answer).strip()))
