"""§C.6 on ICRM's math: the Beta KL against numerical integration, the closed-form optimum, the
analytic gradients against finite differences, antisymmetry, the limits, the `episode_elbo`
reading on conjugate data, and the product-of-experts identity."""

import numpy as np
import pytest
import torch
from scipy import integrate, optimize, stats

from troupe.algorithms.icrm import posterior as P

T = lambda *v: [torch.tensor(float(x), dtype=torch.float64) for x in v]  # noqa: E731
POINTS = [(2.0, 3.0, 1.0, 1.0), (0.4, 0.7, 1.0, 1.0), (5.5, 1.2, 2.0, 0.5), (0.9, 12.0, 0.6, 3.0)]


def kl_by_quadrature(a, b, a0, b0):
    q, p = stats.beta(a, b), stats.beta(a0, b0)
    value, _ = integrate.quad(lambda x: q.pdf(x) * (q.logpdf(x) - p.logpdf(x)), 0, 1, limit=200)
    return value


def minimise(loss, start=(1.0, 1.0)):
    """argmin over (α, β) > 0 of a torch loss, by L-BFGS-B on log α, log β with torch's gradients."""
    def f(z):
        x = torch.tensor(z, dtype=torch.float64, requires_grad=True)
        value = loss(x.exp()[0], x.exp()[1])
        value.backward()
        return value.item(), x.grad.numpy().copy()
    res = optimize.minimize(f, np.log(start), jac=True, method="L-BFGS-B", options={"gtol": 1e-12, "ftol": 1e-15})
    assert res.success or np.abs(res.jac).max() < 1e-7, res.message  # "abnormal" line search at a zero gradient
    return np.exp(res.x)


# -- 1. the Beta KL --------------------------------------------------------------------------------
@pytest.mark.parametrize(("a", "b", "a0", "b0"), POINTS)
def test_beta_kl_matches_numerical_integration(a, b, a0, b0):
    assert float(P.beta_kl(*T(a, b), a0, b0)) == pytest.approx(kl_by_quadrature(a, b, a0, b0), rel=1e-6, abs=1e-9)


@pytest.mark.parametrize(("a", "b"), [(2.0, 3.0), (0.3, 0.8), (40.0, 7.0)])
def test_beta_kl_of_a_distribution_with_itself_is_zero_and_otherwise_positive(a, b):
    assert float(P.beta_kl(*T(a, b), a, b)) == pytest.approx(0.0, abs=1e-12)
    assert float(P.beta_kl(*T(a, b), a + 0.5, b)) > 0


def test_expected_log_likelihood_and_conservative_reward_match_numerical_integration():
    a, b = 2.5, 1.5
    q = stats.beta(a, b)
    log_p, _ = integrate.quad(lambda x: q.pdf(x) * np.log(x), 0, 1)
    log_1mp, _ = integrate.quad(lambda x: q.pdf(x) * np.log1p(-x), 0, 1)
    assert float(P.expected_log_likelihood(*T(a, b), 1.0)) == pytest.approx(log_p, rel=1e-7)
    assert float(P.expected_log_likelihood(*T(a, b), 0.0)) == pytest.approx(log_1mp, rel=1e-7)
    assert float(P.expected_log_likelihood(*T(a, b), 0.3)) == pytest.approx(0.3 * log_p + 0.7 * log_1mp, rel=1e-7)
    assert float(P.conservative_reward(*T(a, b))) == pytest.approx(log_p, rel=1e-7)
    big = P.conservative_reward(*T(1e6, 1.0))
    assert -1e-5 < float(big) < 0  # bounded above by 0, saturating


# -- 2. the closed-form optimum ------------------------------------------------------------------------
@pytest.mark.parametrize("p_bar", [0.0, 0.2, 0.5, 0.9])
@pytest.mark.parametrize(("lam", "a0", "b0"), [(1.0, 1.0, 1.0), (0.3, 1.0, 1.0), (0.1, 2.0, 0.5)])
def test_minimiser_of_the_label_averaged_loss_is_the_closed_form(p_bar, lam, a0, b0):
    got = minimise(lambda a, b: P.negative_elbo(a, b, p_bar, lam, a0, b0))
    want = [float(v) for v in P.population_optimum(p_bar, lam, a0, b0)]
    assert want == pytest.approx([a0 + p_bar / lam, b0 + (1 - p_bar) / lam])
    assert got == pytest.approx(want, rel=1e-5)
    # and the analytic gradient vanishes there
    d_a, d_b = P.negative_elbo_grad(*T(*want), p_bar, lam, a0, b0)
    assert abs(float(d_a)) < 1e-12 and abs(float(d_b)) < 1e-12


def test_with_the_exact_elbo_and_a_flat_prior_mu_is_under_confident():
    # λ = 1, a0 = b0 = 1: labels that always say a, yet μ* = 2/3 and τ* = 3 (§C.2 consequence (i))
    a, b = P.population_optimum(1.0, 1.0, 1.0, 1.0)
    assert float(a / (a + b)) == pytest.approx(2 / 3) and float(a + b) == pytest.approx(3.0)
    a, b = P.population_optimum(0.8, 0.03, 1.0, 1.0)
    assert float(a / (a + b)) == pytest.approx(0.8, abs=0.02)  # small λ: nearly calibrated


# -- 3. gradients ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("a", "b", "a0", "b0"), POINTS)
@pytest.mark.parametrize(("label", "lam"), [(1.0, 1.0), (0.0, 0.3), (0.35, 0.1)])
def test_analytic_gradients_match_finite_differences_and_autograd(a, b, a0, b0, label, lam):
    d_a, d_b = (float(v) for v in P.negative_elbo_grad(*T(a, b), label, lam, a0, b0))
    loss = lambda a_, b_: float(P.negative_elbo(*T(a_, b_), label, lam, a0, b0))  # noqa: E731
    h = 1e-6
    assert d_a == pytest.approx((loss(a + h, b) - loss(a - h, b)) / (2 * h), rel=1e-6, abs=1e-7)
    assert d_b == pytest.approx((loss(a, b + h) - loss(a, b - h)) / (2 * h), rel=1e-6, abs=1e-7)
    alpha, beta = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (a, b))
    P.negative_elbo(alpha, beta, label, lam, a0, b0).backward()
    assert [float(alpha.grad), float(beta.grad)] == pytest.approx([d_a, d_b], rel=1e-10)


@pytest.mark.parametrize(("mu", "tau", "label"), [(0.3, 4.0, 1.0), (0.85, 0.7, 0.0), (0.5, 20.0, 0.6)])
def test_mean_and_confidence_gradients_follow_the_chain_rule(mu, tau, label):
    m, t = (torch.tensor(v, dtype=torch.float64, requires_grad=True) for v in (mu, tau))
    a, b = P.beta_params(m, t)
    P.negative_elbo(a, b, label, 0.5, 1.0, 1.0).backward()
    d_mu, d_tau = P.mean_confidence_grad(*P.negative_elbo_grad(a.detach(), b.detach(), label, 0.5, 1.0, 1.0),
                                         m.detach(), t.detach())
    assert [float(m.grad), float(t.grad)] == pytest.approx([float(d_mu), float(d_tau)], rel=1e-10)


# -- 4. antisymmetry --------------------------------------------------------------------------------------
def test_swapping_the_pair_maps_mu_to_one_minus_mu_and_keeps_tau_and_the_loss():
    r_a, r_b = torch.tensor([0.3, -2.0, 5.0], dtype=torch.float64), torch.tensor([1.1, 0.4, -1.0], dtype=torch.float64)
    mu, mu_swapped = P.preference_mean(r_a, r_b), P.preference_mean(r_b, r_a)
    assert torch.allclose(mu_swapped, 1 - mu)
    tau = P.confidence(torch.tensor([-3.0, 0.0, 2.0], dtype=torch.float64))
    label = torch.tensor([1.0, 0.0, 1.0], dtype=torch.float64)
    loss = P.negative_elbo(*P.beta_params(mu, tau), label, 0.3)
    swapped = P.negative_elbo(*P.beta_params(mu_swapped, tau), 1 - label, 0.3)
    assert torch.allclose(loss, swapped, rtol=1e-12)


def test_confidence_is_at_least_tau_min():
    tau = P.confidence(torch.tensor([-50.0, 0.0, 3.0]), tau_min=1e-2)
    assert float(tau[0]) == pytest.approx(1e-2, rel=1e-6)
    assert float(tau[1]) == pytest.approx(np.log(2) + 1e-2)


# -- 5. limits ----------------------------------------------------------------------------------------------
def test_the_optimal_confidence_grows_without_bound_as_the_kl_weight_goes_to_zero():
    taus = []
    for lam in (1.0, 0.1, 0.01, 0.001):
        a, b = minimise(lambda a_, b_, lam=lam: P.negative_elbo(a_, b_, 0.7, lam), start=(0.7 / lam, 0.3 / lam))
        taus.append(a + b)
        assert a + b == pytest.approx(2 + 1 / lam, rel=1e-4)  # τ* = a0 + b0 + 1/λ
    assert taus == sorted(taus) and taus[-1] > 1000


@pytest.mark.parametrize(("n", "p", "a0", "b0"), [(12, 0.7, 1.0, 1.0), (30, 0.2, 2.0, 3.0), (1, 0.5, 0.5, 0.5)])
def test_episode_elbo_on_conjugate_data_reproduces_the_exact_beta_posterior(n, p, a0, b0):
    rng = np.random.default_rng(n)
    labels = (rng.random(n) < p).astype(float)  # n draws of one latent p: conjugate data
    query, demos = labels[0], labels[1:]
    demo_labels, mask = torch.tensor(demos)[None], torch.ones(1, n - 1, dtype=torch.bool)
    got = minimise(lambda a, b: P.episode_negative_elbo(a[None], b[None], torch.tensor([query], dtype=torch.float64),
                                                        demo_labels, mask, 1.0, a0, b0)[0])
    s = labels.sum()
    # the exact posterior, by normalising prior × likelihood numerically
    def moment(f):
        return integrate.quad(lambda x: f(x) * stats.beta(a0, b0).pdf(x) * x**s * (1 - x) ** (n - s), 0, 1)[0]
    z = moment(lambda x: 1.0)
    mean = moment(lambda x: x) / z
    var = moment(lambda x: (x - mean) ** 2) / z
    a, b = got
    assert a / (a + b) == pytest.approx(mean, rel=1e-4)
    assert a * b / ((a + b) ** 2 * (a + b + 1)) == pytest.approx(var, rel=1e-3)
    assert got == pytest.approx([a0 + s, b0 + n - s], rel=1e-5)
    assert [float(v) for v in P.episode_optimum(s, n - s, 1.0, a0, b0)] == pytest.approx([a0 + s, b0 + n - s])


def test_episode_elbo_tempers_the_likelihood_by_the_kl_weight_and_ignores_masked_demos():
    demo_labels = torch.tensor([[1.0, 1.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, False, False]])  # k = 3: the last two are padding
    got = minimise(lambda a, b: P.episode_negative_elbo(a[None], b[None], torch.tensor([1.0], dtype=torch.float64),
                                                        demo_labels, mask, 0.5)[0])
    assert got == pytest.approx([1 + 3 / 0.5, 1 + 1 / 0.5], rel=1e-5)  # 3 positives, 1 negative, λ = 0.5


def test_episode_elbo_without_demos_is_the_query_loss():
    a, b = T(2.0, 3.0)
    empty = P.episode_negative_elbo(a[None], b[None], torch.tensor([1.0], dtype=torch.float64),
                                    torch.zeros(1, 4, dtype=torch.float64), torch.zeros(1, 4, dtype=torch.bool), 0.3)
    assert float(empty[0]) == pytest.approx(float(P.negative_elbo(a, b, 1.0, 0.3)))


# -- 6. product of experts ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("a", "b"), [(2.0, 5.0), (0.5, 0.5), (30.0, 1.5)])
def test_product_with_the_flat_beta_leaves_a_posterior_unchanged(a, b):
    assert [float(v) for v in P.product_of_experts(*T(1.0, 1.0, a, b))] == [a, b]
    assert [float(v) for v in P.product_of_experts(*T(a, b, 1.0, 1.0))] == [a, b]


def test_product_of_experts_is_the_normalised_product_of_the_densities():
    (a1, b1), (a2, b2) = (3.0, 2.0), (1.5, 4.0)
    a, b = (float(v) for v in P.product_of_experts(*T(a1, b1, a2, b2)))
    x = np.linspace(1e-4, 1 - 1e-4, 2001)
    prod = stats.beta(a1, b1).pdf(x) * stats.beta(a2, b2).pdf(x)
    prod /= integrate.quad(lambda v: stats.beta(a1, b1).pdf(v) * stats.beta(a2, b2).pdf(v), 0, 1)[0]
    assert np.allclose(prod, stats.beta(a, b).pdf(x), rtol=1e-8)
