"""ICRM's network (ALGORITHMS.md §C.1): a context encoder that reads k demonstrations and the query
pair, and the two heads of the Beta posterior.

The split is what lets the heads move to a text backbone: an encoder maps an episode to one
vector per query response, z_a = enc(y_a; C) and z_b = enc(y_b; C), and `ICRMHeads` turns them
into r_a = r(z_a), r_b = r(z_b), μ = σ(r_a − r_b) and τ = softplus(h(z_a, z_b)) + τ_min with h
symmetric. A text backbone (a causal LM's last-token state of "demos, prompt, response") is
another encoder with the same output.

`FeatureContextEncoder` is the encoder over feature vectors for the amortised benchmark (§C.5):
a transformer over [ctx, demo_1 .. demo_K, y_a, y_b] where a demo token embeds (φ(y⁺), φ(y⁻)) and
a query token embeds φ(y). Demos attend to the ctx token and the demos; each query token attends
to those and to itself only, never to the other response, so r(y_a; C) does not depend on y_b and
μ is exactly antisymmetric under swapping the pair. No positions: the demos are a set, and the
output does not depend on their order.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from troupe.algorithms.icrm import posterior
from troupe.envs.preferences.episodes import FeatureEpisodes
from troupe.platform.errors import ConfigError

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class ICRMConfig:
    """The model and its loss; errors name the key ``icrm.<field>``."""

    feature_dim: int = 8  # d of φ(y) (§C.5: 8)
    max_demos: int = 32  # the context: k ∈ {0..max_demos} (§C.1)
    d_model: int = 64
    layers: int = 2
    heads: int = 4
    mlp_ratio: int = 4
    tau_min: float = 1e-2  # §C.1
    a0: float = 1.0  # prior Beta(a0, b0) (§C.1, ASM: 1, 1)
    b0: float = 1.0
    kl_weight: float = 1.0  # λ (§C.2; 1 is the exact ELBO)
    episode_elbo: bool = False  # ASM: §C.2's alternative reading, demo labels as draws of the query's p
    # ASM: add to r(y; C) the bilinear term (Σ_j φ(y⁺_j) − φ(y⁻_j)) / (k + 1) · A φ(y), the
    # one-step reading of a BT persona from its demos (§C.5: r = e_Cᵀφ(y)), beside the encoder's
    # own reading. On a frozen text backbone the encoder alone learns to read demos slowly.
    bilinear: bool = False

    def __post_init__(self) -> None:
        for name in ("feature_dim", "d_model", "layers", "heads", "mlp_ratio"):
            v = getattr(self, name)
            if not (isinstance(v, int) and v >= 1):
                raise ConfigError(f"icrm.{name}={v!r}: expected an integer >= 1")
        if not (isinstance(self.max_demos, int) and self.max_demos >= 0):
            raise ConfigError(f"icrm.max_demos={self.max_demos!r}: expected an integer >= 0")
        if self.d_model % self.heads:
            raise ConfigError(f"icrm.d_model={self.d_model} is not a multiple of icrm.heads={self.heads}")
        for name in ("tau_min", "a0", "b0", "kl_weight"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"icrm.{name}={getattr(self, name)!r}: expected a number > 0")


class ICRMHeads(nn.Module):
    """§C.1's two heads on per-response states z_a, z_b (…, d_model): the reward head r and the
    confidence head h(z_a, z_b) = g(z_a + z_b, |z_a − z_b|), symmetric in (a, b)."""

    def __init__(self, d_model: int, tau_min: float = 1e-2) -> None:
        super().__init__()
        self.reward = nn.Linear(d_model, 1)
        self.confidence = nn.Sequential(nn.Linear(2 * d_model, d_model), nn.GELU(), nn.Linear(d_model, 1))
        self.tau_min = tau_min

    def forward(self, z_a: Tensor, z_b: Tensor, extra_a: Tensor | float = 0.0,
                extra_b: Tensor | float = 0.0) -> dict[str, Tensor]:
        # extra_*: a term added to each response's reward (ICRM's bilinear reading of the demos)
        r_a, r_b = self.reward(z_a).squeeze(-1) + extra_a, self.reward(z_b).squeeze(-1) + extra_b
        h = self.confidence(torch.cat([z_a + z_b, (z_a - z_b).abs()], -1)).squeeze(-1)
        mu = posterior.preference_mean(r_a, r_b)
        tau = posterior.confidence(h, self.tau_min)
        alpha, beta = posterior.beta_params(mu, tau)
        return {"r_a": r_a, "r_b": r_b, "mu": mu, "tau": tau, "alpha": alpha, "beta": beta}


class _Block(nn.Module):
    """Pre-LN transformer block whose attention takes a boolean mask (True: may attend)."""

    def __init__(self, d: int, heads: int, mlp_ratio: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        # SwiGLU, as in Qwen2/Llama: the gate's product lets one token combine its own response with
        # the context it attended to (a BT persona's reward is the bilinear e_Cᵀφ(y), §C.5)
        self.gate = nn.Linear(d, 2 * mlp_ratio * d)
        self.down = nn.Linear(mlp_ratio * d, d)

    def forward(self, x: Tensor, allowed: Tensor) -> Tensor:
        n, length, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(n, length, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
        x = x + self.out(att.transpose(1, 2).reshape(n, length, d))
        gate, up = self.gate(self.ln2(x)).chunk(2, -1)
        return x + self.down(F.silu(gate) * up)


class FeatureContextEncoder(nn.Module):
    """Episode in features → (z_a, z_b): see the module docstring for the token layout and mask."""

    def __init__(self, cfg: ICRMConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.demo = nn.Sequential(nn.Linear(3 * cfg.feature_dim, d), nn.GELU(), nn.Linear(d, d))
        self.response = nn.Sequential(nn.Linear(cfg.feature_dim, d), nn.GELU(), nn.Linear(d, d))
        self.ctx = nn.Parameter(torch.zeros(1, 1, d))  # always attendable: k = 0 leaves attention defined
        self.blocks = nn.ModuleList(_Block(d, cfg.heads, cfg.mlp_ratio) for _ in range(cfg.layers))
        self.ln = nn.LayerNorm(d)

    def forward(self, demo_chosen: Tensor, demo_rejected: Tensor, demo_mask: Tensor, y_a: Tensor,
                y_b: Tensor) -> tuple[Tensor, Tensor]:
        n, slots = demo_mask.shape
        # (y⁺, y⁻, y⁺ − y⁻): the difference is what a BT persona acts on; giving it saves the MLP a step
        demos = self.demo(torch.cat([demo_chosen, demo_rejected, demo_chosen - demo_rejected], -1))
        x = torch.cat([self.ctx.expand(n, 1, -1), demos, self.response(y_a)[:, None], self.response(y_b)[:, None]], 1)
        length = slots + 3
        keys = torch.cat([torch.ones(n, 1, dtype=torch.bool), demo_mask.bool(),
                          torch.zeros(n, 2, dtype=torch.bool)], 1)
        allowed = keys[:, None, :].expand(n, length, length).clone()
        allowed[:, -2, -2] = True  # y_a sees itself, not y_b; y_b likewise
        allowed[:, -1, -1] = True
        for block in self.blocks:
            x = block(x, allowed)
        x = self.ln(x)
        return x[:, -2], x[:, -1]


class ICRM(nn.Module):
    """The feature-space ICRM: `FeatureContextEncoder` and `ICRMHeads`; `loss` is §C.2's."""

    def __init__(self, cfg: ICRMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.encoder = FeatureContextEncoder(cfg)
        self.heads = ICRMHeads(cfg.d_model, cfg.tau_min)
        if cfg.bilinear:  # zero at start: the model begins as the encoder alone
            self.read = nn.Parameter(torch.zeros(cfg.feature_dim, cfg.feature_dim))

    def forward(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        z_a, z_b = self.encoder(batch["demo_chosen"], batch["demo_rejected"], batch["demo_mask"],
                                batch["query_a"], batch["query_b"])
        if not self.cfg.bilinear:
            return self.heads(z_a, z_b)
        e = demo_direction(batch["demo_chosen"], batch["demo_rejected"], batch["demo_mask"]) @ self.read
        return self.heads(z_a, z_b, (e * batch["query_a"]).sum(-1), (e * batch["query_b"]).sum(-1))

    def loss(self, out: dict[str, Tensor], batch: dict[str, Tensor]) -> Tensor:
        """Mean over the batch of §C.2's negative ELBO, or of its ``episode_elbo`` reading."""
        c = self.cfg
        label = batch["label"].to(out["alpha"].dtype)
        if c.episode_elbo:
            per = posterior.episode_negative_elbo(out["alpha"], out["beta"], label, batch["demo_label"],
                                                  batch["demo_mask"], c.kl_weight, c.a0, c.b0)
        else:
            per = posterior.negative_elbo(out["alpha"], out["beta"], label, c.kl_weight, c.a0, c.b0)
        return per.mean()


def demo_direction(chosen: Tensor, rejected: Tensor, mask: Tensor) -> Tensor:
    """(Σ_j φ(y⁺_j) − φ(y⁻_j)) / (k + 1) over each episode's k demos: 0 without demos, and a
    persona's direction scaled by k / (k + 1), its evidence, as k grows."""
    m = mask.to(chosen.dtype)[..., None]
    return ((chosen - rejected) * m).sum(-2) / (m.sum(-2) + 1)


def episode_batch(episodes: FeatureEpisodes, cfg: ICRMConfig) -> dict[str, Tensor]:
    """Tensors of ``episodes`` for `ICRM`, demo slots cut to the largest k; an episode with more
    demos than ``icrm.max_demos``, or features of another size, is a ConfigError naming the fix."""
    ks = episodes.k
    over = np.flatnonzero(ks > cfg.max_demos)
    if over.size:
        i = int(over[0])
        raise ConfigError(f"episode {i} has k={int(ks[i])} demonstrations; the model's context holds "
                          f"icrm.max_demos={cfg.max_demos}: give at most {cfg.max_demos} demos per episode "
                          "or raise icrm.max_demos")
    if episodes.dim != cfg.feature_dim:
        raise ConfigError(f"episodes have {episodes.dim} features per response; the model reads "
                          f"icrm.feature_dim={cfg.feature_dim}: set icrm.feature_dim={episodes.dim}")
    slots = max(int(ks.max(initial=0)), 1)
    return {"demo_chosen": f32(episodes.demo_chosen[:, :slots]),
            "demo_rejected": f32(episodes.demo_rejected[:, :slots]),
            "demo_mask": torch.as_tensor(episodes.demo_mask[:, :slots], dtype=torch.bool),
            "demo_label": f32(episodes.demo_label[:, :slots]),
            "query_a": f32(episodes.query_a), "query_b": f32(episodes.query_b),
            "label": f32(episodes.label), "p_true": f32(episodes.p_true)}


def f32(a: np.ndarray) -> Tensor:
    return torch.as_tensor(np.asarray(a), dtype=torch.float32)


def swap_query(batch: dict[str, Tensor]) -> dict[str, Tensor]:
    """The batch with each query pair shown the other way round (the label and p_true flip)."""
    return {**batch, "query_a": batch["query_b"], "query_b": batch["query_a"], "label": 1 - batch["label"],
            "p_true": 1 - batch["p_true"]}
