"""IVIG and its baselines: closed forms against Monte Carlo, degenerate cases, the GP-regression limit."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import norm

from troupe.algorithms.ivdesign.acquisition import (
    ACQUISITIONS,
    Candidates,
    choose,
    choose_with_botorch,
    gaussian_eig,
    gaussian_eig_logdet,
    ivig_scores,
    ivig_scores_logdet,
    marginal_variance_scores,
    outcome_variance_scores,
    target_agnostic_eig_scores,
)
from troupe.algorithms.ivdesign.model import GPIVPosterior, Hyper, inverse_mills

HYPER = Hyper(ls_f0=0.9, ls_tau=0.8, var_f0=1.0, var_tau=1.0, var_rho=1.0, noise=0.3)


def grid(m: int = 9) -> np.ndarray:
    return np.linspace(-2, 2, m)[:, None]


def all_candidates(m: int, p1: np.ndarray, eta: np.ndarray | None = None, noise: float = 0.3) -> Candidates:
    """Every grid unit at two levels; p1 and eta per candidate (2m of them)."""
    unit = np.repeat(np.arange(m), 2)
    eta = np.zeros(2 * m) if eta is None else eta
    lam = np.column_stack([inverse_mills(eta, 0), inverse_mills(eta, 1)])
    return Candidates(unit, unit.copy(), np.tile([0, 1], m), p1, lam, np.full((2 * m, 2), noise))


def observed_posterior(seed: int = 0, n: int = 12, m: int = 9, hyper: Hyper = HYPER) -> GPIVPosterior:
    rng = np.random.default_rng(seed)
    post = GPIVPosterior.prior(grid(m), hyper, 1.0)
    for _ in range(n):
        t = int(rng.integers(2))
        post.update(int(rng.integers(m)), t, float(inverse_mills(rng.normal(), t)), float(rng.normal()), hyper.noise)
    return post


# -- §F.7.2 the closed form against Monte Carlo ---------------------------------------------
def test_gaussian_eig_matches_a_nested_monte_carlo_estimate():
    rng = np.random.default_rng(0)
    S = np.array([[1.0, 0.6], [0.6, 1.5]])
    c = np.array([0.8, 0.9])
    s2 = 1.2
    exact = gaussian_eig(c, S, s2)
    assert exact == pytest.approx(gaussian_eig_logdet(c, S, s2), rel=1e-12)
    # y | f* ~ N(c' S^-1 f*, s2 - c' S^-1 c); I = E[log p(y | f*) - log E_f*' p(y | f*')]
    a = np.linalg.solve(S, c)
    cond_sd = math.sqrt(s2 - c @ a)
    L = np.linalg.cholesky(S)
    outer, inner = 2000, 2000
    f = rng.standard_normal((outer, 2)) @ L.T
    y = f @ a + cond_sd * rng.standard_normal(outer)
    f_inner = rng.standard_normal((inner, 2)) @ L.T
    log_lik = norm.logpdf(y, f @ a, cond_sd)
    # log N(y_i; a' f_k, cond_sd^2) for every outer y_i and inner f_k, then log of the inner mean
    inner_logs = -0.5 * ((y[:, None] - (f_inner @ a)[None, :]) / cond_sd) ** 2
    log_marg = logsumexp(inner_logs, axis=1) - math.log(inner) - math.log(cond_sd * math.sqrt(2 * math.pi))
    estimate = float(np.mean(log_lik - log_marg))
    assert estimate == pytest.approx(exact, abs=0.03)
    assert exact > 0.2  # not a trivially small information


def test_ivig_matches_monte_carlo_on_a_gp_iv_posterior():
    # I(tau*; (t, y)) = sum_t p_t I(tau*; y | t) when t says nothing about tau*: check by simulation.
    rng = np.random.default_rng(1)
    post = observed_posterior(seed=3, m=7)
    target = np.array([5, 6])
    g, p1, eta = 5, 0.6, 0.4
    cands = Candidates(np.array([g]), np.array([g]), np.array([1]), np.array([p1]),
                       np.array([[inverse_mills(eta, 0), inverse_mills(eta, 1)]]), np.array([[0.3, 0.3]]))
    exact = float(ivig_scores(post, cands, target, jitter=0.0)[0])
    mu_T, S_T = post.tau_moments(target)
    n = 200_000
    tau = mu_T + rng.standard_normal((n, 2)) @ np.linalg.cholesky(S_T).T
    t = (rng.random(n) < p1).astype(int)
    logs = np.zeros(n)
    for tt in (0, 1):
        lam = float(cands.lam[0, tt])
        Sh = post.cov_times_row(g, tt, lam)
        mean_y = post.mean[g] + tt * post.mean[post.m + g] + lam * post.mean[-1]
        s2 = Sh[g] + tt * Sh[post.m + g] + lam * Sh[-1] + 0.3
        c = Sh[post.m + target]
        a = np.linalg.solve(S_T, c)
        cond_sd = math.sqrt(s2 - c @ a)
        sel = t == tt
        y = mean_y + (tau[sel] - mu_T) @ a + cond_sd * rng.standard_normal(sel.sum())
        logs[sel] = norm.logpdf(y, mean_y + (tau[sel] - mu_T) @ a, cond_sd) - norm.logpdf(y, mean_y, math.sqrt(s2))
    assert logs.mean() == pytest.approx(exact, abs=0.01)


def test_vectorised_ivig_equals_the_per_treatment_log_det_formula():
    post = observed_posterior(seed=1)
    rng = np.random.default_rng(2)
    cands = all_candidates(9, rng.uniform(0.05, 0.95, 18), rng.normal(size=18))
    target = np.array([6, 7, 8])
    fast = ivig_scores(post, cands, target, jitter=0.0)
    slow = ivig_scores_logdet(post, cands, target)
    np.testing.assert_allclose(fast, slow, rtol=1e-7, atol=1e-10)
    # the default jitter changes nothing visible on a well-conditioned target
    np.testing.assert_allclose(ivig_scores(post, cands, target), slow, rtol=1e-5)


# -- §F.7.3 non-negativity and degenerate cases ------------------------------------------------
def test_ivig_is_non_negative_even_for_a_near_singular_target():
    post = observed_posterior(seed=4, m=41, n=30)  # 41 units 0.1 apart: Sigma* is numerically singular
    rng = np.random.default_rng(3)
    cands = all_candidates(41, rng.uniform(0, 1, 82), rng.normal(size=82))
    scores = ivig_scores(post, cands, np.arange(25, 41))
    assert np.all(np.isfinite(scores)) and np.all(scores >= 0) and scores.max() > 0


def test_ivig_is_zero_without_treatment_effect_variance():
    post = observed_posterior(seed=5, hyper=Hyper(var_tau=0.0, noise=0.3))
    cands = all_candidates(9, np.full(18, 0.5), np.linspace(-1, 1, 18))
    np.testing.assert_array_equal(ivig_scores(post, cands, np.array([7, 8])), 0.0)


def test_ivig_is_zero_when_no_unit_can_be_treated_and_x_is_uninformative():
    # under the prior f0, tau and rho are independent: with p_hat(t=1) = 0 a query says nothing about tau*
    post = GPIVPosterior.prior(grid(), HYPER, 1.0)
    eta = np.linspace(-2, 2, 18)
    zero = ivig_scores(post, all_candidates(9, np.zeros(18), eta), np.array([7, 8]))
    np.testing.assert_allclose(zero, 0.0, atol=1e-15)
    some = ivig_scores(post, all_candidates(9, np.full(18, 0.5), eta), np.array([7, 8]))
    assert some.max() > 0.05


# -- §F.7.4 perfect compliance and no confounding: plain GP regression on (x, t) ---------------
@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # inside gpytorch
def test_perfect_compliance_reduces_to_gp_regression_and_standard_eig():
    torch = pytest.importorskip("torch")
    from troupe.algorithms.ivdesign.model import build_gpytorch_ivgp

    rng = np.random.default_rng(0)
    m, n = 9, 14
    X = grid(m)
    h = Hyper(ls_f0=0.9, ls_tau=0.8, var_f0=1.0, var_tau=0.8, var_rho=0.0, noise=0.2)
    g = rng.integers(m, size=n)
    t = rng.integers(2, size=n).astype(float)  # t = z: everyone complies
    y = np.sin(X[g, 0]) + t * (1 + 0.5 * X[g, 0] ** 2) + 0.4 * rng.normal(size=n)
    post = GPIVPosterior.prior(X, h, 1.0)
    for i in range(n):  # lambda_t(+-inf) = 0 for the realised t, and rho = 0
        post.update(int(g[i]), t[i], 0.0, y[i], h.noise)
    target = np.array([6, 7, 8])
    mean, cov = post.tau_moments(target)

    names = ("ls_f0",)
    model, _ = build_gpytorch_ivgp(X[g], t, np.zeros(n), y, h, names, tau_mean=1.0)
    model.eval()
    xt = X[target]
    xc, tc = X[3], 1.0  # a candidate query: unit 3 with z = t = 1
    test = np.vstack([np.column_stack([xt, np.ones(3), np.zeros(3)]), np.column_stack([xt, np.zeros(3), np.zeros(3)]),
                      [[xc[0], tc, 0.0]]])
    with torch.no_grad():
        f = model(torch.tensor(test))
        fm, fS = f.mean.numpy(), f.covariance_matrix.numpy()
    A = np.zeros((4, 7))
    A[:3, :3], A[:3, 3:6], A[3, 6] = np.eye(3), -np.eye(3), 1.0  # tau* = f(x*,1) - f(x*,0); the query's f
    jm, jS = A @ fm, A @ fS @ A.T
    np.testing.assert_allclose(mean, jm[:3], atol=1e-6)
    np.testing.assert_allclose(cov, jS[:3, :3], atol=1e-6)
    standard = gaussian_eig(jS[:3, 3], jS[:3, :3], jS[3, 3] + h.noise)
    cands = Candidates(np.array([3]), np.array([3]), np.array([1]), np.array([1.0]), np.zeros((1, 2)),
                       np.full((1, 2), h.noise))
    assert ivig_scores(post, cands, target, jitter=0.0)[0] == pytest.approx(standard, rel=1e-5)


# -- baselines ---------------------------------------------------------------------------------
def test_outcome_variance_is_the_law_of_total_variance():
    post = observed_posterior(seed=6)
    rng = np.random.default_rng(4)
    cands = all_candidates(9, rng.uniform(0, 1, 18), rng.normal(size=18))
    scores = outcome_variance_scores(post, cands, np.array([8]))
    k = 5
    g = int(cands.g[k])
    hs = [post.design_row(g, t, cands.lam[k, t]) for t in (0, 1)]
    means = [h @ post.mean for h in hs]
    vars_ = [h @ post.cov @ h + cands.noise[k, t] for t, h in enumerate(hs)]
    p = cands.p1[k]
    total_mean = (1 - p) * means[0] + p * means[1]
    expect = (1 - p) * (vars_[0] + means[0] ** 2) + p * (vars_[1] + means[1] ** 2) - total_mean**2
    assert scores[k] == pytest.approx(expect, rel=1e-10)


def test_marginal_variance_and_target_agnostic_eig():
    post = observed_posterior(seed=7)
    cands = all_candidates(9, np.full(18, 0.3), np.zeros(18))
    mv = marginal_variance_scores(post, cands, np.array([0]))
    np.testing.assert_allclose(mv, np.diag(post.cov)[post.m + cands.g])
    ta = target_agnostic_eig_scores(post, cands, np.array([0]))
    k = 4
    expect = sum(p * 0.5 * math.log1p(h @ post.cov @ h / 0.3)
                 for p, h in ((0.7, post.design_row(int(cands.g[k]), 0, cands.lam[k, 0])),
                              (0.3, post.design_row(int(cands.g[k]), 1, cands.lam[k, 1]))))
    assert ta[k] == pytest.approx(expect, rel=1e-10)
    assert np.all(ta >= 0)


def test_every_method_scores_every_candidate():
    post = observed_posterior(seed=8)
    cands = all_candidates(9, np.full(18, 0.5))
    for name, fn in ACQUISITIONS.items():
        s = fn(post, cands, np.array([7, 8]))
        assert s.shape == (18,) and np.all(np.isfinite(s)), name


def test_choose_breaks_ties_at_random_and_otherwise_takes_the_best():
    rng = np.random.default_rng(0)
    assert choose(np.array([0.1, 0.5, 0.2]), rng) == 1
    picks = {choose(np.array([1.0, 0.0, 1.0, 1.0]), rng) for _ in range(200)}
    assert picks == {0, 2, 3}


def test_botorch_discrete_optimiser_picks_the_same_candidate():
    pytest.importorskip("botorch")
    scores = np.random.default_rng(5).normal(size=30)
    assert choose_with_botorch(scores) == int(np.argmax(scores))
