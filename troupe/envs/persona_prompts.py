"""Prompts whose rows carry a persona's preference demonstrations: the task of ICRM-RL (§C.2).

A row is one of the text personas' prompts (`troupe.envs.preferences.text_personas.PROMPTS`),
with ``demos``: k comparisons of responses labelled by the persona (what an in-context reward
model is steered by), ``reference``: a response the pairwise rewards compare the completion
with, and ``persona``: the weights the gold reward reads. The exact checker is that gold reward,
``persona_gold``: wᵀφ(completion), the persona's Bradley–Terry utility of the features read from
the completion's text. The policy is never shown the demos: the reward model alone is steered.

SFT fits the policy to write responses of the generator (any persona's), so RL starts from a
policy whose replies vary along every attribute.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from troupe.envs.preferences.personas import PersonaConfig, check_personas, sample_personas
from troupe.envs.preferences.text_personas import ATTRIBUTES, TextPersonas, pool_episodes, response_pool
from troupe.envs.task import Task
from troupe.platform.config import check

_FEATURES: dict[tuple, TextPersonas] = {}


class PersonaPromptsTask(Task):
    """Prompts with a persona's demos in each row; the gold persona reward as the checker."""

    @dataclasses.dataclass
    class Config(Task.Config):
        name: str = "persona_prompts"
        # The persona: its weights over ATTRIBUTES (a unit vector is made of them), or, when
        # empty, persona_index of the personas drawn from persona_split with persona_seed.
        weights: list[float] = dataclasses.field(default_factory=list)
        persona_split: str = "train"
        persona_index: int = 0
        persona_seed: int = 0
        demos: int = 8  # k per row
        pool: int = 2000  # responses the demos and references are drawn from
        beta0: float = 3.0
        seed: int = 0
        eval_seed: int = 12345

        def __post_init__(self) -> None:
            check(not self.weights or len(self.weights) == len(ATTRIBUTES), "task.weights", self.weights,
                  f"{len(ATTRIBUTES)} weights, one per attribute {ATTRIBUTES}, or [] to draw a persona")
            check(not self.weights or float(np.linalg.norm(self.weights)) > 0, "task.weights", self.weights,
                  "weights that are not all zero")
            check(self.persona_split in ("train", "test"), "task.persona_split", self.persona_split, "train or test")
            check(self.persona_index >= 0, "task.persona_index", self.persona_index, "an integer >= 0")
            check(self.demos >= 0, "task.demos", self.demos, "an integer >= 0")
            check(self.pool >= 2, "task.pool", self.pool, "an integer >= 2")

    def __init__(self, config: Any = None, **overrides: Any) -> None:
        super().__init__(config, **overrides)
        self._built: tuple | None = None

    # -- what the rows are made of ----------------------------------------------------------------
    def personas_cfg(self) -> PersonaConfig:
        return PersonaConfig(beta0=self.config.beta0, max_demos=max(self.config.demos, 1))

    def persona(self) -> np.ndarray:
        c = self.config
        if c.weights:
            w = np.asarray(c.weights, dtype=float)
            return check_personas(self.personas_cfg(), w / np.linalg.norm(w))[0]
        drawn = sample_personas(self.personas_cfg(), c.persona_index + 1, c.persona_split,
                                np.random.default_rng(c.persona_seed))
        return drawn[c.persona_index]

    def _parts(self) -> tuple[TextPersonas, Any, np.ndarray]:
        if self._built is None:
            tp = TextPersonas(self.personas_cfg())
            pool = response_pool(tp, self.config.pool, np.random.default_rng([self.config.seed, 11]))
            self._built = (tp, pool, self.persona())
        return self._built

    def _rows(self, n: int, rng: np.random.Generator) -> list[dict]:
        tp, pool, w = self._parts()
        eps = pool_episodes(tp, pool, w[None], n, rng, k=self.config.demos, names=["persona"])
        rows = []
        for e in eps:
            reference = pool.texts[int(rng.integers(len(pool)))]
            rows.append({"prompt": e.query.prompt, "answer": e.query.a, "reference": reference,
                         "demos": [d.as_row() for d in e.demos], "persona": w.tolist(), "beta0": self.config.beta0})
        return rows

    # -- the task contract ------------------------------------------------------------------------
    def train_rows(self, n: int, rng: np.random.Generator) -> list[dict]:
        return self._rows(n, rng)

    def eval_rows(self, n: int) -> list[dict]:
        return self._rows(n, np.random.default_rng(self.config.eval_seed))

    def checker(self) -> str:
        return "persona_gold"

    def cache_key(self) -> dict[str, Any]:
        # SFT fits responses of the generator, whoever the persona is: one checkpoint for all.
        return {"name": self.config.name, "pool": self.config.pool, "seed": self.config.seed}


def persona_gold(completion: str, persona: list[float], **_: object) -> float:
    """The persona's utility wᵀφ(completion) (the gold reward of ICRM-RL)."""
    tp = _FEATURES.setdefault((len(persona),), TextPersonas(PersonaConfig(dim=len(persona))))
    return float(np.dot(np.asarray(persona, dtype=float), tp.features(completion)))
