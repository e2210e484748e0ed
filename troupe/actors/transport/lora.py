"""LoRA adapters only: the rollout engine keeps its base weights and swaps the adapter.

Chosen whenever ``learner.lora.enabled`` (`choose_transport`): the adapter is small and travels
through the object store the way full weights do there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from troupe.actors.transport.base import WeightUpdate, nbytes, pack_state_dict, unpack_state_dict
from troupe.actors.transport.object_store import ObjectStoreTransport
from troupe.platform.errors import ConfigError


class LoraTransport(ObjectStoreTransport):
    """The object store's sync, carrying the peft adapter and its config instead of the model."""

    name = "lora"

    @classmethod
    def check_config(cls, rollout: Any) -> None:
        raise ConfigError("config key 'rollout.weight_transport' = 'lora' is not allowed: the adapter transport "
                          "follows from learner.lora.enabled=true; keep object_store (or nccl) here")

    @classmethod
    def publish(cls, learner: Any) -> WeightUpdate:
        from peft import get_peft_model_state_dict

        return publish(get_peft_model_state_dict(learner.model), learner.cfg.lora.peft_config(), learner.version)

    @classmethod
    def receive(cls, engine: Any, update: WeightUpdate) -> None:
        import ray

        engine.install_adapter(unpack_state_dict(ray.get(update.ref)), update.adapter_config or {})


def publish(adapter_state: dict[str, torch.Tensor], adapter_config: dict[str, Any], version: int) -> WeightUpdate:
    import ray

    packed = pack_state_dict(adapter_state)
    return WeightUpdate(version=version, ref=ray.put(packed), nbytes=nbytes(packed), kind=LoraTransport.name,
                        adapter_config=adapter_config)


def receive(model: Any, update: WeightUpdate) -> Any:
    """Load the update's adapter into ``model`` (see `install_adapter`); returns the model to use."""
    import ray

    return install_adapter(model, unpack_state_dict(ray.get(update.ref)), update.adapter_config or {})


def install_adapter(model: Any, adapter: Mapping[str, torch.Tensor], config: Mapping[str, Any]) -> Any:
    """Load ``adapter`` into ``model``, wrapping it with peft (``LoraConfig(**config)``) on first
    use; returns the model to use."""
    from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict

    if not isinstance(model, PeftModel):
        model = get_peft_model(model, LoraConfig(**config))
    set_peft_model_state_dict(model, dict(adapter))
    model.eval()
    return model
