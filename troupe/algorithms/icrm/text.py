"""ICRM over text (ALGORITHMS.md §C.1): a causal LM backbone reads each response, and the context
transformer of `troupe.algorithms.icrm.model` reads the demos and the query pair from those states.

A response (with its prompt) is encoded once, on its own: the backbone's embedding-layer and
last-layer states are each pooled to their mean and their sum / `SUM_SCALE`, side by side. The
mean carries the share of the response that is of one kind, the sum what it counts (a persona
may weigh how many formal markers a reply has, not their share). A linear probe of the eight
attributes from these states recovers R² 0.89–0.98 of each on the embedded backbone; from the
last layer alone, 0.52–0.96. Those vectors are the "features" the context
encoder reads: demos as (y⁺, y⁻) tokens, each query response as its own token, so r(x, y; C)
does not depend on the other response and μ is exactly antisymmetric under a swap.

Encoding responses apart keeps the cost linear in k (a 16-demo context is 34 short sequences,
not one of 1500 tokens), and the same encoder scores a policy's completion in RL. The backbone
is any causal LM: the embedded tiny model with a tokenizer trained on the task's text, or a hub
id / local directory (the GPU preset's Qwen2.5-1.5B).

`TextICRM.objective` says what it is trained for: ``elbo`` (ICRM, §C.2 with λ) or ``bce`` (the
point baselines of §C.3 on μ alone). With ``context=False`` every demo is masked: the static BT
reward model of §C.3, on the same backbone and the same architecture.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from troupe.actors.models import (
    TinyLMSpec,
    _quiet_transformers,
    build_tiny_lm,
    load_tokenizer,
    save_model,
)
from troupe.algorithms.icrm.model import ICRM, ICRMConfig
from troupe.envs.preferences.episodes import Episode
from troupe.platform.checkpoint import atomic_write_json, build_directory
from troupe.platform.config import check
from troupe.platform.errors import ConfigError

Tensor = torch.Tensor
SUM_SCALE = 32.0  # the sum-pooled half is divided by this, so it is O(1) for responses of ~30 tokens
OBJECTIVES = ("elbo", "bce")
CACHE_LIMIT = 200_000  # texts whose frozen-backbone state a model keeps
CONFIG_FILE = "icrm.json"
WEIGHTS_FILE = "icrm.safetensors"


@dataclasses.dataclass(frozen=True)
class BackboneConfig:
    """The response encoder; errors name ``backbone.<field>``."""

    path: str = "tiny"  # "tiny": built from `tiny`; else a hub id or a local directory of a causal LM
    # One layer of 64: reading an attribute is counting words of a kind; 64 dimensions keep the
    # vocabulary's words apart in the pooled states (a probe of 32 recovers much less of them),
    # and 1024 tokens make most words one token (at 384, "likely" is four).
    tiny: TinyLMSpec = dataclasses.field(default_factory=lambda: TinyLMSpec(
        hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=192, vocab_size=1024,
        max_position_embeddings=128))
    # "tiny" only: next-token pretraining on the task's text before any reward model is fitted
    # (cached), so that the embedded backbone starts, like a real one, as a language model.
    pretrain_steps: int = 1000
    pretrain_batch_size: int = 64
    pretrain_lr: float = 3e-3
    # False: the backbone is frozen and each response's state is computed once (a pool of
    # responses costs one pass); True: fine-tuned with the heads, every response every step.
    train: bool = False
    max_tokens: int = 96  # tokens read per response (its prompt cut first, from the left)
    features: int = 16  # the learned projection of each response's state the context encoder reads
    dtype: str = "float32"
    # Where a learner actor puts the backbone, the heads and the judge: cpu, cuda, cuda:N, or auto
    # (cuda when the actor sees a GPU). A GPU needs a GPU share for the actor (workers.num_gpus).
    device: str = "cpu"
    # Texts the backbone reads in one forward pass; null: all that a batch of episodes holds at once
    # (short synthetic responses). Long responses on a large backbone need a bound.
    encode_batch: int | None = None

    def __post_init__(self) -> None:
        check(self.device in ("cpu", "cuda", "auto") or (self.device.startswith("cuda:")
                                                        and self.device[5:].isdigit()),
              "backbone.device", self.device, "cpu, cuda, cuda:N or auto")
        check(self.features >= 1, "backbone.features", self.features, "an integer >= 1")
        check(self.encode_batch is None or self.encode_batch >= 1, "backbone.encode_batch", self.encode_batch,
              "an integer >= 1, or null")
        check(isinstance(self.max_tokens, int) and self.max_tokens >= 4, "backbone.max_tokens", self.max_tokens,
              "an integer >= 4")
        check(self.dtype in ("float32", "bfloat16", "float16"), "backbone.dtype", self.dtype,
              "float32, bfloat16 or float16")
        check(self.pretrain_steps >= 0, "backbone.pretrain_steps", self.pretrain_steps, "an integer >= 0")
        check(self.pretrain_batch_size >= 1, "backbone.pretrain_batch_size", self.pretrain_batch_size, "an integer >= 1")


def prepare_backbone(cfg: BackboneConfig, corpus: Sequence[str], key: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The directory every model of a run loads its backbone and tokenizer from, and facts about it.
    The embedded backbone is a tiny causal LM with a tokenizer trained on ``corpus``, pretrained
    by next-token prediction on it for ``pretrain_steps``, cached under the troupe cache by
    ``key`` (what shapes ``corpus``) and the backbone's config; any other is ``cfg.path`` itself."""
    import hashlib

    from troupe.algorithms.sft import ModelConfig, cache_root

    if cfg.path != "tiny":
        return cfg.path, {"backbone": cfg.path, "pretrained": "its own weights"}
    # where and in what batches it is read do not change the pretrained weights
    shape = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("device", "encode_batch")}
    src = {"backbone": shape | {"train": None}, "corpus": key, "v": 1}
    digest = hashlib.sha256(json.dumps(src, sort_keys=True).encode()).hexdigest()[:16]
    final = cache_root(ModelConfig()) / "icrm_backbone" / digest
    if (final / "pretrain.json").is_file():
        return str(final), json.loads((final / "pretrain.json").read_text()) | {"cache": "cached"}

    def build(tmp: Path) -> dict[str, Any]:
        facts = _pretrain(cfg, list(corpus), tmp)
        atomic_write_json(tmp / "pretrain.json", facts)
        return facts

    return str(final), build_directory(final, build) | {"cache": "fitted"}


def _pretrain(cfg: BackboneConfig, corpus: list[str], out: Path) -> dict[str, Any]:
    import time

    import numpy as np

    from troupe.actors.models import train_tokenizer

    _quiet_transformers()
    t0 = time.perf_counter()
    tok = train_tokenizer(corpus, cfg.tiny.vocab_size)
    lm = build_tiny_lm(cfg.tiny, tok, seed=0)
    tok.padding_side, tok.truncation_side = "right", "left"
    opt = torch.optim.AdamW(lm.parameters(), lr=cfg.pretrain_lr, weight_decay=0.0)
    rng = np.random.default_rng(0)
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: a second thread only slows a shared 2-core machine
    try:
        lm.train()
        for _ in range(cfg.pretrain_steps):
            texts = [corpus[i] for i in rng.integers(len(corpus), size=cfg.pretrain_batch_size)]
            enc = tok(texts, return_tensors="pt", padding=True, truncation=True, max_length=cfg.max_tokens,
                      add_special_tokens=False)
            labels = enc["input_ids"].masked_fill(enc["attention_mask"] == 0, -100)
            loss = lm(**enc, labels=labels).loss
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
            opt.step()
            losses.append(float(loss.item()))
    finally:
        torch.set_num_threads(threads)
    lm.eval()
    save_model(lm, tok, out)
    return {"backbone": "tiny", "pretrain_steps": cfg.pretrain_steps,
            "pretrain_loss_first": float(np.mean(losses[:20])) if losses else None,
            "pretrain_loss_last": float(np.mean(losses[-20:])) if losses else None,
            "seconds": round(time.perf_counter() - t0, 1)}


def resolve_device(device: str) -> str:
    """``backbone.device`` as torch names it: ``auto`` is cuda where this process sees a GPU."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


def build_backbone_from(cfg: BackboneConfig, path: str) -> tuple[Any, Any]:
    """(base model, tokenizer) of the causal LM at ``path`` (what `prepare_backbone` returned)."""
    from troupe.actors.models import load_causal_lm

    lm, tok = load_causal_lm(path, cfg.dtype)
    return getattr(lm, lm.base_model_prefix), tok


def build_judge_lm(cfg: Any, path: str) -> tuple[Any, Any, int]:
    """(causal LM, tokenizer, tokens it reads) for the generative judge of run config ``cfg``: the
    backbone with its LM head, its positions long enough for a prompt of ``icrm.max_demos`` demos."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from troupe.actors.reward_model import DTYPES

    _quiet_transformers()
    b = cfg.backbone
    max_tokens = (2 * cfg.icrm.max_demos + 2) * b.max_tokens
    where = str(Path(path).expanduser()) if Path(path).expanduser().exists() else path
    config = AutoConfig.from_pretrained(where)
    config.max_position_embeddings = max(int(getattr(config, "max_position_embeddings", 0) or 0), max_tokens)
    lm = AutoModelForCausalLM.from_pretrained(where, config=config, dtype=DTYPES[b.dtype])
    return lm, load_tokenizer(path), max_tokens


def response_text(prompt: str, response: str) -> str:
    """What the encoder reads for one response: the prompt, then the response."""
    return f"{prompt}\n{response}"


class TextICRM(nn.Module):
    """Backbone + `ICRM` (context encoder and heads) over text episodes; see the module docstring."""

    def __init__(self, backbone: Any, tokenizer: Any, cfg: ICRMConfig, max_tokens: int = 96,
                 objective: str = "elbo", context: bool = True, train_backbone: bool = False,
                 features: int = 16, encode_batch: int | None = None) -> None:
        super().__init__()
        if objective not in OBJECTIVES:
            raise ConfigError(f"icrm objective {objective!r}: expected one of {OBJECTIVES}")
        self.state_dim = 4 * int(backbone.config.hidden_size)  # [mean, sum] of the first and last layer's states
        if cfg.feature_dim != features:
            cfg = dataclasses.replace(cfg, feature_dim=features)
        self.cfg = cfg
        self.backbone = backbone
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.objective = objective
        self.context = context
        self.train_backbone = train_backbone
        self.encode_batch = encode_batch
        self.backbone.requires_grad_(train_backbone)
        self._states: dict[str, Tensor] = {}  # a frozen backbone's state of each text it has read
        self.icrm = ICRM(cfg)
        # Pooled states are standardised (`fit_standardiser`) before the context encoder reads
        # them: raw, their norm is ~11 and the demos' evidence drowns in a few large dimensions.
        self.icrm.register_buffer("state_center", torch.zeros(self.state_dim))
        self.icrm.register_buffer("state_scale", torch.ones(self.state_dim))
        # Every response state, demo or query, is read through one learned projection to a few
        # features: the demos' evidence and the query's reward then live in the same small space
        # (without it, on 256 standardised dimensions, the context encoder never used the demos).
        self.icrm.project = nn.Linear(self.state_dim, features)
        tokenizer.padding_side, tokenizer.truncation_side = "right", "left"

    @torch.no_grad()
    def fit_standardiser(self, texts: Sequence[str], chunk: int = 512) -> None:
        """Centre and scale of each pooled dimension over ``texts`` (the training responses)."""
        chunk = min(chunk, self.encode_batch or chunk)
        z = torch.cat([self._encode(list(texts[lo:lo + chunk])) for lo in range(0, len(texts), chunk)])
        self.icrm.state_center.copy_(z.mean(0))
        self.icrm.state_scale.copy_(z.std(0).clamp_min(1e-4))

    # -- encoding -------------------------------------------------------------------------------
    def encode(self, texts: Sequence[str], cache: bool = False) -> Tensor:
        """(n, 4·hidden): mean and scaled sum over each text of the backbone's embedding-layer and
        last-layer states (the first keep which words a text has, the second what they say together).
        With a frozen backbone and ``cache``, each text's state is computed once and kept (the
        training pool), up to `CACHE_LIMIT` texts."""
        if not texts:
            return torch.zeros(0, self.state_dim, device=self.device)
        if self.train_backbone or not cache:
            with torch.set_grad_enabled(self.train_backbone and torch.is_grad_enabled()):
                return self._encode_all(list(texts))
        new = [t for t in dict.fromkeys(texts) if t not in self._states]
        if new:
            with torch.no_grad():
                z = self._encode_all(new)
            if len(self._states) + len(new) > CACHE_LIMIT:
                fresh = dict(zip(new, z, strict=True))
                return torch.stack([self._states.get(t, fresh.get(t)) for t in texts])
            self._states.update(zip(new, z, strict=True))
        return torch.stack([self._states[t] for t in texts])

    def features(self, texts: Sequence[str], cache: bool = False) -> Tensor:
        """(n, features): each text's state through the learned projection, what the context encoder reads."""
        return self.icrm.project(self.encode(texts, cache))

    def _encode_all(self, texts: list[str]) -> Tensor:
        """`_encode` of every text, ``encode_batch`` at a time."""
        step = self.encode_batch or max(len(texts), 1)
        if len(texts) <= step:
            return self._encode(texts)
        return torch.cat([self._encode(texts[lo:lo + step]) for lo in range(0, len(texts), step)])

    def _encode(self, texts: list[str]) -> Tensor:
        """Standardised pooled states (see `fit_standardiser`)."""
        device = next(self.backbone.parameters()).device
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, truncation=True, max_length=self.max_tokens,
                             add_special_tokens=False).to(device)
        out = self.backbone(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_hidden_states=True)
        mask = enc["attention_mask"].unsqueeze(-1).to(out.last_hidden_state.dtype)
        parts = []
        for hidden in (out.hidden_states[0], out.last_hidden_state):
            total = (hidden * mask).sum(1)
            parts += [total / mask.sum(1).clamp_min(1), total / SUM_SCALE]
        z = torch.cat(parts, -1).float()
        return (z - self.icrm.state_center) / self.icrm.state_scale

    @property
    def device(self) -> torch.device:
        return self.icrm.state_center.device

    def batch(self, episodes: Sequence[Episode]) -> dict[str, Tensor]:
        """The tensors `ICRM` reads: every distinct text encoded once, then placed in its slot."""
        k_max = max([e.k for e in episodes] + [0])
        if k_max > self.cfg.max_demos:
            i = next(i for i, e in enumerate(episodes) if e.k > self.cfg.max_demos)
            raise ConfigError(f"episode {i} has k={episodes[i].k} demonstrations; the model's context holds "
                              f"icrm.max_demos={self.cfg.max_demos}: give at most {self.cfg.max_demos} demos or "
                              "raise icrm.max_demos")
        slots = max(k_max, 1) if self.context else 1  # a static model's context is its ctx token alone
        texts: dict[str, int] = {}

        def index(prompt: str, response: str) -> int:
            return texts.setdefault(response_text(prompt, response), len(texts))

        n = len(episodes)
        chosen = torch.zeros(n, slots, dtype=torch.long)
        rejected = torch.zeros(n, slots, dtype=torch.long)
        mask = torch.zeros(n, slots, dtype=torch.bool)
        demo_label = torch.zeros(n, slots)
        qa, qb = torch.zeros(n, dtype=torch.long), torch.zeros(n, dtype=torch.long)
        for i, e in enumerate(episodes):
            for j, d in enumerate(e.demos if self.context else ()):  # a static model reads no demo
                chosen[i, j], rejected[i, j] = index(d.prompt, d.chosen), index(d.prompt, d.rejected)
                demo_label[i, j] = d.label
                mask[i, j] = True
            qa[i], qb[i] = index(e.query.prompt, e.query.a), index(e.query.prompt, e.query.b)
        z = self.features(list(texts), cache=True)
        dim = z.shape[-1]
        chosen, rejected, mask, demo_label, qa, qb = (t.to(z.device)
                                                      for t in (chosen, rejected, mask, demo_label, qa, qb))
        return {"demo_chosen": z[chosen.view(-1)].view(n, slots, dim) * mask[..., None],
                "demo_rejected": z[rejected.view(-1)].view(n, slots, dim) * mask[..., None],
                "demo_mask": mask, "demo_label": demo_label * mask, "query_a": z[qa], "query_b": z[qb],
                "label": torch.tensor([float(e.query.label) for e in episodes], device=z.device)}

    def forward(self, episodes: Sequence[Episode]) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """(heads' outputs, the batch) for ``episodes``."""
        batch = self.batch(episodes)
        return self.icrm(batch), batch

    def loss(self, out: dict[str, Tensor], batch: dict[str, Tensor]) -> Tensor:
        """§C.2's negative ELBO (``elbo``), or the BT cross-entropy on μ alone (``bce``)."""
        if self.objective == "elbo":
            return self.icrm.loss(out, batch)
        return F.binary_cross_entropy_with_logits(out["r_a"] - out["r_b"], batch["label"])

    # -- scoring single responses (the reward in RL) ------------------------------------------------
    def context_states(self, demos: Sequence[Sequence[Any]]) -> tuple[Tensor, Tensor, Tensor]:
        """(chosen, rejected, mask) tensors of per-row demos (lists of `Comparison`)."""
        n, slots = len(demos), max([len(d) for d in demos] + [1])
        texts: dict[str, int] = {}
        ci = torch.zeros(n, slots, dtype=torch.long)
        ri = torch.zeros(n, slots, dtype=torch.long)
        mask = torch.zeros(n, slots, dtype=torch.bool)
        for i, row in enumerate(demos):
            for j, d in enumerate(row if self.context else ()):
                ci[i, j] = texts.setdefault(response_text(d.prompt, d.chosen), len(texts))
                ri[i, j] = texts.setdefault(response_text(d.prompt, d.rejected), len(texts))
                mask[i, j] = True
        z = self.features(list(texts)) if texts else torch.zeros(1, self.cfg.feature_dim, device=self.device)
        dim = z.shape[-1]
        ci, ri, mask = ci.to(z.device), ri.to(z.device), mask.to(z.device)
        return (z[ci.view(-1)].view(n, slots, dim) * mask[..., None], z[ri.view(-1)].view(n, slots, dim) * mask[..., None],
                mask)

    def pair(self, demos: Sequence[Sequence[Any]], prompts: Sequence[str], a: Sequence[str],
             b: Sequence[str]) -> dict[str, Tensor]:
        """Heads' outputs for rows (demos_i, prompt_i, a_i, b_i): μ = P(a ≻ b | C_i), τ, α, β, r_a, r_b."""
        chosen, rejected, mask = self.context_states(demos)
        za = self.features([response_text(p, y) for p, y in zip(prompts, a, strict=True)])
        zb = self.features([response_text(p, y) for p, y in zip(prompts, b, strict=True)])
        return self.icrm({"demo_chosen": chosen, "demo_rejected": rejected, "demo_mask": mask,
                          "query_a": za, "query_b": zb})

    # -- files -----------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """A directory `load_text_icrm` reads: ``backbone/`` (a transformers model and its
        tokenizer), the context encoder and heads (``icrm.safetensors``) and ``icrm.json``."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_model(self.backbone, self.tokenizer, path / "backbone")
        save_file({k: v.detach().cpu().contiguous() for k, v in self.icrm.state_dict().items()}, path / WEIGHTS_FILE)
        atomic_write_json(path / CONFIG_FILE, {"icrm": dataclasses.asdict(self.cfg), "max_tokens": self.max_tokens,
                                                "objective": self.objective, "context": self.context,
                                                "train_backbone": self.train_backbone,
                                                "features": self.cfg.feature_dim,
                                                "pooling": "mean+sum", "sum_scale": SUM_SCALE})


def check_icrm_path(path: str | Path, key: str = "reward.path") -> Path:
    """``path`` as a directory `TextICRM.save` wrote, or a ConfigError naming ``key`` and the fix."""
    p = Path(path).expanduser()
    if not (p / CONFIG_FILE).is_file() or not (p / WEIGHTS_FILE).is_file():
        raise ConfigError(f"{key}={str(path)!r} is not a saved in-context reward model: it has no {CONFIG_FILE} "
                          f"and {WEIGHTS_FILE}; give the directory an icrm run wrote (RUN/models/icrm) or "
                          "TextICRM.save wrote")
    return p


def load_text_icrm(path: str | Path, key: str = "reward.path", device: str = "cpu") -> TextICRM:
    """The `TextICRM` saved at ``path`` by `TextICRM.save`; a ConfigError naming ``key`` otherwise."""
    from safetensors.torch import load_file
    from transformers import AutoModel

    _quiet_transformers()
    path = check_icrm_path(path, key)
    meta = json.loads((path / CONFIG_FILE).read_text())
    backbone = AutoModel.from_pretrained(path / "backbone")
    tok = load_tokenizer(str(path / "backbone"))
    model = TextICRM(backbone, tok, ICRMConfig(**meta["icrm"]), meta["max_tokens"], meta["objective"], meta["context"],
                     meta.get("train_backbone", False), meta.get("features", 16))
    model.icrm.load_state_dict(load_file(path / WEIGHTS_FILE))
    return model.to(device).eval()
