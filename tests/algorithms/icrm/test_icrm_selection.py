"""Best-of-N, its KL, the Pareto front and the 2-D hypervolume: exact expectations."""

import numpy as np
import pytest

from troupe.algorithms.icrm.selection import (
    best_of_n,
    best_of_n_kl,
    hypervolume_2d,
    mixed_counts,
    pareto_front,
)


def test_best_of_n_kl_is_log_n_minus_n_minus_1_over_n():
    assert best_of_n_kl(1) == 0.0
    np.testing.assert_allclose(best_of_n_kl(np.array([2, 4, 1024])),
                               [np.log(2) - 0.5, np.log(4) - 0.75, np.log(1024) - 1023 / 1024])
    with pytest.raises(ValueError, match="n >= 1"):
        best_of_n_kl(0)


def test_best_of_n_takes_the_gold_of_the_proxy_argmax_among_the_first_n():
    proxy = np.array([[0.0, 2.0, 1.0, 3.0], [5.0, 0.0, 9.0, 1.0]])
    gold = np.array([[1.0, -1.0, 4.0, 10.0], [2.0, 7.0, -3.0, 0.0]])
    # row 0 picks candidates 0, 1, 1, 3; row 1 picks 0, 0, 2, 2
    np.testing.assert_allclose(best_of_n(proxy, gold, [1, 2, 3, 4]), [1.5, 0.5, -2.0, 3.5])
    # the gold itself as proxy is the best-of-n upper bound
    np.testing.assert_allclose(best_of_n(gold, gold, [4]), [8.5])


def test_best_of_n_ties_go_to_the_earlier_candidate_and_bad_shapes_are_refused():
    np.testing.assert_allclose(best_of_n(np.zeros((1, 3)), np.array([[1.0, 2.0, 3.0]]), [3]), [1.0])
    with pytest.raises(ValueError, match="same"):
        best_of_n(np.zeros((2, 3)), np.zeros((2, 4)), [1])
    with pytest.raises(ValueError, match="1..3"):
        best_of_n(np.zeros((2, 3)), np.zeros((2, 3)), [4])


def test_pareto_front_drops_dominated_points():
    pts = np.array([[1, 5], [2, 4], [2, 2], [3, 1], [0, 0], [1, 5]])
    np.testing.assert_array_equal(pareto_front(pts), [[1, 5], [2, 4], [3, 1]])


def test_hypervolume_is_the_union_of_rectangles_above_the_reference():
    # staircase: [0,1]x[0,5] ∪ [0,2]x[0,4] ∪ [0,3]x[0,1] = 5 + 4 + 1 - overlaps = 1*5 + 1*4 + 1*1 = 10
    assert hypervolume_2d(np.array([[1, 5], [2, 4], [3, 1]]), (0, 0)) == pytest.approx(10.0)
    assert hypervolume_2d(np.array([[2, 3]]), (1, 1)) == pytest.approx(2.0)
    # a dominated point and a point below the reference add nothing
    assert hypervolume_2d(np.array([[2, 3], [1.5, 2], [5, 0.5]]), (1, 1)) == pytest.approx(2.0)
    assert hypervolume_2d(np.zeros((0, 2)), (0, 0)) == 0.0


def test_mixed_counts_round_the_share_of_the_second_objective():
    assert mixed_counts(8, [0.0, 0.1, 0.5, 0.9, 1.0]) == [0, 1, 4, 7, 8]
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        mixed_counts(8, [1.2])
