"""§D.6 item 4 and the selector's pieces: calibrated outcome models, the decision rule, the
frontier and its area, the §D.3 baselines and regret at matched cost."""

import numpy as np
import pytest

from troupe.algorithms.comm import selector as sel
from troupe.algorithms.comm import simulator as sim


def logit(p: np.ndarray) -> np.ndarray:
    return np.log(p / (1 - p))


# -- 4. perfect features at λ = 0 reach the oracle ------------------------------------------------------
@pytest.mark.parametrize("regime", ["weak_local", "strong_local"])
def test_selector_with_perfect_features_at_lambda_zero_equals_the_oracle(regime):
    # perfect features: each action's true success probability (as a logit), which one
    # logistic model per action represents exactly
    train, test = sim.train_test(getattr(sim.CommParams, regime)(), seed=1)
    models = sel.fit_outcome_models(logit(train.p_success), train.success, degree=1)
    q_hat = models.predict(logit(test.p_success))
    chosen = sel.decide(q_hat, test.tax, 0.0)
    best = sel.decide(test.p_success, test.tax, 0.0)
    acc, _ = sel.evaluate(chosen, test.p_success, test.tax)
    oracle_acc, _ = sel.evaluate(best, test.p_success, test.tax)
    assert oracle_acc - 0.001 <= acc <= oracle_acc
    top2 = np.sort(test.p_success, 1)[:, -2:]
    margin = top2[:, 1] - top2[:, 0]
    # the same action wherever the best one is clearly best (what differs lies in the sparse
    # tails, where isotonic calibration pools its few steps); near-ties cost almost nothing
    assert (chosen == best)[margin > 0.1].mean() >= 0.998
    assert (chosen == best)[margin > 0.03].mean() >= 0.99


def test_outcome_models_are_calibrated():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(20_000, 2))
    p = np.stack([1 / (1 + np.exp(-(z[:, 0] - 0.5 * z[:, 1]))), 0.2 + 0.6 * (z[:, 1] > 0)], 1)
    y = rng.random(p.shape) < p
    q = sel.fit_outcome_models(z, y).predict(z)
    for c in range(2):
        for lo in np.arange(0.0, 1.0, 0.1):  # in each well-populated band of prediction the outcome rate agrees
            band = (q[:, c] >= lo) & (q[:, c] < lo + 0.1)
            if band.sum() > 1000:
                assert y[band, c].mean() == pytest.approx(q[band, c].mean(), abs=0.025)
    assert np.abs(q - p).mean(0).max() < 0.02


def test_an_action_that_always_succeeds_gets_a_constant_model():
    z = np.random.default_rng(0).normal(size=(100, 3))
    y = np.stack([np.ones(100, bool), np.arange(100) % 2 == 0], 1)
    q = sel.fit_outcome_models(z, y).predict(z[:7])
    assert (q[:, 0] == 1.0).all() and q.shape == (7, 2)


def test_outcomes_must_have_one_row_per_step():
    with pytest.raises(ValueError, match="rows of z"):
        sel.fit_outcome_models(np.zeros((10, 2)), np.zeros((9, 2)))


# -- the decision ----------------------------------------------------------------------------------
def test_decide_maximises_gain_minus_lambda_tax_and_breaks_ties_towards_the_cheaper_action():
    q = np.array([[0.5, 0.7, 0.9], [0.6, 0.6, 0.6]])
    tax = np.array([0.0, 1.0, 10.0])
    assert sel.decide(q, tax, 0.0).tolist() == [2, 0]
    assert sel.decide(q, tax, 0.03).tolist() == [1, 0]  # 0.9 − 0.3 < 0.7 − 0.03
    assert sel.decide(q, tax, 1.0).tolist() == [0, 0]
    assert sel.decide(q, np.array([0.0, 1.0, np.inf]), 0.0).tolist() == [2, 0]


def test_oracle_on_realised_outcomes_succeeds_whenever_any_action_does_at_least_cost():
    s = np.array([[0, 1, 1], [0, 0, 0], [1, 1, 1], [0, 0, 1]], float)
    tax = np.array([0.0, 1.0, 2.0])
    f = sel.oracle_frontier(s, tax, [0.0])
    assert f.accuracy[0] == 0.75 and f.cost[0] == pytest.approx((1 + 0 + 0 + 2) / 4)


# -- the frontier ----------------------------------------------------------------------------------
def test_envelope_drops_points_under_the_chord_and_stops_at_the_best_accuracy():
    xs, ys = sel.envelope(np.array([0.0, 1.0, 2.0, 3.0, 4.0, 0.0]), np.array([0.5, 0.55, 0.8, 0.7, 0.8, 0.4]))
    assert xs.tolist() == [0.0, 2.0] and ys.tolist() == [0.5, 0.8]


def test_frontier_area_on_the_normalised_cost_axis():
    assert sel.frontier_area(np.array([0.0]), np.array([0.7]), 10.0) == pytest.approx(0.7)
    assert sel.frontier_area(np.array([0.0, 10.0]), np.array([0.5, 1.0]), 10.0) == pytest.approx(0.75)
    # nothing is reachable below the cheapest point
    assert sel.frontier_area(np.array([5.0, 10.0]), np.array([0.5, 1.0]), 10.0) == pytest.approx(0.5 * 0.75)
    # a frontier that peaks early stays flat to the end of the axis
    assert sel.frontier_area(np.array([0.0, 2.0]), np.array([0.5, 0.9]), 10.0) == pytest.approx(0.2 * 0.7 + 0.8 * 0.9)


def test_regret_to_itself_is_zero_and_a_frontier_dominates_its_own_points():
    f = sel.Frontier(np.array([0.0, 1.0, 2.0]), np.array([0.6, 0.8, 0.85]), np.array([0.0, 3.0, 9.0]))
    assert np.allclose(sel.regret_at_matched_cost(f, f), 0.0)
    assert sel.dominates(f, f.cost, f.accuracy).all()
    assert sel.dominates(f, np.array([1.5, 20.0, 1.5]), np.array([0.7, 0.85, 0.71])).tolist() == [True, True, False]
    lower = sel.Frontier(f.values, f.accuracy - 0.02, f.cost)
    assert np.allclose(sel.regret_at_matched_cost(lower, f), 0.02)


# -- baselines -------------------------------------------------------------------------------------
def test_random_at_matched_cost_mixes_the_two_bracketing_fixed_actions():
    rng = np.random.default_rng(0)
    n = 100_000
    outcomes = np.tile([0.6, 0.7, 0.85, 0.5], (n, 1))  # action 3: dearest and worst, never mixed in
    taxes = np.array([0.0, 10.0, 100.0, 1000.0])
    choice = sel.random_matched_cost(outcomes, taxes, 55.0, rng)
    assert set(np.unique(choice)) == {1, 2}
    acc, cost = sel.evaluate(choice, outcomes, taxes)
    assert cost == pytest.approx(55.0, rel=0.01)
    assert acc == pytest.approx(0.7 + 0.5 * 0.15, abs=0.002)
    assert (sel.random_matched_cost(outcomes, taxes, 0.0, rng) == 0).all()
    assert (sel.random_matched_cost(outcomes, taxes, 5000.0, rng) == 2).all()


def test_threshold_and_sender_relative_rules():
    score = np.array([0.1, 0.5, 0.9])
    assert sel.threshold_rule(score, 0.5, below=1, above=0).tolist() == [1, 0, 0]
    assert sel.sender_relative_rule(score, 0.5, send=1, otherwise=0).tolist() == [0, 1, 1]


def test_fixed_points_are_the_always_policies():
    outcomes = np.array([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])
    acc, cost = sel.fixed_points(outcomes, np.array([[0.0, 2.0], [0.0, 4.0], [0.0, 6.0]]))
    assert acc.tolist() == pytest.approx([2 / 3, 1 / 3]) and cost.tolist() == [0.0, 4.0]


def test_learned_selector_on_noisy_features_beats_the_fixed_protocol_at_lower_cost():
    train, test = sim.train_test(sim.CommParams.weak_local(), n_train=5000, n_test=5000, seed=2)
    q_hat = sel.fit_outcome_models(train.features, train.success).predict(test.features)
    acc, cost = sel.fixed_points(test.p_success, test.tax)
    raw = sim.ACTIONS.index("raw")
    f = sel.selector_frontier(q_hat, test.p_success, test.tax, [0.0])
    # the selector picks RAW only where the slice is short: better than always-RAW, for less
    assert f.accuracy[0] > acc.max() and f.cost[0] < cost[raw]
