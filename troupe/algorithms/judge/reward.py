"""BayesJudge as a pairwise reward: P(completion ≻ reference) from the LLM judge's two calls and the row's labels.

Each row is one comparison, A = the policy's completion, B = the row's reference response. The
judge (`troupe.actors.judge.LLMJudge`) is called in both presentation orders and gives a verdict
distribution per order; the row's human labels (``row["labels"]``) are added as rater labels.
The reward is the BayesJudge posterior of V = A for that comparison under the model's prior
(§G.2), with the parameters integrated out exactly (the §G.3a recursion on one item):

* the judge's answer J^o is a draw from its verdict distribution q_o, so the posterior is averaged
  over the answers it could give (Jeffrey's rule, the Rao–Blackwellised value of sampling the
  judge): P(V=A | D) = Σ_{a,b} q_AB(a) q_BA(b) P(V=A | J^AB=a, J^BA=b, labels);
* ``estimate="lower"`` reports instead the ``quantile`` of p_A(θ) = P(V=A | obs, θ), the
  fixed-parameter posterior (§G.3a's last line), over θ drawn from the posterior of the
  parameters given the same observations: a credible lower bound that is low when the verdict
  rests on parameters the data leave uncertain. Its mean over θ is the ``mean`` estimate.

An order whose answer parsed to no verdict enters as the set of all three answers (no
information, as in `encode_stream`); its count is the row's ``judge_unparsed`` extra.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from troupe.actors.judge import JudgeCall, LLMJudge
from troupe.actors.scorer import as_batch
from troupe.algorithms.judge.exact import ExactRecursion
from troupe.algorithms.judge.model import (
    PHI,
    VERDICTS,
    A,
    Comparison,
    HumanLabel,
    JudgePair,
    JudgePrior,
    Obs,
    encode_stream,
    prior_arrays,
)
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError, DataError

ESTIMATES = ("mean", "lower")


def judge_pair(call: JudgeCall) -> JudgePair:
    """The most likely verdict of each order as a `JudgePair` (None where the answer was unparsed)."""
    return JudgePair(*(None if q is None else VERDICTS[int(np.argmax(q))] for q in (call.ab, call.ba)))


def answer_pairs(call: JudgeCall) -> list[tuple[float, JudgePair | None]]:
    """Every answer pair the judge could give, weighted q_AB(a)·q_BA(b); an unparsed order is one
    None answer of weight 1, and two unparsed orders are no judge observation at all."""
    sides = [[(1.0, None)] if q is None else [(float(q[k]), VERDICTS[k]) for k in range(3) if q[k] > 0]
             for q in (call.ab, call.ba)]
    return [(wa * wb, None if a is None and b is None else JudgePair(a, b)) for wa, a in sides[0] for wb, b in sides[1]]


def human_labels(raw: Any, where: str) -> tuple[HumanLabel, ...]:
    """A row's labels, each ``{"rater", "label", "group"?}`` with label A (the completion), B (the
    reference), T or a list of them (a set-valued label), as `HumanLabel`s."""
    if raw is None:
        return ()
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise DataError(f"{where}: labels must be a list of {{'rater', 'label', 'group'}} dicts, got {type(raw).__name__}")
    out = []
    for k, lab in enumerate(raw):
        if not isinstance(lab, Mapping) or "rater" not in lab or "label" not in lab:
            raise DataError(f"{where}: label {k} is {lab!r}; expected a dict with 'rater' and 'label' (A, B, T)")
        value = lab["label"]
        out.append(HumanLabel(str(lab["rater"]), value if isinstance(value, str) else frozenset(value), lab.get("group")))
    return tuple(out)


def one_item_posterior(pair: JudgePair | None, labels: Sequence[HumanLabel], prior: JudgePrior,
                       judge_model: str = "joint", where: str = "row") -> tuple[ExactRecursion, tuple[Obs, ...]]:
    """The exact posterior (§G.3a) of one comparison with this judge pair and these labels, and its observations."""
    try:
        stream = encode_stream([Comparison(where, tuple(labels), pair)], judge_model, require_groups=False)
    except DataError as e:
        raise DataError(f"{where}: {e}") from e
    rec = ExactRecursion(prior_arrays(prior, stream))
    obs = stream.events[0].obs
    rec.update(obs)
    return rec, obs


def fixed_posteriors(draws: Mapping[str, np.ndarray], obs: Sequence[Obs]) -> np.ndarray:
    """(S, 3) P(V=v | obs, θ_s) ∝ π_v Π Θ · Φ for each parameter draw θ_s (§G.3a, fixed parameters)."""
    logp = np.log(draws["pi"])
    for o in obs:
        rows = (draws["phi"] if o.family == PHI else draws["theta"])[:, o.owner]  # (S, 3, K)
        logp = logp + np.log(rows[:, :, list(o.cells)].sum(-1))
    logp -= logp.max(-1, keepdims=True)
    p = np.exp(logp)
    return p / p.sum(-1, keepdims=True)


def weighted_quantile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The smallest value whose cumulative weight reaches ``q`` of the total (the inverse CDF)."""
    order = np.argsort(values, kind="stable")
    cum = np.cumsum(weights[order])
    return float(values[order][min(int(np.searchsorted(cum, q * cum[-1])), len(order) - 1)])


@dataclasses.dataclass
class PreferencePosterior:
    """P(completion ≻ reference): the posterior mean and, when asked for, a lower credible bound."""

    mean: float
    lower: float | None


def preference_posterior(call: JudgeCall, labels: Sequence[HumanLabel], prior: JudgePrior, judge_model: str = "joint",
                         quantile: float | None = None, draws: int = 256, rng: np.random.Generator | None = None,
                         where: str = "row") -> PreferencePosterior:
    """The BayesJudge posterior of V = A (the completion) for one comparison, averaged over the
    judge's answer distributions; with ``quantile``, also that quantile of p_A(θ) over ``draws``
    draws of θ per answer pair from its exact parameter posterior."""
    mean, values, weights = 0.0, [], []
    for w, pair in answer_pairs(call):
        rec, obs = one_item_posterior(pair, labels, prior, judge_model, where)
        mean += w * float(rec.marginals()[0, A])
        if quantile is not None:
            values.append(fixed_posteriors(rec.sample(draws, rng), obs)[:, A])
            weights.append(np.full(draws, w / draws))
    lower = None if quantile is None else weighted_quantile(np.concatenate(values), np.concatenate(weights), quantile)
    return PreferencePosterior(mean, lower)


def row_seed(seed: int, *texts: str) -> int:
    """A seed of the row's content: a row's draws do not depend on the batch it is scored in."""
    h = hashlib.blake2b("\x1f".join([str(seed), *texts]).encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


class JudgeReward:
    """The ``"reward"`` role with ``reward.kind=judge``: an `LLMJudge` and the BayesJudge posterior per row."""

    def __init__(self, path: str, estimate: str = "mean", quantile: float = 0.1, draws: int = 256,
                 reference_key: str = "reference", labels_key: str = "labels", judge_model: str = "joint",
                 prior: Mapping[str, Any] | None = None, backend: str = "hf", dtype: str = "float32",
                 device: str = "cpu", batch_size: int = 16, min_mass: float = 0.5, template: str | None = None,
                 seed: int = 0) -> None:
        if estimate not in ESTIMATES:
            raise ConfigError(f"reward.judge_estimate={estimate!r}: expected one of {ESTIMATES}")
        self.prior = judge_prior(prior)
        self.estimate, self.quantile, self.draws = estimate, quantile, draws
        self.reference_key, self.labels_key, self.judge_model = reference_key, labels_key, judge_model
        self.seed = seed
        self.judge = LLMJudge(path, backend=backend, dtype=dtype, device=device, batch_size=batch_size,
                              min_mass=min_mass, template=template, seed=seed)

    def references(self, batch: Batch) -> list[str]:
        out = []
        for i, row in enumerate(batch["row"]):
            if self.reference_key not in row:
                raise DataError(f"judge reward row {i}: no {self.reference_key!r} (the reference response the "
                                f"completion is compared with); give rows one or set reward.judge_reference")
            out.append(str(row[self.reference_key]))
        return out

    def score(self, batch: Batch | list[Any]) -> dict[str, Any]:
        """``{"rewards", "errors": [], "extras"}`` as `RuleReward.score`; extras per row: the
        posterior mean, the lower bound (``estimate="lower"``), the judge's P(A) in each order
        (content space; NaN where unparsed) and how many of its two answers were unparsed."""
        batch = as_batch(batch)
        refs = self.references(batch)
        calls = self.judge.compare(batch["prompt"], batch["completion"], refs)
        quantile = self.quantile if self.estimate == "lower" else None
        rewards, extras = [], {"judge_mean": [], "judge_ab": [], "judge_ba": [], "judge_unparsed": []}
        if quantile is not None:
            extras["judge_lower"] = []
        for i, (call, row, prompt, completion, ref) in enumerate(
                zip(calls, batch["row"], batch["prompt"], batch["completion"], refs, strict=True)):
            where = f"judge reward row {i}"
            labels = human_labels(row.get(self.labels_key), where)
            rng = np.random.default_rng(row_seed(self.seed, prompt, completion, ref))
            post = preference_posterior(call, labels, self.prior, self.judge_model, quantile, self.draws, rng, where)
            rewards.append(post.mean if quantile is None else post.lower)
            extras["judge_mean"].append(post.mean)
            if quantile is not None:
                extras["judge_lower"].append(post.lower)
            extras["judge_ab"].append(np.nan if call.ab is None else float(call.ab[A]))
            extras["judge_ba"].append(np.nan if call.ba is None else float(call.ba[A]))
            extras["judge_unparsed"].append(float(call.unparsed))
        return {"rewards": torch.tensor(rewards, dtype=torch.float32), "errors": [],
                "extras": {k: torch.tensor(v, dtype=torch.float32) for k, v in extras.items()}}

    def stats(self) -> dict[str, float]:
        """The judge's counts: engine calls, questions, unparsed answers, seconds."""
        return self.judge.stats()


def judge_prior(values: Mapping[str, Any] | None) -> JudgePrior:
    """A `JudgePrior` from config values (``reward.judge_prior``), each key one of its fields."""
    values = dict(values or {})
    names = {f.name for f in dataclasses.fields(JudgePrior)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(f"reward.judge_prior: unknown keys {unknown}; expected some of {sorted(names)}")
    if "alpha_pi" in values:
        values["alpha_pi"] = tuple(float(x) for x in values["alpha_pi"])
    prior = JudgePrior(**values)
    if prior.group_means != "fixed":
        raise ConfigError("reward.judge_prior.group_means must be 'fixed': each row's posterior is exact, and pooled "
                          "group means are not conjugate")
    return prior


def judge_reward_kwargs(reward: Any, seed: int) -> dict[str, Any]:
    """`JudgeReward`'s arguments from a ``reward`` config section with ``kind=judge``."""
    r = reward
    return {"path": r.path, "estimate": r.judge_estimate, "quantile": r.judge_quantile, "draws": r.judge_draws,
            "reference_key": r.judge_reference, "labels_key": r.judge_labels, "judge_model": r.judge_model,
            "prior": dict(r.judge_prior), "backend": r.judge_backend, "dtype": r.dtype, "device": r.device,
            "batch_size": r.batch_size, "min_mass": r.judge_min_mass, "template": r.judge_template, "seed": seed}
