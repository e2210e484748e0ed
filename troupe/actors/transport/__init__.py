"""Weight transport: how a learner's new weights reach the rollout engines.

One small strategy per file: ``object_store`` (contiguous numpy buffers through Ray's object
store; the CPU default) and ``lora`` (the adapter only, on top of the object store).
"""

from troupe.actors.transport.base import WeightUpdate, pack_state_dict, unpack_state_dict

__all__ = ["WeightUpdate", "pack_state_dict", "unpack_state_dict"]
