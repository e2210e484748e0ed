"""The ``comm`` algorithm's config: every default in one place; presets and `key=value`
overrides change it.

Two agents, each a model with its own engines: ``main`` (M, broad context: it writes the
messages) and ``executor`` (E, a local view and a context budget: it acts). The task section is
the split-context task (`troupe.envs.split_context`) and the two regimes it is run in; the
``comm`` section says how many episodes are logged and how the selector is scored.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

from troupe.actors.sampling import SamplingConfig
from troupe.algorithms.sft import ModelConfig, SFTConfig
from troupe.envs.split_context import KINDS, LOCAL_MISSES, STEP_TYPES, SplitContextConfig
from troupe.platform.config import RunConfig, check, registered
from troupe.platform.errors import ConfigError
from troupe.platform.registry import ROLLOUT_BACKENDS


@dataclasses.dataclass
class EngineConfig:
    """One agent's rollout engines (as GRPO's ``rollout`` section, without weight sync: the
    agents are fitted before the run and do not change during it)."""

    backend: str = registered("hf", ROLLOUT_BACKENDS)  # hf, vllm, or "module:EngineClass"
    num_engines: int = 1
    num_cpus: float = 0.5
    num_gpus: float = 0.0
    gpu_memory_utilization: float = 0.4  # vllm only: a fraction of the whole GPU, at most num_gpus
    max_model_len: int | None = None  # vllm only
    dtype: str | None = None  # vllm only; None: bfloat16
    enforce_eager: bool = False  # vllm only
    max_restarts: int = 2

    def __post_init__(self) -> None:
        check(self.num_engines >= 1, "num_engines", self.num_engines, "an integer >= 1")


@dataclasses.dataclass
class AgentConfig:
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    rollout: EngineConfig = dataclasses.field(default_factory=EngineConfig)
    # The content kinds of E's SFT rows and how often each is drawn (M's rows are its two
    # message kinds). E is fitted on every kind by default, M's code included: the comparison
    # is between contents a trained executor has seen, not a test of an unseen code.
    sft_kinds: dict[str, float] = dataclasses.field(default_factory=dict)


def _main_default() -> AgentConfig:
    # M writes up the belief its prompt shows (task.main_view="belief"). 300 steps were enough
    # for two seeds in three: the third wrote its belief right a quarter of the time.
    return AgentConfig(model=ModelConfig(sft=SFTConfig(steps=600)))


def _executor_default() -> AgentConfig:
    # E must find the key in its view or in what it reads: a lookup the tiny model learns
    # slowly, so it gets more steps, and more rows where the content does not state the key
    return AgentConfig(model=ModelConfig(sft=SFTConfig(steps=2500)),
                       sft_kinds={"none": 2.0, "plain": 1.0, "cryptic": 1.0, "raw": 2.0})


@dataclasses.dataclass
class TaskConfig:
    """The split-context task (`SplitContextConfig`'s fields, less q_L and q_M, which the
    regimes set) and how episodes vary."""

    K: int = 8
    steps: int = 4  # steps per episode; joint success needs all of them
    doc_facts: int = 8
    local_facts: int = 2
    budget: int = 2  # facts E reads of what it receives
    # Each episode's raw slice has one of these lengths (in facts), drawn uniformly: one longer
    # than the budget (it loses the key unless the key sits in its first `budget` facts) and one
    # that fits, as §D.5 mixes l_r in {1, 4}.
    raw_lengths: list[int] = dataclasses.field(default_factory=lambda: [8, 2])
    raw_key_position: str = "uniform"
    local_miss: str = "distractors"
    step_types: list[str] = dataclasses.field(default_factory=lambda: ["copy", "next"])
    main_view: str = "belief"  # what M's prompt shows: "belief" (the key's fact) or "document" (all of it)
    # §D.5's regimes: (q_L, q_M) per regime; each episode draws its own around them
    regimes: dict[str, dict[str, float]] = dataclasses.field(default_factory=lambda: {
        "weak_local": {"q_L": 0.6, "q_M": 0.9}, "strong_local": {"q_L": 0.92, "q_M": 0.55}})
    concentration: float = 20.0  # q_L, q_M ~ Beta centred on the regime's, per episode [ASM, §D.5]
    # Claim 3's upstream strength: extra test episodes at each of these q_M (the regime's q_L)
    upstream_q_M: list[float] = dataclasses.field(default_factory=lambda: [0.55, 0.95])
    # the rows both agents are fitted on: a middle of the regimes (q_M does not change what an
    # agent should write: M copies its document, E trusts the content it reads)
    sft_q_L: float = 0.75
    sft_q_M: float = 0.75

    def __post_init__(self) -> None:
        check(isinstance(self.regimes, dict) and bool(self.regimes), "task.regimes", self.regimes,
              "a mapping regime -> {q_L, q_M}")
        for name, r in self.regimes.items():
            check(isinstance(r, dict) and set(r) == {"q_L", "q_M"}, f"task.regimes.{name}", r,
                  "a mapping with exactly q_L and q_M")
            for k, v in r.items():
                check(isinstance(v, (int, float)) and 0 <= v <= 1, f"task.regimes.{name}.{k}", v,
                      "a probability in [0, 1]")
        check(bool(self.raw_lengths), "task.raw_lengths", self.raw_lengths, "a non-empty list of lengths in facts")
        check(all(t in STEP_TYPES for t in self.step_types) and bool(self.step_types), "task.step_types",
              self.step_types, f"a non-empty list of {STEP_TYPES}")
        check(self.local_miss in LOCAL_MISSES, "task.local_miss", self.local_miss, f"one of {LOCAL_MISSES}")
        check(self.concentration > 0, "task.concentration", self.concentration, "> 0")
        check(all(0 <= q <= 1 for q in self.upstream_q_M), "task.upstream_q_M", self.upstream_q_M,
              "probabilities in [0, 1]")
        for raw in self.raw_lengths:  # every field's own check, with its key
            self.split_context(raw, 0.5, 0.5)

    def split_context(self, raw_length: int, q_L: float, q_M: float) -> SplitContextConfig:
        return SplitContextConfig(K=self.K, steps=self.steps, q_L=q_L, q_M=q_M, doc_facts=self.doc_facts,
                                  local_facts=self.local_facts, raw_length=raw_length, budget=self.budget,
                                  raw_key_position=self.raw_key_position, local_miss=self.local_miss,
                                  step_types=tuple(self.step_types), main_view=self.main_view)


@dataclasses.dataclass
class TaxConfig:
    """tax(c) = κ_tok (tokens written + read) + κ_lat · latency, tokens counted in each agent's
    own tokenizer and latency from per-token rates [ASM: the defaults of the simulator's
    `TaxModel`, less its token counts, which are measured here]."""

    kappa_tok: float = 1.0
    kappa_lat: float = 100.0
    write_s_per_token: float = 0.02
    read_s_per_token: float = 1e-4

    def model(self) -> Any:
        from troupe.algorithms.comm.simulator import TaxModel

        return TaxModel(kappa_tok=self.kappa_tok, kappa_lat=self.kappa_lat, write_s_per_token=self.write_s_per_token,
                        read_s_per_token=self.read_s_per_token)


@dataclasses.dataclass
class CommSettings:
    train_episodes: int = 48  # per regime and step: the selector's counterfactual logs
    test_episodes: int = 48  # per regime and step: every policy is scored on these
    upstream_episodes: int = 24  # per regime, q_M value and step (claim 3)
    # The agents decode greedily: an action is a single digit, a message a few tokens.
    sampling: SamplingConfig = dataclasses.field(default_factory=lambda: SamplingConfig(temperature=0.0,
                                                                                          max_new_tokens=8))
    call_timeout_s: float = 120.0  # one batched engine call; re-issued once, then its episodes fail
    episode_timeout_s: float | None = None
    tax: TaxConfig = dataclasses.field(default_factory=TaxConfig)
    # The selector that runs live on the test episodes after the logs are scored: its λ (tax
    # per token of accuracy; 0 picks the most likely action, ties to the cheaper).
    live_lambda: float = 0.0
    regret_target: float = 0.03  # claim 5: "within a few points of the oracle" [ASM]

    def __post_init__(self) -> None:
        for k in ("train_episodes", "test_episodes"):
            check(getattr(self, k) >= 1, f"comm.{k}", getattr(self, k), "an integer >= 1")
        check(self.upstream_episodes >= 0, "comm.upstream_episodes", self.upstream_episodes, "an integer >= 0")
        check(self.live_lambda >= 0, "comm.live_lambda", self.live_lambda, ">= 0")
        check(self.sampling.max_new_tokens >= 4, "comm.sampling.max_new_tokens", self.sampling.max_new_tokens,
              ">= 4 (a restated key is a few tokens)")


@dataclasses.dataclass
class CommConfig:
    main: AgentConfig = dataclasses.field(default_factory=_main_default)
    executor: AgentConfig = dataclasses.field(default_factory=_executor_default)
    task: TaskConfig = dataclasses.field(default_factory=TaskConfig)
    comm: CommSettings = dataclasses.field(default_factory=CommSettings)
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=4, eval_every=0, checkpoint_every=1))

    def __post_init__(self) -> None:
        for role in ("main", "executor"):
            kinds = getattr(self, role).sft_kinds
            for k, w in kinds.items():
                check(k in KINDS, f"{role}.sft_kinds", k, f"kinds among {KINDS}")
                check(isinstance(w, (int, float)) and w >= 0, f"{role}.sft_kinds.{k}", w, "a weight >= 0")
            if kinds:
                check(sum(kinds.values()) > 0, f"{role}.sft_kinds", kinds, "at least one weight > 0")
        main_kinds = set(self.main.sft_kinds) - {"plain", "cryptic"}
        check(not main_kinds, "main.sft_kinds", sorted(main_kinds), "only 'plain' and 'cryptic': M writes messages")

    def validate(self) -> None:
        """Each agent's engine backend checks its own section (vLLM: a GPU share, its memory)."""
        from troupe.algorithms.policy_graph import rollout_class

        for role in ("main", "executor"):
            check_engine = getattr(rollout_class(getattr(self, role).rollout.backend), "check_config", None)
            if callable(check_engine):
                try:
                    check_engine(engine_view(self, role))
                except ConfigError as e:  # the engine names its own section's keys: say which agent's
                    raise ConfigError(str(e).replace("'rollout.", f"'{role}.rollout.")
                                      .replace("'model.", f"'{role}.model.")) from None


def engine_view(cfg: CommConfig, role: str) -> Any:
    """One agent's sections in the shape an engine class reads (``model``, ``rollout``, ``run``,
    ``learner``). No learner trains on these engines' log-probs, so the learner the engine
    checks against is one that would recompute them."""
    agent = getattr(cfg, role)
    learner = SimpleNamespace(dtype=agent.model.dtype, recompute_old_logprobs=True)
    rollout = SimpleNamespace(**dataclasses.asdict(agent.rollout), sampling=cfg.comm.sampling)
    return SimpleNamespace(model=agent.model, rollout=rollout, run=cfg.run, learner=learner)
