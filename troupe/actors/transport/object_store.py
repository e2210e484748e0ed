"""Full weights through the object store as numpy buffers (several times faster than
pickled torch tensors: ``ray.get`` of numpy is zero-copy). Tied weights travel once."""

from __future__ import annotations

from typing import Any

import torch

from troupe.actors.transport.base import WeightUpdate, nbytes, pack_state_dict, unpack_state_dict


def publish(state: dict[str, torch.Tensor], version: int) -> WeightUpdate:
    import ray

    packed = pack_state_dict(untied(state))
    return WeightUpdate(version=version, ref=ray.put(packed), nbytes=nbytes(packed), kind="full")


def receive(model: Any, update: WeightUpdate) -> None:
    """Copy the update's tensors into ``model`` in place (shapes must match)."""
    import ray

    state = unpack_state_dict(ray.get(update.ref))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # A tied weight (lm_head = embed_tokens) is not sent: loading the tensor it aliases fills it.
    own = model.state_dict()
    tied = own.keys() - untied(own).keys()
    missing = [k for k in missing if k not in tied and not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weight update v{update.version} does not fit the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")


def untied(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` without the entries that alias an earlier entry's memory (tied weights): a
    model with tied embeddings would otherwise send its largest matrix twice."""
    seen: set[tuple] = set()
    out = {}
    for k, t in state.items():
        if t.numel():
            alias = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            if alias in seen:
                continue
            seen.add(alias)
        out[k] = t
    return out
