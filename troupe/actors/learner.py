"""Learner: the policy, its optimizer and its loss; N ranks train with torch DDP.

``update(batch, extras) → metrics`` runs ``num_minibatches`` optimizer steps over the batch;
every rank reads the whole batch (a zero-copy object-store read) and trains on its own
slice of each minibatch, with loss normalisers computed over the whole minibatch, so N
ranks give the gradient of one. ``publish_weights()`` returns a versioned `WeightUpdate`
(LoRA: the adapter only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import socket
from typing import Any

import numpy as np
import torch

from troupe.actors.base import configure_threads
from troupe.actors.logit_processing import as_sampling
from troupe.actors.logprobs import completion_forward, score_completions
from troupe.actors.losses import policy_objective, truncated_is_weights
from troupe.actors.lr_schedule import LR_SCHEDULES, lr_factor
from troupe.actors.models import load_causal_lm
from troupe.actors.sampling import SamplingConfig
from troupe.actors.scorer import as_batch
from troupe.actors.transport import object_store
from troupe.actors.transport.base import WeightUpdate, choose_transport, pack_state_dict, unpack_state_dict
from troupe.platform.batch import Batch
from troupe.platform.config import check, registered
from troupe.platform.errors import ConfigError
from troupe.platform.registry import AGGREGATIONS, POLICY_LOSSES, TRANSPORTS

AUTOCAST = {"none": None, "bf16": torch.bfloat16}  # learner.autocast → the forward passes' dtype


@dataclasses.dataclass
class LoraSettings:
    enabled: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: list[str] = dataclasses.field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def peft_config(self) -> dict[str, Any]:
        return {"r": self.r, "lora_alpha": self.alpha, "lora_dropout": self.dropout,
                "target_modules": list(self.target_modules), "task_type": "CAUSAL_LM"}


@dataclasses.dataclass
class LearnerConfig:
    """The learner section of an RL algorithm's config."""

    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    # The learning rate: a linear warm-up from 0 over `warmup_steps` optimizer steps, then
    # constant, or a linear or cosine decay over `total_steps` (None: run.steps × num_minibatches,
    # one update per step) to `min_lr_ratio` × lr.
    lr_schedule: str = "constant"  # constant, linear or cosine
    warmup_steps: int = 0
    total_steps: int | None = None
    min_lr_ratio: float = 0.0
    loss: str = registered("ppo_clip", POLICY_LOSSES)  # ppo_clip, reinforce, or "module:function"
    # The loss's own hyperparameters, by name; its signature holds their defaults
    # (ppo_clip: clip_low, clip_high — DAPO's clip-higher is loss_kwargs.clip_high=0.28).
    loss_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    aggregation: str = registered("grpo", AGGREGATIONS)  # grpo, dr_grpo, dapo, or "module:function"
    kl_coef: float = 0.0  # k3 KL to the reference policy; > 0 adds a reference scorer
    entropy_coef: float = 0.0  # entropy bonus: the loss minus coef × entropy, aggregated like the policy loss
    num_minibatches: int = 1  # optimizer steps per batch
    micro_batch_size: int = 64  # gradients accumulate over micro-batches: the same step as one batch
    gradient_checkpointing: bool = False  # recompute activations in the backward pass (less memory)
    autocast: str = "none"  # none, or bf16: torch.autocast around the forward passes (float32 weights)
    recompute_old_logprobs: bool = False  # recompute π_old with the learner (use with vLLM)
    # Decoupled PPO with truncated importance weights, for batches sampled by older weights
    # (run.staleness > 0) or by engines whose log-probs differ from the learner's: the learner
    # scores the batch with its own weights before the update (π_prox), PPO clips π/π_prox, and
    # each token's loss is weighted by min(π_prox/π_behaviour, tis_cap), π_behaviour being the
    # engines' log-probs. None: off (PPO clips π/π_behaviour, or π/π_prox with recompute_old_logprobs).
    tis_cap: float | None = None
    num_ranks: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    dtype: str = "float32"
    lora: LoraSettings = dataclasses.field(default_factory=LoraSettings)

    def __post_init__(self) -> None:
        check(self.lr > 0, "learner.lr", self.lr, "a number > 0")
        check(self.num_minibatches >= 1, "learner.num_minibatches", self.num_minibatches, "an integer >= 1")
        check(self.micro_batch_size >= 1, "learner.micro_batch_size", self.micro_batch_size, "an integer >= 1")
        check(self.num_ranks >= 1, "learner.num_ranks", self.num_ranks, "an integer >= 1")
        check(self.grad_clip >= 0, "learner.grad_clip", self.grad_clip, "a number >= 0 (0 disables)")
        check(self.kl_coef >= 0, "learner.kl_coef", self.kl_coef, "a number >= 0")
        check(self.entropy_coef >= 0, "learner.entropy_coef", self.entropy_coef, "a number >= 0 (0 = off)")
        check(self.lr_schedule in LR_SCHEDULES, "learner.lr_schedule", self.lr_schedule,
              "one of " + ", ".join(LR_SCHEDULES))
        check(self.warmup_steps >= 0, "learner.warmup_steps", self.warmup_steps, "an integer >= 0")
        check(self.total_steps is None or self.total_steps >= 1, "learner.total_steps", self.total_steps,
              "an integer >= 1, or null for run.steps × learner.num_minibatches")
        check(0 <= self.min_lr_ratio <= 1, "learner.min_lr_ratio", self.min_lr_ratio, "a number in [0, 1]")
        check(isinstance(self.gradient_checkpointing, bool), "learner.gradient_checkpointing",
              self.gradient_checkpointing, "true or false")
        check(self.autocast in AUTOCAST, "learner.autocast", self.autocast, "one of " + ", ".join(AUTOCAST))
        check(self.tis_cap is None or self.tis_cap > 0, "learner.tis_cap", self.tis_cap,
              "a number > 0 (e.g. 2), or null for no importance weights")

    def validate(self) -> None:
        """Checks that need the loss itself (run in the driver by `check_registered`)."""
        from troupe.actors.losses import check_loss_kwargs

        check_loss_kwargs(self.loss, self.loss_kwargs)


class Learner:
    """One rank of the policy learner."""

    uses_global_rng = True  # dropout and its checkpointed torch state (a fused host keeps it per role)

    def __init__(self, model_path: str, config: dict[str, Any] | LearnerConfig, rank: int = 0,
                 world_size: int = 1, seed: int = 0, temperature: float = 1.0, max_len: int | None = None,
                 device: str = "cpu", chat_template: str | None = None,
                 sampling: SamplingConfig | dict[str, Any] | None = None, run_steps: int | None = None) -> None:
        """``sampling`` is the rollout's (``temperature`` alone, when it is not given): the learner's
        log-probs are those of the distribution the engines sample from. ``run_steps`` (one update
        each) gives the default ``learner.total_steps`` of a decaying learning-rate schedule."""
        configure_threads()
        self.cfg = config if isinstance(config, LearnerConfig) else _learner_config(config)
        self.rank, self.world_size = rank, world_size
        self.sampling = as_sampling(sampling if sampling is not None else temperature)
        # The schedule's step is `updates` (optimizer steps taken), which checkpoints keep.
        derived = run_steps * self.cfg.num_minibatches if run_steps is not None else None
        self.total_steps = self.cfg.total_steps or derived
        if self.cfg.lr_schedule != "constant" and self.total_steps is None:
            raise ConfigError(f"learner.lr_schedule={self.cfg.lr_schedule} decays over learner.total_steps: set it "
                              "(or pass run_steps, as the algorithms do)")
        self.max_len = max_len
        self.device = device if device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        torch.manual_seed(seed)
        # The run's model.chat_template, if set, so the tokenizer matches the engines'; prompts arrive as ids.
        model, self.tokenizer = load_causal_lm(model_path, self.cfg.dtype, self.device, chat_template)
        if self.cfg.gradient_checkpointing:
            # Non-reentrant: the gradient reaches LoRA adapters behind frozen embeddings too.
            # transformers >= 5.x names it activation checkpointing (the old name warns).
            enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
            enable({"use_reentrant": False})
        if self.cfg.lora.enabled:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(**self.cfg.lora.peft_config()))
        self.model = model
        self.model.train()
        self.ddp_model: Any = None
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=self.cfg.lr, betas=tuple(self.cfg.betas),
                                           weight_decay=self.cfg.weight_decay)
        self.version = 0
        self.updates = 0
        self.weight_group: Any = None  # nccl group with the engines, when that transport is on

    # -- distributed ----------------------------------------------------------------
    def master_address(self) -> tuple[str, int]:
        """An address and free port for the process group (asked of rank 0)."""
        import ray

        ip = ray.util.get_node_ip_address()
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ip, port

    def init_distributed(self, addr: str, port: int) -> bool:
        if self.world_size == 1:
            return True
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        backend = "nccl" if self.device.startswith("cuda") else "gloo"
        dist.init_process_group(backend, init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                world_size=self.world_size)
        self.ddp_model = DistributedDataParallel(self.model)
        return True

    # -- training ---------------------------------------------------------------------
    def update(self, batch: Batch | list[Any], extras: dict[str, torch.Tensor]) -> dict[str, float]:
        """Train on ``batch`` with per-row ``extras`` (``advantages`` [N] or [N, C]; optional
        ``ref_logprobs`` [N, C]); returns this rank's metrics."""
        batch = as_batch(batch)
        for k, v in _resolve(extras).items():
            batch[k] = v
        batch.require("advantages", "logprobs", who="Learner.update")
        if self.cfg.kl_coef > 0:
            batch.require("ref_logprobs", who="Learner.update with learner.kl_coef > 0")
        if self.cfg.recompute_old_logprobs or self.cfg.tis_cap is not None:
            if self.cfg.tis_cap is not None:  # the engines' log-probs stay, as the behaviour policy
                batch["behaviour_logprobs"] = batch["logprobs"]
            self.model.eval()
            with self._autocast():
                batch["logprobs"] = score_completions(self.model, batch.to(self.device), self.sampling,
                                                      self.cfg.micro_batch_size)["logprobs"].cpu()
            self.model.train()
        metrics: dict[str, list[float]] = {}
        for minibatch in batch.split(self.cfg.num_minibatches):
            for k, v in self._optimizer_step(minibatch).items():
                metrics.setdefault(k, []).append(v)
        return {k: float(np.mean(v)) for k, v in metrics.items()}

    def _optimizer_step(self, minibatch: Batch) -> dict[str, float]:
        mask = minibatch["completion_mask"]
        norm = {"num_seqs": len(minibatch), "num_tokens": int(mask.sum()),
                "max_len": self.max_len or mask.shape[1]}
        shard = minibatch.split(self.world_size)[self.rank]
        model = self.ddp_model or self.model
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, float] = {}
        micro = list(shard.chunks(self.cfg.micro_batch_size)) or [shard]
        for i, mb in enumerate(micro):
            mb = mb.to(self.device)
            last = i == len(micro) - 1
            ctx = model.no_sync() if (self.ddp_model is not None and not last) else contextlib.nullcontext()
            with ctx:
                with self._autocast():
                    fwd = completion_forward(model, mb, self.sampling, with_entropy=True,
                                             entropy_grad=self.cfg.entropy_coef > 0)
                # Every micro-batch's loss is normalised by the whole minibatch's counts: their
                # gradients add up to the gradient of the minibatch as one batch.
                loss, m = policy_objective(
                    self.cfg.loss, fwd["logprobs"], mb["logprobs"], mb["advantages"], mb["completion_mask"],
                    aggregation=self.cfg.aggregation, kl_coef=self.cfg.kl_coef, ref_logprobs=mb.get("ref_logprobs"),
                    loss_kwargs=self.cfg.loss_kwargs, entropy=fwd["entropy"], entropy_coef=self.cfg.entropy_coef,
                    is_weights=self._is_weights(mb), **norm,
                )
                # DDP averages gradients over ranks; the normalisers are already global.
                (loss * self.world_size).backward()
            cm = mb["completion_mask"].float()
            m["entropy"] = float((fwd["entropy"].detach() * cm).sum() / cm.sum().clamp(min=1))
            for k, v in m.items():
                totals[k] = totals.get(k, 0.0) + v * len(mb) / max(len(shard), 1)
        totals["grad_norm"], totals["lr"] = self._apply_gradients()
        return totals

    def _is_weights(self, mb: Batch) -> torch.Tensor | None:
        """The truncated importance weights of ``learner.tis_cap``, or None when it is off."""
        if self.cfg.tis_cap is None:
            return None
        return truncated_is_weights(mb["logprobs"], mb["behaviour_logprobs"], self.cfg.tis_cap, mb["completion_mask"])

    def _apply_gradients(self) -> tuple[float, float]:
        """Clip the accumulated gradients, set the scheduled learning rate, take the optimizer
        step; returns the gradient norm before clipping and the learning rate."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.grad_clip if self.cfg.grad_clip > 0 else float("inf"))
        lr = self.cfg.lr * lr_factor(self.updates, self.cfg.lr_schedule, self.cfg.warmup_steps, self.total_steps,
                                     self.cfg.min_lr_ratio)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.updates += 1
        return float(grad_norm), lr

    def _autocast(self) -> Any:
        """The context of the forward passes: ``torch.autocast`` to ``learner.autocast``'s dtype, or none."""
        dtype = AUTOCAST[self.cfg.autocast]
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=torch.device(self.device).type, dtype=dtype)

    # -- weights ------------------------------------------------------------------------
    def publish_weights(self, transport: str = "object_store") -> WeightUpdate:
        """The current weights under a new version, as the registered ``transport`` sends them:
        in the object store, or (``"nccl"``) as a manifest whose tensors `broadcast_weights` then
        sends. LoRA always sends the adapter only (`choose_transport`)."""
        self.version += 1
        return self._published(transport)

    def current_weights(self) -> WeightUpdate:
        """The current version again, through the object store (for a restarted engine)."""
        return self._published("object_store")

    def _published(self, transport: str) -> WeightUpdate:
        return TRANSPORTS.get(choose_transport(transport, self.cfg.lora.enabled)).publish(self)

    def init_weight_group(self, address: str, port: int, rank: int, world_size: int) -> bool:
        """Join the nccl group shared with the rollout engines (this rank is the source)."""
        from troupe.actors.transport import nccl

        self.weight_group = nccl.init_group(address, port, rank, world_size, torch.cuda.current_device())
        return True

    def broadcast_weights(self, update: WeightUpdate) -> int:
        """Send the tensors named by an nccl `WeightUpdate` to every engine in the group."""
        from troupe.actors.transport import nccl

        nccl.send(self.weight_group, self.model.state_dict(), update.ref)
        return update.version

    def load_weights(self, update: WeightUpdate) -> int:
        object_store.receive(self.model, update)
        return update.version

    def logprobs(self, batch: Batch | list[Any]) -> torch.Tensor:
        self.model.eval()
        try:
            with self._autocast():
                return score_completions(self.model, as_batch(batch).to(self.device), self.sampling,
                                         self.cfg.micro_batch_size)["logprobs"].cpu()
        finally:
            self.model.train()

    # -- checkpoints ----------------------------------------------------------------------
    def get_state(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """``(arrays, json_state)``: weights and optimizer moments as numpy, the rest as JSON."""
        if self.cfg.lora.enabled:
            from peft import get_peft_model_state_dict

            weights = get_peft_model_state_dict(self.model)
        else:
            weights = self.model.state_dict()
        arrays = {f"model/{k}": v for k, v in weights.items()}
        opt = self.optimizer.state_dict()
        for pid, st in opt["state"].items():
            for name, v in st.items():
                if isinstance(v, torch.Tensor):
                    arrays[f"optim/{pid}/{name}"] = v
        meta = {"param_groups": opt["param_groups"], "version": self.version, "updates": self.updates,
                "optim_keys": {str(pid): sorted(st) for pid, st in opt["state"].items()},
                "torch_rng": torch.get_rng_state().tolist()}
        return pack_state_dict(arrays), json.loads(json.dumps(meta))

    def set_state(self, packed: dict[str, Any], meta: dict[str, Any]) -> bool:
        arrays = unpack_state_dict(packed)
        weights = {k[len("model/"):]: v for k, v in arrays.items() if k.startswith("model/")}
        if self.cfg.lora.enabled:
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(self.model, weights)
        else:
            self.model.load_state_dict(weights, strict=False)
        state = {int(pid): {n: arrays[f"optim/{pid}/{n}"].clone() for n in names}
                 for pid, names in meta["optim_keys"].items()}
        self.optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
        self.version = int(meta["version"])
        self.updates = int(meta["updates"])
        torch.set_rng_state(torch.tensor(meta["torch_rng"], dtype=torch.uint8))
        return True


def _resolve(extras: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Fetch extras passed as object refs (e.g. reference log-probs straight from the scorer)."""
    out = {}
    for k, v in extras.items():
        if not isinstance(v, torch.Tensor | dict):  # only then can it be a ref: no Ray needed in-process
            import ray

            if isinstance(v, ray.ObjectRef):
                v = ray.get(v)
        if isinstance(v, dict):  # a scorer's output: its per-token log-probs
            v = v["logprobs"]
        out[k] = v
    return out


def _learner_config(d: dict[str, Any]) -> LearnerConfig:
    from troupe.platform.config import from_dict

    return from_dict(LearnerConfig, d, prefix="learner.")
