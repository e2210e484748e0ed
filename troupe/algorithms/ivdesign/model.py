"""The empirical-Bayes GP-IV model: a probit first stage and a control-function GP outcome model.

First stage (latent-index probit, fitted by empirical Bayes)::

    t = 1[eta(x, z) + e > 0],  e ~ N(0, 1),  eta(x, z) = w . phi(x, z),  w ~ N(0, I / alpha)

with ``alpha`` chosen by the Laplace evidence and ``eta_hat`` the MAP under that prior.

Outcome (Heckman control function: E[e | t, eta] = lambda_t(eta))::

    y = f0(x) + t tau(x) + rho lambda_t(eta_hat(x, z)) + eps,
    f0 ~ GP(0, k0),  tau ~ GP(tau_mean, k_tau),  rho ~ N(0, var_rho),  eps ~ N(0, noise_i)

``y`` is linear in the jointly Gaussian ``theta = [f0(G), tau(G), rho]`` on the grid ``G`` of
pool and target units, so the posterior is closed-form and each new observation is a rank-1
(Kalman) update. Hyperparameters maximise the log marginal likelihood (L-BFGS-B, restarts);
the ``gpytorch`` backend does the same with gpytorch kernels fitted by botorch.

``noise_model="heckman"`` adds the truncation variance of the confounder to the noise,
``noise_i = noise + kappa * Var[e | t_i, eta_i]`` with ``kappa`` fitted; the default treats
the residual as homoscedastic.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Literal

import numpy as np
from scipy.linalg import cho_factor, cho_solve
from scipy.linalg.blas import dger
from scipy.optimize import minimize, minimize_scalar
from scipy.special import log_ndtr, ndtr

from troupe.platform.config import check
from troupe.platform.errors import ConfigError, DataError

log = logging.getLogger(__name__)

LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)
ETA_CLIP = 8.0  # |eta_hat| beyond this changes Phi by < 1e-15; clipping keeps lambda_t finite
HYPER_NAMES = ("ls_f0", "ls_tau", "var_f0", "var_tau", "var_rho", "noise", "kappa")


# -- control function -----------------------------------------------------------------------
def inverse_mills(eta: np.ndarray | float, t: np.ndarray | int) -> np.ndarray:
    """Control function lambda_t(eta) = E[e | t, eta]: phi/Phi for t=1, -phi/(1-Phi) for t=0."""
    eta = np.asarray(eta, dtype=float)
    t = np.asarray(t)
    log_phi = -0.5 * eta**2 - LOG_SQRT_2PI
    with np.errstate(invalid="ignore", over="ignore"):
        lam1 = np.exp(log_phi - log_ndtr(eta))  # lambda_1 = phi(eta) / Phi(eta)
        lam0 = -np.exp(log_phi - log_ndtr(-eta))  # lambda_0 = -phi(eta) / (1 - Phi(eta))
    return np.where(t > 0.5, lam1, lam0)


def truncation_variance(eta: np.ndarray | float, t: np.ndarray | int) -> np.ndarray:
    """Var[e | t, eta] = 1 - eta lambda_t - lambda_t^2 (variance of a truncated standard normal)."""
    eta = np.asarray(eta, dtype=float)
    lam = inverse_mills(eta, t)
    return np.clip(1.0 - eta * lam - lam**2, 0.0, 1.0)


# -- kernels ----------------------------------------------------------------------------------
def sq_dists(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Pairwise squared Euclidean distances between the rows of A and B."""
    d = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2 * A @ B.T
    return np.maximum(d, 0.0)


def rbf(D2: np.ndarray, lengthscale: float, variance: float) -> np.ndarray:
    """RBF kernel from squared distances: k = variance * exp(-d^2 / (2 lengthscale^2))."""
    return variance * np.exp(-0.5 * D2 / lengthscale**2)


# -- settings and hyperparameters -------------------------------------------------------------
@dataclasses.dataclass
class ModelConfig:
    """Priors, noise model, empirical-Bayes schedule and first-stage basis of the GP-IV model."""

    tau_mean: float = 1.0  # prior mean of tau(x)
    lengthscale: float = 0.7  # initial RBF lengthscale of f0 and tau, per sqrt(covariate dimension)
    var_f0: float = 1.0
    var_tau: float = 1.0
    var_rho: float = 1.0
    noise: float = 0.5  # about Var[e | t] + 0.01 of the benchmark populations
    noise_model: Literal["homoscedastic", "heckman"] = "homoscedastic"
    fit: list[str] = dataclasses.field(default_factory=lambda: ["ls_f0", "ls_tau", "var_f0", "var_tau",
                                                                 "var_rho", "noise"])
    backend: Literal["numpy", "gpytorch"] = "numpy"  # marginal-likelihood fitting
    restarts: int = 5
    refit_every: int = 5  # refit first stage and hyperparameters every r queries
    hyper_min_obs: int = 10  # keep the initial hyperparameters until this many observations
    # sd (in log space) of a log-normal hyperprior centred on the initial values: penalised ML,
    # as botorch's default GP priors do, because type-II ML on 10-40 points is unstable;
    # 0 maximises the plain marginal likelihood
    hyperprior_sd: float = 0.5
    first_stage_basis: Literal["linear", "rbf"] = "rbf"
    first_stage_centres: int = 5
    # p_hat(t | x, z) weighting the two treatment branches: the plug-in Phi(eta_hat) or the
    # Laplace predictive, which stays near 1/2 where the first stage has seen no data
    first_stage_predictive: Literal["plugin", "moderated"] = "moderated"
    jitter: float = 1e-8  # relative jitter of the target covariance before its Cholesky factor

    def __post_init__(self) -> None:
        for name in ("lengthscale", "var_f0", "var_tau", "noise"):
            check(getattr(self, name) > 0, f"model.{name}", getattr(self, name), "a number > 0")
        check(self.var_rho >= 0, "model.var_rho", self.var_rho, "a number >= 0")
        bad = [f for f in self.fit if f not in HYPER_NAMES]
        check(not bad, "model.fit", self.fit, f"names among {', '.join(HYPER_NAMES)}")
        check(self.restarts >= 1, "model.restarts", self.restarts, "an integer >= 1")
        check(self.refit_every >= 1, "model.refit_every", self.refit_every, "an integer >= 1")
        check(self.first_stage_centres >= 1, "model.first_stage_centres", self.first_stage_centres, "an integer >= 1")
        check(self.jitter >= 0, "model.jitter", self.jitter, "a number >= 0")
        check(self.hyperprior_sd >= 0, "model.hyperprior_sd", self.hyperprior_sd, "a number >= 0 (0: no hyperprior)")
        check(not (self.backend == "gpytorch" and self.noise_model == "heckman"), "model.backend", self.backend,
              "'numpy' when model.noise_model='heckman' (the gpytorch backend models homoscedastic noise)")

    def fitted_names(self) -> tuple[str, ...]:
        names = [n for n in HYPER_NAMES if n in self.fit]
        if self.noise_model == "heckman" and "kappa" not in names:
            names.append("kappa")
        if self.noise_model == "homoscedastic":
            names = [n for n in names if n != "kappa"]
        if self.var_rho == 0:  # rho switched off: nothing to fit
            names = [n for n in names if n != "var_rho"]
        return tuple(names)

    def initial_hyper(self, dim: int) -> Hyper:
        ls = self.lengthscale * math.sqrt(dim)
        kappa = 1.0 if self.noise_model == "heckman" else 0.0
        return Hyper(ls, ls, self.var_f0, self.var_tau, self.var_rho, self.noise, kappa)


@dataclasses.dataclass
class Hyper:
    """Kernel and noise hyperparameters of the outcome model."""

    ls_f0: float = 0.7
    ls_tau: float = 0.7
    var_f0: float = 1.0
    var_tau: float = 1.0
    var_rho: float = 1.0
    noise: float = 0.25
    kappa: float = 0.0  # weight of the truncation variance Var[e | t, eta] in the noise

    def get(self, names: tuple[str, ...]) -> np.ndarray:
        return np.array([getattr(self, n) for n in names])

    def with_values(self, names: tuple[str, ...], values: np.ndarray) -> Hyper:
        return dataclasses.replace(self, **{n: float(v) for n, v in zip(names, values, strict=True)})


def hyper_bounds(dim: int) -> dict[str, tuple[float, float]]:
    """Box constraints of each hyperparameter (natural scale); lengthscales scale with sqrt(dim)."""
    s = math.sqrt(dim)
    return {"ls_f0": (0.1 * s, 10 * s), "ls_tau": (0.1 * s, 10 * s), "var_f0": (1e-2, 1e2),
            "var_tau": (1e-2, 1e2), "var_rho": (1e-3, 1e2), "noise": (1e-3, 1e1), "kappa": (1e-3, 1e1)}


# -- observations -----------------------------------------------------------------------------
@dataclasses.dataclass
class Observations:
    """Queried grid indices ``g``, instrument values ``z``, treatments ``t`` and outcomes ``y``."""

    g: np.ndarray
    z: np.ndarray
    t: np.ndarray
    y: np.ndarray

    @classmethod
    def empty(cls) -> Observations:
        return cls(np.zeros(0, int), np.zeros(0), np.zeros(0), np.zeros(0))

    def append(self, g: int, z: float, t: int, y: float) -> Observations:
        return Observations(np.append(self.g, g), np.append(self.z, z), np.append(self.t, t), np.append(self.y, y))

    def __len__(self) -> int:
        return len(self.y)

    def head(self, n: int) -> Observations:
        return Observations(self.g[:n], self.z[:n], self.t[:n], self.y[:n])


def observation_noise(hyper: Hyper, eta: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per-observation noise variance: noise + kappa * Var[e | t, eta]."""
    if hyper.kappa == 0:
        return np.full(np.shape(t), hyper.noise)
    return hyper.noise + hyper.kappa * truncation_variance(eta, t)


# -- the log marginal likelihood ---------------------------------------------------------------
def log_marginal_likelihood(
    log_values: np.ndarray,
    names: tuple[str, ...],
    base: Hyper,
    D2: np.ndarray,
    t: np.ndarray,
    lam: np.ndarray,
    v: np.ndarray,
    y: np.ndarray,
    tau_mean: float,
) -> tuple[float, np.ndarray]:
    """log N(y; tau_mean t, K) and its gradient in the log of the hyperparameters ``names``.

    K = k0(x, x') + t t' k_tau(x, x') + var_rho lambda lambda' + diag(noise + kappa v);
    dL/d theta = 1/2 tr((alpha alpha' - K^-1) dK/d theta) with alpha = K^-1 (y - m).
    """
    h = base.with_values(names, np.exp(log_values))
    K0 = rbf(D2, h.ls_f0, h.var_f0)
    Kt = rbf(D2, h.ls_tau, h.var_tau) * np.outer(t, t)
    Kr = h.var_rho * np.outer(lam, lam)
    K = K0 + Kt + Kr
    K[np.diag_indices_from(K)] += h.noise + h.kappa * v
    r = y - tau_mean * t
    try:
        cf = cho_factor(K, lower=True)
    except np.linalg.LinAlgError:
        return -np.inf, np.zeros(len(names))
    alpha = cho_solve(cf, r)
    logdet = 2 * np.log(np.diag(cf[0])).sum()
    value = -0.5 * r @ alpha - 0.5 * logdet - len(y) * LOG_SQRT_2PI
    W = np.outer(alpha, alpha) - cho_solve(cf, np.eye(len(y)))
    dK = {  # derivatives of K with respect to log(hyperparameter)
        "ls_f0": lambda: K0 * D2 / h.ls_f0**2,
        "ls_tau": lambda: Kt * D2 / h.ls_tau**2,
        "var_f0": lambda: K0,
        "var_tau": lambda: Kt,
        "var_rho": lambda: Kr,
        "noise": lambda: np.diag(np.full(len(y), h.noise)),
        "kappa": lambda: np.diag(h.kappa * v),
    }
    grad = np.array([0.5 * np.sum(W * dK[n]()) for n in names])
    return float(value), grad


def log_hyperprior(log_values: np.ndarray, center: np.ndarray, sd: float) -> tuple[float, np.ndarray]:
    """Log-normal hyperprior: sum_k -(log h_k - log c_k)^2 / (2 sd^2) (up to a constant), and its gradient."""
    if sd <= 0:
        return 0.0, np.zeros_like(log_values)
    diff = log_values - center
    return float(-0.5 * diff @ diff / sd**2), -diff / sd**2


def restart_point(rng: np.random.Generator, log_bounds: np.ndarray, center: np.ndarray, prior_sd: float) -> np.ndarray:
    """A random start in log space: drawn from the hyperprior when there is one (as botorch's
    restarts sample the model's priors), else uniform over the box."""
    if prior_sd > 0:
        return np.clip(center + prior_sd * rng.standard_normal(len(center)), log_bounds[:, 0], log_bounds[:, 1])
    return rng.uniform(log_bounds[:, 0], log_bounds[:, 1])


@dataclasses.dataclass
class FitResult:
    """Fitted hyperparameters and the objective (log marginal likelihood + log hyperprior) before and after."""

    hyper: Hyper
    objective: float
    start_objective: float
    evaluations: int


def fit_hyperparameters(
    X_obs: np.ndarray,
    t: np.ndarray,
    lam: np.ndarray,
    v: np.ndarray,
    y: np.ndarray,
    start: Hyper,
    names: tuple[str, ...],
    tau_mean: float,
    restarts: int,
    rng: np.random.Generator,
    prior_center: Hyper | None = None,
    prior_sd: float = 0.0,
) -> FitResult:
    """Maximise the log marginal likelihood (plus a log-normal hyperprior around ``prior_center``
    when ``prior_sd > 0``) by L-BFGS-B from ``start`` and ``restarts - 1`` random points."""
    if not names:
        return FitResult(start, float("nan"), float("nan"), 0)
    D2 = sq_dists(X_obs, X_obs)
    bounds_all = hyper_bounds(X_obs.shape[1])
    bounds = np.log(np.array([bounds_all[n] for n in names]))
    x0 = np.clip(np.log(start.get(names)), bounds[:, 0], bounds[:, 1])
    center = np.log((prior_center or start).get(names))
    evals = 0

    def negative(x: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal evals
        evals += 1
        val, grad = log_marginal_likelihood(x, names, start, D2, t, lam, v, y, tau_mean)
        if not np.isfinite(val):
            return 1e25, np.zeros_like(x)
        pv, pg = log_hyperprior(x, center, prior_sd)
        return -(val + pv), -(grad + pg)

    start_value = -negative(x0)[0]
    best_x, best_val = x0, start_value
    starts = [x0] + [restart_point(rng, bounds, center, prior_sd) for _ in range(restarts - 1)]
    for s in starts:
        res = minimize(negative, s, jac=True, method="L-BFGS-B", bounds=bounds, options={"maxiter": 200})
        if -res.fun > best_val:
            best_x, best_val = res.x, -res.fun
    return FitResult(start.with_values(names, np.exp(best_x)), float(best_val), float(start_value), evals)


def fit_hyperparameters_gpytorch(
    X_obs: np.ndarray,
    t: np.ndarray,
    lam: np.ndarray,
    v: np.ndarray,
    y: np.ndarray,
    start: Hyper,
    names: tuple[str, ...],
    tau_mean: float,
    restarts: int,
    rng: np.random.Generator,
    prior_center: Hyper | None = None,
    prior_sd: float = 0.0,
) -> FitResult:
    """The same maximisation with gpytorch kernels, fitted by botorch's scipy L-BFGS-B loop.

    Homoscedastic noise only (``v`` is unused: ``start.kappa`` must be 0).
    """
    import torch
    from botorch.optim.fit import fit_gpytorch_mll_scipy

    if start.kappa > 0 or "kappa" in names:
        raise ConfigError("model.backend='gpytorch' supports model.noise_model='homoscedastic' only; "
                          "use model.backend='numpy' for the heckman noise model")
    bounds = np.log(np.array([hyper_bounds(X_obs.shape[1])[n] for n in names]))
    best: tuple[float, Hyper] | None = None
    start_value = float("nan")
    center = np.log((prior_center or start).get(names))
    for r in range(restarts):
        init = start if r == 0 else start.with_values(names, np.exp(restart_point(rng, bounds, center, prior_sd)))
        model, mll = build_gpytorch_ivgp(X_obs, t, lam, y, init, names, tau_mean, prior_center or start, prior_sd)
        if r == 0:
            with torch.no_grad():
                start_value = float(mll(model(*model.train_inputs), model.train_targets)) * len(y)
        try:
            fit_gpytorch_mll_scipy(mll, options={"maxiter": 200})
        except Exception as e:  # a failed restart (e.g. a non-PSD step) is skipped; the others stand
            log.debug("gpytorch restart %d failed: %s", r, e)
            continue
        with torch.no_grad():
            value = float(mll(model(*model.train_inputs), model.train_targets)) * len(y)
        if best is None or value > best[0]:
            best = (value, gpytorch_hyper(model, start))
    if best is None:
        return FitResult(start, start_value, start_value, restarts)
    return FitResult(best[1], best[0], start_value, restarts)


def build_gpytorch_ivgp(X_obs: np.ndarray, t: np.ndarray, lam: np.ndarray, y: np.ndarray, hyper: Hyper,
                        names: tuple[str, ...], tau_mean: float, prior_center: Hyper | None = None,
                        prior_sd: float = 0.0) -> tuple[Any, Any]:
    """An ExactGP with kernel k0(x,x') + t t' k_tau(x,x') + var_rho lambda lambda' and mean tau_mean t.

    Inputs are the columns ``[x..., t, lambda]``; hyperparameters not in ``names`` are frozen.
    With ``prior_sd > 0`` each fitted one gets LogNormal(log c + sd^2, sd), which equals the
    numpy backend's N(log c, sd^2) on its logarithm up to a constant. Returns ``(model, mll)``.
    """
    import gpytorch
    import torch
    from botorch.models.gpytorch import GPyTorchModel
    from gpytorch.constraints import Interval
    from gpytorch.priors import LogNormalPrior

    d = X_obs.shape[1]
    bounds = hyper_bounds(d)
    dims = list(range(d))

    def prior(name: str) -> Any:
        if prior_sd <= 0 or name not in names or prior_center is None:
            return None
        return LogNormalPrior(math.log(getattr(prior_center, name)) + prior_sd**2, prior_sd)

    class TreatmentMean(gpytorch.means.Mean):
        def forward(self, inputs: torch.Tensor) -> torch.Tensor:
            return tau_mean * inputs[..., d]

    class IVKernel(gpytorch.kernels.Kernel):
        """k0(x, x') + t t' k_tau(x, x') + var_rho lambda lambda'."""

        def __init__(self) -> None:
            super().__init__()
            self.k0 = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(active_dims=dims, lengthscale_constraint=Interval(*bounds["ls_f0"]),
                                           lengthscale_prior=prior("ls_f0")),
                outputscale_constraint=Interval(*bounds["var_f0"]), outputscale_prior=prior("var_f0"))
            self.kt = gpytorch.kernels.ScaleKernel(
                gpytorch.kernels.RBFKernel(active_dims=dims, lengthscale_constraint=Interval(*bounds["ls_tau"]),
                                           lengthscale_prior=prior("ls_tau")),
                outputscale_constraint=Interval(*bounds["var_tau"]), outputscale_prior=prior("var_tau"))
            self.kr = gpytorch.kernels.LinearKernel(active_dims=[d + 1], variance_prior=prior("var_rho"),
                                                    variance_constraint=Interval(*bounds["var_rho"]))

        def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False, **params: Any) -> torch.Tensor:
            t1, t2 = x1[..., d], x2[..., d]
            if diag:
                return (self.k0(x1, x2, diag=True) + t1 * t2 * self.kt(x1, x2, diag=True)
                        + self.kr(x1, x2, diag=True))
            return (self.k0(x1, x2).to_dense() + t1.unsqueeze(-1) * t2.unsqueeze(-2) * self.kt(x1, x2).to_dense()
                    + self.kr(x1, x2).to_dense())

    class IVGP(gpytorch.models.ExactGP, GPyTorchModel):
        _num_outputs = 1

        def __init__(self, train_x: torch.Tensor, train_y: torch.Tensor, likelihood: Any) -> None:
            super().__init__(train_x, train_y, likelihood)
            self.mean_module = TreatmentMean()
            self.covar_module = IVKernel()

        def forward(self, x: torch.Tensor) -> Any:
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    dt = torch.float64
    lik = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=Interval(*bounds["noise"]),
                                                  noise_prior=prior("noise")).to(dt)
    train_x = torch.tensor(np.column_stack([X_obs, t, lam]), dtype=dt)
    model = IVGP(train_x, torch.tensor(y, dtype=dt), lik).to(dt)
    cov = model.covar_module

    def inside(name: str, value: float) -> float:  # gpytorch's interval constraints are open
        lo, hi = bounds[name]
        return float(np.clip(value, lo * (1 + 1e-6), hi * (1 - 1e-6)))

    cov.k0.base_kernel.lengthscale = inside("ls_f0", hyper.ls_f0)
    cov.kt.base_kernel.lengthscale = inside("ls_tau", hyper.ls_tau)
    cov.k0.outputscale = inside("var_f0", hyper.var_f0)
    cov.kt.outputscale = inside("var_tau", hyper.var_tau)
    cov.kr.variance = inside("var_rho", hyper.var_rho)
    lik.noise = inside("noise", hyper.noise)
    raw = {"ls_f0": cov.k0.base_kernel.raw_lengthscale, "ls_tau": cov.kt.base_kernel.raw_lengthscale,
           "var_f0": cov.k0.raw_outputscale, "var_tau": cov.kt.raw_outputscale,
           "var_rho": cov.kr.raw_variance, "noise": lik.noise_covar.raw_noise}
    for n, p in raw.items():
        p.requires_grad_(n in names)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(lik, model)
    model.train()
    return model, mll


def gpytorch_hyper(model: Any, base: Hyper) -> Hyper:
    """Read the hyperparameters back from a model made by `build_gpytorch_ivgp`."""
    cov, lik = model.covar_module, model.likelihood

    def value(p: Any) -> float:
        return float(p.detach().reshape(-1)[0])

    return dataclasses.replace(
        base,
        ls_f0=value(cov.k0.base_kernel.lengthscale), ls_tau=value(cov.kt.base_kernel.lengthscale),
        var_f0=value(cov.k0.outputscale), var_tau=value(cov.kt.outputscale),
        var_rho=value(cov.kr.variance), noise=value(lik.noise),
    )


# -- the posterior over theta = [f0(G), tau(G), rho] --------------------------------------------
class GPIVPosterior:
    """Gaussian posterior over f0 and tau on a grid of ``m`` units and the coefficient rho.

    Observation i has design row h_i = [e_g ; t e_g ; lambda] (e_g the unit vector of its grid
    point), so y_i = h_i . theta + eps_i. Kept as a dense (2m+1)-vector mean and covariance.
    """

    def __init__(self, mean: np.ndarray, cov: np.ndarray, m: int) -> None:
        self.mean = np.array(mean, dtype=float)
        self.cov = np.array(cov, dtype=float, order="C")
        self.m = m
        if self.cov.shape != (2 * m + 1, 2 * m + 1):
            raise ValueError(f"covariance shape {self.cov.shape} does not fit a grid of {m} units")

    @classmethod
    def prior(cls, X_grid: np.ndarray, hyper: Hyper, tau_mean: float) -> GPIVPosterior:
        """Prior N([0, tau_mean 1, 0], blockdiag(K0, K_tau, var_rho)) on the grid."""
        m = len(X_grid)
        D2 = sq_dists(X_grid, X_grid)
        cov = np.zeros((2 * m + 1, 2 * m + 1))
        cov[:m, :m] = rbf(D2, hyper.ls_f0, hyper.var_f0)
        cov[m : 2 * m, m : 2 * m] = rbf(D2, hyper.ls_tau, hyper.var_tau)
        cov[-1, -1] = hyper.var_rho
        mean = np.concatenate([np.zeros(m), np.full(m, tau_mean), [0.0]])
        return cls(mean, 0.5 * (cov + cov.T), m)

    def copy(self) -> GPIVPosterior:
        return GPIVPosterior(self.mean.copy(), self.cov.copy(), self.m)

    def design_row(self, g: int, t: float, lam: float) -> np.ndarray:
        """h = [e_g ; t e_g ; lambda] as a dense vector."""
        h = np.zeros(2 * self.m + 1)
        h[g] += 1.0
        h[self.m + g] += t
        h[-1] = lam
        return h

    def cov_times_row(self, g: int, t: float, lam: float) -> np.ndarray:
        """Sigma h, using that h has three non-zero entries (rows, which are contiguous, for columns)."""
        return self.cov[g] + t * self.cov[self.m + g] + lam * self.cov[-1]

    def update(self, g: int, t: float, lam: float, y: float, noise: float) -> None:
        """Rank-1 Kalman update: mu += Sigma h (y - h.mu) / s^2, Sigma -= k k' with k = Sigma h / s."""
        Sh = self.cov_times_row(g, t, lam)
        s2 = Sh[g] + t * Sh[self.m + g] + lam * Sh[-1] + noise
        pred = self.mean[g] + t * self.mean[self.m + g] + lam * self.mean[-1]
        self.mean += Sh * ((y - pred) / s2)
        k = Sh / np.sqrt(s2)
        # In-place BLAS rank-1 update (no D x D temporary); both triangles get k_i k_j, so Sigma stays
        # symmetric up to rounding and rows can stand for columns.
        self.cov = dger(-1.0, k, k, a=self.cov.T, overwrite_a=1).T

    def tau_moments(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Posterior mean and covariance of tau at grid indices ``idx``."""
        j = self.m + np.asarray(idx)
        return self.mean[j], self.cov[np.ix_(j, j)]


def design_matrix(g: np.ndarray, t: np.ndarray, lam: np.ndarray, m: int) -> np.ndarray:
    """The N x (2m+1) matrix whose rows are h_i = [e_g ; t e_g ; lambda]."""
    H = np.zeros((len(g), 2 * m + 1))
    rows = np.arange(len(g))
    H[rows, g] += 1.0
    H[rows, m + np.asarray(g)] += t
    H[:, -1] = lam
    return H


def batch_posterior(prior: GPIVPosterior, g: np.ndarray, t: np.ndarray, lam: np.ndarray, y: np.ndarray,
                    noise: np.ndarray) -> GPIVPosterior:
    """All observations at once: mu = mu0 + S0 H' A^-1 (y - H mu0), Sigma = S0 - S0 H' A^-1 H S0,
    with A = H S0 H' + diag(noise)."""
    if len(y) == 0:
        return prior.copy()
    m = prior.m
    S0 = prior.cov
    S0H = S0[:, g] + S0[:, m + np.asarray(g)] * t + S0[:, [-1]] * lam  # S0 H' without forming H
    A = S0H[g] + S0H[m + np.asarray(g)] * t[:, None] + np.outer(lam, S0H[-1])
    A = 0.5 * (A + A.T)
    A[np.diag_indices_from(A)] += noise
    pred = prior.mean[g] + t * prior.mean[m + np.asarray(g)] + lam * prior.mean[-1]
    cf = cho_factor(A, lower=True)
    mean = prior.mean + S0H @ cho_solve(cf, y - pred)
    cov = S0 - S0H @ cho_solve(cf, S0H.T)
    return GPIVPosterior(mean, 0.5 * (cov + cov.T), m)


# -- first stage ----------------------------------------------------------------------------
def probit_map(Phi: np.ndarray, t: np.ndarray, alpha: float, w0: np.ndarray | None = None,
               iters: int = 50) -> tuple[np.ndarray, np.ndarray, float]:
    """MAP of w for t ~ Bernoulli(Phi(Phi w)), w ~ N(0, I/alpha), by damped Newton.

    Returns (w, Hessian of the negative log posterior, log likelihood at w).
    """
    s = 2 * np.asarray(t, float) - 1
    w = np.zeros(Phi.shape[1]) if w0 is None else w0.copy()

    def objective(w: np.ndarray) -> float:
        return float(log_ndtr(s * (Phi @ w)).sum() - 0.5 * alpha * w @ w)

    obj = objective(w)
    for _ in range(iters):
        u = s * (Phi @ w)
        lam = np.exp(-0.5 * u**2 - LOG_SQRT_2PI - log_ndtr(u))  # phi(u)/Phi(u)
        grad = Phi.T @ (s * lam) - alpha * w
        Wd = lam * (u + lam)  # -d2/du2 log Phi(u) > 0
        H = Phi.T @ (Phi * Wd[:, None]) + alpha * np.eye(len(w))
        step = np.linalg.solve(H, grad)
        a, new = 1.0, -np.inf
        while a > 1e-6:
            new = objective(w + a * step)
            if new >= obj - 1e-12:
                break
            a *= 0.5
        if new < obj - 1e-12:  # no ascent along the Newton direction: at the optimum up to rounding
            break
        w, prev, obj = w + a * step, obj, new
        if abs(obj - prev) < 1e-10 * (1 + abs(obj)):
            break
    u = s * (Phi @ w)
    lam = np.exp(-0.5 * u**2 - LOG_SQRT_2PI - log_ndtr(u))
    H = Phi.T @ (Phi * (lam * (u + lam))[:, None]) + alpha * np.eye(len(w))
    return w, H, float(log_ndtr(u).sum())


def probit_log_evidence(Phi: np.ndarray, t: np.ndarray, alpha: float,
                        w0: np.ndarray | None = None) -> tuple[float, np.ndarray]:
    """Laplace evidence log p(t | alpha) = log p(t|w) - alpha/2 |w|^2 + p/2 log alpha - 1/2 log|H|."""
    w, H, loglik = probit_map(Phi, t, alpha, w0)
    _, logdet = np.linalg.slogdet(H)
    p = Phi.shape[1]
    return loglik - 0.5 * alpha * w @ w + 0.5 * p * math.log(alpha) - 0.5 * logdet, w


class ProbitFirstStage:
    """eta(x, z) = w . phi(x, z) with phi = [1, x, z, z x] (+ RBF bumps of x and z times them).

    Fitted by empirical Bayes: ``alpha`` maximises the Laplace evidence, ``w`` is the MAP.
    Covariates are standardised with the pool's mean and scale; z is scaled to [0, 1].
    """

    ALPHA_RANGE = (0.1, 1e4)  # prior sd of the weights between 0.01 and ~3 (eta saturates beyond)

    def __init__(self, X_pool: np.ndarray, z_levels: tuple[float, ...], basis: str = "rbf",
                 centres: int = 5, rng: np.random.Generator | None = None) -> None:
        self.loc = X_pool.mean(axis=0)
        self.scale = np.where(X_pool.std(axis=0) > 0, X_pool.std(axis=0), 1.0)
        self.z_scale = max(abs(z) for z in z_levels) or 1.0
        self.centres = None
        if basis == "rbf":
            Xs = (X_pool - self.loc) / self.scale
            self.centres = farthest_points(Xs, min(centres, len(Xs)))
            gaps = sq_dists(self.centres, self.centres)
            gaps = np.sqrt(gaps[gaps > 0]) if len(self.centres) > 1 else np.array([1.0])
            self.width = float(np.median(gaps)) if len(gaps) else 1.0
        self.w = np.zeros(self.features(X_pool[:1], 0.0).shape[1])
        self.w_cov = np.eye(len(self.w))
        self.alpha = 1.0
        self.log_evidence = float("nan")

    def features(self, X: np.ndarray, z: np.ndarray | float) -> np.ndarray:
        Xs = (np.atleast_2d(X) - self.loc) / self.scale
        zs = np.broadcast_to(np.asarray(z, float) / self.z_scale, (len(Xs),))[:, None]
        cols = [np.ones((len(Xs), 1)), Xs]
        if self.centres is not None:
            cols.append(np.exp(-0.5 * sq_dists(Xs, self.centres) / self.width**2))
        base = np.hstack(cols)
        return np.hstack([base, zs * base])

    def fit(self, X: np.ndarray, z: np.ndarray, t: np.ndarray) -> ProbitFirstStage:
        """Empirical Bayes: maximise the Laplace evidence over log alpha, keep the MAP weights."""
        Phi = self.features(X, z)
        t = np.asarray(t, float)
        cache: dict[float, np.ndarray] = {}

        def neg_evidence(log_alpha: float) -> float:
            ev, w = probit_log_evidence(Phi, t, math.exp(log_alpha), self.w)
            cache[log_alpha] = w
            return -ev

        lo, hi = (math.log(a) for a in self.ALPHA_RANGE)
        res = minimize_scalar(neg_evidence, bounds=(lo, hi), method="bounded", options={"xatol": 1e-2})
        self.alpha = math.exp(res.x)
        self.w, H, _ = probit_map(Phi, t, self.alpha, cache.get(res.x, self.w))
        self.w_cov = np.linalg.inv(H)  # Laplace posterior covariance of the weights
        self.log_evidence = -float(res.fun)
        return self

    def eta(self, X: np.ndarray, z: np.ndarray | float) -> np.ndarray:
        return np.clip(self.features(X, z) @ self.w, -ETA_CLIP, ETA_CLIP)

    def propensity(self, X: np.ndarray, z: np.ndarray | float, moderated: bool = False) -> np.ndarray:
        """Phi(eta_hat), or with ``moderated`` the Laplace predictive Phi(eta_hat / sqrt(1 + Var eta))."""
        if not moderated:
            return ndtr(self.eta(X, z))
        F = self.features(X, z)
        var = np.einsum("ij,jk,ik->i", F, self.w_cov, F)
        return ndtr(np.clip(F @ self.w, -ETA_CLIP, ETA_CLIP) / np.sqrt(1.0 + var))


def farthest_points(X: np.ndarray, k: int) -> np.ndarray:
    """``k`` rows of X spread out by farthest-point traversal from the row nearest the mean."""
    idx = [int(np.argmin(((X - X.mean(0)) ** 2).sum(1)))]
    d = ((X - X[idx[0]]) ** 2).sum(1)
    while len(idx) < k:
        j = int(np.argmax(d))
        if d[j] <= 0:
            break
        idx.append(j)
        d = np.minimum(d, ((X - X[j]) ** 2).sum(1))
    return X[idx]


def grid_of(X_pool: np.ndarray, X_target: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The unique units of pool and target, and each pool and target row's index in that grid."""
    allx = np.vstack([X_pool, X_target])
    if not np.all(np.isfinite(allx)):
        raise DataError("population covariates hold a NaN or infinite value")
    grid, inv = np.unique(allx, axis=0, return_inverse=True)
    inv = np.asarray(inv).reshape(-1)
    return grid, inv[: len(X_pool)], inv[len(X_pool) :]
