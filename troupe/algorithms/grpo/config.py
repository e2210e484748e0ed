"""GRPO's config: every default in one place; presets and `key=value` overrides change it."""

from __future__ import annotations

import dataclasses
from typing import Literal

from troupe.actors.learner import LearnerConfig
from troupe.actors.sampling import SamplingConfig
from troupe.algorithms.sft import ModelConfig
from troupe.platform.config import RunConfig, check


@dataclasses.dataclass
class TaskConfig:
    """The verifiable task: synthetic arithmetic, or prompts from a JSONL file."""

    name: str = "arithmetic"
    digits: int = 2
    ops: list[str] = dataclasses.field(default_factory=lambda: ["+"])
    dataset: str | None = None  # JSONL rows with "prompt" and "answer" for RL prompts (the synthetic task still fits SFT)
    eval_dataset: str | None = None


@dataclasses.dataclass
class RolloutConfig:
    backend: Literal["hf", "vllm"] = "hf"
    num_engines: int = 1
    num_cpus: float = 0.5
    num_gpus: float = 0.0
    colocate_with_learner: bool = False  # share bundles (and a GPU) with the learner ranks
    gpu_memory_utilization: float = 0.4  # vllm only
    max_model_len: int | None = None  # vllm only; None: the model's own
    weight_transport: Literal["object_store", "nccl"] = "object_store"  # nccl: vllm engines on their own GPUs
    sampling: SamplingConfig = dataclasses.field(default_factory=lambda: SamplingConfig(max_new_tokens=8))
    max_restarts: int = 2

    def __post_init__(self) -> None:
        check(self.num_engines >= 1, "rollout.num_engines", self.num_engines, "an integer >= 1")
        if self.weight_transport == "nccl":
            check(self.backend == "vllm" and not self.colocate_with_learner, "rollout.weight_transport",
                  self.weight_transport, "'object_store' unless rollout.backend=vllm on GPUs of its own "
                  "(nccl cannot put two ranks on one GPU)")


@dataclasses.dataclass
class RewardConfig:
    fn: str = "arithmetic_exact"  # a registered reward or "module:function"
    on_error: float | str = "raise"  # "raise", or the reward a failing row gets (and is counted)
    num_cpus: float = 0.1

    def __post_init__(self) -> None:
        check(isinstance(self.on_error, float) or self.on_error == "raise", "reward.on_error", self.on_error,
              "'raise' or a number")


@dataclasses.dataclass
class GRPOSettings:
    prompts_per_step: int = 8
    group_size: int = 8
    advantage: str = "grpo"  # a registered estimator: grpo, dr_grpo, rloo, or "module:function"

    def __post_init__(self) -> None:
        check(self.prompts_per_step >= 1, "grpo.prompts_per_step", self.prompts_per_step, "an integer >= 1")
        check(self.group_size >= 2, "grpo.group_size", self.group_size, "an integer >= 2 (a group needs a baseline)")


@dataclasses.dataclass
class EvalConfig:
    num_prompts: int = 200
    temperature: float = 0.0  # greedy


@dataclasses.dataclass
class ReferenceConfig:
    num_cpus: float = 0.25
    num_gpus: float = 0.0


@dataclasses.dataclass
class GRPOConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    reference: ReferenceConfig = dataclasses.field(default_factory=ReferenceConfig)
    grpo: GRPOSettings = dataclasses.field(default_factory=GRPOSettings)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=200, eval_every=20, checkpoint_every=50))
