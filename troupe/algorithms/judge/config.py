"""The ``judge`` algorithm's config: every default in one place; presets and ``key=value``
overrides change it.

``streams``: §G.6's synthetic streams (one per condition and seed) and any JSONL streams of the
user's; ``prior`` and ``smc``: the model (§G.2) and its online inference (§G.3b); ``lm``: the tiny
LM judge and its text comparison task, whose both-order verdicts make one more stream;
``workers``: the aggregator actors the streams are shared out to.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from troupe.actors.judge import check_template
from troupe.algorithms.judge.model import GROUP_MEANS, JUDGE_MODELS, JudgePrior
from troupe.algorithms.judge.smc import SMCConfig
from troupe.algorithms.judge.word_task import TEMPLATE, WordTaskConfig
from troupe.algorithms.sft import ModelConfig, SFTConfig
from troupe.envs.judge_streams import SyntheticConfig
from troupe.platform.config import RunConfig, check

ANSWERS = ("sample", "argmax")


@dataclasses.dataclass
class RatersConfig:
    """§G.6's human raters: experts and crowd workers, each with confusion rows set by (diag, tie).
    The defaults are the stream generator's own (`SyntheticConfig`), kept in one place."""

    n_experts: int = SyntheticConfig.n_experts
    expert_diag: float = SyntheticConfig.expert_diag
    expert_tie: float = SyntheticConfig.expert_tie
    experts_per_item: int = SyntheticConfig.experts_per_item
    n_crowd: int = SyntheticConfig.n_crowd
    crowd_diag: float = SyntheticConfig.crowd_diag
    crowd_tie: float = SyntheticConfig.crowd_tie
    crowd_per_item: int = SyntheticConfig.crowd_per_item
    # Θ_r ~ Dir(c · group rows) per rater; None: every rater at its group's rows
    concentration: float | None = None

    def __post_init__(self) -> None:
        for g, pool_key, per_key in (("expert", "n_experts", "experts_per_item"), ("crowd", "n_crowd", "crowd_per_item")):
            diag, tie = getattr(self, f"{g}_diag"), getattr(self, f"{g}_tie")
            check(0 < diag < 1, f"raters.{g}_diag", diag, "a probability in (0, 1)")
            check(0 <= tie and diag + tie <= 1, f"raters.{g}_tie", tie, f">= 0 with {g}_diag + {g}_tie <= 1")
            pool, per = getattr(self, pool_key), getattr(self, per_key)
            check(pool >= 0, f"raters.{pool_key}", pool, "an integer >= 0")
            check(0 <= per <= pool, f"raters.{per_key}", per, f"an integer in [0, {pool}] (the raters of that group)")
        check(self.experts_per_item + self.crowd_per_item >= 1, "raters.experts_per_item",
              self.experts_per_item, "at least one human label per comparison (with raters.crowd_per_item)")
        check(self.concentration is None or self.concentration > 0, "raters.concentration", self.concentration,
              "> 0 or null")


@dataclasses.dataclass
class StreamsConfig:
    """The synthetic streams (§G.6): ``seeds`` streams per judge condition, and the user's files."""

    n: int = 1500  # comparisons per synthetic stream
    beta_ord: list[float] = dataclasses.field(default_factory=lambda: [0.15, 0.0])  # one condition each; 0: null
    seeds: int = 10  # streams per condition, seeds run.seed, run.seed + 1, ...
    pi: list[float] = dataclasses.field(default_factory=lambda: [0.4, 0.4, 0.2])
    judge_accuracy: float = 0.8
    late_fraction: float = 0.0  # share of human labels that arrive later, as late events
    # JSONL streams of the user's own (`troupe.envs.judge_streams.load_stream_jsonl`): one
    # comparison per line; a "truth" field, where present, is scored like the synthetic truth
    files: list[str] = dataclasses.field(default_factory=list)
    require_groups: bool = True  # a rater without a group is an error (the group signatures need one)

    def __post_init__(self) -> None:
        check(self.n >= 1, "streams.n", self.n, "an integer >= 1")
        check(self.seeds >= 0, "streams.seeds", self.seeds, "an integer >= 0")
        check(all(0 <= b <= 1 for b in self.beta_ord), "streams.beta_ord", self.beta_ord, "values in [0, 1]")
        check(len(set(self.beta_ord)) == len(self.beta_ord), "streams.beta_ord", self.beta_ord, "distinct values")
        check(len(self.pi) == 3 and min(self.pi) >= 0 and abs(sum(self.pi) - 1) < 1e-9, "streams.pi", self.pi,
              "a probability vector over (A, B, T)")
        check(0 < self.judge_accuracy < 1, "streams.judge_accuracy", self.judge_accuracy, "a probability in (0, 1)")
        check(0 <= self.late_fraction < 1, "streams.late_fraction", self.late_fraction, "a fraction in [0, 1)")

    def synthetic(self, raters: RatersConfig, beta: float, seed: int, n: int | None = None) -> SyntheticConfig:
        r = raters
        return SyntheticConfig(
            n=self.n if n is None else n, pi=tuple(self.pi), n_experts=r.n_experts, expert_diag=r.expert_diag,
            expert_tie=r.expert_tie, experts_per_item=r.experts_per_item, n_crowd=r.n_crowd, crowd_diag=r.crowd_diag,
            crowd_tie=r.crowd_tie, crowd_per_item=r.crowd_per_item, judge_accuracy=self.judge_accuracy,
            beta_ord=beta, rater_concentration=r.concentration, late_fraction=self.late_fraction, seed=seed)


@dataclasses.dataclass
class PriorConfig:
    """§G.2's hyperparameters (`JudgePrior`)."""

    alpha_pi: list[float] = dataclasses.field(default_factory=lambda: [2.0, 2.0, 1.0])
    group_strength: float = 10.0  # s_g
    group_diag: float = 0.7  # m_g[v,v]
    group_means: str = "fixed"  # "fixed" (conjugate) or "pooled" (group-level shrinkage)
    hyper_strength: float = 3.0
    phi_strength: float = 9.0
    phi_diag: float = 0.5
    judge_model: str = "joint"  # the 9-cell pair model, or "factorised"

    def __post_init__(self) -> None:
        check(len(self.alpha_pi) == 3 and min(self.alpha_pi) > 0, "prior.alpha_pi", self.alpha_pi,
              "three positive pseudo-counts")
        for key in ("group_strength", "hyper_strength", "phi_strength"):
            check(getattr(self, key) > 0, f"prior.{key}", getattr(self, key), "> 0")
        for key in ("group_diag", "phi_diag"):
            check(0 < getattr(self, key) < 1, f"prior.{key}", getattr(self, key), "a probability in (0, 1)")
        check(self.group_means in GROUP_MEANS, "prior.group_means", self.group_means, f"one of {GROUP_MEANS}")
        check(self.judge_model in JUDGE_MODELS, "prior.judge_model", self.judge_model, f"one of {JUDGE_MODELS}")

    def model(self) -> JudgePrior:
        return JudgePrior(alpha_pi=tuple(self.alpha_pi), group_strength=self.group_strength,
                          group_diag=self.group_diag, group_means=self.group_means,
                          hyper_strength=self.hyper_strength, phi_strength=self.phi_strength, phi_diag=self.phi_diag)


@dataclasses.dataclass
class InferenceConfig:
    """§G.3(b)'s SMC (`SMCConfig`) and the posterior draws its summaries are read from."""

    n_particles: int = 500
    adf: bool = False
    ess_threshold: float = 0.5
    window: int = 50
    rejuvenate: bool = True
    sweep_every: int | None = None
    draws: int = 2000  # parameter draws from the particle mixture for intervals and detection
    ds_iterations: int = 100  # Dawid–Skene EM (the baseline)

    def __post_init__(self) -> None:
        check(self.n_particles >= 1, "smc.n_particles", self.n_particles, "an integer >= 1")
        check(0 <= self.ess_threshold <= 1, "smc.ess_threshold", self.ess_threshold, "a fraction in [0, 1]")
        check(self.window >= 1, "smc.window", self.window, "an integer >= 1")
        check(self.sweep_every is None or self.sweep_every >= 1, "smc.sweep_every", self.sweep_every, ">= 1 or null")
        check(self.draws >= 100, "smc.draws", self.draws, "an integer >= 100 (the intervals' tails need draws)")
        check(self.ds_iterations >= 1, "smc.ds_iterations", self.ds_iterations, "an integer >= 1")

    def model(self, seed: int) -> SMCConfig:
        return SMCConfig(n_particles=self.n_particles, adf=self.adf, ess_threshold=self.ess_threshold,
                         window=self.window, rejuvenate=self.rejuvenate, sweep_every=self.sweep_every, seed=seed)


def _judge_model() -> ModelConfig:
    # At the SFT default lr (3e-3) the judge sits longer on the plateau of answering the letters'
    # base rates; at 1e-3 it reads the words' class after about 250 steps
    return ModelConfig(sft=SFTConfig(steps=500, batch_size=64, lr=1e-3))


@dataclasses.dataclass
class LMJudgeConfig:
    """The tiny LM judge (`troupe.actors.judge.LLMJudge`) on the word task (`word_task`)."""

    enabled: bool = True
    model: ModelConfig = dataclasses.field(default_factory=_judge_model)
    task: WordTaskConfig = dataclasses.field(default_factory=WordTaskConfig)
    comparisons: int = 600  # held-out comparisons judged, in run.steps chunks
    template: str = TEMPLATE
    # How an order's verdict is read from the judge's letter distribution: "sample" draws it (the
    # judge answering at temperature 1), "argmax" takes the likeliest letter (greedy decoding)
    answer: str = "sample"
    min_mass: float = 0.5  # below this letter mass an answer parses to no verdict (counted)
    batch_size: int = 32
    num_judges: int = 1
    num_cpus: float = 0.5

    def __post_init__(self) -> None:
        check(self.comparisons >= 1, "lm.comparisons", self.comparisons, "an integer >= 1")
        check(self.answer in ANSWERS, "lm.answer", self.answer, f"one of {ANSWERS}")
        check(0 <= self.min_mass <= 1, "lm.min_mass", self.min_mass, "a probability in [0, 1]")
        check(self.batch_size >= 1, "lm.batch_size", self.batch_size, "an integer >= 1")
        check(self.num_judges >= 1, "lm.num_judges", self.num_judges, "an integer >= 1")
        check(self.num_cpus >= 0, "lm.num_cpus", self.num_cpus, ">= 0")
        try:
            check_template(self.template)
        except Exception as e:  # the judge's own message names its reward key
            raise type(e)(str(e).replace("reward.judge_template", "lm.template")) from None

    def validate(self) -> None:
        self.model.validate()


@dataclasses.dataclass
class WorkersConfig:
    """Aggregator actors; each owns a share of the streams and advances them a chunk per step."""

    count: int = 2
    num_cpus: float = 0.5  # the whole graph (two aggregators and a judge) fits on 2 cores

    def __post_init__(self) -> None:
        check(self.count >= 1, "workers.count", self.count, "an integer >= 1")
        check(self.num_cpus >= 0, "workers.num_cpus", self.num_cpus, ">= 0")


@dataclasses.dataclass
class ExactCheckConfig:
    """§G.6's check that SMC matches the exact posterior, on small streams the exact recursion can hold
    (one expert and two crowd workers, one label of each per comparison, the judge at β_ord = 0.15)."""

    exact_streams: int = 4  # 0 skips the check
    exact_n: int = 10

    def __post_init__(self) -> None:
        check(self.exact_streams >= 0, "check.exact_streams", self.exact_streams, "an integer >= 0")
        check(1 <= self.exact_n <= 12, "check.exact_n", self.exact_n,
              "1 to 12 comparisons (the exact mixture grows up to 3^n components)")

    def raters(self) -> RatersConfig:
        return RatersConfig(n_experts=1, experts_per_item=1, n_crowd=2, crowd_per_item=1)


@dataclasses.dataclass
class JudgeConfig:
    streams: StreamsConfig = dataclasses.field(default_factory=StreamsConfig)
    raters: RatersConfig = dataclasses.field(default_factory=RatersConfig)
    prior: PriorConfig = dataclasses.field(default_factory=PriorConfig)
    smc: InferenceConfig = dataclasses.field(default_factory=InferenceConfig)
    lm: LMJudgeConfig = dataclasses.field(default_factory=LMJudgeConfig)
    workers: WorkersConfig = dataclasses.field(default_factory=WorkersConfig)
    check: ExactCheckConfig = dataclasses.field(default_factory=ExactCheckConfig)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=5, eval_every=0, checkpoint_every=1))

    def __post_init__(self) -> None:
        n_streams = self.streams.seeds * len(self.streams.beta_ord) + len(self.streams.files) + self.lm.enabled
        check(n_streams >= 1, "streams.seeds", self.streams.seeds,
              "at least one stream (streams.seeds >= 1, a file in streams.files, or lm.enabled=true)")
        check(self.run.steps >= 1, "run.steps", self.run.steps, "an integer >= 1: one step is a chunk of every stream")
        check(self.check.exact_streams == 0 or self.prior.group_means == "fixed", "check.exact_streams",
              self.check.exact_streams, "0 with prior.group_means=pooled (the exact recursion is the conjugate model's)")

    def synthetic_streams(self) -> list[dict[str, Any]]:
        """Every synthetic stream: its name, condition and seed."""
        return [{"name": f"beta{b:g}/seed{self.run.seed + k}", "beta_ord": b, "seed": self.run.seed + k}
                for b in self.streams.beta_ord for k in range(self.streams.seeds)]
