"""Full weights through the object store as numpy buffers (several times faster than
pickled torch tensors: ``ray.get`` of numpy is zero-copy)."""

from __future__ import annotations

from typing import Any

import torch

from troupe.actors.transport.base import WeightUpdate, nbytes, pack_state_dict, unpack_state_dict


def publish(state: dict[str, torch.Tensor], version: int) -> WeightUpdate:
    import ray

    packed = pack_state_dict(state)
    return WeightUpdate(version=version, ref=ray.put(packed), nbytes=nbytes(packed), kind="full")


def receive(model: Any, update: WeightUpdate) -> None:
    """Copy the update's tensors into ``model`` in place (shapes must match)."""
    import ray

    state = unpack_state_dict(ray.get(update.ref))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings legitimately leave lm_head out of a saved state dict.
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"weight update v{update.version} does not fit the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
