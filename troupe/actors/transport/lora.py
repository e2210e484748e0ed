"""LoRA adapters only: the rollout engine keeps its base weights and swaps the adapter."""

from __future__ import annotations

from typing import Any

import torch

from troupe.actors.transport.base import WeightUpdate, nbytes, pack_state_dict, unpack_state_dict


def publish(adapter_state: dict[str, torch.Tensor], adapter_config: dict[str, Any], version: int) -> WeightUpdate:
    import ray

    packed = pack_state_dict(adapter_state)
    return WeightUpdate(version=version, ref=ray.put(packed), nbytes=nbytes(packed), kind="lora",
                        adapter_config=adapter_config)


def receive(model: Any, update: WeightUpdate) -> Any:
    """Load the adapter into ``model`` (wrapping it with peft on first use); returns the model to use."""
    import ray
    from peft import LoraConfig, PeftModel, get_peft_model, set_peft_model_state_dict

    if not isinstance(model, PeftModel):
        model = get_peft_model(model, LoraConfig(**update.adapter_config))
    set_peft_model_state_dict(model, unpack_state_dict(ray.get(update.ref)))
    model.eval()
    return model
