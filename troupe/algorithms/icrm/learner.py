"""The learner role of `troupe run icrm`: an actor that fits a share of the reward models.

Every model of the comparison is a `Variant`: ICRM at each KL weight λ, the in-context BCE point
model, the static BT reward models of the ensemble and the generative judge (§C.3), each on the
same backbone. An actor holds its variants' models, optimizers and episode streams; `advance`
fits each to a step count, `predict` scores the evaluation episodes, `export`/`restore` carry
everything an exact resume needs. Variants draw their episodes from their own seeded stream, so
a variant's fit does not depend on which actor holds it or on what else that actor holds.

The task's data (`task_data`) is the synthetic text personas (`TaskData`), a multi-attribute
dataset split by prompt (`DatasetData`) or arithmetic problems with (correct, incorrect) solution
pairs (`ArithmeticData`); `train_episodes`, `eval_sets` and `corpus` read each.
"""

from __future__ import annotations

import dataclasses
import io
import time
from pathlib import Path

import numpy as np
import torch

from troupe.actors.base import configure_threads
from troupe.algorithms.icrm.config import (
    ARITHMETIC,
    MIN_EVAL_PROMPTS,
    PERSONAS,
    SPLITS,
    ICRMRunConfig,
    TrainConfig,
)
from troupe.algorithms.icrm.judge_baseline import GenerativeJudge, judge_corpus
from troupe.algorithms.icrm.text import (
    TextICRM,
    build_backbone_from,
    build_judge_lm,
    resolve_device,
    response_text,
)
from troupe.envs.arithmetic import ArithmeticTask
from troupe.envs.preferences.attributes import AttributeSet
from troupe.envs.preferences.episodes import Episode
from troupe.envs.preferences.personas import bt_probability, sample_personas
from troupe.envs.preferences.solutions import SolutionPool, draw_problems, solution_episodes, solution_pool
from troupe.envs.preferences.text_personas import (
    PROMPTS,
    ResponsePool,
    TextPersonas,
    pool_episodes,
    response_pool,
)
from troupe.platform.errors import ConfigError, DataError
from troupe.platform.preference_rows import Comparison

KINDS = ("rm", "judge")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One model of the comparison: its name, what it is, and its seed."""

    name: str
    kind: str = "rm"  # rm: a TextICRM; judge: the generative judge
    objective: str = "elbo"  # rm: elbo (ICRM) or bce (the point baselines)
    context: bool = True  # rm: False masks every demo (a static RM)
    kl_weight: float = 1.0
    seed: int = 0


def variants(cfg: ICRMRunConfig) -> list[Variant]:
    """The models `troupe run icrm` fits, in a fixed order."""
    t = cfg.train
    out = [Variant(icrm_name(lam), kl_weight=lam, seed=t.seed) for lam in t.lambdas]
    if t.point:
        out.append(Variant("point", objective="bce", seed=t.seed))
    out += [Variant(f"static_{i}", objective="bce", context=False, seed=t.seed + i) for i in range(t.ensemble)]
    if t.judge:
        out.append(Variant("judge", kind="judge", seed=t.seed))
    return out


def fit_steps(v: Variant, t: TrainConfig) -> int:
    """The Adam steps model ``v`` is fitted for: the judge and the static RMs have their own."""
    if v.kind == "judge":
        return t.judge_steps or t.steps
    return t.steps if v.context else t.static_fit_steps


def icrm_name(lam: float) -> str:
    return f"icrm_lam{lam:g}"


# -- the task's data, the same in every actor and in the driver --------------------------------
@dataclasses.dataclass
class TaskData:
    """The text personas: train-split persona weights and a response pool for training; per
    evaluation split its personas, and an evaluation pool."""

    personas: TextPersonas
    train_weights: np.ndarray
    pool: ResponsePool
    eval_weights: dict[str, np.ndarray]
    eval_pool: ResponsePool


@dataclasses.dataclass
class DatasetData:
    """A multi-attribute dataset's prompts in three parts by a seeded hash of each prompt's text:
    ``train`` (the training episodes), ``valid`` (λ's choice) and ``test`` (the seen and unseen
    splits); ``objectives`` label train, valid and seen, ``unseen`` the unseen split."""

    source: str
    train: AttributeSet
    valid: AttributeSet
    test: AttributeSet
    objectives: dict[str, dict[str, float]]
    unseen: dict[str, dict[str, float]]

    def split(self, name: str) -> tuple[AttributeSet, dict[str, dict[str, float]]]:
        """The prompts and the objectives of evaluation split ``name``."""
        return {"valid": (self.valid, self.objectives), "seen": (self.test, self.objectives),
                "unseen": (self.test, self.unseen)}[name]

    def facts(self) -> dict[str, object]:
        """What the report says about the data."""
        parts = {"train": self.train, "valid": self.valid, "test": self.test}
        return {"source": self.source, "prompts": {n: len(p.prompts) for n, p in parts.items()},
                "responses": {n: sum(len(g.responses) for g in p.groups) for n, p in parts.items()},
                "attributes": list(self.train.attributes), "objectives": self.objectives,
                "unseen_objectives": self.unseen}


@dataclasses.dataclass
class ArithmeticData:
    """data.source=arithmetic: distinct train-split problems with wrong answers of the ``mistakes``
    kinds (the training episodes), and distinct held-out problems, halved, with wrong answers of
    every kind: ``valid`` (λ's choice) and ``test`` (``seen``: the ``mistakes`` kinds; ``unseen``:
    the held-out ``unseen`` kinds)."""

    train: SolutionPool
    valid: SolutionPool
    test: SolutionPool
    mistakes: tuple[str, ...]
    unseen: tuple[str, ...]

    def split(self, name: str) -> tuple[SolutionPool, tuple[str, ...]]:
        """The problems and the mistake kinds of evaluation split ``name``."""
        return {"valid": (self.valid, self.mistakes), "seen": (self.test, self.mistakes),
                "unseen": (self.test, self.unseen)}[name]

    def facts(self) -> dict[str, object]:
        """What the report says about the data."""
        parts = {"train": self.train, "valid": self.valid, "test": self.test}
        return {"source": ARITHMETIC, "prompts": {n: len(p) for n, p in parts.items()},
                "responses": {n: len(p.texts()) for n, p in parts.items()}, "mistakes": list(self.mistakes),
                "unseen_mistakes": list(self.unseen)}


Data = TaskData | DatasetData | ArithmeticData


def task_data(cfg: ICRMRunConfig) -> Data:
    """The run's data: `persona_data`, `arithmetic_data` or `dataset_data` by ``data.source``."""
    if cfg.data.source == PERSONAS:
        return persona_data(cfg)
    return arithmetic_data(cfg) if cfg.data.source == ARITHMETIC else dataset_data(cfg)


def arithmetic_task(cfg: ICRMRunConfig) -> ArithmeticTask:
    """The problems of data.source=arithmetic (the RL arms' task has the same)."""
    return ArithmeticTask(digits=cfg.data.digits, ops=list(cfg.data.ops))


def arithmetic_data(cfg: ICRMRunConfig) -> ArithmeticData:
    d = cfg.data
    task = arithmetic_task(cfg)
    rng = np.random.default_rng([d.seed, 0])
    train = solution_pool(draw_problems(task, d.problems, "train", rng), d.mistakes, rng)
    held = draw_problems(task, d.eval_problems, "test", rng)
    half = len(held) // 2
    kinds = [*d.mistakes, *d.unseen_mistakes]
    valid, test = solution_pool(held[:half], kinds, rng), solution_pool(held[half:], kinds, rng)
    return ArithmeticData(train, valid, test, tuple(d.mistakes), tuple(d.unseen_mistakes))


def persona_data(cfg: ICRMRunConfig) -> TaskData:
    d = cfg.data
    tp = TextPersonas(d.personas)
    rng = np.random.default_rng([d.seed, 0])
    train_w = sample_personas(d.personas, d.train_personas, "train", rng)
    pool = response_pool(tp, d.pool, rng)
    erng = np.random.default_rng([d.seed, 1])
    eval_w = {s: sample_personas(d.personas, d.eval_personas, "test" if s == "unseen" else "train", erng)
              for s in SPLITS}
    return TaskData(tp, train_w, pool, eval_w, response_pool(tp, d.eval_pool, erng))


def dataset_data(cfg: ICRMRunConfig) -> DatasetData:
    """``data.source`` read from ``data.path`` (or its hub id), cut to ``data.max_prompts`` prompts
    and split by prompt: ``1 - eval_fraction`` for training, the rest halved into validation and
    test. A part with fewer than `MIN_EVAL_PROMPTS` prompts is an error naming the keys to change."""
    from troupe.envs.preferences.loaders import load_attribute_set

    d = cfg.data
    data = load_attribute_set(d.source, d.path, d.split)
    if d.max_prompts is not None:
        data = data.limited(d.max_prompts, d.seed)
    where = f"data.source={d.source} ({data.source})"
    parts = data.split_by_prompt([1 - d.eval_fraction, d.eval_fraction / 2, d.eval_fraction / 2], d.seed)
    counts = [len({g.prompt for g in part}) for part in parts]
    for name, n, least in zip(("training", "validation", "test"), counts, (1, MIN_EVAL_PROMPTS, MIN_EVAL_PROMPTS),
                              strict=True):
        if n < least:
            raise ConfigError(
                f"data.eval_fraction={d.eval_fraction}: {where} has {len(data.prompts)} prompts with a pair"
                + (f" (data.max_prompts={d.max_prompts})" if d.max_prompts is not None else "")
                + f", which gives the {name} part {n} (split {counts} into training, validation and test); "
                f"it needs at least {least}: give a dataset with more prompts"
                + (" or raise data.max_prompts" if d.max_prompts is not None else "")
                + " or change data.eval_fraction")
    train, valid, test = (AttributeSet(data.attributes, part, f"{data.source} [{name} prompts]")
                          for part, name in zip(parts, ("training", "validation", "test"), strict=True))
    return DatasetData(d.source, train, valid, test, dict(d.objectives), dict(d.unseen_objectives))


def train_episodes(cfg: ICRMRunConfig, data: Data, n: int, rng: np.random.Generator,
                   k: int | tuple[int, int] | None = None) -> list[Episode]:
    """n training episodes, ``k`` demos each (default uniform on 0..data.personas.max_demos)."""
    if isinstance(data, TaskData):
        return pool_episodes(data.personas, data.pool, data.train_weights, n, rng, k=k)
    d = cfg.data
    if isinstance(data, ArithmeticData):
        return solution_episodes(data.train, data.mistakes, n, rng, k=(0, d.max_demos) if k is None else k)
    return data.train.episodes(data.objectives, n, rng, k=(0, d.max_demos) if k is None else k, labels=d.labels,
                               beta=d.beta)


def training_texts(data: Data, limit: int | None = None) -> list[str]:
    """What the encoder reads of the training responses (each with its prompt), up to ``limit``."""
    if isinstance(data, TaskData):
        pool = data.pool
        return [response_text(p, t) for p, t in zip(pool.prompts[:limit], pool.texts[:limit], strict=False)]
    return [response_text(p, r) for p, r in data.train.texts()[:limit]]


EvalSets = dict[str, dict[int, tuple[list[Episode], np.ndarray]]]  # split -> k -> (episodes, p_true)


def eval_sets(cfg: ICRMRunConfig, data: Data) -> EvalSets:
    """Per split and k: the evaluation episodes and each query's true P(a ≻ b) under its persona
    or objective. The ks are nested: every k reads the first k demos of the same episodes (same
    personas, same queries), so accuracy-vs-k differences are paired and not sampling noise between sets."""
    if isinstance(data, DatasetData):
        return _dataset_eval_sets(cfg, data)
    if isinstance(data, ArithmeticData):
        return _arithmetic_eval_sets(cfg, data)
    out: EvalSets = {}
    feats = dict(zip(data.eval_pool.texts, data.eval_pool.features, strict=True))
    k_max = max(cfg.data.eval_ks)
    for si, split in enumerate(SPLITS):
        w = data.eval_weights[split]
        names = [f"{split}-{i}" for i in range(len(w))]
        rng = np.random.default_rng([cfg.data.seed, 2, si])
        full = pool_episodes(data.personas, data.eval_pool, w, cfg.data.eval_episodes, rng, k=k_max, names=names)
        who = np.array([names.index(e.objective) for e in full])
        fa = np.stack([feats[e.query.a] for e in full])
        fb = np.stack([feats[e.query.b] for e in full])
        p_true = bt_probability(w[who], fa, fb, cfg.data.personas.beta0)
        out[split] = {k: ([dataclasses.replace(e, demos=e.demos[:k]) for e in full], p_true)
                      for k in cfg.data.eval_ks}
    return out


def _dataset_eval_sets(cfg: ICRMRunConfig, data: DatasetData) -> EvalSets:
    """As `eval_sets` on held-out prompts; p_true is σ(β·margin) (bt labels) or the label (threshold)."""
    d = cfg.data
    out = {}
    for si, split in enumerate(SPLITS):
        part, objectives = data.split(split)
        rng = np.random.default_rng([d.seed, 2, si])
        try:
            full, p_true = part.labelled_episodes(objectives, d.eval_episodes, rng, k=max(d.eval_ks), labels=d.labels,
                                                  beta=d.beta)
        except DataError as e:
            key = "data.unseen_objectives" if split == "unseen" else "data.objectives"
            raise DataError(f"the {split} split ({key}, {len(part.prompts)} held-out prompts): {e}") from None
        out[split] = {k: ([dataclasses.replace(e, demos=e.demos[:k]) for e in full], p_true) for k in d.eval_ks}
    return out


def _arithmetic_eval_sets(cfg: ICRMRunConfig, data: ArithmeticData) -> EvalSets:
    """As `eval_sets` on held-out problems; p_true is the label (the correct solution always wins)."""
    d = cfg.data
    out = {}
    for si, split in enumerate(SPLITS):
        pool, kinds = data.split(split)
        full = solution_episodes(pool, kinds, d.eval_episodes, np.random.default_rng([d.seed, 2, si]), k=max(d.eval_ks))
        p_true = np.array([float(e.query.label) for e in full])
        out[split] = {k: ([dataclasses.replace(e, demos=e.demos[:k]) for e in full], p_true) for k in d.eval_ks}
    return out


def corpus(cfg: ICRMRunConfig, data: Data) -> list[str]:
    """What the embedded backbone's tokenizer is trained and the backbone pretrained on: responses
    with their prompts, and judge prompts. Arithmetic: the training problems' correct solutions (as
    a language model reads worked arithmetic, not the mistakes it is then asked to tell apart)."""
    rng = np.random.default_rng([cfg.data.seed, 3])
    if isinstance(data, ArithmeticData):
        texts = [response_text(p, a) for p, a in zip(data.train.prompts, data.train.answers, strict=True)]
    else:
        texts = training_texts(data, 4000)
    if isinstance(data, TaskData):
        eps = pool_episodes(data.personas, data.pool, data.train_weights, 200, rng, k=(0, 2))
    else:
        eps = train_episodes(cfg, data, 200, rng, k=(0, min(2, cfg.data.max_demos)))
    return texts + judge_corpus(eps)


@dataclasses.dataclass(frozen=True)
class SelectionSet:
    """What best-of-N and the steering front select from (`selection_set`): per row a prompt, N
    candidate responses and a reference response (indices into the evaluation pool), and k demos
    of each RL persona drawn from the evaluation pool."""

    prompts: tuple[str, ...]
    candidates: np.ndarray  # (rows, N)
    reference: np.ndarray  # (rows,)
    demos: dict[str, list[tuple[Comparison, ...]]]  # "a" / "b" -> per row, k comparisons


SELECT_ROWS, SELECT_N = 64, 64


def persona_weights(cfg: ICRMRunConfig) -> dict[str, np.ndarray]:
    """The RL personas a and b as unit vectors."""
    return {who: np.asarray(getattr(cfg.rl, f"persona_{who}"), float)
            / np.linalg.norm(getattr(cfg.rl, f"persona_{who}")) for who in ("a", "b")}


def selection_set(cfg: ICRMRunConfig, data: TaskData) -> SelectionSet:
    """The same `SelectionSet` in the driver and in every actor (seeded by ``data.seed``)."""
    rng = np.random.default_rng([cfg.data.seed, 4])
    pool = data.eval_pool
    cands = np.stack([rng.choice(len(pool), SELECT_N, replace=False) for _ in range(SELECT_ROWS)])
    prompts = tuple(str(p) for p in rng.choice(PROMPTS, SELECT_ROWS))
    reference = rng.integers(len(pool), size=SELECT_ROWS)
    k = cfg.data.personas.max_demos
    demos = {who: [e.demos for e in pool_episodes(data.personas, pool, w[None], SELECT_ROWS, rng, k=k)]
             for who, w in persona_weights(cfg).items()}
    return SelectionSet(prompts, cands, reference, demos)


def mixed_demos(sel: SelectionSet, m_b: int) -> list[tuple[Comparison, ...]]:
    """Per row, the context of k demos whose last ``m_b`` are persona b's and the rest a's."""
    return [a[:len(a) - m_b] + b[:m_b] for a, b in zip(sel.demos["a"], sel.demos["b"], strict=True)]


# -- the actor ---------------------------------------------------------------------------------
class _Fit:
    """A variant's model, optimizer, schedule and episode stream."""

    def __init__(self, v: Variant, cfg: ICRMRunConfig, backbone_path: str, data: Data) -> None:
        self.v = v
        self.cfg = cfg
        t = cfg.train
        device = resolve_device(cfg.backbone.device)
        if v.kind == "judge":
            lm, tok, max_tokens = build_judge_lm(cfg, backbone_path)
            self.model = GenerativeJudge(lm.to(device), tok, max_tokens)
            self.batch_size = t.judge_batch_size
        else:
            backbone, tok = build_backbone_from(cfg.backbone, backbone_path)
            icrm_cfg = dataclasses.replace(cfg.icrm, kl_weight=v.kl_weight)
            torch.manual_seed(v.seed)  # the heads' and context encoder's initialisation
            self.model = TextICRM(backbone, tok, icrm_cfg, cfg.backbone.max_tokens, v.objective, v.context,
                                  cfg.backbone.train, cfg.backbone.features, cfg.backbone.encode_batch).to(device)
            self.model.fit_standardiser(training_texts(data, 2000))
            self.batch_size = t.batch_size
        self.steps = fit_steps(v, t)
        self.opt = torch.optim.Adam([p for p in self.model.parameters() if p.requires_grad], lr=t.lr)
        self.sched = torch.optim.lr_scheduler.OneCycleLR(self.opt, max_lr=t.lr, total_steps=self.steps, pct_start=0.1)
        self.rng = np.random.default_rng([v.seed, 7])
        self.done = 0
        self.losses: list[float] = []

    def train_to(self, until: int, data: Data) -> None:
        until = min(until, self.steps)
        self.model.train()
        while self.done < until:
            # a static model reads no demo: its episodes are drawn without them
            k = 0 if self.v.kind == "rm" and not self.v.context else None
            eps = train_episodes(self.cfg, data, self.batch_size, self.rng, k=k)
            if isinstance(self.model, GenerativeJudge):
                out = self.model(eps)
                loss = self.model.loss(out, eps)
            else:
                out, batch = self.model(eps)
                loss = self.model.loss(out, batch)
            self.opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.opt.step()
            self.sched.step()
            self.losses.append(float(loss.item()))
            self.done += 1
        self.model.eval()

    @torch.no_grad()
    def predict(self, eps: list[Episode], chunk: int = 64) -> dict[str, list[float]]:
        self.model.eval()
        mus, taus = [], []
        for lo in range(0, len(eps), chunk):
            part = eps[lo:lo + chunk]
            if isinstance(self.model, GenerativeJudge):
                mus.append(self.model(part)["mu"])
            else:
                out, _ = self.model(part)
                mus.append(out["mu"])
                taus.append(out["tau"])
        out = {"mu": torch.cat(mus).tolist()}
        if taus:
            out["tau"] = torch.cat(taus).tolist()
        return out

    def _frozen_backbone(self) -> bool:
        return isinstance(self.model, TextICRM) and not self.model.train_backbone

    def state(self) -> bytes:
        # A frozen backbone is the one every actor loads from the backbone path: a checkpoint keeps
        # the heads and context encoder only (a 1.5B backbone per model would be gigabytes each).
        frozen = self._frozen_backbone()
        weights = {"icrm": self.model.icrm.state_dict()} if frozen else {"model": self.model.state_dict()}
        buf = io.BytesIO()
        torch.save({**weights, "opt": self.opt.state_dict(), "sched": self.sched.state_dict(),
                    "rng": self.rng.bit_generator.state, "done": self.done, "losses": self.losses,
                    "torch_rng": torch.get_rng_state()}, buf)
        return buf.getvalue()

    def restore(self, blob: bytes) -> None:
        s = torch.load(io.BytesIO(blob), weights_only=False, map_location=self.model.device
                       if isinstance(self.model, TextICRM) else None)
        if "icrm" in s:
            self.model.icrm.load_state_dict(s["icrm"])
        else:
            self.model.load_state_dict(s["model"])
        self.opt.load_state_dict(s["opt"])
        self.sched.load_state_dict(s["sched"])
        self.rng.bit_generator.state = s["rng"]
        self.done, self.losses = s["done"], s["losses"]
        torch.set_rng_state(s["torch_rng"])


class ICRMLearner:
    """Fits its share of the variants (the ``"learner"`` role of `troupe run icrm`)."""

    uses_global_rng = True  # dropout and its checkpointed torch state (a fused host keeps it per role)

    def __init__(self, cfg: ICRMRunConfig, variants: list[Variant], backbone_path: str,
                 data: Data | None = None) -> None:
        configure_threads()
        self.cfg = cfg
        self.data = data if data is not None else task_data(cfg)
        self.fits = {v.name: _Fit(v, cfg, backbone_path, self.data) for v in variants}
        self._evals: dict | None = None
        self._share_states()

    def _share_states(self) -> None:
        """One cache of response states for every frozen-backbone model of this actor, filled at
        once with every (prompt, response) text the training episodes can draw. The models load
        the same backbone and fit the same standardiser on the same texts, so their states are
        the same: each would otherwise encode the whole pool again, piecemeal, as its episodes
        first met each text."""
        models = [f.model for f in self.fits.values() if isinstance(f.model, TextICRM) and not f.model.train_backbone]
        if not models:
            return
        shared = models[0]._states
        for m in models[1:]:
            m._states = shared
        if isinstance(self.data, TaskData):
            texts = [response_text(p, t) for p in PROMPTS for t in self.data.pool.texts]
        else:
            texts = training_texts(self.data)
        with torch.no_grad():
            for lo in range(0, len(texts), 512):
                models[0].encode(texts[lo:lo + 512], cache=True)

    def names(self) -> list[str]:
        return list(self.fits)

    def advance(self, until: int) -> dict[str, dict[str, float]]:
        """Fit every variant to ``until`` steps (each capped at its own total); per variant the mean
        loss of the steps just taken and their seconds."""
        out = {}
        for name, fit in self.fits.items():
            t0, before = time.perf_counter(), len(fit.losses)
            # the judge and the static RMs have their own step counts: reached at the same share of the run
            share = min(until / self.cfg.train.steps, 1.0)
            fit.train_to(round(share * fit.steps), self.data)
            new = fit.losses[before:]
            out[name] = {"loss": float(np.mean(new)) if new else float("nan"), "seconds": time.perf_counter() - t0,
                         "steps": float(fit.done)}
        return out

    def predict(self, splits: tuple[str, ...] = SPLITS) -> dict[str, dict[str, dict[int, dict[str, list[float]]]]]:
        """μ (and τ for reward models) of every variant on the evaluation episodes: [variant][split][k]."""
        if self._evals is None:
            self._evals = eval_sets(self.cfg, self.data)
        return {name: {s: {k: fit.predict(eps) for k, (eps, _) in self._evals[s].items()} for s in splits}
                for name, fit in self.fits.items()}

    @torch.no_grad()
    def selection_scores(self, name: str, contexts: dict[str, int]) -> dict[str, list[list[float]]]:
        """Variant ``name``'s scores of every candidate of `selection_set`, one context per entry
        of ``contexts`` (label → demos of persona b among k, the rest a's; a negative count: no
        demos): "r/<label>", the reward r(x, y; C), and "conservative/<label>", E_q log p of the
        candidate against the row's reference. Each (rows, N)."""
        model = self.fits[name].model
        if not isinstance(model, TextICRM):
            raise ValueError(f"variant {name!r} is a {type(model).__name__}, not a reward model")
        from troupe.algorithms.icrm.posterior import conservative_reward

        model.eval()
        sel = selection_set(self.cfg, self.data)
        texts = self.data.eval_pool.texts
        rows, n = sel.candidates.shape
        z = model.features([response_text(p, texts[j]) for p, row in zip(sel.prompts, sel.candidates, strict=True)
                            for j in row], cache=True).view(rows, n, -1)
        z_ref = model.features([response_text(p, texts[j]) for p, j in zip(sel.prompts, sel.reference, strict=True)])
        out: dict[str, list[list[float]]] = {}
        for label, m_b in contexts.items():
            demos = mixed_demos(sel, m_b) if m_b >= 0 else [()] * rows
            chosen, rejected, mask = model.context_states(demos)

            def per_candidate(t: torch.Tensor) -> torch.Tensor:
                return t[:, None].expand(rows, n, *t.shape[1:]).reshape(rows * n, *t.shape[1:])

            o = model.icrm({"demo_chosen": per_candidate(chosen), "demo_rejected": per_candidate(rejected),
                            "demo_mask": per_candidate(mask), "query_a": z.reshape(rows * n, -1),
                            "query_b": per_candidate(z_ref)})
            out[f"r/{label}"] = o["r_a"].view(rows, n).tolist()
            out[f"conservative/{label}"] = conservative_reward(o["alpha"], o["beta"]).view(rows, n).tolist()
        return out

    def save_model(self, name: str, path: str) -> str:
        """Write variant ``name``'s model where a reward actor loads it (`TextICRM.save`)."""
        model = self.fits[name].model
        if not isinstance(model, TextICRM):
            raise ValueError(f"variant {name!r} is a {type(model).__name__}, not a reward model")
        model.save(Path(path))
        return path

    def export(self) -> dict[str, bytes]:
        return {name: fit.state() for name, fit in self.fits.items()}

    def restore(self, states: dict[str, bytes]) -> None:
        for name, blob in states.items():
            self.fits[name].restore(blob)
