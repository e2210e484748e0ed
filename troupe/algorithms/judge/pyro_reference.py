"""ALGORITHMS.md §G.2's generative process in Pyro: the batch reference beyond the exact recursion's reach.

The verdicts V_i are a discrete site enumerated in parallel (`infer={"enumerate": "parallel"}`);
SVI runs on that model with TraceEnum_ELBO and a mean-field Dirichlet guide. NUTS runs over the
continuous parameters (π, Θ, Φ, and the group means m_g when pooled) on the same density with the
verdicts summed out by hand (`_potential`; a test checks it against the model's).
Set-valued labels enter as the log of the summed row probabilities, as in §G.2.

`smc_vs_pyro` is the agreement check of §G.6 (n = 1500 in the benchmark, small n in tests).
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import torch

from troupe.algorithms.judge.model import THETA, EncodedStream, PriorArrays, beta_bar
from troupe.platform.errors import ConfigError

if TYPE_CHECKING:
    from troupe.algorithms.judge.smc import SMCConfig


@dataclasses.dataclass
class ObsTensors:
    """Every observation of a batch stream as flat tensors, per family."""

    n_items: int
    item: list[torch.Tensor]  # per family (theta, phi): (M,) item index
    owner: list[torch.Tensor]  # (M,) row owner
    mask: list[torch.Tensor]  # (M, K) allowed cells


@contextlib.contextmanager
def _one_thread():
    """These tensors are tiny: intra-op threads only add synchronisation (16x slower per gradient on a busy 2-core machine)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


def obs_tensors(stream: EncodedStream, kc: int) -> ObsTensors:
    rows: list[list[tuple[int, int, np.ndarray]]] = [[], []]
    for i, obs in enumerate(stream.by_item()):
        for o in obs:
            k = 3 if o.family == THETA else kc
            m = np.zeros(k)
            m[list(o.cells)] = 1.0
            rows[o.family].append((i, o.owner, m))
    out = ObsTensors(stream.n_items, [], [], [])
    for fam, k in ((0, 3), (1, kc)):
        r = rows[fam]
        out.item.append(torch.tensor([x[0] for x in r], dtype=torch.long))
        out.owner.append(torch.tensor([x[1] for x in r], dtype=torch.long))
        out.mask.append(torch.tensor(np.asarray([x[2] for x in r]).reshape(-1, k), dtype=torch.float64))
    return out


def _loglik(params: list[torch.Tensor], t: ObsTensors) -> torch.Tensor:
    """(n, 3) log P(obs_i | V_i = v): the sum over each label's cells, logged and added up per item."""
    ll = torch.zeros(t.n_items, 3, dtype=torch.float64)
    for fam, rows in enumerate(params):
        if len(t.item[fam]) == 0:
            continue
        lik = (rows[t.owner[fam]] * t.mask[fam][:, None, :]).sum(-1)  # (M, 3)
        ll = ll.index_add(0, t.item[fam], torch.log(lik))
    return ll


def _prior_tensors(prior: PriorArrays) -> tuple[torch.Tensor, ...]:
    """The prior's arrays as the tensors both the Pyro model and the NUTS potential read:
    (α_π, α_Φ, group means, group strengths, each rater's group)."""
    f64 = dict(dtype=torch.float64)
    return (torch.tensor(prior.alpha_pi, **f64), torch.tensor(prior.alpha_phi, **f64),
            torch.tensor(prior.group_m, **f64), torch.tensor(prior.group_s, **f64),
            torch.tensor(prior.rater_group, dtype=torch.long))


def make_model(prior: PriorArrays, t: ObsTensors, enumerate_verdicts: bool = True):
    """The Pyro model of §G.2 for one stream.

    enumerate_verdicts=False sums the verdicts out by hand (logsumexp over v): the same density,
    several times faster under NUTS than Pyro's enumeration machinery."""
    import pyro
    import pyro.distributions as dist
    from pyro.ops.indexing import Vindex

    alpha_pi, alpha_phi, m0, s_g, rg = _prior_tensors(prior)

    def model():
        pi = pyro.sample("pi", dist.Dirichlet(alpha_pi))
        if prior.pooled:
            m = pyro.sample("group_m", dist.Dirichlet(prior.hyper_strength * m0).to_event(2))
        else:
            m = m0
        theta = pyro.sample("theta", dist.Dirichlet(s_g[rg, None, None] * m[rg]).to_event(2))
        phi = pyro.sample("phi", dist.Dirichlet(alpha_phi).to_event(2))
        ll = _loglik([theta, phi], t)
        if not enumerate_verdicts:
            pyro.factor("obs", torch.logsumexp(torch.log(pi) + ll, -1).sum())
            return
        with pyro.plate("items", t.n_items):
            v = pyro.sample("v", dist.Categorical(pi), infer={"enumerate": "parallel"})
            pyro.factor("obs", Vindex(ll)[torch.arange(t.n_items), v])

    return model


def _prepare(stream: EncodedStream, prior: PriorArrays, enumerate_verdicts: bool = True):
    if prior.n_raters == 0:
        raise ConfigError("the Pyro reference needs at least one human rater in the stream")
    return make_model(prior, obs_tensors(stream, prior.alpha_phi.shape[-1]), enumerate_verdicts)


def _potential(prior: PriorArrays, t: ObsTensors):
    """−log p(params, D) over stick-breaking coordinates, verdicts summed out: the collapsed model's
    density written out so that each NUTS gradient is a few tensor ops instead of a model trace."""
    from torch.distributions import Dirichlet
    from torch.distributions.transforms import StickBreakingTransform

    sb = StickBreakingTransform()
    alpha_pi, alpha_phi, m0, s_g, rg = _prior_tensors(prior)

    def constrain(z: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        x = {k: sb(v) for k, v in z.items()}
        logdet = sum(sb.log_abs_det_jacobian(z[k], x[k]).sum() for k in z)
        return x, logdet

    def potential(z: dict[str, torch.Tensor]) -> torch.Tensor:
        x, logdet = constrain(z)
        m = x["group_m"] if prior.pooled else m0
        lp = Dirichlet(alpha_pi).log_prob(x["pi"]) + Dirichlet(alpha_phi).log_prob(x["phi"]).sum()
        lp = lp + Dirichlet(s_g[rg, None, None] * m[rg]).log_prob(x["theta"]).sum()
        if prior.pooled:
            lp = lp + Dirichlet(prior.hyper_strength * m0).log_prob(m).sum()
        ll = _loglik([x["theta"], x["phi"]], t)
        return -(lp + torch.logsumexp(torch.log(x["pi"]) + ll, -1).sum() + logdet)

    init = {"pi": (2,), "theta": (prior.n_raters, 3, 2), "phi": (*prior.alpha_phi.shape[:-1], prior.alpha_phi.shape[-1] - 1)}
    if prior.pooled:
        init["group_m"] = (len(prior.group_s), 3, 2)
    return potential, constrain, {k: torch.zeros(v, dtype=torch.float64) for k, v in init.items()}


def nuts_posterior(
    stream: EncodedStream, prior: PriorArrays, num_samples: int = 500, warmup: int = 300, seed: int = 0,
    max_tree_depth: int = 8,
) -> dict[str, np.ndarray]:
    """Posterior draws of the continuous parameters by Pyro's NUTS, the verdicts summed out exactly."""
    import pyro
    from pyro.infer import MCMC, NUTS

    if prior.n_raters == 0:
        raise ConfigError("the Pyro reference needs at least one human rater in the stream")
    pyro.set_rng_seed(seed)
    potential, constrain, init = _potential(prior, obs_tensors(stream, prior.alpha_phi.shape[-1]))
    kernel = NUTS(potential_fn=potential, max_tree_depth=max_tree_depth)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup, initial_params=init, disable_progbar=True)
    with _one_thread():
        mcmc.run()
    z = mcmc.get_samples()
    x, _ = constrain(z)
    return {k: v.detach().numpy() for k, v in x.items()}


def svi_posterior(
    stream: EncodedStream, prior: PriorArrays, steps: int = 1500, lr: float = 0.02, num_samples: int = 2000,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A mean-field Dirichlet guide fitted with TraceEnum_ELBO (faster than NUTS, narrower intervals)."""
    import pyro
    import pyro.distributions as dist
    from pyro.infer import SVI, TraceEnum_ELBO
    from torch.distributions import constraints

    pyro.set_rng_seed(seed)
    pyro.clear_param_store()
    model = _prepare(stream, prior)
    init = {"pi": prior.alpha_pi, "theta": prior.alpha_theta, "phi": prior.alpha_phi}
    if prior.pooled:
        init["group_m"] = prior.hyper_strength * prior.group_m

    def guide():
        for name in ("pi", "group_m", "theta", "phi"):
            if name not in init:
                continue
            a = pyro.param(f"q_{name}", torch.tensor(init[name], dtype=torch.float64), constraint=constraints.positive)
            d = dist.Dirichlet(a)
            pyro.sample(name, d if name == "pi" else d.to_event(2))

    svi = SVI(model, guide, pyro.optim.Adam({"lr": lr}), TraceEnum_ELBO(max_plate_nesting=1))
    with _one_thread():
        for _ in range(steps):
            svi.step()
    out = {}
    for name in init:
        g = torch.distributions.Dirichlet(pyro.param(f"q_{name}").detach()).sample((num_samples,))
        out[name] = g.numpy()
    return out


def verdict_marginals(samples: dict[str, np.ndarray], stream: EncodedStream) -> np.ndarray:
    """(n, 3) P(V_i | D) = E_params[P(V_i | obs_i, params)] over the posterior draws."""
    t = obs_tensors(stream, samples["phi"].shape[-1])
    out = np.zeros((stream.n_items, 3))
    for pi, th, ph in zip(samples["pi"], samples["theta"], samples["phi"], strict=True):
        ll = _loglik([torch.as_tensor(th), torch.as_tensor(ph)], t).numpy() + np.log(pi)
        p = np.exp(ll - ll.max(-1, keepdims=True))
        out += p / p.sum(-1, keepdims=True)
    return out / len(samples["pi"])


def summary(samples: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Posterior means of π, Θ, Φ and the mean and sd of β̄_ord."""
    bb = beta_bar(samples["pi"], samples["phi"])
    return {
        "pi": samples["pi"].mean(0),
        "theta": samples["theta"].mean(0),
        "phi": samples["phi"].mean(0),
        "beta_bar": np.array([bb.mean(), bb.std()]),
    }


def compare(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> dict[str, float]:
    """The largest absolute difference of each summary between two sets of posterior draws."""
    sa, sb = summary(a), summary(b)
    out = {k: float(np.abs(sa[k] - sb[k]).max()) for k in ("pi", "theta", "phi")}
    out["beta_bar_mean"] = float(abs(sa["beta_bar"][0] - sb["beta_bar"][0]))
    out["beta_bar_sd"] = float(abs(sa["beta_bar"][1] - sb["beta_bar"][1]))
    return out


def smc_vs_pyro(
    stream: EncodedStream, prior: PriorArrays, smc_config: SMCConfig | None = None, method: str = "nuts", num_samples: int = 500,
    warmup: int = 300, seed: int = 0, reference: dict[str, np.ndarray] | None = None,
) -> dict[str, float]:
    """§G.6: how far SMC's parameter and verdict posteriors lie from Pyro's on the same stream.

    reference: Pyro draws already made for this stream (then method, num_samples, warmup are unused)."""
    from troupe.algorithms.judge.smc import SMCConfig, run_smc

    smc = run_smc(stream, prior, smc_config or SMCConfig(seed=seed))
    if reference is not None:
        ref = reference
    elif method == "nuts":
        ref = nuts_posterior(stream, prior, num_samples=num_samples, warmup=warmup, seed=seed)
    elif method == "svi":
        ref = svi_posterior(stream, prior, num_samples=num_samples, seed=seed)
    else:
        raise ConfigError(f"method={method!r}: expected 'nuts' or 'svi'")
    mine = smc.sample(max(num_samples, 2000), np.random.default_rng(seed))
    out = compare(mine, ref)
    tv = 0.5 * np.abs(smc.marginals() - verdict_marginals(ref, stream)).sum(-1)
    out["verdict_tv_mean"] = float(tv.mean())
    out["verdict_tv_max"] = float(tv.max())
    return out
