"""Weight transport: how a learner's new weights reach the rollout engines.

One `Transport` per file, registered in ``TRANSPORTS``: ``object_store`` (contiguous numpy
buffers through Ray's object store; the CPU default), ``nccl`` (broadcast from learner rank 0
to vLLM engines on GPUs of their own) and ``lora`` (the adapter only, on top of the object
store; always used with LoRA, see `choose_transport`).
"""

from troupe.actors.transport.base import (
    PendingSync,
    Transport,
    WeightUpdate,
    choose_transport,
    pack_state_dict,
    unpack_state_dict,
)

__all__ = ["PendingSync", "Transport", "WeightUpdate", "choose_transport", "pack_state_dict", "unpack_state_dict"]
