"""The GP-IV model: control function, rank-1 posterior, marginal likelihood, first stage (ALGORITHMS.md §F.7)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import ndtr
from scipy.stats import multivariate_normal

from troupe.algorithms.ivdesign.model import (
    GPIVPosterior,
    Hyper,
    ModelConfig,
    ProbitFirstStage,
    batch_posterior,
    design_matrix,
    fit_hyperparameters,
    grid_of,
    inverse_mills,
    log_hyperprior,
    log_marginal_likelihood,
    probit_log_evidence,
    probit_map,
    sq_dists,
    truncation_variance,
)
from troupe.platform.errors import ConfigError

HYPER = Hyper(ls_f0=0.8, ls_tau=0.6, var_f0=1.2, var_tau=0.7, var_rho=0.9, noise=0.3, kappa=0.2)


def random_data(n: int, m: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = np.linspace(-2, 2, m)[:, None]
    g = rng.integers(m, size=n)
    t = rng.integers(2, size=n).astype(float)
    eta = rng.normal(size=n)
    lam = inverse_mills(eta, t)
    v = truncation_variance(eta, t)
    y = np.sin(X[g, 0]) + t * (1 + 0.5 * X[g, 0] ** 2) + lam + 0.3 * rng.normal(size=n)
    return X, g, t, lam, v, y


# -- §F.7.5 control function ------------------------------------------------------------------
@pytest.mark.parametrize("eta", [-1.5, 0.0, 0.7, 2.0])
def test_control_function_matches_monte_carlo(eta):
    e = np.random.default_rng(1).standard_normal(400_000)
    t1 = eta + e > 0
    phi = math.exp(-0.5 * eta**2) / math.sqrt(2 * math.pi)
    # E[e | t=1, eta] = phi(eta)/Phi(eta); E[e | t=0, eta] = -phi(eta)/(1-Phi(eta))
    assert inverse_mills(eta, 1) == pytest.approx(phi / ndtr(eta), rel=1e-12)
    assert inverse_mills(eta, 1) == pytest.approx(e[t1].mean(), abs=0.01)
    assert inverse_mills(eta, 0) == pytest.approx(e[~t1].mean(), abs=0.01)
    assert truncation_variance(eta, 1) == pytest.approx(e[t1].var(), abs=0.01)
    assert truncation_variance(eta, 0) == pytest.approx(e[~t1].var(), abs=0.01)


def test_control_function_is_stable_in_the_tails():
    lam = inverse_mills(np.array([-30.0, 30.0]), np.array([1, 0]))
    assert np.all(np.isfinite(lam))
    assert lam[0] == pytest.approx(30.0, rel=0.01) and lam[1] == pytest.approx(-30.0, rel=0.01)
    assert inverse_mills(30.0, 1) == pytest.approx(0.0, abs=1e-100)


# -- §F.7.1 rank-1 updates equal the batch posterior ---------------------------------------------
def test_rank_one_updates_equal_the_batch_posterior():
    X, g, t, lam, v, y = random_data(30, 12)
    noise = 0.3 + 0.2 * v  # heteroscedastic noise per observation
    prior = GPIVPosterior.prior(X, HYPER, tau_mean=1.0)
    post = prior.copy()
    for i in range(len(y)):
        post.update(int(g[i]), t[i], lam[i], y[i], noise[i])
    batch = batch_posterior(prior, g, t, lam, y, noise)
    np.testing.assert_allclose(post.cov, post.cov.T, rtol=0, atol=1e-15)  # rows can stand for columns
    np.testing.assert_allclose(post.mean, batch.mean, atol=1e-8)
    np.testing.assert_allclose(post.cov, batch.cov, atol=1e-8)
    # and both equal the precision (weight-space) form (S0^-1 + H' N^-1 H)^-1
    H = design_matrix(g, t, lam, prior.m)
    P = np.linalg.inv(prior.cov) + H.T @ (H / noise[:, None])
    cov = np.linalg.inv(P)
    mean = cov @ (np.linalg.solve(prior.cov, prior.mean) + H.T @ (y / noise))
    np.testing.assert_allclose(post.cov, cov, atol=1e-7)
    np.testing.assert_allclose(post.mean, mean, atol=1e-7)


def test_design_row_and_sparse_products_agree():
    X, *_ = random_data(1, 7)
    post = GPIVPosterior.prior(X, HYPER, 1.0)
    h = post.design_row(3, 1.0, -0.4)
    np.testing.assert_allclose(post.cov_times_row(3, 1.0, -0.4), post.cov @ h)
    np.testing.assert_allclose(design_matrix(np.array([3]), np.array([1.0]), np.array([-0.4]), post.m)[0], h)


def test_prior_blocks_are_independent_with_the_tau_mean():
    X, *_ = random_data(1, 5)
    post = GPIVPosterior.prior(X, HYPER, tau_mean=1.5)
    m = post.m
    np.testing.assert_allclose(post.mean, np.r_[np.zeros(m), np.full(m, 1.5), 0.0])
    assert np.all(post.cov[:m, m:] == 0) and post.cov[-1, -1] == HYPER.var_rho
    np.testing.assert_allclose(post.cov[0, 1], 1.2 * math.exp(-0.5 * 1.0**2 / 0.8**2))


# -- §F.7.6 empirical Bayes ---------------------------------------------------------------------
NAMES = ("ls_f0", "ls_tau", "var_f0", "var_tau", "var_rho", "noise", "kappa")


def test_log_marginal_likelihood_is_the_gaussian_density_of_the_outcomes():
    X, g, t, lam, v, y = random_data(15, 10, seed=2)
    value, _ = log_marginal_likelihood(np.log(HYPER.get(NAMES)), NAMES, HYPER, sq_dists(X[g], X[g]), t, lam, v, y, 1.0)
    prior = GPIVPosterior.prior(X, HYPER, 1.0)
    H = design_matrix(g, t, lam, prior.m)
    K = H @ prior.cov @ H.T + np.diag(HYPER.noise + HYPER.kappa * v)
    assert value == pytest.approx(multivariate_normal(H @ prior.mean, K).logpdf(y), rel=1e-10)


def test_marginal_likelihood_gradient_matches_finite_differences():
    X, g, t, lam, v, y = random_data(20, 10, seed=3)
    D2 = sq_dists(X[g], X[g])
    x0 = np.log(HYPER.get(NAMES))
    _, grad = log_marginal_likelihood(x0, NAMES, HYPER, D2, t, lam, v, y, 1.0)
    eps = 1e-6
    for k in range(len(NAMES)):
        d = np.zeros_like(x0)
        d[k] = eps
        fd = (log_marginal_likelihood(x0 + d, NAMES, HYPER, D2, t, lam, v, y, 1.0)[0]
              - log_marginal_likelihood(x0 - d, NAMES, HYPER, D2, t, lam, v, y, 1.0)[0]) / (2 * eps)
        assert grad[k] == pytest.approx(fd, rel=1e-5, abs=1e-7), NAMES[k]


def test_hyperprior_gradient_matches_finite_differences():
    x, c = np.array([0.3, -1.2]), np.array([0.0, 0.5])
    val, grad = log_hyperprior(x, c, 0.7)
    assert val == pytest.approx(-0.5 * np.sum((x - c) ** 2) / 0.49)
    for k in range(2):
        d = np.eye(2)[k] * 1e-6
        assert grad[k] == pytest.approx((log_hyperprior(x + d, c, 0.7)[0] - log_hyperprior(x - d, c, 0.7)[0]) / 2e-6)
    assert log_hyperprior(x, c, 0.0) == (0.0, pytest.approx(np.zeros(2)))


def test_optimiser_improves_the_marginal_likelihood():
    X, g, t, lam, v, y = random_data(30, 15, seed=4)
    names = ("ls_f0", "ls_tau", "var_f0", "var_tau", "var_rho", "noise")
    start = Hyper(ls_f0=3.0, ls_tau=3.0, var_f0=5.0, var_tau=0.05, var_rho=5.0, noise=2.0)
    res = fit_hyperparameters(X[g], t, lam, v, y, start, names, 1.0, restarts=3, rng=np.random.default_rng(0))
    assert res.objective > res.start_objective + 1.0
    D2 = sq_dists(X[g], X[g])
    at_fit = log_marginal_likelihood(np.log(res.hyper.get(names)), names, res.hyper, D2, t, lam, v, y, 1.0)[0]
    assert at_fit == pytest.approx(res.objective, rel=1e-9)  # no hyperprior: the objective is the log ML
    # a hyperprior pulls the fit towards its centre
    res_p = fit_hyperparameters(X[g], t, lam, v, y, start, names, 1.0, restarts=3, rng=np.random.default_rng(0),
                                prior_center=start, prior_sd=0.1)
    moved = np.abs(np.log(res.hyper.get(names)) - np.log(start.get(names))).sum()
    moved_p = np.abs(np.log(res_p.hyper.get(names)) - np.log(start.get(names))).sum()
    assert moved_p < moved


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")  # inside gpytorch
def test_gpytorch_backend_computes_the_same_marginal_likelihood():
    torch = pytest.importorskip("torch")
    from troupe.algorithms.ivdesign.model import build_gpytorch_ivgp, fit_hyperparameters_gpytorch

    X, g, t, lam, v, y = random_data(25, 10, seed=5)
    names = ("ls_f0", "ls_tau", "var_f0", "var_tau", "var_rho", "noise")
    h = Hyper(ls_f0=0.8, ls_tau=0.6, var_f0=1.2, var_tau=0.7, var_rho=0.9, noise=0.3)
    ours = log_marginal_likelihood(np.log(h.get(names)), names, h, sq_dists(X[g], X[g]), t, lam, v, y, 1.0)[0]
    model, mll = build_gpytorch_ivgp(X[g], t, lam, y, h, names, 1.0)
    with torch.no_grad():
        theirs = float(mll(model(*model.train_inputs), model.train_targets)) * len(y)
    assert theirs == pytest.approx(ours, rel=1e-8)
    res = fit_hyperparameters_gpytorch(X[g], t, lam, v, y, h, names, 1.0, restarts=1, rng=np.random.default_rng(0))
    assert res.objective >= res.start_objective
    refit = log_marginal_likelihood(np.log(res.hyper.get(names)), names, res.hyper, sq_dists(X[g], X[g]),
                                    t, lam, v, y, 1.0)[0]
    assert refit == pytest.approx(res.objective, rel=1e-6)


# -- first stage ----------------------------------------------------------------------------
def test_probit_map_is_a_stationary_point_of_the_log_posterior():
    rng = np.random.default_rng(0)
    Phi = np.column_stack([np.ones(200), rng.normal(size=(200, 2))])
    t = (Phi @ np.array([0.3, 1.0, -0.5]) + rng.normal(size=200) > 0).astype(float)
    w, H, _ = probit_map(Phi, t, alpha=0.5)
    s = 2 * t - 1
    u = s * (Phi @ w)
    grad = Phi.T @ (s * np.exp(-0.5 * u**2) / math.sqrt(2 * math.pi) / ndtr(u)) - 0.5 * w
    np.testing.assert_allclose(grad, 0, atol=1e-6)
    assert np.all(np.linalg.eigvalsh(H) > 0)
    # the Laplace evidence is finite and the empirical-Bayes alpha beats both ends of its range
    ev = [probit_log_evidence(Phi, t, a)[0] for a in (1e-3, 1.0, 1e4)]
    assert ev[1] > ev[0] and ev[1] > ev[2]


def test_empirical_bayes_first_stage_recovers_the_propensity():
    rng = np.random.default_rng(1)
    xs = np.linspace(-2, 2, 41)[:, None]
    fs = ProbitFirstStage(xs, (0.0, 1.0), basis="linear")
    n = 3000
    X = xs[rng.integers(41, size=n)]
    z = rng.integers(2, size=n).astype(float)
    eta = -1 + 1.5 * z + 0.5 * z * X[:, 0]
    t = (eta + rng.normal(size=n) > 0).astype(float)
    fs.fit(X, z, t)
    true = ndtr(-1 + 1.5 + 0.5 * xs[:, 0])
    np.testing.assert_allclose(fs.propensity(xs, 1.0), true, atol=0.05)
    # the moderated predictive shrinks towards 1/2 and is close to the plug-in with this much data
    np.testing.assert_allclose(fs.propensity(xs, 1.0, moderated=True), fs.propensity(xs, 1.0), atol=0.02)
    few = ProbitFirstStage(xs, (0.0, 1.0)).fit(X[:4], z[:4], t[:4])
    plug, mod = few.propensity(xs, 1.0), few.propensity(xs, 1.0, moderated=True)
    assert np.all(np.abs(mod - 0.5) <= np.abs(plug - 0.5) + 1e-12)


def test_grid_merges_pool_and_target_units():
    pool = np.array([[0.0], [1.0], [2.0]])
    target = np.array([[1.0], [3.0]])
    grid, pg, tg = grid_of(pool, target)
    assert grid[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
    assert pg.tolist() == [0, 1, 2] and tg.tolist() == [1, 3]


def test_model_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="model.noise"):
        ModelConfig(noise=0.0)
    with pytest.raises(ConfigError, match="model.fit"):
        ModelConfig(fit=["lengthscale"])
    with pytest.raises(ConfigError, match="model.backend"):
        ModelConfig(backend="gpytorch", noise_model="heckman")
    assert "kappa" in ModelConfig(noise_model="heckman").fitted_names()
    assert "var_rho" not in ModelConfig(var_rho=0.0).fitted_names()
