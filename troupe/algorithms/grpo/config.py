"""GRPO's config: every default in one place; presets and `key=value` overrides change it."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from troupe.actors.learner import LearnerConfig
from troupe.actors.sampling import SamplingConfig
from troupe.algorithms.sft import ModelConfig
from troupe.envs.arithmetic import ArithmeticTask
from troupe.envs.task import Task, build_task
from troupe.platform.config import RunConfig, check, registered, selected
from troupe.platform.registry import ADVANTAGES, REWARDS, ROLLOUT_BACKENDS, TASKS, TRANSPORTS


@dataclasses.dataclass
class RolloutConfig:
    backend: str = registered("hf", ROLLOUT_BACKENDS)  # hf, vllm, or "module:EngineClass"
    num_engines: int = 1
    num_cpus: float = 0.5
    num_gpus: float = 0.0
    colocate_with_learner: bool = False  # share bundles (and a GPU) with the learner ranks
    gpu_memory_utilization: float = 0.4  # vllm only: a fraction of the whole GPU, at most num_gpus
    max_model_len: int | None = None  # vllm only; None: the model's own
    dtype: str | None = None  # vllm only; None: bfloat16 (vLLM's float32 path has no FlashAttention)
    enforce_eager: bool = False  # vllm only: no CUDA graphs (faster start, less memory, slower decoding)
    # object_store, or nccl (vllm engines on GPUs of their own); with LoRA the adapter always
    # travels alone (the lora transport), whatever this says.
    weight_transport: str = registered("object_store", TRANSPORTS)
    sampling: SamplingConfig = dataclasses.field(default_factory=lambda: SamplingConfig(max_new_tokens=8))
    max_restarts: int = 2
    # The engines' OS priority (nice, 0-19). With run.staleness >= 1 on shared cores, a positive
    # value lets generation ahead take the cycles the learner leaves idle instead of slowing the
    # update, which is the step's critical path (benchmarks/grpo.py measures both).
    niceness: int = 0

    def __post_init__(self) -> None:
        check(self.num_engines >= 1, "rollout.num_engines", self.num_engines, "an integer >= 1")
        check(isinstance(self.niceness, int) and not isinstance(self.niceness, bool) and 0 <= self.niceness <= 19,
              "rollout.niceness", self.niceness, "an integer in 0..19 (0: normal priority; 19: the lowest)")

    def validate(self) -> None:
        """The weight transport's own checks (run in the driver by `check_registered`)."""
        TRANSPORTS.get(self.weight_transport).check_config(self)


@dataclasses.dataclass
class RewardConfig:
    # rule: a Python function per row (`fn`); model: a learned reward model (`path`); judge: the
    # BayesJudge posterior that the completion beats the row's reference, from an LLM judge (`path`)
    # called in both orders (troupe.algorithms.judge.reward). With model and judge, `fn` stays the
    # held-out checker, so eval/accuracy stays the task's exact accuracy. icrm: an in-context
    # reward model (`path`: the models/icrm directory of an icrm run) steered by each row's demos.
    kind: Literal["rule", "model", "judge", "icrm"] = "rule"
    # A registered reward or "module:function"; None: the task's own exact checker.
    fn: str | None = registered(None, REWARDS)
    on_error: float | str = "raise"  # "raise", or the reward a failing row gets (and is counted)
    # kind=model: a hub id or local directory of a sequence classifier with num_labels=1, or of a
    # causal LM saved with a value head (troupe.actors.reward_model); kind=judge: the judge's causal LM.
    path: str | None = None
    dtype: str = "float32"  # kind=model|judge: float32, bfloat16 or float16
    device: str = "cpu"  # kind=model|judge: cpu, cuda or auto
    batch_size: int = 16  # kind=model|judge: rows per forward pass (judge: questions per engine call)
    max_length: int | None = None  # kind=model: tokens read per row (cut from the left); None: the model's limit
    # kind=judge: the reward is the posterior mean of P(completion > reference), or its lower
    # credible bound, the judge_quantile of P(V=A | obs, θ) over judge_draws draws of θ per answer pair.
    judge_estimate: Literal["mean", "lower"] = "mean"
    judge_quantile: float = 0.1
    judge_draws: int = 256
    judge_reference: str = "reference"  # the row key holding the reference response
    judge_labels: str = "labels"  # the row key of human labels: [{rater, label: A|B|T|[...], group?}]
    judge_model: Literal["joint", "factorised"] = "joint"  # §G.2's pair model of the judge's two calls
    judge_prior: dict[str, Any] = dataclasses.field(default_factory=dict)  # JudgePrior fields, e.g. phi_diag
    judge_backend: str = registered("hf", ROLLOUT_BACKENDS)  # the engine the judge runs in its actor
    judge_min_mass: float = 0.5  # an answer whose A/B/T letters hold less first-token mass is unparsed
    judge_template: str | None = None  # the question, with {prompt}, {first}, {second}; None: the default
    # kind=icrm: mu = P(completion > row[icrm_reference] | demos), r = the completion's reward
    # r(x, y; demos), conservative = E_q log p against the reference (troupe.algorithms.icrm.reward)
    icrm_estimate: Literal["mu", "r", "conservative"] = "mu"
    icrm_reference: str = "reference"
    num_cpus: float = 0.1
    num_gpus: float = 0.0
    max_restarts: int = 2  # a reward actor that dies is restarted and its call re-issued

    def __post_init__(self) -> None:
        check(isinstance(self.on_error, float) or self.on_error == "raise", "reward.on_error", self.on_error,
              "'raise' or a number")
        check(self.batch_size >= 1, "reward.batch_size", self.batch_size, "an integer >= 1")
        check(self.max_length is None or self.max_length >= 1, "reward.max_length", self.max_length,
              "an integer >= 1, or null for the model's limit")
        check(self.dtype in ("float32", "bfloat16", "float16"), "reward.dtype", self.dtype,
              "float32, bfloat16 or float16")
        check(self.device in ("cpu", "cuda", "auto"), "reward.device", self.device, "cpu, cuda or auto")
        check(self.max_restarts >= 0, "reward.max_restarts", self.max_restarts, "an integer >= 0")
        check(self.kind != "rule" or self.path is None, "reward.path", self.path,
              "no path with reward.kind=rule (set reward.kind=model to score with a reward model, or judge)")
        check(self.kind != "model" or bool(self.path), "reward.path", self.path,
              "a hub id or local directory of a reward model, with reward.kind=model")
        check(self.kind != "judge" or bool(self.path), "reward.path", self.path,
              "a hub id or local directory of the judge's causal LM, with reward.kind=judge")
        check(self.kind != "icrm" or bool(self.path), "reward.path", self.path,
              "the directory of an in-context reward model (an icrm run's models/icrm), with reward.kind=icrm")
        check(0 < self.judge_quantile < 1, "reward.judge_quantile", self.judge_quantile, "a probability in (0, 1)")
        check(self.judge_draws >= 1, "reward.judge_draws", self.judge_draws, "an integer >= 1")
        check(0 <= self.judge_min_mass <= 1, "reward.judge_min_mass", self.judge_min_mass, "a probability in [0, 1]")

    def validate(self) -> None:
        """With ``kind=model``: the path holds a reward model (read from its config and weight names
        in the driver, before any actor starts), or a ConfigError naming ``reward.path``. With
        ``kind=judge``: the path holds a causal LM, and the prior and template are well formed."""
        if self.kind == "model":
            from troupe.actors.reward_model import reward_model_kind

            reward_model_kind(self.path)
        elif self.kind == "judge":
            from troupe.actors.judge import check_judge_path, check_template
            from troupe.algorithms.judge.reward import judge_prior

            check_judge_path(self.path)
            check_template(self.judge_template)
            judge_prior(self.judge_prior)
        elif self.kind == "icrm":
            from troupe.algorithms.icrm.text import check_icrm_path

            check_icrm_path(self.path)


@dataclasses.dataclass
class GRPOSettings:
    prompts_per_step: int = 8
    group_size: int = 8
    advantage: str = registered("grpo", ADVANTAGES)  # grpo, dr_grpo, rloo, or "module:function"

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
    # `task.name` picks the task (a registered one or "module:Class"); the section is its Config.
    task: Task.Config = selected(TASKS, ArithmeticTask.Config)
    rollout: RolloutConfig = dataclasses.field(default_factory=RolloutConfig)
    reward: RewardConfig = dataclasses.field(default_factory=RewardConfig)
    learner: LearnerConfig = dataclasses.field(default_factory=LearnerConfig)
    reference: ReferenceConfig = dataclasses.field(default_factory=ReferenceConfig)
    grpo: GRPOSettings = dataclasses.field(default_factory=GRPOSettings)
    eval: EvalConfig = dataclasses.field(default_factory=EvalConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=200, eval_every=20, checkpoint_every=50))

    def __post_init__(self) -> None:
        if self.reward.fn is None:  # recorded in the run's config.yaml, as the reward role gets it
            self.reward = dataclasses.replace(self.reward, fn=build_task(self.task).checker())

    def validate(self) -> None:
        """Checks across the rollout, learner and model sections (after each section's own)."""
        from troupe.algorithms.policy_graph import check_policy_config

        check_policy_config(self)
