"""§G.7 test 1: the ADF projection of a Dirichlet mixture."""

import numpy as np
import pytest

from troupe.algorithms.judge.adf import dirichlet_moments, moment_match


@pytest.mark.parametrize("alpha", [[2.0, 2.0, 1.0], [0.3, 5.0, 1.7, 2.2, 9.0, 0.5, 1.0, 1.0, 3.0]])
def test_one_component_returns_the_input(alpha):
    a = np.asarray(alpha)
    assert np.allclose(moment_match(a[None], np.ones(1)), a, rtol=1e-10)


def test_output_matches_the_mixture_mean_and_sum_of_second_moments():
    rng = np.random.default_rng(0)
    alphas = rng.uniform(0.5, 6.0, size=(3, 3))
    w = np.array([0.5, 0.3, 0.2])
    out = moment_match(alphas, w)
    m1, m2 = dirichlet_moments(alphas)
    o1, o2 = dirichlet_moments(out)
    assert np.allclose(o1, w @ m1, rtol=1e-12)
    assert o2.sum() == pytest.approx((w @ m2).sum(), rel=1e-12)


def test_a_spread_mixture_projects_to_a_flatter_dirichlet():
    # two sharp, opposite components: matching their spread needs less total concentration
    alphas = np.array([[20.0, 1.0, 1.0], [1.0, 20.0, 1.0]])
    out = moment_match(alphas, np.array([0.5, 0.5]))
    assert out.sum() < 22.0 and out[0] == pytest.approx(out[1])


def test_moment_match_is_vectorised_over_leading_axes():
    rng = np.random.default_rng(1)
    alphas = rng.uniform(0.5, 4.0, size=(4, 2, 2, 3))
    w = rng.dirichlet([1, 1], size=(4, 2))
    out = moment_match(alphas, w)
    assert out.shape == (4, 2, 3)
    assert np.allclose(out[2, 1], moment_match(alphas[2, 1], w[2, 1]))
