"""ALGORITHMS.md §G.2: BayesJudge's generative model, its label stream and its functionals.

A stream of pairwise comparisons (A_i, B_i), each with human labels and one LLM-judge pair:

* verdict V_i ~ Cat(π), π ~ Dir(α_π), over {A, B, T} (T = tie, both a label and a latent class);
* human rater r of group g: y_ir | V_i=v ~ Cat(Θ_r[v,·]), Θ_r[v,·] ~ Dir(s_g m_g[v,·]); the group
  mean m_g is fixed (conjugate, the exact recursion's model) or pooled over the group's raters;
* LLM judge, joint pair model: (J^AB, J^BA) | V=v ~ Cat_9(Φ[v,·]), Φ[v,·] ~ Dir(φ_0), where J^AB
  maps "first" → A and J^BA maps "first" → B (content space); the factorised variant draws
  J^o | v ~ Cat(Φ_o[v,·]) independently for o ∈ {AB, BA};
* a set-valued label S ⊆ {A, B, T} has likelihood Σ_{y∈S} Θ_r[v,y]; a judge order whose answer
  parsed to no verdict is the set of all three answers for that order.

Every observation is encoded as an `Obs`: one Dirichlet family ("theta" for raters, "phi" for
the judge), the row's owner (a rater, or a judge order in the factorised variant) and the cells
the label allows. Inference modules (exact, smc, pyro_reference) read `EncodedStream` and
`PriorArrays` only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from troupe.platform.errors import ConfigError, DataError

VERDICTS = ("A", "B", "T")
A, B, T = 0, 1, 2
JUDGE_MODELS = ("joint", "factorised")
GROUP_MEANS = ("fixed", "pooled")
THETA, PHI = 0, 1  # the two Dirichlet families an observation can hit


def cell(ab: int, ba: int) -> int:
    """Index of the content-space judge pair (J^AB, J^BA) among Φ's 9 cells."""
    return 3 * ab + ba


FIRST_CONSISTENT = cell(A, B)  # the judge said "first" in both orders
SECOND_CONSISTENT = cell(B, A)  # the judge said "second" in both orders
CONSISTENT_CELLS = (cell(A, A), cell(B, B), cell(T, T))


# -- the label stream --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class HumanLabel:
    """One rater's label on one comparison: a verdict ("A", "B", "T") or a set of them ({"A", "T"})."""

    rater: str
    label: str | frozenset[str]
    group: str | None = None


@dataclasses.dataclass(frozen=True)
class JudgePair:
    """The LLM judge's two calls, in content space; None for an order whose answer parsed to no verdict."""

    ab: str | None
    ba: str | None


@dataclasses.dataclass(frozen=True)
class Comparison:
    """One arrival on the stream. An id seen before carries late labels for that comparison."""

    id: str
    labels: tuple[HumanLabel, ...] = ()
    judge: JudgePair | None = None
    responses: tuple[str, str] | None = None


def judge_pair_from_positions(ab_answer: str | None, ba_answer: str | None) -> JudgePair:
    """Map position answers ("first", "second", "tie") of the two presentation orders to content space.

    Order AB shows A first; order BA shows B first, so its "first" means B (§G.2)."""
    maps = ({"first": "A", "second": "B", "tie": "T"}, {"first": "B", "second": "A", "tie": "T"})
    out = []
    for answer, table in zip((ab_answer, ba_answer), maps, strict=True):
        if answer is not None and answer not in table:
            raise DataError(f"judge answer {answer!r}: expected 'first', 'second', 'tie' or None (unparsed)")
        out.append(None if answer is None else table[answer])
    return JudgePair(*out)


@dataclasses.dataclass(frozen=True)
class Obs:
    """One encoded observation: the Dirichlet family, the row owner and the cells the label allows."""

    family: int
    owner: int
    cells: tuple[int, ...]

    @property
    def is_set(self) -> bool:
        return len(self.cells) > 1


@dataclasses.dataclass(frozen=True)
class Event:
    """One encoded arrival: the item (comparison index), its observations, and whether it is late."""

    item: int
    obs: tuple[Obs, ...]
    late: bool


@dataclasses.dataclass
class EncodedStream:
    """A validated stream: events in arrival order over integer items, raters and groups."""

    items: list[str]
    raters: list[str]
    groups: list[str]
    rater_group: np.ndarray  # (R,) the group index of each rater
    events: list[Event]
    judge_model: str
    counts: dict[str, int]  # what was skipped or coarsened, for the run report

    @property
    def n_items(self) -> int:
        return len(self.items)

    def by_item(self) -> list[tuple[Obs, ...]]:
        """Every item's observations with late labels folded in (the batch view; order-invariant)."""
        out: list[list[Obs]] = [[] for _ in self.items]
        for e in self.events:
            out[e.item].extend(e.obs)
        return [tuple(o) for o in out]


def _label_cells(label: str | Iterable[str], where: str) -> tuple[int, ...]:
    values = {label} if isinstance(label, str) else set(label)
    if not values:
        raise DataError(f"{where}: empty label set; give at least one of {VERDICTS} (all three = no information)")
    bad = sorted(str(v) for v in values if v not in VERDICTS)
    if bad:
        raise DataError(f"{where}: label {bad} is not one of {VERDICTS}; map it to A, B or T (tie) first")
    return tuple(sorted(VERDICTS.index(v) for v in values))


def encode_stream(
    comparisons: Iterable[Comparison], judge_model: str = "joint", require_groups: bool = True,
    roster: Sequence[tuple[str, str]] = (),
) -> EncodedStream:
    """Validate a stream and encode it (§G.1). Bad input raises DataError naming the comparison and the fix.

    A repeated id is a late arrival for that comparison; it must carry the same responses (or none).
    A rater labels a comparison at most once, and the judge pair arrives at most once: the model's
    one-step predictive (§G.3a) is a product of Dirichlet means only when no row is hit twice.
    A judge pair with both orders unparsed is skipped and counted; one unparsed order is coarsened to a set.
    ``roster``: (rater, group) pairs registered first, in this order, so that a stream encoded as it
    grows keeps its raters' and groups' indices (and the filter's arrays their shapes).
    """
    if judge_model not in JUDGE_MODELS:
        raise ConfigError(f"judge.judge_model={judge_model!r}: expected one of {JUDGE_MODELS}")
    items: dict[str, int] = {}
    responses: dict[str, tuple[str, str] | None] = {}
    seen_raters: dict[int, set[str]] = {}
    judged: set[int] = set()
    raters: dict[str, int] = {}
    groups: dict[str, int] = {}
    rater_group: list[int] = []
    events: list[Event] = []
    counts = {"late_events": 0, "set_labels": 0, "judge_half_unparsed": 0, "judge_unparsed_skipped": 0}
    for rater, group in roster:
        if rater in raters:
            raise DataError(f"roster: rater {rater!r} is listed twice")
        groups.setdefault(group, len(groups))
        raters[rater] = len(raters)
        rater_group.append(groups[group])
    for comp in comparisons:
        cid = str(comp.id)
        late = cid in items
        if late:
            prev = responses[cid]
            if comp.responses is not None and prev is not None and tuple(comp.responses) != tuple(prev):
                raise DataError(
                    f"comparison {cid!r} repeats an id with different responses; give each distinct pair its own id"
                )
            if prev is None:
                responses[cid] = comp.responses
            counts["late_events"] += 1
        else:
            items[cid] = len(items)
            responses[cid] = comp.responses
            seen_raters[items[cid]] = set()
        i = items[cid]
        obs: list[Obs] = []
        for lab in comp.labels:
            where = f"comparison {cid!r}, rater {lab.rater!r}"
            cells = _label_cells(lab.label, where)
            if lab.rater in seen_raters[i]:
                raise DataError(f"{where}: this rater labelled the comparison twice; keep one label per rater")
            seen_raters[i].add(lab.rater)
            if lab.rater not in raters:
                if lab.group is None and require_groups:
                    raise DataError(
                        f"{where}: rater has no group and groups are required; set HumanLabel.group "
                        "(e.g. 'expert', 'crowd') or pass require_groups=False"
                    )
                g = lab.group if lab.group is not None else "default"
                groups.setdefault(g, len(groups))
                raters[lab.rater] = len(raters)
                rater_group.append(groups[g])
            elif lab.group is not None and groups.get(lab.group) != rater_group[raters[lab.rater]]:
                raise DataError(f"{where}: rater is in group {lab.group!r} here and another group before")
            counts["set_labels"] += len(cells) > 1
            obs.append(Obs(THETA, raters[lab.rater], cells))
        if comp.judge is not None:
            if i in judged:
                raise DataError(f"comparison {cid!r}: a second judge pair; the judge's two calls arrive once")
            judged.add(i)
            sides = []
            for order, v in (("AB", comp.judge.ab), ("BA", comp.judge.ba)):
                sides.append((0, 1, 2) if v is None else _label_cells(v, f"comparison {cid!r}, judge order {order}"))
            unparsed = (comp.judge.ab is None) + (comp.judge.ba is None)
            if unparsed == 2:
                counts["judge_unparsed_skipped"] += 1
            else:
                counts["judge_half_unparsed"] += unparsed == 1
                if judge_model == "joint":
                    obs.append(Obs(PHI, 0, tuple(cell(x, y) for x in sides[0] for y in sides[1])))
                else:
                    obs.extend(Obs(PHI, o, s) for o, s in enumerate(sides) if len(s) < 3)
        events.append(Event(i, tuple(obs), late))
    return EncodedStream(
        items=list(items),
        raters=list(raters),
        groups=list(groups),
        rater_group=np.asarray(rater_group, dtype=np.int64),
        events=events,
        judge_model=judge_model,
        counts=counts,
    )


# -- the prior ---------------------------------------------------------------------------------------
def diag_rows(k: int, diag: float, strength: float) -> np.ndarray:
    """Dirichlet rows s·m with m[v,v] = diag and the rest spread evenly (§G.2's diagonal-heavy prior)."""
    m = np.full((3, k), (1.0 - diag) / (k - 1))
    for v in range(3):
        m[v, cell(v, v) if k == 9 else v] = diag
    return strength * m


@dataclasses.dataclass(frozen=True)
class JudgePrior:
    """§G.2's hyperparameters; defaults are §G.2's where it gives them.

    group_means="fixed" keeps m_g at its prior mean (the conjugate model: exact recursion, Pyro's
    reference); "pooled" treats m_g as a shared Dirichlet with prior Dir(hyper_strength·m0) whose
    posterior mean pools the counts of the group's raters (group-level shrinkage).
    """

    alpha_pi: tuple[float, float, float] = (2.0, 2.0, 1.0)
    group_strength: float = 10.0  # s_g
    group_diag: float = 0.7  # m_g[v,v]
    group_mean: Mapping[str, Sequence[Sequence[float]]] | None = None  # per-group m_g overriding group_diag
    group_means: str = "fixed"
    hyper_strength: float = 3.0  # the Dir(1,1,1) hyperprior when m0 is uniform
    phi_strength: float = 9.0  # total concentration of each Φ row (joint) or Φ_o row (factorised: /3)
    phi_diag: float = 0.5  # mass of the consistent cell (v,v) in Φ[v,·]; of cell v in Φ_o[v,·]

    def __post_init__(self) -> None:
        if len(self.alpha_pi) != 3 or min(self.alpha_pi) <= 0:
            raise ConfigError(f"judge.alpha_pi={self.alpha_pi}: expected three positive pseudo-counts")
        for name in ("group_strength", "hyper_strength", "phi_strength"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"judge.{name}={getattr(self, name)}: expected > 0")
        for name in ("group_diag", "phi_diag"):
            if not 0 < getattr(self, name) < 1:
                raise ConfigError(f"judge.{name}={getattr(self, name)}: expected a probability in (0, 1)")
        if self.group_means not in GROUP_MEANS:
            raise ConfigError(f"judge.group_means={self.group_means!r}: expected one of {GROUP_MEANS}")


@dataclasses.dataclass
class PriorArrays:
    """The prior as arrays over one stream's raters and groups."""

    alpha_pi: np.ndarray  # (3,)
    group_m: np.ndarray  # (G, 3, 3) m_g
    group_s: np.ndarray  # (G,) s_g
    rater_group: np.ndarray  # (R,)
    alpha_phi: np.ndarray  # (O, 3, K): O=1, K=9 joint; O=2, K=3 factorised
    pooled: bool
    hyper_strength: float

    @property
    def alpha_theta(self) -> np.ndarray:
        """(R, 3, 3) the fixed-mean prior rows s_g m_g."""
        return self.group_s[self.rater_group, None, None] * self.group_m[self.rater_group]

    @property
    def n_raters(self) -> int:
        return len(self.rater_group)


def prior_arrays(prior: JudgePrior, stream: EncodedStream) -> PriorArrays:
    m = []
    for g in stream.groups:
        if prior.group_mean is not None and g in prior.group_mean:
            mg = np.asarray(prior.group_mean[g], dtype=float)
            if mg.shape != (3, 3) or (mg <= 0).any() or not np.allclose(mg.sum(-1), 1):
                raise ConfigError(f"judge.group_mean[{g!r}]: expected a 3x3 matrix of positive rows summing to 1")
        else:
            mg = diag_rows(3, prior.group_diag, 1.0)
        m.append(mg)
    if stream.judge_model == "joint":
        alpha_phi = diag_rows(9, prior.phi_diag, prior.phi_strength)[None]
    else:
        alpha_phi = np.stack([diag_rows(3, prior.phi_diag, prior.phi_strength / 3)] * 2)
    return PriorArrays(
        alpha_pi=np.asarray(prior.alpha_pi, dtype=float),
        group_m=np.asarray(m, dtype=float).reshape(-1, 3, 3),
        group_s=np.full(len(stream.groups), float(prior.group_strength)),
        rater_group=stream.rater_group.copy(),
        alpha_phi=alpha_phi,
        pooled=prior.group_means == "pooled",
        hyper_strength=prior.hyper_strength,
    )


# -- fixed-parameter likelihood (§G.3a's last line) -------------------------------------------------
@dataclasses.dataclass
class Params:
    """One draw of the continuous parameters: π (3,), Θ (R,3,3), Φ (O,3,K)."""

    pi: np.ndarray
    theta: np.ndarray
    phi: np.ndarray


def obs_likelihood(params: Params, obs: Obs) -> np.ndarray:
    """(3,) P(obs | V=v): the sum over the label's cells of its row's probabilities."""
    rows = params.theta[obs.owner] if obs.family == THETA else params.phi[obs.owner]
    return rows[:, list(obs.cells)].sum(-1)


def log_likelihood_matrix(params: Params, items: Sequence[Sequence[Obs]]) -> np.ndarray:
    """(n, 3) log P(obs_i | V_i=v) for fixed parameters."""
    out = np.zeros((len(items), 3))
    for i, obs in enumerate(items):
        for o in obs:
            out[i] += np.log(obs_likelihood(params, o))
    return out


def verdict_posterior_fixed(params: Params, items: Sequence[Sequence[Obs]]) -> np.ndarray:
    """(n, 3) P(V_i=v | obs_i) ∝ π_v Π Θ · Φ for fixed parameters (§G.3a)."""
    logp = np.log(params.pi) + log_likelihood_matrix(params, items)
    logp -= logp.max(-1, keepdims=True)
    p = np.exp(logp)
    return p / p.sum(-1, keepdims=True)


# -- functionals (§G.2's order-bias functionals, §G.5's group signatures) ----------------------------
def joint_phi(phi: np.ndarray) -> np.ndarray:
    """(..., 3, 9) the joint pair model from Φ (..., 1, 3, 9) or the factorised Φ_o (..., 2, 3, 3)."""
    if phi.shape[-3:] == (1, 3, 9):
        return phi[..., 0, :, :]
    if phi.shape[-3:] == (2, 3, 3):
        ab, ba = phi[..., 0, :, :], phi[..., 1, :, :]
        return (ab[..., :, None] * ba[..., None, :]).reshape(*ab.shape[:-1], 9)
    raise ValueError(f"phi of shape {phi.shape}: expected (..., 1, 3, 9) or (..., 2, 3, 3)")


def beta_ord(phi: np.ndarray) -> np.ndarray:
    """(..., 3) β_ord(v) = Φ[v,(A,B)] − Φ[v,(B,A)] (§G.2)."""
    j = joint_phi(phi)
    return j[..., FIRST_CONSISTENT] - j[..., SECOND_CONSISTENT]


def beta_bar(pi: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """β̄_ord = Σ_v π_v β_ord(v) (§G.2)."""
    return (pi * beta_ord(phi)).sum(-1)


def inconsistency(pi: np.ndarray, phi: np.ndarray) -> np.ndarray:
    """κ = 1 − Σ_v π_v (Φ[v,(A,A)] + Φ[v,(B,B)] + Φ[v,(T,T)]) (§G.2)."""
    j = joint_phi(phi)
    return 1.0 - (pi * j[..., list(CONSISTENT_CELLS)].sum(-1)).sum(-1)


def order_effect(beta_bar_samples: np.ndarray, level: float = 0.05) -> dict[str, float | bool]:
    """§G.2's detection rule: P(β̄_ord > 0 | D) above 1 − level/2 or below level/2, and the 95% interval."""
    p = float((np.asarray(beta_bar_samples) > 0).mean())
    lo, hi = np.quantile(beta_bar_samples, [level / 2, 1 - level / 2])
    return {"p_positive": p, "detected": bool(p > 1 - level / 2 or p < level / 2), "lo": float(lo), "hi": float(hi)}


def group_signatures(pi: np.ndarray, theta: np.ndarray, rater_group: np.ndarray, n_groups: int) -> dict[str, np.ndarray]:
    """Per group: tie propensity Σ_v π_v Θ_r[v,T] and accuracy Σ_v π_v Θ_r[v,v], averaged over its raters.

    pi (..., 3), theta (..., R, 3, 3) → arrays (..., G), one value per draw (§G.5)."""
    tie = (pi[..., None, :] * theta[..., :, :, T]).sum(-1)  # (..., R)
    acc = (pi[..., None, :] * np.diagonal(theta, axis1=-2, axis2=-1)).sum(-1)
    member = np.eye(n_groups)[rater_group]  # (R, G)
    size = np.maximum(member.sum(0), 1)
    return {"tie_propensity": tie @ member / size, "accuracy": acc @ member / size}


def sample_params(prior: PriorArrays, rng: np.random.Generator) -> Params:
    """One draw of (π, Θ, Φ) from the fixed-mean prior (§G.2)."""
    return Params(
        pi=rng.dirichlet(prior.alpha_pi),
        theta=np.stack([[rng.dirichlet(a) for a in rows] for rows in prior.alpha_theta]).reshape(-1, 3, 3),
        phi=np.stack([[rng.dirichlet(a) for a in rows] for rows in prior.alpha_phi]),
    )


def swap_ab(comparisons: Iterable[Comparison]) -> list[Comparison]:
    """Relabel A↔B in every label and judge verdict, keeping the orders (§G.7 test 6: β_ord → −β_ord)."""
    sw = {"A": "B", "B": "A", "T": "T"}

    def lab(x):
        return sw[x] if isinstance(x, str) else frozenset(sw[y] for y in x)

    out = []
    for c in comparisons:
        judge = None if c.judge is None else JudgePair(*(None if v is None else sw[v] for v in (c.judge.ab, c.judge.ba)))
        out.append(
            dataclasses.replace(
                c, labels=tuple(dataclasses.replace(h, label=lab(h.label)) for h in c.labels), judge=judge
            )
        )
    return out
