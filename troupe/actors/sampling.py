"""Sampling parameters shared by every rollout backend."""

from __future__ import annotations

import dataclasses

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
