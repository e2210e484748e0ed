"""The Pyro model of §G.2: its density equals the numpy model's, and its posteriors agree with exact and SMC."""

import numpy as np
import pytest
import torch
from conftest import make_toy

from troupe.algorithms.judge import model as M
from troupe.algorithms.judge import pyro_reference as R
from troupe.algorithms.judge.exact import exact_posterior
from troupe.algorithms.judge.model import JudgePrior
from troupe.algorithms.judge.smc import SMCConfig
from troupe.platform.errors import ConfigError


def setup(comps, judge_model="factorised", prior=JudgePrior()):
    s = M.encode_stream(comps, judge_model=judge_model)
    return s, M.prior_arrays(prior, s)


def dirichlet_logpdf(x, a):
    from scipy.special import gammaln

    return float((gammaln(a.sum(-1)) - gammaln(a).sum(-1) + ((a - 1) * np.log(x)).sum(-1)).sum())


@pytest.mark.parametrize("enumerate_verdicts", [True, False])
def test_model_log_density_equals_the_numpy_model(enumerate_verdicts):
    import pyro
    import pyro.distributions as dist
    from pyro.infer import Trace_ELBO, TraceEnum_ELBO

    s, p = setup(make_toy(n=5, seed=1, set_labels=True), judge_model="joint")
    params = M.sample_params(p, np.random.default_rng(0))
    model = R.make_model(p, R.obs_tensors(s, 9), enumerate_verdicts)

    def guide():  # a point mass at params: −ELBO is −log p(params, D) with the verdicts summed out
        pyro.sample("pi", dist.Delta(torch.tensor(params.pi)).to_event(1))
        pyro.sample("theta", dist.Delta(torch.tensor(params.theta)).to_event(3))
        pyro.sample("phi", dist.Delta(torch.tensor(params.phi)).to_event(3))

    elbo = TraceEnum_ELBO(max_plate_nesting=1) if enumerate_verdicts else Trace_ELBO()
    got = -elbo.loss(model, guide)
    ll = M.log_likelihood_matrix(params, s.by_item()) + np.log(params.pi)
    want = float(np.logaddexp.reduce(ll, -1).sum())
    want += dirichlet_logpdf(params.pi, p.alpha_pi) + dirichlet_logpdf(params.theta, p.alpha_theta)
    want += dirichlet_logpdf(params.phi, p.alpha_phi)
    assert got == pytest.approx(want, rel=1e-9)
    if not enumerate_verdicts:  # NUTS's hand-written potential is the same density in stick-breaking coordinates
        from torch.distributions.transforms import StickBreakingTransform

        sb = StickBreakingTransform()
        potential, constrain, _ = R._potential(p, R.obs_tensors(s, 9))
        z = {k: sb.inv(torch.tensor(getattr(params, k))) for k in ("pi", "theta", "phi")}
        _, logdet = constrain(z)
        assert -potential(z).item() - logdet.item() == pytest.approx(want, rel=1e-9)


@pytest.fixture(scope="module")
def nuts_run():
    s, p = setup(make_toy(n=7, seed=3, raters=2))
    return s, p, R.nuts_posterior(s, p, num_samples=300, warmup=150, seed=0)


def test_nuts_posterior_agrees_with_the_exact_posterior(nuts_run):
    s, p, draws = nuts_run
    exact = exact_posterior(s, p)
    got, want = R.summary(draws), exact.posterior_mean()
    for k in ("pi", "theta", "phi"):
        assert np.abs(got[k] - want[k]).max() < 0.06, k
    assert np.abs(R.verdict_marginals(draws, s) - exact.marginals()).max() < 0.06
    prior_pi = p.alpha_pi / p.alpha_pi.sum()
    assert np.abs(want["pi"] - prior_pi).max() > 0.06  # the data move π further than the tolerance


def test_smc_parameter_posteriors_agree_with_nuts(nuts_run):
    s, p, draws = nuts_run
    out = R.smc_vs_pyro(s, p, SMCConfig(n_particles=3000, seed=1), reference=draws)
    assert max(out["pi"], out["theta"], out["phi"]) < 0.06
    assert out["beta_bar_mean"] < 0.03 and out["verdict_tv_max"] < 0.06


def test_svi_with_trace_enum_moves_the_guide_towards_the_exact_means():
    s, p = setup(make_toy(n=7, seed=3, raters=2))
    draws = R.svi_posterior(s, p, steps=300, lr=0.05, num_samples=2000, seed=0)
    want = exact_posterior(s, p).posterior_mean()
    prior_pi = p.alpha_pi / p.alpha_pi.sum()
    assert draws["theta"].shape == (2000, 2, 3, 3) and draws["phi"].shape == (2000, 2, 3, 3)
    assert np.abs(draws["pi"].mean(0) - want["pi"]).max() < np.abs(prior_pi - want["pi"]).max()


def test_reference_needs_raters_and_a_known_method():
    s, p = setup([M.Comparison("c", (), M.JudgePair("A", "A"))])
    with pytest.raises(ConfigError, match="at least one human rater"):
        R.nuts_posterior(s, p)
    s, p = setup(make_toy(n=2))
    with pytest.raises(ConfigError, match="'nuts' or 'svi'"):
        R.smc_vs_pyro(s, p, SMCConfig(n_particles=10), method="hmc")
