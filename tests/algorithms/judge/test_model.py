"""§G.2's model and the label stream: encoding, bad input, the prior, the order-bias functionals."""

import numpy as np
import pytest

from troupe.algorithms.judge import model as M
from troupe.algorithms.judge.model import Comparison, HumanLabel, JudgePair, JudgePrior
from troupe.platform.errors import ConfigError, DataError


def lab(r, y, g="crowd"):
    return HumanLabel(r, y, g)


def test_encoding_maps_raters_groups_and_folds_late_labels_into_their_item():
    s = M.encode_stream([
        Comparison("x", (lab("e", "A", "expert"), lab("c", frozenset("AT"))), JudgePair("A", "B"), ("p", "q")),
        Comparison("y", (lab("c", "T"),)),
        Comparison("x", (lab("d", "B"),), None, ("p", "q")),  # a late label, same responses
    ])
    assert s.items == ["x", "y"] and s.raters == ["e", "c", "d"] and s.groups == ["expert", "crowd"]
    assert s.rater_group.tolist() == [0, 1, 1]
    assert [e.late for e in s.events] == [False, False, True]
    x = s.by_item()[0]
    assert [(o.family, o.owner, o.cells) for o in x] == [(0, 0, (0,)), (0, 1, (0, 2)), (1, 0, (M.cell(0, 1),)), (0, 2, (1,))]
    assert s.counts["late_events"] == 1 and s.counts["set_labels"] == 1


@pytest.mark.parametrize(
    ("comps", "needle"),
    [
        ([Comparison("c", (lab("r", "X"),))], "label ['X'] is not one of"),
        ([Comparison("c", (lab("r", frozenset()),))], "empty label set"),
        ([Comparison("c", (HumanLabel("r", "A"),))], "rater has no group and groups are required"),
        ([Comparison("c", (), None, ("a", "b")), Comparison("c", (), None, ("a", "z"))], "repeats an id with different responses"),
        ([Comparison("c", (lab("r", "A"),)), Comparison("c", (lab("r", "B"),))], "labelled the comparison twice"),
        ([Comparison("c", (), JudgePair("A", "A")), Comparison("c", (), JudgePair("A", "B"))], "a second judge pair"),
        ([Comparison("c", (), JudgePair("first", "A"))], "judge order AB"),
        ([Comparison("c", (lab("r", "A", "expert"),)), Comparison("d", (lab("r", "A", "crowd"),))], "another group"),
    ],
)
def test_bad_input_raises_a_data_error_naming_the_comparison_and_the_fix(comps, needle):
    with pytest.raises(DataError, match="comparison 'c'|comparison 'd'") as e:
        M.encode_stream(comps)
    assert needle in str(e.value)


def test_groups_are_optional_when_not_required():
    s = M.encode_stream([Comparison("c", (HumanLabel("r", "A"),))], require_groups=False)
    assert s.groups == ["default"]


def test_unparsed_judge_orders_are_coarsened_or_skipped_and_counted():
    comps = [Comparison("a", (), JudgePair(None, "B")), Comparison("b", (), JudgePair(None, None))]
    joint = M.encode_stream(comps)
    assert joint.by_item()[0][0].cells == (M.cell(0, 1), M.cell(1, 1), M.cell(2, 1))  # any J^AB, J^BA = B
    assert joint.by_item()[1] == ()
    assert joint.counts["judge_half_unparsed"] == 1 and joint.counts["judge_unparsed_skipped"] == 1
    fact = M.encode_stream(comps, judge_model="factorised")
    assert [(o.owner, o.cells) for o in fact.by_item()[0]] == [(1, (1,))]


def test_position_answers_map_to_content_space():
    assert M.judge_pair_from_positions("first", "first") == JudgePair("A", "B")  # first-position consistent
    assert M.judge_pair_from_positions("second", "tie") == JudgePair("B", "T")
    assert M.judge_pair_from_positions(None, "second") == JudgePair(None, "A")
    with pytest.raises(DataError, match="'maybe'"):
        M.judge_pair_from_positions("maybe", "first")


def test_prior_rows_follow_the_defaults_of_g2():
    s = M.encode_stream([Comparison("c", (lab("r", "A"),), JudgePair("A", "A"))])
    p = M.prior_arrays(JudgePrior(), s)
    assert p.alpha_pi.tolist() == [2, 2, 1]
    assert np.allclose(p.alpha_theta[0], [[7, 1.5, 1.5], [1.5, 7, 1.5], [1.5, 1.5, 7]])
    assert np.allclose(p.alpha_phi.sum(-1), 9) and np.allclose(p.alpha_phi[0, 1, M.cell(1, 1)], 4.5)
    f = M.prior_arrays(JudgePrior(), M.encode_stream([Comparison("c", (lab("r", "A"),))], judge_model="factorised"))
    assert f.alpha_phi.shape == (2, 3, 3) and np.allclose(f.alpha_phi.sum(-1), 3)
    custom = JudgePrior(group_mean={"crowd": [[0.5, 0.2, 0.3], [0.2, 0.5, 0.3], [0.25, 0.25, 0.5]]})
    assert np.allclose(M.prior_arrays(custom, s).alpha_theta[0, 0], [5, 2, 3])


@pytest.mark.parametrize("bad", [{"alpha_pi": (1, 0, 1)}, {"group_diag": 1.0}, {"group_means": "mean"}, {"phi_strength": 0}])
def test_prior_rejects_bad_hyperparameters(bad):
    with pytest.raises(ConfigError, match="judge."):
        JudgePrior(**bad)


def test_order_bias_functionals_on_a_known_pair_model():
    phi = np.full((3, 9), 0.05)
    phi[:, M.FIRST_CONSISTENT] = [0.3, 0.2, 0.1]
    phi[:, M.SECOND_CONSISTENT] = [0.1, 0.1, 0.1]
    phi[:, 0] += 1 - phi.sum(-1)  # (A,A) takes the rest
    pi = np.array([0.5, 0.3, 0.2])
    assert np.allclose(M.beta_ord(phi[None]), [0.2, 0.1, 0.0])
    assert M.beta_bar(pi, phi[None]) == pytest.approx(0.5 * 0.2 + 0.3 * 0.1)
    consistent = phi[:, 0] + phi[:, 4] + phi[:, 8]
    assert M.inconsistency(pi, phi[None]) == pytest.approx(1 - pi @ consistent)


def test_factorised_judge_implies_the_outer_product_pair_model():
    ab = np.array([[0.7, 0.2, 0.1], [0.1, 0.8, 0.1], [0.2, 0.2, 0.6]])
    ba = np.array([[0.6, 0.3, 0.1], [0.3, 0.6, 0.1], [0.1, 0.1, 0.8]])
    j = M.joint_phi(np.stack([ab, ba]))
    assert j[1, M.cell(2, 0)] == pytest.approx(ab[1, 2] * ba[1, 0])
    assert np.allclose(M.beta_ord(np.stack([ab, ba])), ab[:, 0] * ba[:, 1] - ab[:, 1] * ba[:, 0])


def test_order_effect_rule_uses_the_two_sided_975_threshold():
    assert M.order_effect(np.r_[np.full(980, 0.1), np.full(20, -0.1)])["detected"]
    assert not M.order_effect(np.r_[np.full(970, 0.1), np.full(30, -0.1)])["detected"]
    assert M.order_effect(np.r_[np.full(20, 0.1), np.full(980, -0.1)])["detected"]


def test_group_signatures_average_the_raters_of_each_group():
    pi = np.array([0.5, 0.3, 0.2])
    theta = np.stack([np.eye(3) * 0.7 + 0.1, np.full((3, 3), 1 / 3), np.eye(3)])
    sig = M.group_signatures(pi, theta, np.array([0, 0, 1]), 2)
    assert sig["tie_propensity"] == pytest.approx([(pi @ theta[0, :, 2] + 1 / 3) / 2, 0.2])
    assert sig["accuracy"] == pytest.approx([(0.8 + 1 / 3) / 2, 1.0])


def test_fixed_parameter_posterior_is_prior_times_likelihoods():
    params = M.Params(
        pi=np.array([0.5, 0.3, 0.2]),
        theta=np.array([[[0.8, 0.1, 0.1], [0.2, 0.7, 0.1], [0.3, 0.3, 0.4]]]),
        phi=np.full((1, 3, 9), 1 / 9),
    )
    items = [(M.Obs(M.THETA, 0, (0,)),), (M.Obs(M.THETA, 0, (0, 2)),)]
    got = M.verdict_posterior_fixed(params, items)
    want0 = params.pi * np.array([0.8, 0.2, 0.3])
    want1 = params.pi * np.array([0.9, 0.3, 0.7])
    assert np.allclose(got, [want0 / want0.sum(), want1 / want1.sum()])


def test_swap_ab_relabels_labels_and_judge_verdicts():
    c = Comparison("c", (lab("r", "A"), lab("s", frozenset("BT"))), JudgePair("A", None))
    (sw,) = M.swap_ab([c])
    assert [h.label for h in sw.labels] == ["B", frozenset("AT")] and sw.judge == JudgePair("B", None)
