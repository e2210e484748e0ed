"""What the engine, learner and scorers run on their batches keeps every tensor on the batch's
device. A GPU is not needed to show it: the tensors live on the ``meta`` device, and a torch
function mode fails any call that mixes a tensor from there with one made on the CPU (which is
what a GPU run then fails with: "Expected all tensors to be on the same device")."""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves

from troupe.actors.distill_learner import one_hot_logprobs, targets_from_topk
from troupe.actors.logit_processing import process_logits, seen_tokens
from troupe.actors.rollout_hf import completion_mask
from troupe.actors.sampling import SamplingConfig
from troupe.platform.batch import Batch

META = torch.device("meta")


class OneDevice(TorchFunctionMode):
    """Fails a torch call whose tensor arguments (0-d ones aside: torch moves scalars itself)
    are on more than one device."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        devices = {t.device for t in tensors if t.dim() > 0}
        if len(devices) > 1:
            name = getattr(func, "__name__", func)
            raise AssertionError(f"{name} mixes devices {sorted(map(str, devices))}")
        return func(*args, **kwargs)


def test_the_mode_catches_a_mixed_call():
    with OneDevice(), pytest.raises(AssertionError, match="mixes devices"):
        torch.zeros(3, device=META) + torch.ones(3)


def test_batch_select_split_and_chunks_stay_on_the_batch_device():
    b = Batch({"ids": torch.zeros(6, 4, dtype=torch.long, device=META), "lp": torch.zeros(6, 4, device=META)})
    with OneDevice():
        parts = [b.select([0, 2]), b.select(torch.tensor([True, False] * 3)), *b.split(2), *b.chunks(4)]
    assert all(t.device == META for p in parts for t in p.tensors.values())
    assert [len(p) for p in parts] == [2, 3, 3, 3, 4, 2]


def test_completion_mask_runs_on_the_completion_device():
    with OneDevice():
        mask = completion_mask(torch.zeros(3, 5, dtype=torch.long, device=META), eos_id=1, pad_id=0)
    assert mask.device == META and mask.shape == (3, 5)


@pytest.mark.parametrize("sampling", [
    SamplingConfig(temperature=0.7, top_k=5, top_p=0.9, min_p=0.05, repetition_penalty=1.2),
    SamplingConfig(temperature=0.7, explore=0.3),
])
def test_process_logits_runs_on_the_logits_device(sampling):
    B, C, V = 2, 3, 11
    ids = torch.zeros(B, C, dtype=torch.long, device=META)
    with OneDevice():
        seen = seen_tokens(torch.zeros(B, 4, dtype=torch.long, device=META),
                           torch.ones(B, 4, dtype=torch.long, device=META), ids, V)
        out = process_logits(torch.zeros(B, C, V, device=META), sampling, seen, keep=ids)
    assert out.device == META and out.shape == (B, C, V)


def test_distillation_targets_are_built_on_the_ids_device():
    ids = torch.zeros(2, 3, 4, dtype=torch.long, device=META)
    with OneDevice():
        dense = targets_from_topk(ids, torch.zeros(2, 3, 4, device=META), vocab=9)
        hard = one_hot_logprobs(ids[..., 0], vocab=9)
    assert (dense.device, hard.device) == (META, META) and dense.shape == hard.shape == (2, 3, 9)
