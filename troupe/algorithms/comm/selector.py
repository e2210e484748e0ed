"""ALGORITHMS.md §D.2–D.4: the inference-time communication selector, its baselines and metrics.

Generic over the feature matrix z [n, d] and the actions (columns of the outcome and tax
matrices [n, A]): the same code serves the synthetic benchmark and features measured from
real agents. Outcomes are the logged counterfactual successes (every step forked and run
under every action), or any per-step success probabilities a caller knows.

* `fit_outcome_models`: per action a calibrated q̂_c(z) ≈ P(S=1 | c, z);
* `decide`: c* = argmax_c q̂_c(z) − λ tax(c), ties to the cheaper action;
* `sweep`: the accuracy–mean-cost frontier over λ; `frontier_area` on a normalised cost axis;
* baselines (§D.3): `fixed_points`, `random_matched_cost`, `threshold_rule`,
  `sender_relative_rule`, the oracle (`decide` on the logged outcomes themselves);
* `regret_at_matched_cost`, `dominates`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np


# -- outcome models -----------------------------------------------------------------------------
@dataclasses.dataclass
class OutcomeModels:
    """One calibrated classifier per action (or the constant rate of an action whose logged
    outcomes never vary)."""

    models: list

    def predict(self, z: np.ndarray) -> np.ndarray:
        """[n, A] calibrated success probabilities q̂_c(z)."""
        z = np.asarray(z, dtype=float)
        cols = [np.full(len(z), m) if isinstance(m, float) else m.predict_proba(z)[:, 1] for m in self.models]
        return np.stack(cols, axis=1)


def fit_outcome_models(z: np.ndarray, success: np.ndarray, degree: int = 2, folds: int = 5,
                       seed: int = 0) -> OutcomeModels:
    """Fit q̂_c(z) for every column c of ``success`` [n, A]: logistic regression on the
    standardised features (with their products up to ``degree``, since P_MSG is bilinear in
    q_L and q_M), then isotonic calibration.

    Calibration is cross-fitted (`CalibratedClassifierCV`, ``folds`` shuffled folds): each
    fold's logistic model is calibrated on the steps it did not see, and the folds' calibrated
    models are averaged. Every logged step thus serves both fits, where a single held-out split
    would leave isotonic regression, which overfits small sets, a fifth of the data."""
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import PolynomialFeatures, StandardScaler

    z = np.asarray(z, dtype=float)
    success = np.asarray(success).astype(int)
    if success.ndim != 2 or success.shape[0] != z.shape[0]:
        raise ValueError(f"success has shape {success.shape}: expected [n, actions] with n = {z.shape[0]} "
                         "(the rows of z)")
    models: list = []
    for c in range(success.shape[1]):
        y = success[:, c]
        if y.min() == y.max() or min(y.sum(), len(y) - y.sum()) < folds:
            models.append(float(y.mean()))  # too few of one outcome to fit or calibrate
            continue
        base = make_pipeline(PolynomialFeatures(degree, include_bias=False), StandardScaler(),
                             LogisticRegression(max_iter=1000))
        cv = StratifiedKFold(folds, shuffle=True, random_state=seed)
        models.append(CalibratedClassifierCV(base, method="isotonic", cv=cv).fit(z, y))
    return OutcomeModels(models)


# -- decisions and their evaluation ---------------------------------------------------------------
def decide(q: np.ndarray, taxes: np.ndarray, lam: float) -> np.ndarray:
    """c* = argmax_c q_c − λ tax_c per step; among equal scores the cheapest action."""
    q = np.asarray(q, dtype=float)
    taxes = np.broadcast_to(np.asarray(taxes, dtype=float), q.shape)
    score = q - lam * taxes if lam > 0 else q  # λ = 0 must not turn 0 · inf into nan
    best = score.max(1, keepdims=True)
    best_rows = score >= best - 1e-12
    # the best-scoring actions first, then the cheapest of them (a tax may be inf)
    return np.lexsort((taxes, ~best_rows), axis=1)[:, 0]


def evaluate(choice: np.ndarray, outcomes: np.ndarray, taxes: np.ndarray) -> tuple[float, float]:
    """(accuracy, mean cost) of a per-step choice of action."""
    rows = np.arange(len(choice))
    taxes = np.broadcast_to(np.asarray(taxes, dtype=float), np.shape(outcomes))
    return float(np.asarray(outcomes, dtype=float)[rows, choice].mean()), float(taxes[rows, choice].mean())


@dataclasses.dataclass
class Frontier:
    """Accuracy and mean cost of a family of policies, one per swept value (λ or τ)."""

    values: np.ndarray
    accuracy: np.ndarray
    cost: np.ndarray

    def to_dict(self) -> dict[str, list[float]]:
        return {"values": self.values.tolist(), "accuracy": self.accuracy.tolist(), "cost": self.cost.tolist()}


def sweep(policy: Callable[[float], np.ndarray], values: Sequence[float], outcomes: np.ndarray,
          taxes: np.ndarray) -> Frontier:
    """Evaluate ``policy(v)`` (a per-step choice) for every v in ``values``."""
    points = [evaluate(policy(v), outcomes, taxes) for v in values]
    return Frontier(np.asarray(values, dtype=float), np.array([a for a, _ in points]),
                    np.array([c for _, c in points]))


def selector_frontier(q_hat: np.ndarray, outcomes: np.ndarray, taxes: np.ndarray,
                      lams: Sequence[float]) -> Frontier:
    """The selector's frontier: `decide` on the predicted q̂ at each λ, scored on ``outcomes``."""
    return sweep(lambda lam: decide(q_hat, taxes, lam), lams, outcomes, taxes)


def oracle_frontier(oracle_outcomes: np.ndarray, taxes: np.ndarray, lams: Sequence[float],
                    outcomes: np.ndarray | None = None) -> Frontier:
    """The per-instance oracle at each λ: the best action per step given its logged outcomes
    (`decide` on ``oracle_outcomes`` themselves), scored on ``outcomes`` (default: the same)."""
    scored = oracle_outcomes if outcomes is None else outcomes
    return sweep(lambda lam: decide(oracle_outcomes, taxes, lam), lams, scored, taxes)


# -- the frontier as a curve ------------------------------------------------------------------------
def envelope(cost: np.ndarray, accuracy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The vertices of the achievable frontier: the upper concave hull of the points, cut where
    accuracy stops rising. Mixing two policies per step reaches every point between them, and
    spending less is always possible."""
    order = np.lexsort((-np.asarray(accuracy), np.asarray(cost)))
    pts = [(float(cost[i]), float(accuracy[i])) for i in order]
    hull: list[tuple[float, float]] = []
    for x, y in pts:
        if hull and x == hull[-1][0]:
            continue  # same cost, lower accuracy (sorted)
        while len(hull) >= 2 and ((hull[-1][0] - hull[-2][0]) * (y - hull[-2][1])
                                  - (hull[-1][1] - hull[-2][1]) * (x - hull[-2][0])) >= 0:
            hull.pop()  # the last vertex lies on or under the chord: not on the upper hull
        hull.append((x, y))
    top = int(np.argmax([y for _, y in hull]))
    xs, ys = zip(*hull[: top + 1], strict=True)
    return np.array(xs), np.array(ys)


def accuracy_at(cost: np.ndarray, accuracy: np.ndarray, at: np.ndarray | float) -> np.ndarray:
    """The frontier's accuracy at mean cost ``at`` (nan below its cheapest point)."""
    xs, ys = envelope(cost, accuracy)
    at = np.asarray(at, dtype=float)
    return np.where(at < xs[0] - 1e-12, np.nan, np.interp(at, xs, ys))


def frontier_area(cost: np.ndarray, accuracy: np.ndarray, cost_max: float) -> float:
    """Area under the frontier on the normalised cost axis x = cost / cost_max ∈ [0, 1]
    (0 where the frontier has no point yet)."""
    xs, ys = envelope(np.asarray(cost) / cost_max, accuracy)
    if xs[0] >= 1.0:
        return 0.0
    grid = np.concatenate([[xs[0]], xs[(xs > xs[0]) & (xs < 1)], [1.0]])
    vals = np.interp(grid, xs, ys)  # flat at ys[-1] past the last vertex; linear between vertices
    return float(np.sum((grid[1:] - grid[:-1]) * (vals[1:] + vals[:-1]) / 2))


def regret_at_matched_cost(frontier: Frontier, oracle: Frontier) -> np.ndarray:
    """The oracle's accuracy at each of ``frontier``'s mean costs minus ``frontier``'s accuracy."""
    return accuracy_at(oracle.cost, oracle.accuracy, frontier.cost) - frontier.accuracy


def dominates(frontier: Frontier, cost: np.ndarray | float, accuracy: np.ndarray | float,
              tol: float = 0.0) -> np.ndarray:
    """Whether ``frontier`` reaches at least ``accuracy`` − tol at mean cost ``cost`` (per point)."""
    at = accuracy_at(frontier.cost, frontier.accuracy, cost)
    return np.nan_to_num(at, nan=-np.inf) >= np.asarray(accuracy) - tol


# -- baselines ----------------------------------------------------------------------------------
def fixed_points(outcomes: np.ndarray, taxes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(accuracy, mean cost) of always taking each action: arrays over the actions."""
    n, actions = np.shape(outcomes)
    # through `evaluate`, so that a policy that picks one action everywhere scores exactly the same
    points = [evaluate(np.full(n, a), outcomes, taxes) for a in range(actions)]
    return np.array([a for a, _ in points]), np.array([c for _, c in points])


def random_matched_cost(outcomes: np.ndarray, taxes: np.ndarray, target_cost: float,
                        rng: np.random.Generator) -> np.ndarray:
    """A per-step random choice between fixed actions whose mean cost is ``target_cost``: the
    two fixed policies of the fixed points' frontier that bracket the cost, mixed in the
    proportion that matches it (the best a content-blind mixture reaches)."""
    acc, cost = fixed_points(outcomes, taxes)
    xs, ys = envelope(cost, acc)
    ids = [int(np.flatnonzero((cost == x) & (acc == y))[0]) for x, y in zip(xs, ys, strict=True)]
    n = np.shape(outcomes)[0]
    if target_cost <= xs[0]:
        return np.full(n, ids[0])
    if target_cost >= xs[-1]:
        return np.full(n, ids[-1])
    j = int(np.searchsorted(xs, target_cost))
    p_upper = (target_cost - xs[j - 1]) / (xs[j] - xs[j - 1])
    return np.where(rng.random(n) < p_upper, ids[j], ids[j - 1])


def threshold_rule(score: np.ndarray, tau: float, below: int, above: int) -> np.ndarray:
    """Action ``below`` where ``score`` < τ, else ``above`` (e.g. communicate when the
    executor's self-assessed sufficiency is low)."""
    return np.where(np.asarray(score) < tau, below, above)


def sender_relative_rule(m_sufficiency: np.ndarray, tau: float, send: int, otherwise: int) -> np.ndarray:
    """Send the message iff M judges it sufficient (its score >= τ): the sender-relative rule."""
    return np.where(np.asarray(m_sufficiency) >= tau, send, otherwise)


def baselines(outcomes: np.ndarray, taxes: np.ndarray, self_sufficiency: np.ndarray, m_confidence: np.ndarray,
              send: int, silent: int, at_costs: np.ndarray, rng: np.random.Generator,
              grid: int = 41) -> dict[str, Frontier]:
    """§D.3's rule baselines on logged steps: random at each of ``at_costs`` (a matched-cost
    mixture of fixed policies), a threshold on E's self-assessed sufficiency (``send`` below τ,
    else ``silent``) and the sender-relative rule (``send`` when M's confidence is at least τ),
    each τ swept over the quantiles of its score."""
    points = [evaluate(random_matched_cost(outcomes, taxes, c, rng), outcomes, taxes) for c in at_costs]
    random = Frontier(np.asarray(at_costs, dtype=float), np.array([a for a, _ in points]),
                      np.array([c for _, c in points]))

    def taus(score: np.ndarray) -> np.ndarray:
        return np.concatenate([[-np.inf], np.quantile(score, np.linspace(0, 1, grid)), [np.inf]])

    threshold = sweep(lambda t: threshold_rule(self_sufficiency, t, send, silent), taus(self_sufficiency),
                      outcomes, taxes)
    sender = sweep(lambda t: sender_relative_rule(m_confidence, t, send, silent), taus(m_confidence), outcomes, taxes)
    return {"random": random, "threshold_self_sufficiency": threshold, "sender_relative": sender}
