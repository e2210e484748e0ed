"""`troupe run icrm`'s configuration: the preference task, the backbone, ICRM and its baselines."""

from __future__ import annotations

import dataclasses

from troupe.actors.learner import LearnerConfig
from troupe.actors.sampling import SamplingConfig
from troupe.algorithms.grpo.config import EvalConfig, GRPOConfig, GRPOSettings, RolloutConfig
from troupe.algorithms.icrm.model import ICRMConfig
from troupe.algorithms.icrm.text import BackboneConfig
from troupe.algorithms.sft import ModelConfig, SFTConfig
from troupe.envs.arithmetic import ArithmeticTask
from troupe.envs.persona_prompts import PersonaPromptsTask
from troupe.envs.preferences.attributes import LABELS
from troupe.envs.preferences.loaders import ATTRIBUTES_OF
from troupe.envs.preferences.personas import PersonaConfig
from troupe.envs.preferences.solutions import MISTAKES, kinds_possible, split_size
from troupe.envs.preferences.text_personas import ATTRIBUTES
from troupe.platform.config import RunConfig, check
from troupe.platform.errors import ConfigError

# λ is chosen on valid; seen: new personas of the train split (a dataset: the training objectives
# on held-out prompts); unseen: the test split (a dataset: held-out objectives on those prompts)
SPLITS = ("valid", "seen", "unseen")
PERSONAS = "personas"
ARITHMETIC = "arithmetic"
SOURCES = (PERSONAS, ARITHMETIC, *ATTRIBUTES_OF)
MIN_EVAL_PROMPTS = 2  # per evaluation part: demos come from prompts other than the query's

# A dataset's objectives when data.objectives is not given: (training, held out for "unseen").
# The held-out ones are new weightings, and weightings of attributes no training objective uses.
DEFAULT_OBJECTIVES: dict[str, tuple[dict[str, dict[str, float]], dict[str, dict[str, float]]]] = {
    "helpsteer2": ({"helpful": {"helpfulness": 1.0}, "correct": {"correctness": 1.0},
                    "coherent": {"coherence": 1.0}, "helpful_correct": {"helpfulness": 1.0, "correctness": 1.0}},
                   {"terse": {"verbosity": -1.0}, "complex_helpful": {"complexity": 1.0, "helpfulness": 0.5}}),
    "ultrafeedback": ({"helpful": {"helpfulness": 1.0}, "follows": {"instruction_following": 1.0},
                       "helpful_follows": {"helpfulness": 1.0, "instruction_following": 1.0}},
                      {"honest": {"honesty": 1.0}, "truthful": {"truthfulness": 1.0}}),
    "pku_saferlhf": ({"helpful": {"helpful": 1.0}, "harmless": {"harmless": 1.0}},
                     {"helpful_harmless": {"helpful": 1.0, "harmless": 1.0}, "safe": {"safe": 1.0}}),
}
# DataConfig's keys that only a dataset source reads
DATASET_KEYS = ("source", "path", "split", "objectives", "unseen_objectives", "labels", "beta", "eval_fraction",
                "max_prompts")
# DataConfig's keys that only data.source=personas reads, and those only data.source=arithmetic reads
PERSONA_KEYS = ("train_personas", "eval_personas", "pool", "eval_pool")
ARITHMETIC_KEYS = ("digits", "ops", "mistakes", "unseen_mistakes", "problems", "eval_problems")


@dataclasses.dataclass
class DataConfig:
    """Where the episodes come from (``source``).

    ``personas`` (the default): text persona episodes (§C.5 in text), trained on a pool of
    train-split personas and evaluated on new personas of both splits, with responses the learners
    never saw (``personas``, ``train_personas``, ``eval_personas``, ``pool``, ``eval_pool``).

    ``helpsteer2``, ``ultrafeedback``, ``pku_saferlhf``: a multi-attribute dataset
    (`troupe.envs.preferences.loaders`) read from ``path`` (a local file or ``save_to_disk``
    folder in the dataset's own format) or, when ``path`` is null, its hub id; ``split`` is the
    split read. An objective is a weighting of the dataset's attributes (§C.2): ``objectives``
    (name → {attribute: weight}) label the training episodes and the ``valid`` and ``seen``
    evaluation splits; ``unseen_objectives``, held-out weightings and attributes, the ``unseen``
    split. Empty: `DEFAULT_OBJECTIVES` of the source. ``labels``: ``threshold`` (a prefers b iff
    wᵀ(s_a − s_b) > 0; ties are left out) or ``bt`` (Bradley–Terry draws at ``beta``). Prompts are
    split by a seeded hash of their text: ``eval_fraction`` of them are held out of training, half
    for validation, half for the test splits, so no evaluation prompt is a training one;
    ``max_prompts`` keeps that many prompts of the file (chosen by another hash of the text;
    null: all). An objective naming an attribute the dataset lacks, with no nonzero weight, or in
    both lists, is a ConfigError naming ``data.objectives.<name>``; a dataset too small for the
    evaluation parts (`MIN_EVAL_PROMPTS` prompts each), one naming ``data.eval_fraction``.

    ``arithmetic``: verifiable math (§C.2, "use as RL reward"). Problems of
    `troupe.envs.arithmetic.ArithmeticTask` (``digits``, ``ops``), answered as its policy answers
    them; a pair is a problem's correct answer against a plausible wrong one
    (`troupe.envs.preferences.solutions`: ``off_by``, a dropped ``carry`` or borrow, a wrong
    ``digit``), and an episode's demos are pairs of *other* problems. ``problems`` distinct
    train-split problems train the models; ``eval_problems`` distinct held-out (test-split)
    problems, halved, give ``valid`` and ``seen`` (wrong answers of the ``mistakes`` kinds) and
    ``unseen`` (the same problems as ``seen``, wrong answers and demos of the held-out
    ``unseen_mistakes`` kinds). The persona and dataset keys do not apply (a ConfigError names them).

    Every source: ``personas.max_demos`` bounds the demos of an episode (training k is uniform on
    0..max_demos); ``eval_episodes`` per split and k; ``eval_ks`` the k evaluated.
    """

    source: str = PERSONAS
    personas: PersonaConfig = dataclasses.field(default_factory=lambda: PersonaConfig(max_demos=8))
    train_personas: int = 256  # the personas training episodes are drawn from
    eval_personas: int = 64  # per evaluation split
    pool: int = 5000  # training responses, written once
    eval_pool: int = 2000  # evaluation responses, disjoint from training's
    eval_episodes: int = 300  # per split and k
    eval_ks: list[int] = dataclasses.field(default_factory=lambda: [0, 2, 4, 8])
    seed: int = 0
    # a dataset source only
    path: str | None = None
    split: str = "train"
    objectives: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    unseen_objectives: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    labels: str = "threshold"
    beta: float = 1.0
    eval_fraction: float = 0.2
    max_prompts: int | None = None
    # data.source=arithmetic only
    digits: int = 2
    ops: list[str] = dataclasses.field(default_factory=lambda: ["+"])
    mistakes: list[str] = dataclasses.field(default_factory=lambda: ["off_by", "carry"])
    unseen_mistakes: list[str] = dataclasses.field(default_factory=lambda: ["digit"])
    problems: int = 2000  # train-split problems the training episodes are drawn from
    eval_problems: int = 400  # held-out problems, halved into validation and test

    def __post_init__(self) -> None:
        check(self.source in SOURCES, "data.source", self.source, f"one of {list(SOURCES)}")
        self._check_keys_apply()
        if self.source == ARITHMETIC:
            self._check_arithmetic()
        elif self.source == PERSONAS:
            for key in ("objectives", "unseen_objectives"):
                check(not getattr(self, key), f"data.{key}", getattr(self, key),
                      "no objectives with data.source=personas (its personas come from data.personas); "
                      f"objectives weight the attributes of a dataset source {list(ATTRIBUTES_OF)}")
        else:
            self._check_objectives()
        check(self.labels in LABELS, "data.labels", self.labels, f"one of {list(LABELS)}")
        check(self.beta > 0, "data.beta", self.beta, "a Bradley-Terry scale > 0")
        check(0 < self.eval_fraction < 1, "data.eval_fraction", self.eval_fraction,
              "a share of the prompts in (0, 1), held out for validation and test")
        check(self.max_prompts is None or self.max_prompts >= 1, "data.max_prompts", self.max_prompts,
              "an integer >= 1, or null for every prompt")
        for name in ("train_personas", "eval_personas", "eval_episodes"):
            check(getattr(self, name) >= 1, f"data.{name}", getattr(self, name), "an integer >= 1")
        check(self.pool >= 2 and self.eval_pool >= 2, "data.pool", (self.pool, self.eval_pool),
              "at least 2 responses in data.pool and data.eval_pool")
        check(bool(self.eval_ks) and all(0 <= k <= self.personas.max_demos for k in self.eval_ks), "data.eval_ks",
              self.eval_ks, f"demo counts in 0..data.personas.max_demos={self.personas.max_demos}")

    @property
    def max_demos(self) -> int:
        """The demos an episode holds at most, for every source."""
        return self.personas.max_demos

    def _changed(self, keys: tuple[str, ...]) -> list[str]:
        """The keys among ``keys`` set to other than their defaults."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        out = []
        for key in keys:
            f = fields[key]
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if getattr(self, key) != default:
                out.append(key)
        return out

    def _check_keys_apply(self) -> None:
        """A key another source reads is a mistake with this one: name it and what to do."""
        if self.source == ARITHMETIC:
            personas = dataclasses.replace(PersonaConfig(), max_demos=self.personas.max_demos)
            extra = self._changed(PERSONA_KEYS + DATASET_KEYS[1:]) + (["personas"] if self.personas != personas else [])
            if extra:
                raise ConfigError(f"config key(s) {[f'data.{k}' for k in extra]} do not apply with "
                                  "data.source=arithmetic (they shape persona or dataset episodes); remove them. An "
                                  "arithmetic episode is set by data.digits, data.ops, data.mistakes, "
                                  "data.unseen_mistakes, data.problems, data.eval_problems and "
                                  "data.personas.max_demos")
        elif extra := self._changed(ARITHMETIC_KEYS):
            raise ConfigError(f"config key(s) {[f'data.{k}' for k in extra]} apply with data.source=arithmetic only "
                              f"(data.source={self.source}); remove them, or set data.source=arithmetic")

    def _check_arithmetic(self) -> None:
        check(1 <= self.digits <= 6, "data.digits", self.digits, "1 to 6")
        check(bool(self.ops) and all(o in ("+", "-", "*") for o in self.ops) and len(set(self.ops)) == len(self.ops),
              "data.ops", self.ops, "distinct operators among '+', '-', '*'")
        for key in ("mistakes", "unseen_mistakes"):
            kinds = getattr(self, key)
            check(bool(kinds) and all(k in MISTAKES for k in kinds) and len(set(kinds)) == len(kinds), f"data.{key}",
                  kinds, f"distinct mistake kinds among {list(MISTAKES)}, at least one")
            possible = kinds_possible(self.digits, self.ops, kinds)
            check(bool(possible), f"data.{key}", kinds,
                  f"a mistake kind some problem admits: with data.digits={self.digits} and data.ops={self.ops} no "
                  "answer has a carry or borrow to drop ('carry' needs '+' or '-' and data.digits >= 2); add "
                  "'off_by' or 'digit'")
        both = sorted(set(self.mistakes) & set(self.unseen_mistakes))
        check(not both, "data.unseen_mistakes", both, "kinds apart from data.mistakes' (a kind is trained on or held out)")
        check(self.problems >= 2, "data.problems", self.problems, "an integer >= 2 (demos come from other problems)")
        check(self.eval_problems >= 2 * MIN_EVAL_PROMPTS, "data.eval_problems", self.eval_problems,
              f"an integer >= {2 * MIN_EVAL_PROMPTS} (halved into validation and test)")
        task = ArithmeticTask(digits=self.digits, ops=list(self.ops))
        for key, split, n in (("problems", "train", self.problems), ("eval_problems", "test", self.eval_problems)):
            have = split_size(task, split)
            check(have is None or n <= have, f"data.{key}", n,
                  f"at most {have}, the distinct {split}-split problems of data.digits={self.digits} and "
                  f"data.ops={self.ops}; lower data.{key} or raise data.digits")

    def _check_objectives(self) -> None:
        """Fill a dataset's default objectives; each must weight attributes the dataset has."""
        train, unseen = DEFAULT_OBJECTIVES[self.source]
        if not self.objectives:
            self.objectives = {n: dict(w) for n, w in train.items()}
        if not self.unseen_objectives:
            self.unseen_objectives = {n: dict(w) for n, w in unseen.items()}
        attributes = list(ATTRIBUTES_OF[self.source])
        for key in ("objectives", "unseen_objectives"):
            for name, weights in getattr(self, key).items():
                where = f"data.{key}.{name}"
                if not isinstance(weights, dict) or not weights:
                    raise ConfigError(f"config key {where!r} = {weights!r}: expected a non-empty mapping "
                                      f"{{attribute: weight}} over {self.source}'s attributes {attributes}")
                unknown = [a for a in weights if a not in attributes]
                if unknown:
                    raise ConfigError(f"config key {where!r}: objective names attribute(s) {unknown} the dataset "
                                      f"{self.source} does not have; its attributes: {attributes}")
                check(any(float(v) != 0 for v in weights.values()), where, weights,
                      "at least one nonzero weight")
        both = sorted(set(self.objectives) & set(self.unseen_objectives))
        check(not both, "data.unseen_objectives", both,
              "names apart from data.objectives' (an objective is either trained on or held out)")


@dataclasses.dataclass
class TrainConfig:
    """Every model is fitted for `steps` Adam steps on batches of fresh episodes; λ is chosen among
    `lambdas` by the lowest ECE on the validation split (§C.2 (i))."""

    # 3000: on the embedded backbone the context encoder starts reading the demos after 500 steps,
    # and how soon depends on the seed: at 1000 steps seed 0 gained 0.643 -> 0.700 from k = 0 to 8
    # (seen personas, λ = 0.1) while seed 1 stayed flat (0.783 -> 0.767); at 3000 both read them
    # (0.647 -> 0.717, 0.760 -> 0.793), measured offline on each seed's data and backbone
    steps: int = 3000
    chunks: int = 4  # run steps the fitting is spread over (each one a checkpoint and a log line)
    # Episodes per step. With a frozen backbone a response's state is computed once, so a step
    # of 256 episodes costs the context encoder alone.
    batch_size: int = 256
    lr: float = 3e-3
    lambdas: list[float] = dataclasses.field(default_factory=lambda: [1.0, 0.3, 0.1, 0.03])
    point: bool = True  # §C.3 2: the in-context BCE point model
    ensemble: int = 5  # §C.3 1 and 4: static BT RMs (member 0 is "the" static RM); 0: none
    judge: bool = True  # §C.3 3: the generative judge
    judge_steps: int | None = 150  # None: `steps`; its every step reads whole prompts of all demos
    # The static RMs read no demo and need not wait for a context encoder to start reading: fitted
    # 1000 steps their accuracy on seen personas was 0.663 / 0.777 / 0.657 (seeds 0-2) against
    # 0.670 / 0.747 / 0.657 at 3000 (measured); None: `steps`; never more than `steps`
    static_steps: int | None = 1000
    judge_batch_size: int = 16
    seed: int = 0

    def __post_init__(self) -> None:
        check(self.steps >= 1, "train.steps", self.steps, "an integer >= 1")
        check(1 <= self.chunks <= self.steps, "train.chunks", self.chunks, f"1..train.steps={self.steps}")
        check(self.batch_size >= 1, "train.batch_size", self.batch_size, "an integer >= 1")
        check(self.lr > 0, "train.lr", self.lr, "a learning rate > 0")
        check(bool(self.lambdas) and all(v > 0 for v in self.lambdas), "train.lambdas", self.lambdas,
              "KL weights > 0, at least one")
        check(len(set(self.lambdas)) == len(self.lambdas), "train.lambdas", self.lambdas, "no repeated weight")
        check(self.ensemble >= 0, "train.ensemble", self.ensemble, "an integer >= 0")
        check(self.judge_steps is None or self.judge_steps >= 1, "train.judge_steps", self.judge_steps,
              "an integer >= 1, or null for train.steps")
        check(self.static_steps is None or self.static_steps >= 1, "train.static_steps", self.static_steps,
              "an integer >= 1, or null for train.steps")

    @property
    def static_fit_steps(self) -> int:
        return min(self.static_steps or self.steps, self.steps)


@dataclasses.dataclass
class WorkersConfig:
    """Learner actors; the models are dealt to them round-robin and fitted in parallel."""

    count: int = 2
    num_cpus: float = 1.0
    num_gpus: float = 0.0  # each learner actor's GPU share (backbone.device=cuda needs one)

    def __post_init__(self) -> None:
        check(self.count >= 1, "workers.count", self.count, "an integer >= 1")
        check(self.num_cpus > 0, "workers.num_cpus", self.num_cpus, "a number > 0")
        check(self.num_gpus >= 0, "workers.num_gpus", self.num_gpus, "a number >= 0")


# arm -> (the reward model it is trained against, the persona whose demos steer it); "rule" is the
# task's own exact checker (the shared "reward" role)
ARMS = {"icrm": ("icrm", "a"), "static": ("static", "a"), "icrm_b": ("icrm", "b"), "rule": ("rule", "a")}
SOURCE_ARMS = {PERSONAS: ["icrm", "static", "icrm_b"], ARITHMETIC: ["icrm", "static", "rule"]}
PERSONA_RL_STEPS = 40  # rl.steps left unset with data.source=personas; a dataset source: 0
ARITHMETIC_RL_STEPS = 30  # ... and with data.source=arithmetic


def _policy() -> GRPOConfig:
    return GRPOConfig(
        model=ModelConfig(sft=SFTConfig(steps=200)),
        task=PersonaPromptsTask.Config(),
        rollout=RolloutConfig(num_cpus=0.25, sampling=SamplingConfig(max_new_tokens=48, temperature=1.0)),
        # lr 3e-4 with a KL term to the SFT policy: at lr 1e-3 without it (or 1e-4 over 20 steps)
        # the policy collapsed within 10 steps to byte garbage the ICRM scored μ ≈ 0.9 against the
        # reference while the gold reward fell (measured); with k3 KL 0.1 it climbs and stays
        learner=LearnerConfig(lr=3e-4, kl_coef=0.1, num_cpus=0.5),
        grpo=GRPOSettings(prompts_per_step=8, group_size=8),
        eval=EvalConfig(num_prompts=32),
        run=RunConfig(steps=20, eval_every=0, checkpoint_every=0))


@dataclasses.dataclass
class RLConfig:
    """ICRM-RL (§C.2, "use as RL reward"): GRPO arms from one SFT policy, each trained against a
    reward model steered by a persona's demos in every row (`ARMS`), all scored by the personas'
    gold rewards. ``policy`` is a GRPO config (model, rollout, learner, grpo, eval); its task is
    the persona prompts, its run length ``steps``, its reward set by each arm.

    The arms and their gold rewards are the synthetic personas' (wᵀφ of a response's attributes
    counted from its text): a dataset source has no gold scorer for a policy's new responses, so
    with one, ``steps`` left unset is 0 (no RL) and a nonzero ``steps`` is refused. The report
    says so, as it says that best-of-N and the steering front (which select from the personas'
    evaluation pool by the same gold reward) are not run."""

    steps: int | None = None  # GRPO steps per arm; 0 skips RL; None: PERSONA_RL_STEPS, or 0 with a dataset
    arms: list[str] = dataclasses.field(default_factory=list)  # empty: SOURCE_ARMS of data.source
    estimate: str = "mu"  # reward.icrm_estimate: mu, r or conservative
    # Two personas that weigh disjoint attributes (cosine 0): a = science and formality,
    # b = numbers, hedging and politeness. Unit vectors are made of them.
    persona_a: list[float] = dataclasses.field(default_factory=lambda: [0, 1, 1, 0, 0, 0, 0, 0])
    persona_b: list[float] = dataclasses.field(default_factory=lambda: [0, 0, 0, 1, 1, 1, 0, 0])
    eval_every: int = 10
    # Sampled completions per held-out prompt, at the rollout temperature, scored beside the
    # greedy one: the policy's expected gold, which a greedy evaluation of a few prompts moves
    # by whole completions. 0: greedy only.
    eval_samples: int = 4
    policy: GRPOConfig = dataclasses.field(default_factory=_policy)

    def __post_init__(self) -> None:
        check(self.steps is None or self.steps >= 0, "rl.steps", self.steps, "an integer >= 0")
        check(all(a in ARMS for a in self.arms) and len(set(self.arms)) == len(self.arms),
              "rl.arms", self.arms, f"distinct names among {list(ARMS)}, or [] for the source's own")
        check(self.estimate in ("mu", "r", "conservative"), "rl.estimate", self.estimate, "mu, r or conservative")
        for key in ("persona_a", "persona_b"):
            w = getattr(self, key)
            check(len(w) == len(ATTRIBUTES) and any(v != 0 for v in w), f"rl.{key}", w,
                  f"{len(ATTRIBUTES)} weights, not all zero, one per attribute {ATTRIBUTES}")
        check(self.eval_every >= 1, "rl.eval_every", self.eval_every, "an integer >= 1")
        check(self.eval_samples >= 0, "rl.eval_samples", self.eval_samples, "an integer >= 0 (0: greedy only)")
        # Its GRPO step (grpo_step) takes each rollout when it runs: nothing generates ahead.
        check(self.policy.run.staleness == 0, "rl.policy.run.staleness", self.policy.run.staleness,
              "0 (ICRM-RL does not generate ahead of its update)")


@dataclasses.dataclass
class ICRMRunConfig:
    # run.steps 0: train.chunks + rl.steps, the fitting then the RL arms. A local cluster of 6
    # logical CPUs holds the reward-model learners and the RL arms at once; they never run at
    # the same time, so 2 cores serve both.
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=0, eval_every=0, checkpoint_every=1,
                                                                         num_cpus=6))
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    backbone: BackboneConfig = dataclasses.field(default_factory=BackboneConfig)
    # A small context encoder: it reads 256 episodes of up to 18 response states a step.
    icrm: ICRMConfig = dataclasses.field(default_factory=lambda: ICRMConfig(max_demos=8, d_model=32, layers=1,
                                                                            heads=4))
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    workers: WorkersConfig = dataclasses.field(default_factory=WorkersConfig)
    rl: RLConfig = dataclasses.field(default_factory=RLConfig)

    def __post_init__(self) -> None:
        source = self.data.source
        gold = source in SOURCE_ARMS  # a source with a gold scorer of a policy's new responses
        if self.rl.steps is None:
            self.rl.steps = {PERSONAS: PERSONA_RL_STEPS, ARITHMETIC: ARITHMETIC_RL_STEPS}.get(source, 0)
        check(gold or self.rl.steps == 0, "rl.steps", self.rl.steps,
              f"0 (or unset) with data.source={source}: the RL arms are scored by a gold reward (the synthetic "
              "personas' or the arithmetic checker), which a dataset has no equivalent of; add rl.steps=0 (a preset "
              "such as smoke sets it), or use data.source=personas or arithmetic for ICRM-RL")
        if gold:
            if not self.rl.arms:
                self.rl.arms = list(SOURCE_ARMS[source])
            check(all(a in SOURCE_ARMS[source] for a in self.rl.arms), "rl.arms", self.rl.arms,
                  f"arms of data.source={source}: names among {SOURCE_ARMS[source]}")
        if source == ARITHMETIC:
            self._arithmetic_policy_task()
        total = self.train.chunks + self.rl.steps
        if self.run.steps == 0:
            self.run = dataclasses.replace(self.run, steps=total)
        check(self.run.steps == total, "run.steps", self.run.steps,
              f"train.chunks + rl.steps = {total} (or 0 for that): the fitting's chunks, then the RL steps")
        check(not self.rl.steps or "static" not in self.rl.arms or self.train.ensemble >= 1, "rl.arms",
              self.rl.arms, "no static arm with train.ensemble=0 (its reward is the static RM), or train.ensemble >= 1")
        check(self.backbone.device in ("cpu", "auto") or self.workers.num_gpus > 0, "workers.num_gpus",
              self.workers.num_gpus, f"a GPU share > 0 for backbone.device={self.backbone.device} (a learner "
              "actor without one sees no GPU), or backbone.device=cpu")
        policy = self.rl.policy
        self.rl.policy = dataclasses.replace(policy, run=dataclasses.replace(policy.run, steps=max(self.rl.steps, 1),
                                                                             seed=self.run.seed))
        check(self.icrm.max_demos >= self.data.personas.max_demos, "icrm.max_demos", self.icrm.max_demos,
              f"at least data.personas.max_demos={self.data.personas.max_demos}, the demos an episode holds")

    def _arithmetic_policy_task(self) -> None:
        """The RL arms' task is data.source=arithmetic's problems: the default (persona) task is
        replaced by them, and an arithmetic task of other problems is refused."""
        d, policy = self.data, self.rl.policy
        task = policy.task
        if isinstance(task, ArithmeticTask.Config):
            check(task.digits == d.digits and list(task.ops) == list(d.ops), "rl.policy.task", to_task_keys(task),
                  f"the problems of data.digits={d.digits} and data.ops={d.ops} (the reward models were fitted on "
                  "them); set data.digits and data.ops, and leave rl.policy.task out")
            return
        check(task == PersonaPromptsTask.Config(), "rl.policy.task", task.name,
              "no task with data.source=arithmetic: the arms train on its problems (data.digits, data.ops)")
        self.rl.policy = dataclasses.replace(policy, task=ArithmeticTask.Config(digits=d.digits, ops=list(d.ops)),
                                             reward=dataclasses.replace(policy.reward, fn=None))


def to_task_keys(task: ArithmeticTask.Config) -> dict[str, object]:
    return {"name": task.name, "digits": task.digits, "ops": list(task.ops)}
