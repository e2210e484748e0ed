"""Full weights by NCCL broadcast from learner rank 0 to the rollout engines' vLLM workers (GPU).

The group is separate from the learner's DDP group and from vLLM's own: a vLLM
`StatelessProcessGroup` (a TCP store for the rendezvous) carrying a `PyNcclCommunicator`,
the recipe vLLM documents for trainer-to-engine weight sync. Torch's default process group
cannot serve: both the learner (DDP) and the vLLM worker already own one.

Setup handshake, once before the first sync:

1. Learner rank 0 picks its node address and a free port (`Learner.master_address`).
2. Each engine says how many vLLM workers it runs (`VLLMRolloutEngine.weight_group_size`:
   tensor-parallel size × pipeline size, 1 for the default engine).
3. `plan_group(address, port, sizes)` numbers the group: the learner is rank 0, engine ``i``'s
   workers are ranks ``rank_offsets[i] + r`` for worker rank ``r``; the world size is
   ``1 + sum(sizes)``.
4. Every member calls `init_group` at the same time: learner rank 0 with rank 0, each engine
   with `GroupPlan.engine_args(i)`. Rank 0 hosts the TCP store; the calls must be launched
   together and waited on together, or the rendezvous deadlocks.

Each sync: the learner calls `publish` (a manifest of names, dtypes and shapes packed into
buckets, a few KB, travelling through Ray as the `WeightUpdate`), the engines enter `receive`
with it and the learner enters `send`; each bucket is one broadcast of a flat byte buffer, and
an engine loads a bucket's tensors as soon as it arrives, so peak extra memory is one bucket.

`NcclTransport` runs this from the driver: the handshake in `setup`, each sync in `begin`.

After a restart. A restarted engine has lost its communicator, and NCCL has no timeout: a
broadcast with a rank missing waits forever. So whenever the driver sees an engine restart (a
generate call lost to a dead engine, or a straggler it killed; `recover`), the group is rebuilt
for every member on a new port (a new *generation*) and the restarted engine gets the weights it
missed through the object store. If the rebuild fails, every sync goes through the object store
(``sync/object_store_fallbacks``, counted as faults) until a rebuild after one of them
succeeds (``sync/group_rebuilds``). An engine that dies in the middle of a broadcast leaves
learner rank 0 inside it: that sync fails with a `RemoteCallError` and the run stops.

NCCL refuses two ranks on one GPU: nccl needs whole GPUs for the learner and the engines and
engines not colocated with the learner (`check_config`, `check_policy_config`), and `setup`
compares the engines' device UUIDs before any communicator exists. A learner colocated with its
engines uses the object store transport instead. With LoRA the adapter is small and always
travels through the object store (`lora.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from troupe.actors.transport.base import PendingSync, Transport, WeightUpdate
from troupe.platform.config import check
from troupe.platform.errors import ConfigError, RemoteCallError

log = logging.getLogger(__name__)

DEFAULT_BUCKET_BYTES = 256 * 2**20
ALIGN = 16  # byte alignment of each tensor in a bucket: a uint8 slice views as any dtype
_DTYPES = {name: getattr(torch, name) for name in
           ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor of a bucket: its name, dtype, shape and byte offset in the bucket buffer."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * dtype_from_name(self.dtype).itemsize


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Tensors broadcast together as one flat byte buffer of ``nbytes``."""

    specs: tuple[TensorSpec, ...]
    nbytes: int


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What the receivers allocate, in the order the sender broadcasts."""

    buckets: tuple[Bucket, ...]

    @property
    def names(self) -> list[str]:
        return [s.name for b in self.buckets for s in b.specs]

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data (the buffers add alignment padding)."""
        return sum(s.nbytes for b in self.buckets for s in b.specs)


@dataclasses.dataclass(frozen=True)
class GroupPlan:
    """Address, world size and each engine's first rank in the weight-sync group."""

    address: str
    port: int
    world_size: int
    rank_offsets: tuple[int, ...]
    generation: int = 0  # which build of the group: a rebuild after a restart is the next one

    def engine_args(self, i: int) -> dict[str, Any]:
        """Keyword arguments of `VLLMRolloutEngine.init_weight_group` for engine ``i``."""
        return {"address": self.address, "port": self.port, "rank_offset": self.rank_offsets[i],
                "world_size": self.world_size, "generation": self.generation}

    def trainer_args(self) -> dict[str, Any]:
        """Keyword arguments of `init_group` for learner rank 0."""
        return {"address": self.address, "port": self.port, "rank": 0, "world_size": self.world_size}


def plan_group(address: str, port: int, engine_sizes: Sequence[int], generation: int = 0) -> GroupPlan:
    """Number the group: rank 0 is the learner, then each engine's workers in turn."""
    if not engine_sizes:
        raise ConfigError("nccl weight transport: there are no rollout engines to send to")
    if any(int(n) < 1 for n in engine_sizes):
        raise ConfigError(f"nccl weight transport: every engine needs >= 1 worker, got sizes {list(engine_sizes)}")
    if not 0 < int(port) < 65536:
        raise ConfigError(f"nccl weight transport: port {port} is not a TCP port")
    offsets, next_rank = [], 1
    for n in engine_sizes:
        offsets.append(next_rank)
        next_rank += int(n)
    return GroupPlan(address=address, port=int(port), world_size=next_rank, rank_offsets=tuple(offsets),
                     generation=generation)


def whole_gpus(n: float) -> bool:
    return n >= 1 and float(n).is_integer()


def check_distinct_devices(devices: Mapping[str, Sequence[str]]) -> None:
    """Raise a `ConfigError` if two members of the group (name → device UUIDs of its ranks) share a
    GPU: NCCL refuses a communicator with two ranks on one device."""
    seen: dict[str, str] = {}
    for member, uuids in devices.items():
        for uuid in uuids:
            if uuid in seen:
                raise ConfigError(
                    f"nccl weight transport: {seen[uuid]} and {member} are on the same GPU ({uuid}), and NCCL "
                    "cannot put two ranks on one GPU: give every engine whole GPUs of its own (rollout.num_gpus "
                    "an integer >= 1), or set rollout.weight_transport=object_store")
            seen[uuid] = member


def device_uuid(device: torch.device | int | str) -> str:
    """The CUDA device's UUID (the same GPU seen from two processes has one UUID)."""
    return str(torch.cuda.get_device_properties(device).uuid)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` → ``"bfloat16"`` (names travel in the manifest; dtypes do not pickle everywhere)."""
    name = str(dtype).removeprefix("torch.")
    dtype_from_name(name)
    return name


def dtype_from_name(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise ValueError(f"nccl weight transport cannot carry dtype {name!r}; supported: {sorted(_DTYPES)}")
    return _DTYPES[name]


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def build_manifest(state: Mapping[str, torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> Manifest:
    """Pack the tensors, in order, into buckets of at most ``bucket_bytes`` (a larger tensor gets its own)."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes={bucket_bytes} is smaller than one aligned slot ({ALIGN} bytes)")
    buckets: list[Bucket] = []
    specs: list[TensorSpec] = []
    used = 0
    for name, t in state.items():
        spec = TensorSpec(name, dtype_name(t.dtype), tuple(int(d) for d in t.shape), 0)
        if specs and used + spec.nbytes > bucket_bytes:
            buckets.append(Bucket(tuple(specs), used))
            specs, used = [], 0
        specs.append(dataclasses.replace(spec, offset=used))
        used = _aligned(used + spec.nbytes)
    if specs:
        buckets.append(Bucket(tuple(specs), used))
    return Manifest(tuple(buckets))


def pack_bucket(state: Mapping[str, torch.Tensor], bucket: Bucket, device: torch.device | str) -> torch.Tensor:
    """One flat uint8 buffer holding the bucket's tensors at their offsets."""
    buf = torch.zeros(bucket.nbytes, dtype=torch.uint8, device=device)
    for s in bucket.specs:
        t = state[s.name].detach()
        if dtype_name(t.dtype) != s.dtype or tuple(t.shape) != s.shape:
            raise ValueError(f"{s.name}: the tensor ({t.dtype}, {tuple(t.shape)}) no longer matches the manifest "
                             f"({s.dtype}, {s.shape})")
        buf[s.offset:s.offset + s.nbytes].copy_(t.reshape(-1).view(torch.uint8))
    return buf


def unpack_bucket(buf: torch.Tensor, bucket: Bucket) -> list[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` views into ``buf`` (no copy)."""
    return [(s.name, buf[s.offset:s.offset + s.nbytes].view(dtype_from_name(s.dtype)).view(s.shape))
            for s in bucket.specs]


class NcclTransport(Transport):
    """Full weights by broadcast from learner rank 0 to the engines' workers; the update that
    travels through Ray is the manifest. After a restart the group is rebuilt for every member
    on a new port, and a sync without an intact group goes through the object store (see the
    module docstring)."""

    name = "nccl"

    def __init__(self, learners: Any, engines: Any) -> None:
        super().__init__(learners, engines)
        self.generation = 0  # builds of the group so far
        self.port: int | None = None
        self.intact = False  # every engine is a member of the current build
        self._counts = {"fallbacks": 0, "rebuilds": 0}

    @classmethod
    def check_config(cls, rollout: Any) -> None:
        from troupe.platform.registry import ROLLOUT_BACKENDS

        engine = ROLLOUT_BACKENDS.get(rollout.backend)
        check(hasattr(engine, "install_broadcast") and not rollout.colocate_with_learner, "rollout.weight_transport",
              rollout.weight_transport, "'object_store' unless rollout.backend=vllm on GPUs of its own "
              "(nccl cannot put two ranks on one GPU)")

    @classmethod
    def check_policy_config(cls, cfg: Any) -> None:
        # A fractional share lets Ray put two ranks on one GPU, which NCCL refuses.
        for key, n in (("rollout.num_gpus", cfg.rollout.num_gpus), ("learner.num_gpus", cfg.learner.num_gpus)):
            check(whole_gpus(n), key, n, "whole GPUs (an integer >= 1) with rollout.weight_transport=nccl, which "
                  "cannot put two ranks on one GPU; or rollout.weight_transport=object_store for GPU shares")

    def setup(self) -> None:
        """One group: learner rank 0 is rank 0, then every engine's workers."""
        self._build()

    def _build(self) -> None:
        learners, engines = self.learners, self.engines
        self.intact = False
        devices = engines.call("weight_group_devices")
        check_distinct_devices({f"rollout engine {i}": d for i, d in enumerate(devices)})
        addr, port = learners.wait([learners[0].master_address.remote()], "master_address")[0]
        self.generation += 1
        plan = plan_group(addr, port, engines.call("weight_group_size"), self.generation)
        # Launch every member before waiting: rank 0 hosts the rendezvous.
        refs = [h.init_weight_group.remote(**plan.engine_args(i)) for i, h in enumerate(engines.handles)]
        refs.append(learners[0].init_weight_group.remote(**plan.trainer_args()))
        engines.wait(refs, "init_weight_group")
        self.port, self.intact = port, True

    def _rebuild(self) -> bool:
        """Build the group anew for every member; False (and the object store until the next try) if it fails."""
        try:
            self._build()
        except RemoteCallError as e:
            log.warning("nccl weight group: rebuild %d failed, syncing through the object store: %s",
                        self.generation, e)
            return False
        self._counts["rebuilds"] += 1
        return True

    def begin(self) -> PendingSync:
        t = time.perf_counter()
        if not self.intact:
            # A broadcast would wait forever for a rank that is not in the group.
            self._counts["fallbacks"] += 1
            update_ref = self.learners[0].publish_weights.remote("object_store")
            return PendingSync(t, [h.load_weights.remote(update_ref) for h in self.engines.handles], update_ref)
        # Each call gets the manifest once the publish (queued behind the update) returns it;
        # the engines then receive while rank 0 broadcasts.
        update_ref = self.learners[0].publish_weights.remote(self.name)
        loads = [h.load_weights.remote(update_ref) for h in self.engines.handles]
        loads.append(self.learners[0].broadcast_weights.remote(update_ref))
        return PendingSync(t, loads, update_ref)

    def end(self, pending: PendingSync) -> float:
        try:
            nbytes = super().end(pending)
        except RemoteCallError:
            self.intact = False  # a member failed mid-sync: never broadcast to this build again
            raise
        if not self.intact:
            self._rebuild()  # the learner and engines are idle now: try the group again
        return nbytes

    def recover(self, i: int) -> None:
        # The restarted engine lost its communicator: rebuild the group for every member (or
        # fall back to the object store), then send it the weights it missed.
        self.intact = False
        self._rebuild()
        current = self.learners[0].current_weights.remote()
        self.engines.wait([self.engines[i].load_weights.remote(current)], "load_weights")

    def sync_metrics(self) -> dict[str, float]:
        out = {"sync/object_store_fallbacks": float(self._counts["fallbacks"]),
               "sync/group_rebuilds": float(self._counts["rebuilds"])}
        self._counts = {"fallbacks": 0, "rebuilds": 0}
        return out

    @classmethod
    def publish(cls, learner: Any) -> WeightUpdate:
        return publish(learner.model.state_dict(), learner.version)

    @classmethod
    def receive(cls, engine: Any, update: WeightUpdate) -> None:
        engine.install_broadcast(update.ref)


# -- learner side ---------------------------------------------------------------------
def publish(state: Mapping[str, torch.Tensor], version: int, bucket_bytes: int = DEFAULT_BUCKET_BYTES) -> WeightUpdate:
    """The update the engines receive with: the manifest only (the tensors follow by `send`)."""
    manifest = build_manifest(state, bucket_bytes)
    # `ref` holds the manifest itself: it is small and the tensors never enter the object store.
    return WeightUpdate(version=version, ref=manifest, nbytes=manifest.nbytes, kind=NcclTransport.name)


def send(group: Any, state: Mapping[str, torch.Tensor], manifest: Manifest, src: int = 0) -> int:
    """Broadcast the tensors bucket by bucket from rank ``src``; returns the bytes sent."""
    device = next(iter(state.values())).device if state else torch.device("cpu")
    sent = 0
    for bucket in manifest.buckets:
        buf = pack_bucket(state, bucket, device)
        group.broadcast(buf, src=src)
        sent += bucket.nbytes
    return sent


# -- engine side ----------------------------------------------------------------------
def receive(group: Any, manifest: Manifest, load: Callable[[list[tuple[str, torch.Tensor]]], Any],
            device: torch.device | str, src: int = 0) -> int:
    """Receive every bucket and hand its tensors to ``load``; returns the number of tensors."""
    n = 0
    for bucket in manifest.buckets:
        buf = torch.empty(bucket.nbytes, dtype=torch.uint8, device=device)
        group.broadcast(buf, src=src)
        tensors = unpack_bucket(buf, bucket)
        load(tensors)
        n += len(tensors)
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)  # the next generate must see every loaded weight
    return n


def init_group(address: str, port: int, rank: int, world_size: int, device: torch.device | int | str) -> Any:
    """Join the weight-sync group (every member at once); returns vLLM's NCCL communicator."""
    try:
        from vllm.distributed.device_communicators.pynccl import PyNcclCommunicator
        from vllm.distributed.utils import StatelessProcessGroup
    except ImportError as e:
        raise ConfigError('the nccl weight transport needs vLLM on the learner and engine nodes: '
                          'pip install -e ".[gpu]" on machines with CUDA GPUs') from e
    pg = StatelessProcessGroup.create(host=address, port=port, rank=rank, world_size=world_size)
    return PyNcclCommunicator(pg, device=device)
