"""§A.5's synthetic benchmark: BPO and its baselines on a softmax-linear policy with a
perceptual bottleneck (shared/ALGORITHMS.md §A.5).

The policy reads a clip only through five features, so it cannot tell a shuffled clip from an
original one: the order sign (perceived wrongly with probability ``order_noise``), the
frequency difference (the shortcut), the presence of X, the evidence fraction and a bias. In
training the shortcut predicts the temporal answer more often (``cue_strength``, 0.85) than the
noisy order sign does (0.8), so the policy that maximises the original-view reward follows
the shortcut, and GRPO has no reason to leave it. A shuffled clip keeps the shortcut and
destroys the order, so BPO's SENS reward on it penalises exactly the shortcut.

Everything BPO-specific comes from the same registered parts the actor-based algorithm uses:
`behavior.criterion` for every reward, `behavior.counterfactual_baselines` and the
``ar_cf`` / ``ar_literal`` / ``mixed_mean`` / ``mixed_meanstd`` / ``grpo`` estimators from the
advantage registry, `TypeEMA` for single-anchor packs, and `evaluation`'s records, metrics and
bootstrap. Only the policy and the clips are §A.5's own.

Choices §A.5 leaves open, made here (each a field of `LinearConfig`):

* An item's perceived order sign is drawn once per rendering (the original clip and each view),
  like a clip whose frames are misleading, not once per response.
* ``mask`` blanks every X frame. A static item without X has nothing to mask; its mask view is
  STAB (the intervention is irrelevant) rather than SENS (``mask_without_x``).
* Macro accuracy is the mean over three test groups: static, temporal shortcut-consistent and
  temporal-hard. This is the reading under which all three rows of §A.5's expected table add
  up (SFT 0.50 = (0.5 + 1 + 0) / 3, GRPO 0.67 = (1 + 1 + 0) / 3).
* Evaluation is greedy (argmax), as the GRPO temporal-hard figure of exactly 0.00 implies.
* Updates are plain REINFORCE on the advantages, averaged over the batch's responses, with SGD.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from troupe.algorithms.bpo.behavior import TypeEMA, call_advantage, counterfactual_baselines, criterion
from troupe.algorithms.bpo.evaluation import item_record
from troupe.envs.video_qa.items import ABST
from troupe.platform.errors import ConfigError
from troupe.platform.registry import ADVANTAGES

X, Y, BLANK = 0, 1, -1
NUM_EVENTS = 6  # event ids 0..5; X = 0 and Y = 1, the rest are distractors
YES, NO = 0, 1  # answers are option indices; ABST (-1) is the abstain option
ACTIONS = (YES, NO, ABST)  # the policy's three outputs, in logit order
QTYPES = ("static", "temporal")
FEATURES = ("order_sign", "freq_diff", "presence", "evidence", "bias")
VIEWS = ("shuffle", "mask", "blank")


@dataclasses.dataclass
class LinearArm:
    """One method: ``views`` packs (1 anchor + one response per view) or a GRPO group of
    ``group`` responses on the original; ``reward`` "behaviour" (the §A.2 table) or "orig"
    (every response rewarded for a*, Aug-GRPO); ``advantage`` a registered estimator."""

    views: bool
    advantage: str
    reward: str = "behaviour"
    group: int = 4


ARMS: dict[str, LinearArm] = {
    "grpo": LinearArm(views=False, advantage="grpo", reward="orig"),
    "grpo_2x": LinearArm(views=False, advantage="grpo", reward="orig", group=8),
    "aug_grpo": LinearArm(views=True, advantage="grpo", reward="orig"),
    "bpo": LinearArm(views=True, advantage="ar_cf"),
    "bpo_ar_literal": LinearArm(views=True, advantage="ar_literal"),
    "bpo_mixed_mean": LinearArm(views=True, advantage="mixed_mean"),
    "bpo_mixed_meanstd": LinearArm(views=True, advantage="mixed_meanstd"),
}


@dataclasses.dataclass
class LinearConfig:
    num_frames: int = 8
    cue_strength: float = 0.85  # train: P(the more frequent of X, Y appears first)
    order_noise: float = 0.2  # P(the perceived order sign is flipped), per rendering
    temporal_share: float = 0.5  # share of temporal items
    blank_share: float = 0.5  # share of filler frames left blank (the rest are distractor events)
    steps: int = 300
    batch_prompts: int = 32
    lr: float = 0.2
    c_fa: float = 0.5  # false-abstention penalty
    ema_decay: float = 0.95  # the anchor baseline of a single-anchor pack
    # The mask view of an item without X leaves the clip as it was: STAB (the intervention is
    # irrelevant) or, reading §A.5's "mask-X (SENS)" literally, SENS.
    mask_without_x: str = "STAB"
    test_items: int = 600
    test_seed: int = 10_000
    # The SFT start (§A.5): the shortcut weighs 1.5, the order sign 0.3, abstaining -1.
    sft_shortcut: float = 1.5
    sft_order: float = 0.3
    sft_abstain_bias: float = -1.0

    def __post_init__(self) -> None:
        for name in ("cue_strength", "order_noise", "temporal_share", "blank_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ConfigError(f"linear.{name} = {v!r}: must lie in [0, 1]")
        for name in ("num_frames", "steps", "batch_prompts", "test_items"):
            if getattr(self, name) < 1:
                raise ConfigError(f"linear.{name} = {getattr(self, name)!r}: must be an integer >= 1")
        if self.mask_without_x not in ("STAB", "SENS"):
            raise ConfigError(f"linear.mask_without_x = {self.mask_without_x!r}: expected STAB or SENS")
        if self.num_frames < 4:
            raise ConfigError(f"linear.num_frames = {self.num_frames}: a temporal clip needs at least 4 frames")


@dataclasses.dataclass
class Clip:
    frames: np.ndarray  # [F] event ids, BLANK for an empty frame
    qtype: str  # "static": does X occur?  "temporal": does the first X precede the first Y?
    gold: int  # YES or NO
    hard: bool = False  # temporal, and the shortcut points to the wrong answer


# -- clips and views -----------------------------------------------------------------------------
def _fill(rng: np.random.Generator, frames: np.ndarray, cfg: LinearConfig) -> np.ndarray:
    """Free frames (-2) become blanks or distractor events 2..5."""
    free = frames == -2
    fill = np.where(rng.random(free.sum()) < cfg.blank_share, BLANK, rng.integers(2, NUM_EVENTS, free.sum()))
    frames[free] = fill
    return frames


def temporal_clip(rng: np.random.Generator, cfg: LinearConfig, follows_cue: bool) -> Clip:
    """(#X, #Y) ∈ {(3, 1), (1, 3)}; the shortcut "X more frequent ⇔ yes" holds iff ``follows_cue``."""
    gold = YES if rng.random() < 0.5 else NO
    x_more = (gold == YES) == follows_cue
    labels = [X, X, X, Y] if x_more else [X, Y, Y, Y]
    pos = np.sort(rng.choice(cfg.num_frames, 4, replace=False))
    while True:  # an arrangement of the four events whose first-X/first-Y order gives gold
        order = rng.permutation(labels)
        if (order.tolist().index(X) < order.tolist().index(Y)) == (gold == YES):
            break
    frames = np.full(cfg.num_frames, -2)
    frames[pos] = order
    return Clip(_fill(rng, frames, cfg), "temporal", gold, hard=not follows_cue)


def static_clip(rng: np.random.Generator, cfg: LinearConfig) -> Clip:
    """Does X occur? X appears 1-3 times when the answer is yes; Y appears 0-2 times."""
    gold = YES if rng.random() < 0.5 else NO
    n_x = int(rng.integers(1, 4)) if gold == YES else 0
    n_y = int(rng.integers(0, 3))
    frames = np.full(cfg.num_frames, -2)
    pos = rng.choice(cfg.num_frames, n_x + n_y, replace=False)
    frames[pos[:n_x]], frames[pos[n_x:]] = X, Y
    return Clip(_fill(rng, frames, cfg), "static", gold)


def train_clip(rng: np.random.Generator, cfg: LinearConfig) -> Clip:
    if rng.random() < cfg.temporal_share:
        return temporal_clip(rng, cfg, follows_cue=rng.random() < cfg.cue_strength)
    return static_clip(rng, cfg)


def test_set(cfg: LinearConfig) -> list[Clip]:
    """Temporal items alternate shortcut-consistent / shortcut-broken (temporal-hard)."""
    rng = np.random.default_rng(cfg.test_seed)
    n_temporal = round(cfg.test_items * cfg.temporal_share)
    clips = [temporal_clip(rng, cfg, follows_cue=i % 2 == 0) for i in range(n_temporal)]
    return clips + [static_clip(rng, cfg) for _ in range(cfg.test_items - n_temporal)]


def view(clip: Clip, name: str, rng: np.random.Generator) -> np.ndarray:
    """The frames of ``clip`` under a view operator."""
    f = clip.frames
    if name == "orig":
        return f.copy()
    if name == "shuffle":
        while True:  # a permutation other than the identity
            perm = rng.permutation(len(f))
            if (perm != np.arange(len(f))).any():
                return f[perm]
    if name == "mask":
        return np.where(f == X, BLANK, f)
    if name == "blank":
        return np.full_like(f, BLANK)
    raise ConfigError(f"view {name!r} is not one of orig, {', '.join(VIEWS)}")


def label(clip: Clip, name: str, mask_without_x: str = "STAB") -> str:
    """§A.5's behaviour table: shuffle is SENS for temporal items and STAB for static ones,
    mask SENS (``mask_without_x`` when there is no X to mask), blank ABST."""
    if name == "shuffle":
        return "SENS" if clip.qtype == "temporal" else "STAB"
    if name == "mask":
        return "SENS" if (clip.frames == X).any() else mask_without_x
    if name == "blank":
        return "ABST"
    raise ConfigError(f"view {name!r} is not one of {', '.join(VIEWS)}")


def features(frames: np.ndarray, rng: np.random.Generator, order_noise: float) -> np.ndarray:
    """The five features of ``FEATURES``; the order sign (0 when X or Y is absent) is
    flipped with probability ``order_noise``."""
    xs, ys = np.flatnonzero(frames == X), np.flatnonzero(frames == Y)
    sign = 0.0 if len(xs) == 0 or len(ys) == 0 else (1.0 if xs[0] < ys[0] else -1.0)
    if sign and rng.random() < order_noise:
        sign = -sign
    return np.array([sign, (len(xs) - len(ys)) / 2, float(len(xs) > 0), float((frames != BLANK).mean()), 1.0])


# -- the policy ----------------------------------------------------------------------------------
class LinearPolicy:
    """Softmax over (yes, no, abstain) with one weight vector per question type and output."""

    def __init__(self, cfg: LinearConfig) -> None:
        w = torch.zeros(len(QTYPES), len(ACTIONS), len(FEATURES), dtype=torch.float64)
        t = QTYPES.index("temporal")
        w[t, ACTIONS.index(YES), FEATURES.index("freq_diff")] = cfg.sft_shortcut
        w[t, ACTIONS.index(YES), FEATURES.index("order_sign")] = cfg.sft_order
        w[:, ACTIONS.index(ABST), FEATURES.index("bias")] = cfg.sft_abstain_bias
        self.weights = w.requires_grad_(True)

    def log_probs(self, phi: torch.Tensor, qtype: torch.Tensor) -> torch.Tensor:
        """``[N, 3]`` log-probabilities of (yes, no, abstain)."""
        return torch.log_softmax(torch.einsum("nf,naf->na", phi, self.weights[qtype]), -1)

    def state(self) -> dict[str, Any]:
        w = self.weights.detach()
        return {q: {str(a): dict(zip(FEATURES, w[i, j].tolist(), strict=True)) for j, a in
                    enumerate(("yes", "no", "abstain"))} for i, q in enumerate(QTYPES)}


def _answers(actions: torch.Tensor) -> torch.Tensor:
    return torch.tensor(ACTIONS, dtype=torch.long)[actions]


# -- training --------------------------------------------------------------------------------------
def rollout(clips: Sequence[Clip], arm: LinearArm, cfg: LinearConfig, rng: np.random.Generator) -> dict[str, Any]:
    """One batch's rows: per prompt, the anchor and one response per view (BPO, Aug-GRPO) or
    ``arm.group`` responses on the original (GRPO); each rendering perceived once."""
    rows: dict[str, list[Any]] = {"phi": [], "qtype": [], "gold": [], "label": [], "group": [], "anchor": []}
    for i, clip in enumerate(clips):
        renderings = [("orig", arm.group if not arm.views else 1)]
        if arm.views:
            renderings += [(v, 1) for v in VIEWS]
        for name, k in renderings:
            phi = features(view(clip, name, rng), rng, cfg.order_noise)
            lab = "ORIG" if name == "orig" else (label(clip, name, cfg.mask_without_x) if arm.reward == "behaviour"
                                          else "STAB")
            for _ in range(k):
                rows["phi"].append(phi)
                rows["qtype"].append(QTYPES.index(clip.qtype))
                rows["gold"].append(clip.gold)
                rows["label"].append(lab)
                rows["group"].append(i)
                rows["anchor"].append(name == "orig")
    return {"phi": torch.tensor(np.array(rows["phi"])), "qtype": torch.tensor(rows["qtype"]),
            "gold": torch.tensor(rows["gold"]), "labels": rows["label"], "group": torch.tensor(rows["group"]),
            "anchor": torch.tensor(rows["anchor"])}


def advantages(arm: LinearArm, batch: dict[str, Any], answers: torch.Tensor, conf_gold: torch.Tensor,
               rewards: torch.Tensor, ema: TypeEMA, cfg: LinearConfig) -> torch.Tensor:
    """The arm's registered estimator on the batch, given the pack fields it accepts (as `bpo` does)."""
    kw: dict[str, Any] = {"is_anchor": batch["anchor"]}
    if arm.views and arm.reward == "behaviour":
        kw["anchor_baseline"] = ema.baseline([QTYPES[int(q)] for q in batch["qtype"]], rewards, batch["anchor"])
        kw["cf_baseline"] = counterfactual_baselines(batch["group"], batch["anchor"], batch["labels"], answers,
                                                     batch["gold"], conf_gold, c_fa=cfg.c_fa)
    return call_advantage(ADVANTAGES.get(arm.advantage), rewards, batch["group"], kw).to(torch.float64)


def train(arm_name: str, cfg: LinearConfig, seed: int) -> tuple[LinearPolicy, list[dict[str, float]]]:
    """REINFORCE from the SFT start; returns the policy and per-step training figures."""
    if arm_name not in ARMS:
        raise ConfigError(f"linear arm {arm_name!r} is not one of sft, {', '.join(ARMS)}")
    arm = ARMS[arm_name]
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    policy = LinearPolicy(cfg)
    opt = torch.optim.SGD([policy.weights], lr=cfg.lr)
    ema = TypeEMA(cfg.ema_decay)
    log = []
    for _ in range(cfg.steps):
        batch = rollout([train_clip(rng, cfg) for _ in range(cfg.batch_prompts)], arm, cfg, rng)
        logp = policy.log_probs(batch["phi"], batch["qtype"])
        probs = logp.detach().exp()
        actions = torch.multinomial(probs, 1, generator=gen).squeeze(1)
        answers = _answers(actions)
        conf_gold = probs.gather(1, batch["gold"].unsqueeze(1)).squeeze(1)  # c_v(a*): a* is an option index
        rewards = torch.tensor([criterion(lab, int(a), int(g), float(c), c_fa=cfg.c_fa) for lab, a, g, c in
                                zip(batch["labels"], answers, batch["gold"], conf_gold, strict=True)],
                               dtype=torch.float64)
        adv = advantages(arm, batch, answers, conf_gold, rewards, ema, cfg)
        loss = -(adv * logp.gather(1, actions.unsqueeze(1)).squeeze(1)).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        a = batch["anchor"]
        log.append({"reward_orig": float(rewards[a].mean()), "reward_views": float(rewards[~a].mean())
                    if bool((~a).any()) else float("nan")})
    return policy, log


# -- evaluation ------------------------------------------------------------------------------------
def evaluate(policy: LinearPolicy | None, cfg: LinearConfig) -> list[dict[str, Any]]:
    """One record per test item, in `evaluation.item_record`'s format: greedy answers on the
    original, its null (blank) copy and its shuffle and mask views, each perceived once with
    the test seed (so every arm sees the same perceptions). ``None`` evaluates the SFT start."""
    policy = policy or LinearPolicy(cfg)
    rng = np.random.default_rng(cfg.test_seed + 1)
    records = []
    with torch.no_grad():
        for i, clip in enumerate(test_set(cfg)):
            names = ("orig", "blank", "shuffle", "mask")
            phi = torch.tensor(np.array([features(view(clip, n, rng), rng, cfg.order_noise) for n in names]))
            probs = policy.log_probs(phi, torch.full((len(names),), QTYPES.index(clip.qtype))).exp()
            answers = _answers(probs.argmax(1)).tolist()
            conf = probs.numpy()  # yes and no are options 0 and 1, as in the item's answer
            item = SimpleNamespace(item_id=f"linear-{i}", qtype=clip.qtype, answer=clip.gold, hard=clip.hard,
                                   source="linear")
            views = [(label(clip, n, cfg.mask_without_x), answers[j], conf[j]) for j, n in enumerate(names[2:], start=2)]
            record = item_record(item, answers[0], conf[0], answers[1], views)
            # Macro accuracy over §A.5's three groups (see the module docstring).
            record["group"] = clip.qtype if clip.qtype == "static" else ("temporal_hard" if clip.hard else "temporal")
            record["temporal"] = clip.qtype == "temporal"
            records.append(record)
    return records


def run(arms: Sequence[str], seeds: Sequence[int], cfg: LinearConfig) -> dict[str, Any]:
    """Every arm, and "sft", over ``seeds``: the test records of each seed, the learned weights
    of the first seed and the training rewards averaged over seeds (per 10 steps)."""
    out: dict[str, Any] = {"records": {}, "weights": {}, "curves": {}}
    for name in ["sft", *[a for a in arms if a != "sft"]]:
        records, curves = [], []
        for seed in seeds:
            policy, log = (None, []) if name == "sft" else train(name, cfg, seed)
            records.append(evaluate(policy, cfg))
            curves.append(log)
            if name not in out["weights"]:
                out["weights"][name] = (policy or LinearPolicy(cfg)).state()
        out["records"][name] = records
        out["curves"][name] = {k: _mean_curve(curves, k) for k in ("reward_orig", "reward_views")}
    return out


def _mean_curve(curves: list[list[dict[str, float]]], key: str, every: int = 10) -> list[float]:
    if not curves or not curves[0]:
        return []
    arr = np.array([[step[key] for step in c] for c in curves], dtype=float)
    if np.isnan(arr).all():  # GRPO has no view responses
        return []
    return [float(np.nanmean(arr[:, i:i + every])) for i in range(0, arr.shape[1], every)]
