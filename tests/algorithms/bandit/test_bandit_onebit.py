"""1-bit mean estimation: the probit MLE and its rate, Robbins–Monro, dithering, bisection."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from troupe.algorithms.bandit.onebit import (
    OneBitMeanEstimator,
    bisection_margin,
    dither_bits,
    dither_estimate,
    fixed_threshold_estimate,
    probit_bits,
    probit_loglik,
    probit_mle,
    robbins_monro_step,
)


def play(est: OneBitMeanEstimator, draw) -> OneBitMeanEstimator:
    """Answer every threshold with 1[Z >= tau] for fresh draws Z = draw(size)."""
    while not est.done:
        th = est.ask()
        est.tell((draw(th.size) >= th).astype(np.int8))
    return est


def test_margins_and_lengths_follow_their_formulas():
    assert math.isclose(bisection_margin(0.5, 0.1), 0.5 * math.sqrt(2 * math.log(20)))
    assert probit_bits(100, 10, 0.1) == math.ceil(math.pi / 2 * 10 + 2 * math.log(20))
    assert dither_bits(2.0, 0.5, 40, 4) == math.ceil(4 * 40 / (4 * 4 * 0.25))


def test_robbins_monro_step_and_its_clipping():
    sd = 0.3
    assert math.isclose(robbins_monro_step(0.1, 1, 4, sd, -1, 1), 0.1 + sd * math.sqrt(2 * math.pi) * 0.5 / 4)
    assert math.isclose(robbins_monro_step(0.1, 0, 2, sd, -1, 1), 0.1 - sd * math.sqrt(2 * math.pi) * 0.5 / 2)
    assert robbins_monro_step(0.99, 1, 1, sd, -1, 1) == 1.0


def test_probit_mle_at_one_threshold_inverts_the_gaussian_cdf():
    sd, tau = 0.2, 0.1
    bits = np.array([1] * 7 + [0] * 3)
    mu = probit_mle(np.full(10, tau), bits, sd, -1, 1)
    assert math.isclose(mu, tau + sd * norm.ppf(0.7), abs_tol=1e-9)
    # it maximises the likelihood
    for eps in (-1e-3, 1e-3):
        assert probit_loglik(mu, np.full(10, tau), bits, sd) >= probit_loglik(mu + eps, np.full(10, tau), bits, sd)


def test_probit_mle_stays_in_its_interval_when_every_bit_agrees():
    assert probit_mle(np.zeros(5), np.ones(5), 0.1, -0.5, 0.5) == 0.5
    assert probit_mle(np.zeros(5), np.zeros(5), 0.1, -0.5, 0.5) == -0.5


def test_fixed_threshold_estimate_clips_a_saturated_fraction():
    assert math.isclose(fixed_threshold_estimate(np.array([1, 1, 0, 0]), 0.0, 0.3, 1.0), 0.0, abs_tol=1e-12)
    # all ones: p_hat is clipped at 1 - 1/(2m), so the estimate is finite and capped at R
    assert fixed_threshold_estimate(np.ones(4), 0.0, 0.3, 1.0) == pytest.approx(0.3 * norm.ppf(1 - 1 / 8))
    assert fixed_threshold_estimate(np.ones(4), 0.0, 10.0, 1.0) == 1.0


@pytest.mark.parametrize("growth", [1.0, 2.0])
def test_probit_estimate_error_matches_its_rate(growth):
    # error ~ sd sqrt(pi / (2 m)) with m refinement bits (Fisher information 2/pi per bit at the median)
    rng = np.random.default_rng(7)
    mu, sd = 0.37, 0.1
    errs = []
    for _ in range(200):
        est = OneBitMeanEstimator(sd, n_ratio=50, delta_prime=0.01, lo=-1, hi=1, rm_growth=growth)
        errs.append(play(est, lambda n: mu + sd * rng.standard_normal(n)).estimate - mu)
    rate = sd * math.sqrt(math.pi / (2 * est.m))
    rmse = math.sqrt(np.mean(np.square(errs)))
    assert 0.8 * rate < rmse < 1.25 * rate
    assert abs(np.mean(errs)) < 4 * rate / math.sqrt(200)


def test_dithered_estimate_is_unbiased_when_z_stays_in_the_interval():
    # Z uniform on [mu - 0.2, mu + 0.2] inside [lo', hi']: E[bit] = (Z - lo')/(hi' - lo')
    rng = np.random.default_rng(3)
    mu = 0.23
    ests = [play(OneBitMeanEstimator(0.1, n_ratio=1, delta_prime=0.1, lo=-0.5, hi=0.7, refine="dither",
                                     localize=False, rng=rng),
                 lambda n: mu + rng.uniform(-0.2, 0.2, n)).estimate for _ in range(400)]
    se = np.std(ests) / math.sqrt(len(ests))
    assert abs(np.mean(ests) - mu) < 4 * se
    lo, hi = -0.5 - bisection_margin(0.1, 0.1), 0.7 + bisection_margin(0.1, 0.1)
    bits = np.array([1, 0, 1, 1])
    assert dither_estimate(bits, lo, hi) == pytest.approx(lo + 0.75 * (hi - lo))


def test_bisection_keeps_mu_in_its_interval_with_the_promised_probability():
    rng = np.random.default_rng(11)
    delta_prime, sd, mu = 0.1, 0.05, -0.61
    misses, steps = 0, 0
    reps = 400
    for _ in range(reps):
        est = OneBitMeanEstimator(sd, n_ratio=1, delta_prime=delta_prime, lo=-1, hi=1, edge_check=False)
        while est.localizing:  # localisation only
            th = est.ask()
            est.tell((mu + sd * rng.standard_normal(th.size) >= th).astype(np.int8))
        assert est.hi - est.lo <= 4 * est.w + 1e-12
        misses += not (est.lo <= mu <= est.hi)
        steps = max(steps, est.localize_steps)
    assert misses / reps <= steps * delta_prime
    # with noise-free answers the invariant holds every time
    est = OneBitMeanEstimator(sd, n_ratio=1, delta_prime=delta_prime, lo=-1, hi=1)
    play(est, lambda n: np.full(n, mu))
    assert est.lo <= mu <= est.hi


def test_a_warm_start_that_misses_mu_is_recovered_by_the_edge_check():
    rng = np.random.default_rng(5)
    mu, sd = 0.8, 0.01
    est = play(OneBitMeanEstimator(sd, n_ratio=4, delta_prime=0.01, lo=-0.3, hi=0.1),
               lambda n: mu + sd * rng.standard_normal(n))
    assert abs(est.estimate - mu) < 5 * sd


def test_bisection_bits_grow_like_log_one_over_w_as_sigma_goes_to_zero():
    for sd in (1e-2, 1e-4, 1e-6):
        est = play(OneBitMeanEstimator(sd, n_ratio=1, delta_prime=0.01, lo=-1, hi=1), lambda n: np.full(n, 0.3))
        w = bisection_margin(sd, 0.01)
        assert est.localize_steps <= math.log2(2 / w) + 1
        assert abs(est.estimate - 0.3) <= 4 * w
        assert est.bits_used <= math.log2(2 / w) + 1 + probit_bits(1, 1, 0.01)
