"""G-optimal design (Kiefer–Wolfowitz), Frank–Wolfe, support reduction and the phase arithmetic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from troupe.algorithms.bandit.design import (
    confidence_width,
    frank_wolfe,
    g_optimal_design,
    g_value,
    least_squares,
    leverages,
    phase_allocation,
    project_to_span,
    reduce_support,
    round_design,
)
from troupe.envs.linear_bandit import hypercube_arms, sphere_arms


@pytest.mark.parametrize("d,k,eta", [(2, 10, 0.1), (5, 50, 0.1), (8, 200, 0.05), (5, 50, 0.01)])
def test_frank_wolfe_reaches_g_at_most_one_plus_eta_times_d(d, k, eta):
    x = sphere_arms(k, d, np.random.default_rng(d * k))
    des = frank_wolfe(x, eta)
    assert des.g <= (1 + eta) * d + 1e-9
    assert math.isclose(des.pi.sum(), 1.0) and (des.pi >= 0).all()
    # Kiefer–Wolfowitz: no design beats g = d
    assert des.g >= d - 1e-9


def test_uniform_design_on_a_basis_is_optimal_with_g_equal_to_d():
    x = np.eye(4)
    assert math.isclose(g_value(x, np.full(4, 0.25)), 4.0)
    des = frank_wolfe(x, 1e-6)
    np.testing.assert_allclose(des.pi, 0.25)
    assert des.iterations == 1  # the uniform start is already optimal


def test_basis_with_duplicates_puts_one_over_d_on_each_direction():
    x = np.vstack([np.eye(3), np.eye(3)[[0, 0, 2]]])  # e1 three times, e3 twice
    des = frank_wolfe(x, 1e-4)
    direction_mass = [des.pi[[0, 3, 4]].sum(), des.pi[1], des.pi[[2, 5]].sum()]
    np.testing.assert_allclose(direction_mass, 1 / 3, atol=1e-3)
    assert des.g <= 3 * (1 + 1e-4)


def test_every_design_has_g_at_least_d_since_the_mean_leverage_is_d():
    x = sphere_arms(40, 5, np.random.default_rng(0))
    for seed in range(5):
        pi = np.random.default_rng(seed).dirichlet(np.ones(40))
        assert math.isclose(float(pi @ leverages(x, pi)), 5.0, rel_tol=1e-9)
        assert g_value(x, pi) >= 5.0 - 1e-9


def test_support_reduction_keeps_g_below_the_bound_and_shrinks_the_support():
    x = sphere_arms(200, 4, np.random.default_rng(1))
    des = frank_wolfe(x, 0.1)
    pi = reduce_support(x, des.pi, 2 * 4)
    assert g_value(x, pi) <= 8 + 1e-9
    assert (pi > 0).sum() < (des.pi > 0).sum()
    assert (pi > 0).sum() >= 4  # a design must still span R^4
    assert math.isclose(pi.sum(), 1.0)
    full = g_optimal_design(x, 0.1, reduce_to=2.0)
    assert full.g <= 8 + 1e-9 and np.array_equal(full.support, np.flatnonzero(pi > 0))


def test_projection_onto_the_span_of_rank_deficient_arms():
    x = hypercube_arms(8, 5)  # lives in the first 3 coordinates
    coords, basis = project_to_span(x)
    assert coords.shape == (8, 3)
    np.testing.assert_allclose(coords @ basis, x, atol=1e-12)
    assert frank_wolfe(coords, 0.1).g <= 3.3 + 1e-9


def test_phase_allocation_is_the_phased_elimination_formula():
    pi = np.array([0.5, 0.25, 0.25, 0.0])
    n = phase_allocation(pi, d=2, eps=0.25, k=10, phase=2, delta=0.1, sigma=2.0)
    expect = [math.ceil(2 * 2 * p * 4 / 0.0625 * math.log(10 * 2 * 3 / 0.1)) for p in pi[:3]]
    assert n.tolist() == [*expect, 0]


def test_least_squares_recovers_theta_from_exact_means():
    x = sphere_arms(6, 3, np.random.default_rng(2))
    theta = np.array([0.3, -0.2, 0.5])
    counts = np.array([3.0, 1.0, 7.0, 2.0, 5.0, 4.0])
    np.testing.assert_allclose(least_squares(x, counts, x @ theta), theta, atol=1e-12)


def test_confidence_width_on_a_basis():
    # V_N = N I: max ||a||^2_{V^{-1}} = 1/N, so width = sigma sqrt(2/N log(k l(l+1)/delta))
    x = np.eye(3)
    w = confidence_width(x, np.full(3, 50.0), x, k=3, phase=1, delta=0.1, sigma=0.5)
    assert math.isclose(w, 0.5 * math.sqrt(2 / 50 * math.log(3 * 2 / 0.1)))


def test_round_design_sums_to_n_and_covers_the_support():
    pi = np.array([0.5, 0.3, 0.2, 0.0])
    c = round_design(pi, 16)
    assert c.sum() == 16 and (c[:3] >= 1).all() and c[3] == 0
    c = round_design(pi, 2)  # fewer pulls than support arms: the heaviest ones
    assert c.tolist() == [1, 1, 0, 0]
