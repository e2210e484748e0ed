"""The `Transport` interface, the message a learner publishes, and the numpy packing the
object-store transports share."""

from __future__ import annotations

import dataclasses
import warnings
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

# numpy has no bfloat16: such tensors travel as int16 bit patterns and are viewed back.
_VIEW_AS = {torch.bfloat16: (torch.int16, "bfloat16")}
_FROM_NAME = {"bfloat16": torch.bfloat16}

if TYPE_CHECKING:
    from troupe.platform.placement import ActorGroup


@dataclasses.dataclass
class WeightUpdate:
    """A versioned set of weights; ``kind`` names the transport that made it, which installs it
    on an engine (object store and LoRA: ``ref`` resolves to packed arrays; nccl: the manifest)."""

    version: int
    ref: Any  # ray.ObjectRef of dict[str, (np.ndarray, dtype_name | None)], or an nccl Manifest
    nbytes: int
    kind: str = "object_store"  # a name in TRANSPORTS
    adapter_config: dict[str, Any] | None = None


@dataclasses.dataclass
class PendingSync:
    """A weight sync in flight: its start time, the install calls, and the update's ref."""

    t: float
    loads: list[Any]
    update_ref: Any = None


def choose_transport(configured: str, lora_enabled: bool) -> str:
    """The transport a policy uses: LoRA sends the adapter only, whatever ``configured``
    (``rollout.weight_transport``) says; otherwise the configured one."""
    return "lora" if lora_enabled else configured


class Transport:
    """How a learner's new weights reach the rollout engines: one subclass per file, registered
    in ``TRANSPORTS`` and chosen by `choose_transport`.

    The driver builds one per policy with its learner and engine groups, calls `setup` once the
    actors exist, `begin` and `end` around every sync, and `recover` when an engine comes back
    from a restart. The actor-side halves are classmethods run inside the actors: `publish` on
    learner rank 0 makes the `WeightUpdate` (its ``kind`` is `name`), and `receive` installs it
    on an engine through the engine's install primitives (``install_state``,
    ``install_adapter``, ``install_broadcast``), so only the transport knows the wire format.
    """

    name: ClassVar[str]  # the registered name, carried by every update as `WeightUpdate.kind`

    def __init__(self, learners: ActorGroup, engines: ActorGroup) -> None:
        self.learners, self.engines = learners, engines
        self.last_update: Any = None  # ref of the newest update in the object store, for restarted engines

    @classmethod
    def check_config(cls, rollout: Any) -> None:
        """Raise `ConfigError` if the ``rollout`` config section cannot use this transport."""

    @classmethod
    def check_policy_config(cls, cfg: Any) -> None:
        """Raise `ConfigError` if a whole policy config (``rollout``, ``learner``, ...) cannot use
        this transport, when it is the one `choose_transport` picks."""

    def sync_metrics(self) -> dict[str, float]:
        """Counts this transport keeps since the last call (e.g. syncs that fell back), for the step's metrics."""
        return {}

    def setup(self) -> None:
        """Once, after the actors exist (nccl builds its group here)."""

    def begin(self) -> PendingSync:
        """Submit the publish on learner rank 0 and every engine's install; wait for nothing, so
        the publish queues behind an update still running on rank 0."""
        raise NotImplementedError

    def end(self, pending: PendingSync) -> float:
        """Wait for `begin`'s installs; returns the bytes the update carried."""
        self.engines.wait(pending.loads, "load_weights")
        # The update itself is a small message: its arrays stay in the store, or went by broadcast.
        return float(self.learners.wait([pending.update_ref], "publish_weights")[0].nbytes)

    def recover(self, i: int) -> None:
        """Engine ``i`` was restarted with its weights reset: give it the current weights."""
        raise NotImplementedError

    @classmethod
    def publish(cls, learner: Any) -> WeightUpdate:
        """On learner rank 0: its current weights (``learner.model``) as an update of ``learner.version``."""
        raise NotImplementedError

    @classmethod
    def receive(cls, engine: Any, update: WeightUpdate) -> None:
        """On an engine: install ``update`` with the engine's install primitives."""
        raise NotImplementedError


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
