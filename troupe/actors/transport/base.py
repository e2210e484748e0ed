"""The message a learner publishes and the numpy packing both transports share."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import numpy as np
import torch

# numpy has no bfloat16: such tensors travel as int16 bit patterns and are viewed back.
_VIEW_AS = {torch.bfloat16: (torch.int16, "bfloat16")}
_FROM_NAME = {"bfloat16": torch.bfloat16}


@dataclasses.dataclass
class WeightUpdate:
    """A versioned set of weights in the object store (``ref`` resolves to packed arrays)."""

    version: int
    ref: Any  # ray.ObjectRef of dict[str, (np.ndarray, dtype_name | None)]
    nbytes: int
    kind: str = "full"  # "full" state dict or "lora" adapter
    adapter_config: dict[str, Any] | None = None


def pack_state_dict(state: dict[str, torch.Tensor]) -> dict[str, tuple[np.ndarray, str | None]]:
    """Tensors → contiguous numpy arrays (read zero-copy from the object store)."""
    out = {}
    for k, t in state.items():
        t = t.detach().cpu().contiguous()
        if t.dtype in _VIEW_AS:
            view, name = _VIEW_AS[t.dtype]
            out[k] = (t.view(view).numpy(), name)
        else:
            out[k] = (t.numpy(), None)
    return out


def unpack_state_dict(packed: dict[str, tuple[np.ndarray, str | None]]) -> dict[str, torch.Tensor]:
    """Numpy arrays → tensors sharing their memory (read-only when they come from the object store)."""
    out = {}
    with warnings.catch_warnings():
        # Object-store arrays are read-only; the tensors are only read (copied into parameters).
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for k, (arr, name) in packed.items():
            t = torch.from_numpy(np.asarray(arr))
            out[k] = t.view(_FROM_NAME[name]) if name else t
    return out


def nbytes(packed: dict[str, tuple[np.ndarray, str | None]]) -> int:
    return int(sum(a.nbytes for a, _ in packed.values()))
