"""`troupe run opd`'s config: every default in one place; presets and `key=value` overrides change it.

An arm of the comparison is a method (`METHODS`) at a horizon; every arm starts from the same
student (the embedded model, untrained, or ``model.path``) and is given the same teacher-token
budget: an online arm scores ``opd.prompts_per_step`` roll-ins a step, an offline arm gets as
many teacher trajectories up front (``run.steps × opd.prompts_per_step``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from troupe.actors.learner import LearnerConfig
from troupe.algorithms.grpo.config import RewardConfig, RolloutConfig
from troupe.algorithms.opd.kernels import NoiseConfig
from troupe.algorithms.sft import ModelConfig, SFTConfig
from troupe.envs.chain import MAX_H, MIN_H, PLAIN_TEMPLATE, ChainTask, answer_length
from troupe.platform.config import RunConfig, check
from troupe.platform.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Method:
    """What an arm does each step: where its data comes from, how it rolls in, what it fits."""

    data: str  # offline (teacher trajectories up front), online (fresh roll-ins), dagger (aggregated)
    roll: str  # offline: noisy, clean or kd (the teacher's temperature); else sample (T=1) or greedy
    loss: str  # a distillation loss (hard, tl, rkl, jsd) or sampled_rkl
    access: str = "logits"  # logits, or votes (m draws per position, majority)
    beta: float | None = None  # jsd's β; None: opd.jsd_beta


METHODS: dict[str, Method] = {
    "bc": Method("offline", "noisy", "hard"),
    "clean_bc": Method("offline", "clean", "hard"),
    "seq_kd": Method("offline", "kd", "hard"),
    "gkd_fkl": Method("online", "sample", "jsd", beta=0.0),
    "gkd_rkl": Method("online", "sample", "jsd", beta=1.0),
    "gkd_jsd": Method("online", "sample", "jsd"),
    "tm_opd": Method("online", "sample", "sampled_rkl"),
    "ne_opd_hard": Method("dagger", "greedy", "hard"),
    "ne_opd_tl": Method("dagger", "greedy", "tl"),
    "ne_opd_rkl": Method("dagger", "greedy", "rkl"),
    "ne_opd_vote": Method("dagger", "greedy", "hard", access="votes"),
}


def _teacher_model() -> ModelConfig:
    # Wider than the student and fitted on clean chains of every horizon (cached like the SFT policy).
    from troupe.actors.models import TinyLMSpec

    return ModelConfig(tiny=TinyLMSpec(hidden_size=128, intermediate_size=384), chat_template=PLAIN_TEMPLATE,
                       sft=SFTConfig(enabled=True, steps=2000, schedule="cosine"))


@dataclasses.dataclass
class TeacherConfig:
    # "program": the task's rule at every state (a clean expert the student can learn exactly);
    # "tiny": an embedded LM SFT-fitted on clean chains of every horizon (`teacher.model`), with
    # the student's tokenizer; or a causal LM by hub id or local directory sharing that tokenizer.
    path: str = "program"
    model: ModelConfig = dataclasses.field(default_factory=_teacher_model)  # path=tiny only
    # A wrong digit at each step w.p. ε (the step kernel): with the chain tokenizer's 261 tokens,
    # uniform noise is a non-digit token 96% of the time, which a digit chain reads past, so
    # ν = uniform (§B.1's default, `kernel=uniform`) would barely corrupt an answer.
    noise: NoiseConfig = dataclasses.field(default_factory=lambda: NoiseConfig(kernel="step"))
    votes: int = 0  # sample access: draws per position; 0 = the Hoeffding m of §B.2 at `delta`
    top_k: int = 0  # logit access sends π̃'s top-k at each position (a large vocabulary); 0: all of it
    delta: float = 0.1
    device: str = "cpu"
    dtype: str = "float32"
    num_cpus: float = 0.25
    num_gpus: float = 0.0
    max_restarts: int = 2

    def __post_init__(self) -> None:
        check(isinstance(self.votes, int) and self.votes >= 0, "teacher.votes", self.votes,
              "draws per position >= 1, or 0 for the Hoeffding number")
        check(0 < self.delta < 1, "teacher.delta", self.delta, "a probability in (0, 1)")
        check(isinstance(self.top_k, int) and self.top_k >= 0, "teacher.top_k", self.top_k,
              "an integer >= 0 (0 sends whole distributions)")

    def validate(self) -> None:
        if self.path not in ("program", "tiny"):
            from troupe.actors.models import model_config_or_error

            model_config_or_error(self.path, "teacher.path", "the teacher's causal LM")


@dataclasses.dataclass
class OPDSettings:
    methods: list[str] = dataclasses.field(default_factory=lambda: ["bc", "gkd_rkl", "tm_opd", "ne_opd_hard"])
    horizons: list[int] = dataclasses.field(default_factory=lambda: [4, 8])
    prompts_per_step: int = 32  # roll-ins an online arm has scored each step: the budget unit
    updates_per_step: int = 16  # optimizer steps an online or aggregating arm takes each step
    # Optimizer steps an offline arm (bc, clean_bc, seq_kd) takes each step [ASM]: its data is
    # bought up front, so more steps cost no teacher tokens, and the baseline is fitted toward
    # convergence instead of stopped on a plateau. 4x: at H = 4, BC on noisy trajectories went
    # from greedy 0.00 to 0.92 (1,600 vs 6,400 updates, seed 1, lr 1e-3).
    offline_updates_per_step: int = 64
    batch_size: int = 64  # rows per update drawn from an offline or aggregated data set
    kd_temperature: float = 0.3  # seq_kd's teacher temperature [ASM]
    roll_temperature: float = 0.0  # NE-OPD's roll-in: 0 greedy, or a low temperature (§B.2: <= 0.3) to explore
    # NE-OPD's roll-in, ε-greedy [ASM, 0.05 optional]: a token drawn from the student (at
    # roll_temperature, or 1 if that is 0) with probability ε, else its argmax
    explore: float = 0.0
    jsd_beta: float = 0.5  # gkd_jsd's β
    buffer_capacity: int = 0  # rows an aggregated data set keeps per arm (oldest dropped); 0 = all
    # Teacher tokens each arm may use; 0: run.steps × prompts_per_step × (answer + end token).
    # An online arm stops asking once its roll-ins would pass it (an aggregating arm trains on).
    teacher_tokens: int = 0

    def __post_init__(self) -> None:
        check(bool(self.methods) and all(m in METHODS for m in self.methods), "opd.methods", self.methods,
              "a non-empty list of " + ", ".join(METHODS))
        check(len(set(self.methods)) == len(self.methods), "opd.methods", self.methods, "each method once")
        check(bool(self.horizons) and all(isinstance(h, int) and MIN_H <= h <= MAX_H for h in self.horizons),
              "opd.horizons", self.horizons, f"a non-empty list of integers from {MIN_H} to {MAX_H}")
        check(len(set(self.horizons)) == len(self.horizons), "opd.horizons", self.horizons, "each horizon once")
        for key in ("prompts_per_step", "updates_per_step", "offline_updates_per_step", "batch_size"):
            check(getattr(self, key) >= 1, f"opd.{key}", getattr(self, key), "an integer >= 1")
        check(self.kd_temperature > 0, "opd.kd_temperature", self.kd_temperature, "a number > 0")
        check(0 <= self.roll_temperature <= 1, "opd.roll_temperature", self.roll_temperature,
              "a number in [0, 1] (0: greedy roll-in)")
        check(0 <= self.explore < 1, "opd.explore", self.explore, "a probability in [0, 1) (0: no exploration)")
        check(0 <= self.jsd_beta <= 1, "opd.jsd_beta", self.jsd_beta, "a number in [0, 1]")
        check(self.buffer_capacity >= 0, "opd.buffer_capacity", self.buffer_capacity, "an integer >= 0 (0 = all)")
        check(self.teacher_tokens >= 0, "opd.teacher_tokens", self.teacher_tokens,
              "an integer >= 0 (0 = the steps' roll-ins)")


@dataclasses.dataclass
class OPDEvalConfig:
    num_prompts: int = 200  # held-out chains per horizon
    bootstrap: int = 1000  # resamples of the prompts for the 95% intervals


def _student() -> ModelConfig:
    # Untrained: every arm learns the task from its teacher alone. The chain continues the
    # prompt's digits with no chat turn between them, so every step reads the two digits before it.
    return ModelConfig(sft=SFTConfig(enabled=True, steps=0), chat_template=PLAIN_TEMPLATE)


def _learner() -> LearnerConfig:
    # sampled_rkl: a clipped policy-gradient step (several a batch), token-mean (DAPO) aggregation.
    # lr 1e-3: at 3e-3 BC on clean trajectories (the oracle) stayed on a plateau (loss 1.29,
    # greedy 0.10 at H = 4) where at 1e-3 it reached 1.00 by step 50.
    return LearnerConfig(lr=1e-3, lr_schedule="cosine", warmup_steps=50, min_lr_ratio=0.1, loss="ppo_clip",
                         aggregation="dapo", grad_clip=1.0, num_cpus=0.25)


def _rollout() -> RolloutConfig:
    from troupe.actors.sampling import SamplingConfig

    return RolloutConfig(num_cpus=0.25, sampling=SamplingConfig(max_new_tokens=MAX_H + 3))


@dataclasses.dataclass
class OPDConfig:
    model: ModelConfig = dataclasses.field(default_factory=_student)
    task: ChainTask.Config = dataclasses.field(default_factory=lambda: ChainTask.Config(kind="recurrence"))
    teacher: TeacherConfig = dataclasses.field(default_factory=TeacherConfig)
    opd: OPDSettings = dataclasses.field(default_factory=OPDSettings)
    rollout: RolloutConfig = dataclasses.field(default_factory=_rollout)
    learner: LearnerConfig = dataclasses.field(default_factory=_learner)
    reward: RewardConfig = dataclasses.field(default_factory=lambda: RewardConfig(fn="chain_exact"))
    eval: OPDEvalConfig = dataclasses.field(default_factory=OPDEvalConfig)
    run: RunConfig = dataclasses.field(
        default_factory=lambda: RunConfig(steps=100, eval_every=25, checkpoint_every=25, num_cpus=6))

    def __post_init__(self) -> None:
        need = answer_length(self.task.kind, max(self.opd.horizons)) + 1
        if self.opd.teacher_tokens and self.opd.teacher_tokens < need:
            raise ConfigError(f"opd.teacher_tokens={self.opd.teacher_tokens} is less than one episode at "
                              f"H={max(self.opd.horizons)} ({need} tokens with the end token): give at least that")
        if self.rollout.sampling.max_new_tokens < need:
            raise ConfigError(f"rollout.sampling.max_new_tokens={self.rollout.sampling.max_new_tokens} cannot hold "
                              f"the longest answer of opd.horizons ({max(self.opd.horizons)} steps of "
                              f"{self.task.kind}) and its end token: set it to at least {need}")

    def validate(self) -> None:
        """The rollout backend's and the weight transport's own checks (vLLM's GPU memory rules)."""
        from troupe.algorithms.policy_graph import check_policy_config

        check_policy_config(self)

    def arms(self) -> list[tuple[str, str, int]]:
        """(arm name, method, horizon) for every arm, horizons outermost."""
        return [(f"{m}_h{h}", m, h) for h in self.opd.horizons for m in self.opd.methods]

    def updates_per_step(self, method: str) -> int:
        """Optimizer steps an arm of ``method`` takes each step."""
        offline = METHODS[method].data == "offline"
        return self.opd.offline_updates_per_step if offline else self.opd.updates_per_step

    def arm_learner(self, method: str) -> LearnerConfig:
        """The learner of an arm of ``method``: its learning-rate schedule spans its own updates
        (``learner.total_steps``, or every step's ``updates_per_step(method)``)."""
        total = self.learner.total_steps or max(1, self.run.steps * self.updates_per_step(method))
        return dataclasses.replace(self.learner, total_steps=total)

    def episode_tokens(self, horizon: int) -> int:
        """Positions of one episode: a whole answer and its end token."""
        return answer_length(self.task.kind, horizon) + 1

    def budget(self, horizon: int) -> int:
        """Teacher tokens an arm at ``horizon`` is given: ``opd.teacher_tokens``, or every step's
        roll-ins (fewer are used where a student stops early)."""
        return self.opd.teacher_tokens or self.run.steps * self.opd.prompts_per_step * self.episode_tokens(horizon)

    def query_steps(self, horizon: int) -> int:
        """The steps on which an online arm asks the teacher: as many as its budget pays for."""
        return self.budget(horizon) // (self.opd.prompts_per_step * self.episode_tokens(horizon))

    def trajectories(self, horizon: int) -> int:
        """Teacher trajectories an offline arm is given up front: its budget's worth (at least one)."""
        return max(1, self.budget(horizon) // self.episode_tokens(horizon))

    def facts(self) -> dict[str, Any]:
        return {"arms": [a for a, _, _ in self.arms()]}
