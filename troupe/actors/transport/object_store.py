"""Full weights through the object store as numpy buffers (several times faster than
pickled torch tensors: ``ray.get`` of numpy is zero-copy). Tied weights travel once. The CPU
default transport."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from troupe.actors.transport.base import (
    PendingSync,
    Transport,
    WeightUpdate,
    nbytes,
    pack_state_dict,
    unpack_state_dict,
)


class ObjectStoreTransport(Transport):
    """Learner rank 0 puts the weights in the object store; every engine reads them from there.
    A restarted engine is given the newest update again (`last_update`)."""

    name = "object_store"

    def begin(self) -> PendingSync:
        t = time.perf_counter()
        # Queued behind the update on rank 0; the engines install it as soon as it exists.
        update_ref = self.learners[0].publish_weights.remote(self.name)
        self.last_update = update_ref
        return PendingSync(t, [h.load_weights.remote(update_ref) for h in self.engines.handles], update_ref)

    def recover(self, i: int) -> None:
        if self.last_update is not None:
            self.engines.wait([self.engines[i].load_weights.remote(self.last_update)], "load_weights")

    @classmethod
    def publish(cls, learner: Any) -> WeightUpdate:
        return publish(learner.model.state_dict(), learner.version)

    @classmethod
    def receive(cls, engine: Any, update: WeightUpdate) -> None:
        import ray

        engine.install_state(unpack_state_dict(ray.get(update.ref)))


def publish(state: dict[str, torch.Tensor], version: int) -> WeightUpdate:
    import ray

    packed = pack_state_dict(untied(state))
    return WeightUpdate(version=version, ref=ray.put(packed), nbytes=nbytes(packed), kind=ObjectStoreTransport.name)


def receive(model: Any, update: WeightUpdate, share: bool = False) -> int:
    """Fetch the update's tensors and `install` them in ``model``; returns how many parameters
    were shared rather than copied."""
    import ray

    return install(model, unpack_state_dict(ray.get(update.ref)), share, what=f"weight update v{update.version}")


def install(model: Any, state: Mapping[str, torch.Tensor], share: bool = False, what: str = "weight update") -> int:
    """Install ``state`` (tensors by name) in ``model`` (shapes must match); returns how many
    parameters were shared rather than copied.

    ``share=True`` is for a model that only runs inference (a rollout engine): a CPU parameter
    of the same dtype then points at the update's read-only object-store buffer instead of
    receiving a copy of it. That skips the copy, and every engine on a node reads one copy of
    the weights. Ray keeps the buffer alive while a tensor uses it; the next update releases
    it. A parameter on another device or of another dtype is copied as usual. The
    ``Parameter`` objects stay the same, so tied weights stay tied.
    """
    state = dict(state)  # shared entries leave this copy of the mapping, not the caller's
    shared: set[str] = set()
    if share:
        params = dict(model.named_parameters(remove_duplicate=False))
        with torch.no_grad():
            for k in list(state):
                p, t = params.get(k), state[k]
                if p is not None and p.device.type == "cpu" and p.dtype == t.dtype and p.shape == t.shape:
                    p.data = t
                    shared.add(k)
                    del state[k]
    own = model.state_dict()
    if state:
        missing, unexpected = model.load_state_dict(state, strict=False)
    else:  # everything was shared: what load_state_dict would report, without its pass over the model
        missing, unexpected = [k for k in own if k not in shared], []
    # A tied weight (lm_head = embed_tokens) is not sent: loading the tensor it aliases fills it.
    tied = own.keys() - untied(own).keys()
    missing = [k for k in missing if k not in tied and k not in shared and not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{what} does not fit the model: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}")
    return len(shared)


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
