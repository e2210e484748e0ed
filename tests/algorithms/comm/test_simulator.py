"""§D.6 items 1–3, 5, 6 and §D.5's table: the closed forms, the generative process they
summarise, the failure-stage labels and the protocol tax."""

import math

import numpy as np
import pytest

from troupe.algorithms.comm import simulator as sim
from troupe.algorithms.comm.simulator import ACTIONS, STAGES, SUCCESS, CommParams

# §D.5's expected closed forms at the defaults: (regime, l_r) -> (∅, MSG plain, MSG cryptic, RAW)
TABLE = {
    ("weak_local", 4.0): (0.624, 0.848, 0.624, 0.474),
    ("weak_local", 1.0): (0.624, 0.848, 0.624, 0.884),
    ("strong_local", 4.0): (0.890, 0.635, 0.889, 0.660),
    ("strong_local", 1.0): (0.890, 0.635, 0.889, 0.918),
}
CELLS = [(r, lr, a, want[i]) for (r, lr), want in TABLE.items() for i, a in enumerate(ACTIONS)]
OFF_DEFAULT = [  # parameter points away from the defaults, where no two terms of the formulas coincide
    {"K": 3, "q_L": 0.3, "q_M": 0.7, "q_C": 0.8, "e": 0.6, "p_c": 0.6, "w": 0.3, "d_r": 0.7, "capacity": 3.2},
    {"K": 5, "q_L": 0.85, "q_M": 0.2, "q_C": 0.5, "e": 0.8, "p_c": 0.4, "w": 0.9, "d_r": 0.1, "capacity": 2.0,
     "l_r": 2.0},
]


def regime(name: str, **kw) -> CommParams:
    return getattr(CommParams, name)(**kw)


# -- §D.5's table -----------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "l_r", "action", "want"), CELLS)
def test_closed_forms_reproduce_the_expected_table_at_the_defaults(name, l_r, action, want):
    assert float(sim.success_probability(regime(name, l_r=l_r), action)) == pytest.approx(want, abs=0.001)


def test_closure_rates_and_absorptions_at_the_defaults():
    p = CommParams()
    assert sim.closure_rates(p) == pytest.approx((0.95625, 0.00625, 0.125))
    assert sim.a_cryp(p) == pytest.approx(1 / (1 + math.exp(6)))  # σ(4(1.5 − 3))
    assert sim.a_raw(p, l_r=1.0) == pytest.approx(1 / (1 + math.exp(-2)))  # σ(4(1.5 − 1))
    assert sim.absorption(p, "msg_plain") == 0.95


# -- 1. the Monte Carlo of the generative process matches the closed forms ------------------------------
@pytest.mark.parametrize(("name", "l_r", "action"), [(r, lr, a) for r, lr, a, _ in CELLS])
def test_monte_carlo_matches_the_closed_forms_in_both_regimes(name, l_r, action):
    p = regime(name, l_r=l_r)
    mc = sim.monte_carlo(p, action, 200_000, seed=7)["success"]
    assert mc == pytest.approx(float(sim.success_probability(p, action)), abs=0.005)


@pytest.mark.parametrize("overrides", OFF_DEFAULT)
@pytest.mark.parametrize("action", ACTIONS)
def test_monte_carlo_matches_the_closed_forms_away_from_the_defaults(overrides, action):
    p = CommParams(**overrides)
    mc = sim.monte_carlo(p, action, 200_000, seed=11)["success"]
    assert mc == pytest.approx(float(sim.success_probability(p, action)), abs=0.005)


def test_logged_steps_succeed_at_their_per_instance_closed_form_rates():
    steps = sim.log_steps(CommParams.weak_local(), 200_000, np.random.default_rng(3))
    # realised success averages to the mean closed form at each step's own q_L, q_M, l_r
    assert np.abs(steps.success.mean(0) - steps.p_success.mean(0)).max() < 0.005
    raw = ACTIONS.index("raw")
    for length in (1.0, 4.0):
        at = steps.instances.l_r == length
        assert steps.success[at, raw].mean() == pytest.approx(steps.p_success[at, raw].mean(), abs=0.006)


# -- 2. limits --------------------------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [{"e": 0.0}, {"a_plain": 0.0}])
@pytest.mark.parametrize("name", ["weak_local", "strong_local"])
def test_msg_equals_none_when_nothing_is_externalised_and_absorbed(name, overrides):
    p = regime(name, **overrides)
    assert sim.p_msg(p, sim.absorption(p, "msg_plain")) == pytest.approx(sim.p_none(p), abs=1e-15)


@pytest.mark.parametrize("q_M", [0.0, 0.55, 1.0])
def test_msg_equals_none_with_a_full_local_view_that_never_trusts_the_message(q_M):
    p = CommParams(q_L=1.0, w=0.0, q_M=q_M)
    for action in ("msg_plain", "msg_cryptic"):
        assert sim.success_probability(p, action) == pytest.approx(sim.p_none(p), abs=1e-15)
    assert sim.monte_carlo(p, "msg_plain", 200_000, seed=5)["success"] == pytest.approx(sim.p_none(p), abs=0.005)


@pytest.mark.parametrize("q_L", [0.0, 0.6, 0.92])
def test_raw_always_absorbed_and_always_holding_the_evidence_succeeds_at_h1(q_L):
    p = CommParams(q_L=q_L, q_C=1.0, capacity=100.0, l_r=1.0)  # σ(4 · 99) = 1 in float64
    assert sim.a_raw(p) == 1.0
    h1 = sim.closure_rates(p)[0]
    assert sim.p_raw(p) == pytest.approx(h1, abs=1e-15)
    assert sim.monte_carlo(p, "raw", 200_000, seed=9)["success"] == pytest.approx(h1, abs=0.005)


# -- 3. the derivative ------------------------------------------------------------------------------
@pytest.mark.parametrize(("q_L", "q_M", "w"), [(0.6, 0.9, 0.8), (0.92, 0.55, 0.8), (0.95, 0.5, 0.05), (0.1, 0.3, 0.5)])
@pytest.mark.parametrize("action", ["msg_plain", "msg_cryptic"])
def test_msg_derivative_in_q_m_matches_finite_differences(q_L, q_M, w, action):
    p = CommParams(q_L=q_L, q_M=q_M, w=w, capacity=2.8)
    a, h = sim.absorption(p, action), 1e-6
    fd = (sim.p_msg(p, a, q_M=q_M + h) - sim.p_msg(p, a, q_M=q_M - h)) / (2 * h)
    assert float(sim.dp_msg_dq_m(p, a)) == pytest.approx(float(fd), rel=1e-6, abs=1e-10)


def test_upstream_strength_matters_little_with_a_strong_local_view_that_distrusts_messages():
    a = 0.95
    weak = sim.dp_msg_dq_m(CommParams(q_L=0.2, w=0.8), a)
    strong = sim.dp_msg_dq_m(CommParams(q_L=0.95, w=0.05), a)
    # the ratio is (1 − q_L(1−w)) at the strong point over the weak one: 0.0975 / 0.84
    assert strong / weak == pytest.approx((1 - 0.95 * 0.95) / (1 - 0.2 * 0.2))
    assert strong < 0.12 * weak


# -- 5. the failure-stage labels --------------------------------------------------------------------
@pytest.mark.parametrize("overrides", [{}, {"q_M": 0.2, "p_c": 0.5}, {"capacity": 3.0, "l_r": 3.0}, OFF_DEFAULT[1]])
@pytest.mark.parametrize("action", ACTIONS)
def test_stage_labels_are_mutually_exclusive_and_exhaustive_over_failures(overrides, action):
    p = CommParams(**overrides)
    rng = np.random.default_rng(0)
    step = sim.run_action(p, action, sim.sample_state(p, 50_000, rng), rng)
    per_step = step.flags.sum(1)
    assert (per_step[~step.success] == 1).all()  # each failure: exactly one stage
    assert (per_step[step.success] == 0).all()  # a success: none
    assert ((step.stage == SUCCESS) == step.success).all()
    assert (~step.success).sum() > 1000  # the checks above saw many failures


def _shares(p: CommParams, action: str) -> dict[str, float]:
    return sim.failure_shares(p, action, 100_000, seed=2)


def test_stage_labels_follow_where_the_step_broke():
    # a message never written: no absorption or misleading failure is possible
    s = _shares(CommParams(e=0.0), "msg_plain")
    assert s["absorption"] == s["misleading"] == 0.0 and s["externalisation"] > 0.5
    # M always wrong, always externalised: failures are misleading, or closure on the local view
    s = _shares(CommParams(q_M=0.0, e=1.0), "msg_plain")
    assert s["absorption"] == s["externalisation"] == 0.0 and s["misleading"] > 0.9
    # perfect closure: a right belief never fails
    assert _shares(CommParams(p_c=1.0), "raw")["closure"] == 0.0
    # nothing is sent under none: a failure is closure (the local view held the key) or externalisation
    s = _shares(CommParams(), "none")
    assert s["absorption"] == s["misleading"] == 0.0
    assert s["closure"] == pytest.approx(0.6 * (1 - 0.95625) / (1 - 0.62375), abs=0.01)


def test_failure_shares_sum_to_one():
    for action in ACTIONS:
        assert sum(_shares(CommParams.strong_local(), action).values()) == pytest.approx(1.0)


def test_forked_actions_share_the_state():
    # a raw slice never absorbed and never distracting leaves E exactly where `none` does
    p = CommParams(capacity=0.01, l_r=500.0, d_r=0.0)  # σ(−2000) = 0
    assert sim.a_raw(p) == 0.0
    rng = np.random.default_rng(4)
    state = sim.sample_state(p, 10_000, rng)
    none, raw = sim.run_action(p, "none", state, rng), sim.run_action(p, "raw", state, rng)
    assert (none.belief == raw.belief).all()
    assert (none.belief == np.where(state.local_has_key, 0, sim.NO_BELIEF)).all()


# -- 6. the protocol tax ----------------------------------------------------------------------------
@pytest.mark.parametrize("l_r", [0.5, 1.0, 4.0])
def test_no_communication_costs_nothing(l_r):
    written, read = sim.action_tokens("none", l_r)
    assert written == read == 0.0
    assert sim.protocol_tax(written, read) == 0.0
    assert sim.tax_matrix(np.array([l_r]))[0, ACTIONS.index("none")] == 0.0


def test_tax_is_increasing_in_tokens_written_and_read():
    grid = np.array([0.0, 1.0, 10.0, 100.0, 1000.0])
    for tax in (sim.TaxModel(), sim.TaxModel(kappa_tok=0.0), sim.TaxModel(kappa_lat=0.0)):
        t = sim.protocol_tax(grid[:, None], grid[None, :], tax)
        assert (np.diff(t, axis=0) > 0).all() and (np.diff(t, axis=1) > 0).all()


def test_default_taxes_rank_the_actions_by_what_they_move():
    t = sim.tax_matrix(np.array([1.0, 4.0]))
    none, plain, cryptic, raw = (ACTIONS.index(a) for a in ("none", "msg_plain", "msg_cryptic", "raw"))
    assert t[0, none] < t[0, cryptic] < t[0, plain] < t[0, raw] < t[1, raw]
    # plain: 100 tokens written and read, 100 × 0.02 s + 100 × 1e-4 s at 100 per second
    assert t[0, plain] == pytest.approx(200 + 100 * (2.0 + 0.01))
    assert t[1, raw] == pytest.approx(4000 + 100 * 0.4)


# -- parameters and heterogeneity -------------------------------------------------------------------
@pytest.mark.parametrize(("field", "value"), [
    ("K", 1), ("K", 2.5), ("q_L", -0.1), ("q_M", 1.2), ("q_C", 2.0), ("e", -1.0), ("p_c", 1.5), ("w", -0.01),
    ("d_r", 1.01), ("a_plain", 3.0), ("s", -1.0), ("c_cryp", math.inf), ("l0", 0.0), ("capacity", -1.0),
    ("l_r", 0.0)])
def test_out_of_range_parameters_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=rf"comm\.{field}="):
        CommParams(**{field: value})


def test_tax_model_refuses_negative_rates_by_name():
    with pytest.raises(ValueError, match=r"comm\.tax\.kappa_lat="):
        sim.TaxModel(kappa_lat=-1.0)


def test_regimes_are_the_d5_values():
    assert (CommParams.weak_local().q_L, CommParams.weak_local().q_M) == (0.6, 0.9)
    assert (CommParams.strong_local().q_L, CommParams.strong_local().q_M) == (0.92, 0.55)
    assert CommParams.strong_local(l_r=1.0).l_r == 1.0


def test_instances_are_beta_around_the_regime_with_concentration_20_and_noisy_features():
    p = CommParams.strong_local()
    rng = np.random.default_rng(1)
    inst = sim.sample_instances(p, 100_000, rng)
    assert inst.q_L.mean() == pytest.approx(0.92, abs=0.003)
    assert inst.q_M.var() == pytest.approx(0.55 * 0.45 / 21, rel=0.03)  # Beta var m(1−m)/(κ+1)
    assert (inst.q_C >= inst.q_M).all() and set(np.unique(inst.l_r)) == {1.0, 4.0}
    z = sim.noisy_features(inst, rng)
    assert (z[:, 0] - inst.q_L).std() == pytest.approx(0.1, rel=0.02)
    assert (z[:, 2] == inst.l_r).all()


def test_train_and_test_logs_are_20k_independent_counterfactual_steps():
    train, test = sim.train_test(CommParams.weak_local(), seed=0)
    assert train.n == test.n == 20_000
    assert train.success.shape == train.p_success.shape == train.tax.shape == (20_000, len(ACTIONS))
    assert not np.array_equal(train.features, test.features)
    assert set(np.unique(train.stage)) <= {SUCCESS, *range(len(STAGES))}
