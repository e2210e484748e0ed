"""The distillation learner: a policy learner that also fits a teacher's targets position by position.

`distill(batch, loss)` takes one optimizer step on a batch whose rows carry, at every
completion position, the teacher's log-distribution (``targets`` ``[B, C, V]``, or its top-k: ``targets_topk_ids`` and ``targets_topk_logprobs``) or one token
(``target_ids`` ``[B, C]``: a teacher's majority vote, or the completion itself for SFT/BC);
the loss is a registered distillation loss (``troupe.distill_losses``: ``hard``, ``tl``,
``rkl``, ``jsd`` with its ``beta``) of the student's whole distribution at each position,
averaged over the completion tokens of the whole batch (so N ranks give one rank's gradient).
`sampled_rkl` is on-policy distillation's sampled reverse KL, a policy-gradient step through
the policy-loss path with the per-token advantage log π̃(a) − log π(a).
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any

import torch

from troupe.actors.learner import Learner
from troupe.actors.logprobs import completion_forward
from troupe.actors.scorer import as_batch
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError
from troupe.platform.registry import DISTILL_LOSSES


def check_distill_kwargs(loss: str, loss_kwargs: dict[str, Any], key: str = "loss_kwargs") -> None:
    """Every key of ``loss_kwargs`` must be a parameter of the distillation loss after its two tensors."""
    fn = DISTILL_LOSSES.resolve(loss, "loss")
    own = list(inspect.signature(fn).parameters)[2:]
    unknown = sorted(set(loss_kwargs) - set(own))
    if unknown:
        raise ConfigError(f"{key} has {unknown} but the distillation loss {loss!r} takes {own or 'no hyperparameters'}")


def targets_from_topk(ids: torch.Tensor, logprobs: torch.Tensor, vocab: int) -> torch.Tensor:
    """A teacher's log-distribution ``[..., V]`` from its top-k (``ids``, ``logprobs`` ``[..., k]``):
    the rest of the mass, 1 − Σ top-k, spread evenly over the other tokens (none when it is 0)."""
    rest = (1.0 - logprobs.exp().sum(-1, keepdim=True)).clamp(min=0.0)
    others = max(vocab - ids.shape[-1], 1)
    fill = torch.log(rest / others).expand(*ids.shape[:-1], vocab).clone()
    return fill.scatter_(-1, ids, logprobs)


def one_hot_logprobs(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """log of a point mass on ``ids`` ``[...]``: 0 there, -inf elsewhere ``[..., V]``."""
    out = torch.full((*ids.shape, vocab), float("-inf"), device=ids.device)
    return out.scatter_(-1, ids.unsqueeze(-1).clamp(0, vocab - 1), 0.0)


class DistillLearner(Learner):
    """One rank of a learner that distils (and, through `update`, still takes policy-gradient steps)."""

    def distill(self, batch: Batch | list[Any], loss: str, loss_kwargs: dict[str, Any] | None = None
                ) -> dict[str, float]:
        """One optimizer step of ``loss`` on ``batch`` (``targets`` or ``target_ids``)."""
        batch = as_batch(batch)
        kwargs = dict(loss_kwargs or {})
        check_distill_kwargs(loss, kwargs)
        fn = DISTILL_LOSSES.get(loss)
        if "targets" not in batch and "targets_topk_ids" not in batch:
            batch.require("target_ids", who="DistillLearner.distill (a teacher's distributions or tokens)")
            if not getattr(fn, "mode_only", False):  # 'hard' and any loss that reads the teacher's mode alone
                raise ConfigError(f"the distillation loss {loss!r} needs the teacher's distributions (logit access); "
                                  "with tokens alone (sample access, or SFT on trajectories) use 'hard'")
        mask = batch["completion_mask"]
        total = max(int(mask.sum()), 1)
        shard = batch.split(self.world_size)[self.rank]
        model = self.ddp_model or self.model
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss/distill": 0.0, "entropy": 0.0, "agree/teacher_mode": 0.0}
        micro = list(shard.chunks(self.cfg.micro_batch_size)) or [shard]
        for i, mb in enumerate(micro):
            last = i == len(micro) - 1
            ctx = model.no_sync() if (self.ddp_model is not None and not last) else contextlib.nullcontext()
            with ctx, self._autocast():
                fwd = completion_forward(model, mb.to(self.device), 1.0, with_entropy=True, with_distribution=True)
                student = fwd["distribution"]
                if "targets" in mb:
                    target = mb["targets"].to(self.device).float()
                elif "targets_topk_ids" in mb:  # the [B, C, V] targets built where the student's are
                    target = targets_from_topk(mb["targets_topk_ids"].to(self.device),
                                               mb["targets_topk_logprobs"].to(self.device).float(),
                                               student.shape[-1])
                else:
                    target = one_hot_logprobs(mb["target_ids"].to(self.device), student.shape[-1])
                per_pos = fn(student, target, **kwargs)
                m = mb["completion_mask"].to(self.device).float()
                # Normalised by the whole batch's tokens: the micro-batches' gradients add up to one.
                loss_value = (per_pos * m).sum() / total
                (loss_value * self.world_size).backward()
            sums["loss/distill"] += float(loss_value.detach())
            sums["entropy"] += float((fwd["entropy"].detach() * m).sum()) / total
            agree = (student.detach().argmax(-1) == target.argmax(-1)).float()
            sums["agree/teacher_mode"] += float((agree * m).sum()) / total
        grad_norm, lr = self._apply_gradients()
        # This rank's shares; the caller sums them over ranks.
        return {**sums, "grad_norm": grad_norm, "lr": lr}

    def sampled_rkl(self, batch: Batch | list[Any]) -> dict[str, float]:
        """On-policy distillation's sampled reverse KL: the completions are the student's own
        samples, ``teacher_logprobs`` the teacher's log-probs of them; the advantage of a token
        is log π̃(a) − log π(a) under the sampling policy (its expectation is −KL(π‖π̃))."""
        batch = as_batch(batch)
        batch.require("teacher_logprobs", "logprobs", who="DistillLearner.sampled_rkl")
        mask = batch["completion_mask"].float()
        advantages = (batch["teacher_logprobs"] - batch["logprobs"]) * mask
        metrics = self.update(batch, {"advantages": advantages})
        metrics["opd/reverse_kl"] = float((-advantages).sum() / mask.sum().clamp(min=1))
        return metrics
