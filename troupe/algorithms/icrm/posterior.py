"""ICRM's math as pure torch functions (ALGORITHMS.md §C.1–§C.2).

The variational posterior over p = P(y_a ≻ y_b | x, C) is Beta(α, β) with α = μτ, β = (1 − μ)τ,
the prior Beta(a0, b0). Every function is elementwise over broadcastable tensors and
differentiable, so the same code is the training loss, the reward and what the tests check
against closed forms.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

Tensor = torch.Tensor


def preference_mean(r_a: Tensor, r_b: Tensor) -> Tensor:
    # §C.1: μ = σ(r(x, y_a; C) − r(x, y_b; C)), antisymmetric in (a, b) by construction
    return torch.sigmoid(r_a - r_b)


def confidence(h: Tensor, tau_min: float = 1e-2) -> Tensor:
    # §C.1: τ = softplus(h) + τ_min
    return F.softplus(h) + tau_min


def beta_params(mu: Tensor, tau: Tensor) -> tuple[Tensor, Tensor]:
    # §C.1: α = μτ, β = (1 − μ)τ
    return mu * tau, (1 - mu) * tau


def log_beta_fn(a: Tensor, b: Tensor) -> Tensor:
    return torch.lgamma(a) + torch.lgamma(b) - torch.lgamma(a + b)


def beta_kl(alpha: Tensor, beta: Tensor, a0: Tensor | float = 1.0, b0: Tensor | float = 1.0) -> Tensor:
    """KL(Be(α, β) ‖ Be(a0, b0)) = ln B(a0,b0) − ln B(α,β) + (α−a0)ψ(α) + (β−b0)ψ(β) + (a0+b0−α−β)ψ(α+β)."""
    a0 = torch.as_tensor(a0, dtype=alpha.dtype)
    b0 = torch.as_tensor(b0, dtype=alpha.dtype)
    s = alpha + beta
    return (log_beta_fn(a0, b0) - log_beta_fn(alpha, beta) + (alpha - a0) * torch.digamma(alpha)
            + (beta - b0) * torch.digamma(beta) + (a0 + b0 - s) * torch.digamma(s))


def expected_log_likelihood(alpha: Tensor, beta: Tensor, label: Tensor | float) -> Tensor:
    """E_q[log p(ℓ | p)] = ℓ(ψ(α) − ψ(α+β)) + (1−ℓ)(ψ(β) − ψ(α+β)) (§C.2); a soft ℓ ∈ [0, 1] is the
    average over labels with that frequency."""
    ds = torch.digamma(alpha + beta)
    return label * (torch.digamma(alpha) - ds) + (1 - label) * (torch.digamma(beta) - ds)


def negative_elbo(alpha: Tensor, beta: Tensor, label: Tensor | float, kl_weight: float = 1.0,
                  a0: float = 1.0, b0: float = 1.0) -> Tensor:
    """§C.2's per-query loss L = −E_q[log p(ℓ | p)] + λ KL(Be(α, β) ‖ Be(a0, b0)); λ = 1 is the ELBO."""
    return -expected_log_likelihood(alpha, beta, label) + kl_weight * beta_kl(alpha, beta, a0, b0)


def episode_negative_elbo(alpha: Tensor, beta: Tensor, label: Tensor, demo_labels: Tensor, demo_mask: Tensor,
                          kl_weight: float = 1.0, a0: float = 1.0, b0: float = 1.0) -> Tensor:
    """§C.2's ``episode_elbo`` reading [ASM]: the k demo labels (n, K), masked by ``demo_mask``, are
    further draws of the query's latent p, so the likelihood sums over query and demos:
    L = −E_q[log p(ℓ)] − Σ_i E_q[log p(ℓ_i)] + λ KL. Its optimum is Beta(a0 + Σℓ/λ, b0 + Σ(1−ℓ)/λ)
    (`episode_optimum`), whose τ grows with k."""
    demo_ll = expected_log_likelihood(alpha[..., None], beta[..., None], demo_labels.to(alpha.dtype))
    demo_ll = (demo_ll * demo_mask.to(alpha.dtype)).sum(-1)
    return negative_elbo(alpha, beta, label, kl_weight, a0, b0) - demo_ll


def negative_elbo_grad(alpha: Tensor, beta: Tensor, label: Tensor | float, kl_weight: float = 1.0,
                       a0: float = 1.0, b0: float = 1.0) -> tuple[Tensor, Tensor]:
    """(∂L/∂α, ∂L/∂β), §C.2's analytic gradients:
    ∂α = −ℓψ₁(α) + ψ₁(α+β) + λ[(α−a0)ψ₁(α) − (α+β−a0−b0)ψ₁(α+β)], and ∂β likewise with 1−ℓ, β, b0."""
    t_a, t_b, t_s = (torch.polygamma(1, v) for v in (alpha, beta, alpha + beta))
    kl_s = (alpha + beta - a0 - b0) * t_s
    d_alpha = -label * t_a + t_s + kl_weight * ((alpha - a0) * t_a - kl_s)
    d_beta = -(1 - label) * t_b + t_s + kl_weight * ((beta - b0) * t_b - kl_s)
    return d_alpha, d_beta


def mean_confidence_grad(d_alpha: Tensor, d_beta: Tensor, mu: Tensor, tau: Tensor) -> tuple[Tensor, Tensor]:
    # §C.2: ∂μ = τ(∂α − ∂β), ∂τ = μ∂α + (1 − μ)∂β (chain rule through α = μτ, β = (1−μ)τ)
    return tau * (d_alpha - d_beta), mu * d_alpha + (1 - mu) * d_beta


def episode_optimum(positives: Tensor | float, negatives: Tensor | float, kl_weight: float = 1.0,
                    a0: float = 1.0, b0: float = 1.0) -> tuple[Tensor, Tensor]:
    """Minimiser of −Σ E_q[log p(ℓ_i)] + λ KL over Beta(α, β), for label counts (positives, negatives):
    Beta(a0 + positives/λ, b0 + negatives/λ), the prior times the likelihood to the power 1/λ."""
    positives, negatives = _float64(positives), _float64(negatives)
    return a0 + positives / kl_weight, b0 + negatives / kl_weight


def population_optimum(p_bar: Tensor | float, kl_weight: float = 1.0, a0: float = 1.0,
                       b0: float = 1.0) -> tuple[Tensor, Tensor]:
    """§C.2's closed-form optimum of the query-only loss for label frequency p̄:
    q* = Beta(a0 + p̄/λ, b0 + (1 − p̄)/λ), so τ* = a0 + b0 + 1/λ and μ* = (a0 + p̄/λ)/τ*."""
    p_bar = _float64(p_bar)
    return episode_optimum(p_bar, 1 - p_bar, kl_weight, a0, b0)


def _float64(x: Tensor | float) -> Tensor:
    return x if isinstance(x, Tensor) else torch.tensor(float(x), dtype=torch.float64)


def product_of_experts(alpha1: Tensor, beta1: Tensor, alpha2: Tensor, beta2: Tensor) -> tuple[Tensor, Tensor]:
    # §C.2 (PoE) [ASM]: Be(α1, β1)·Be(α2, β2) ∝ Be(α1 + α2 − 1, β1 + β2 − 1)
    return alpha1 + alpha2 - 1, beta1 + beta2 - 1


def conservative_reward(alpha: Tensor, beta: Tensor) -> Tensor:
    # §C.2: R = E_q[log p] = ψ(α) − ψ(α + β) ≤ 0
    return torch.digamma(alpha) - torch.digamma(alpha + beta)
