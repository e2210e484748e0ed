"""The nccl weight transport's handshake, manifest and bucket packing, checked on CPU.

The broadcast itself needs GPUs (tests/actors/test_rollout_vllm.py); here a recording group
and a replaying group stand in for learner rank 0's and an engine's communicators.
"""

from __future__ import annotations

import inspect
import sys
from types import SimpleNamespace

import pytest
import torch

from troupe.actors.rollout_vllm import VLLMRolloutEngine
from troupe.actors.transport import nccl
from troupe.actors.transport.base import WeightUpdate
from troupe.actors.transport.nccl import NcclTransport
from troupe.platform.errors import ConfigError, RemoteCallError


def mixed_state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "embed.weight": torch.randn(37, 8, generator=g),
        "layer.q.weight": torch.randn(8, 8, generator=g).to(torch.bfloat16),
        "layer.q.bias": torch.randn(3, generator=g).half(),
        "step": torch.tensor(7, dtype=torch.int64),  # 0-dim
        "empty": torch.zeros(0, 4),
        "flags": torch.tensor([True, False, True]),
        "norm.weight": torch.randn(5, generator=g).double(),
    }


class RecordingGroup:
    def __init__(self) -> None:
        self.sent: list[torch.Tensor] = []

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        assert src == 0
        self.sent.append(tensor.clone())


class ReplayGroup:
    def __init__(self, sent: list[torch.Tensor]) -> None:
        self.sent = list(sent)

    def broadcast(self, tensor: torch.Tensor, src: int = 0) -> None:
        source = self.sent.pop(0)
        assert source.shape == tensor.shape and source.dtype == tensor.dtype == torch.uint8
        tensor.copy_(source)


# -- handshake -----------------------------------------------------------------------------
def test_plan_puts_the_learner_at_rank_0_and_each_engine_after_the_previous_one():
    plan = nccl.plan_group("10.0.0.1", 29500, [1, 2, 1])
    assert plan.world_size == 5 and plan.rank_offsets == (1, 2, 4)
    assert plan.trainer_args() == {"address": "10.0.0.1", "port": 29500, "rank": 0, "world_size": 5}
    assert plan.engine_args(1) == {"address": "10.0.0.1", "port": 29500, "rank_offset": 2, "world_size": 5,
                                   "generation": 0}
    ranks = [plan.rank_offsets[i] + r for i, n in enumerate([1, 2, 1]) for r in range(n)]
    assert sorted([0, *ranks]) == list(range(plan.world_size))  # every rank taken exactly once


def test_plan_refuses_no_engines_empty_engines_and_bad_ports():
    with pytest.raises(ConfigError, match="no rollout engines"):
        nccl.plan_group("h", 29500, [])
    with pytest.raises(ConfigError, match=">= 1 worker"):
        nccl.plan_group("h", 29500, [1, 0])
    with pytest.raises(ConfigError, match="not a TCP port"):
        nccl.plan_group("h", 70000, [1])


def test_handshake_arguments_fit_the_calls_that_take_them():
    plan = nccl.plan_group("h", 1234, [1])
    inspect.signature(VLLMRolloutEngine.init_weight_group).bind(None, **plan.engine_args(0))
    inspect.signature(nccl.init_group).bind(**plan.trainer_args(), device=0)


def test_init_group_without_vllm_says_to_install_the_gpu_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    monkeypatch.setitem(sys.modules, "vllm.distributed", None)
    with pytest.raises(ConfigError, match=r'pip install -e "\.\[gpu\]"'):
        nccl.init_group("127.0.0.1", 29500, 0, 2, 0)


# -- manifest -------------------------------------------------------------------------------
def test_manifest_keeps_every_name_dtype_and_shape_in_order():
    state = mixed_state()
    m = nccl.build_manifest(state)
    assert m.names == list(state)
    specs = {s.name: s for b in m.buckets for s in b.specs}
    for k, t in state.items():
        assert nccl.dtype_from_name(specs[k].dtype) == t.dtype and specs[k].shape == tuple(t.shape)
        assert specs[k].nbytes == t.numel() * t.element_size()
    assert m.nbytes == sum(t.numel() * t.element_size() for t in state.values())


def test_buckets_respect_the_size_limit_and_align_every_tensor():
    state = mixed_state()
    m = nccl.build_manifest(state, bucket_bytes=512)
    assert len(m.buckets) > 1
    for b in m.buckets:
        assert b.nbytes <= 512 or len(b.specs) == 1  # only a tensor larger than a bucket gets one alone
        ends = [s.offset + s.nbytes for s in b.specs]
        assert all(s.offset % nccl.ALIGN == 0 for s in b.specs)
        assert all(e <= nxt.offset for e, nxt in zip(ends, b.specs[1:], strict=False))  # no overlaps
        assert max(ends) <= b.nbytes
    big = nccl.build_manifest({"w": torch.zeros(1000)}, bucket_bytes=512)
    assert len(big.buckets) == 1 and big.buckets[0].nbytes >= 4000


def test_manifest_refuses_dtypes_it_cannot_carry():
    with pytest.raises(ValueError, match="complex64"):
        nccl.build_manifest({"z": torch.zeros(2, dtype=torch.complex64)})
    with pytest.raises(ValueError, match="float128"):
        nccl.dtype_from_name("float128")


def test_publish_gives_a_versioned_nccl_update_holding_only_the_manifest():
    state = mixed_state()
    update = nccl.publish(state, version=3, bucket_bytes=256)
    assert update.kind == "nccl" and update.version == 3 and update.adapter_config is None
    assert isinstance(update.ref, nccl.Manifest) and update.nbytes == update.ref.nbytes
    import pickle

    assert len(pickle.dumps(update)) < 4096  # travels through Ray as a small message


# -- packing and the broadcast round trip ------------------------------------------------------
def test_pack_then_unpack_returns_identical_tensors():
    state = mixed_state()
    for bucket in nccl.build_manifest(state, bucket_bytes=256).buckets:
        buf = nccl.pack_bucket(state, bucket, "cpu")
        assert buf.dtype == torch.uint8 and buf.numel() == bucket.nbytes
        for name, t in nccl.unpack_bucket(buf, bucket):
            assert t.dtype == state[name].dtype and torch.equal(t, state[name]), name


def test_pack_refuses_a_tensor_that_changed_since_the_manifest():
    state = mixed_state()
    m = nccl.build_manifest(state)
    state["embed.weight"] = torch.zeros(38, 8)
    with pytest.raises(ValueError, match="embed.weight.*no longer matches"):
        nccl.pack_bucket(state, m.buckets[0], "cpu")


def test_receive_loads_exactly_what_send_broadcast_bucket_by_bucket():
    state = mixed_state()
    update = nccl.publish(state, version=1, bucket_bytes=256)
    sender = RecordingGroup()
    sent = nccl.send(sender, state, update.ref)
    assert len(sender.sent) == len(update.ref.buckets) and sent == sum(b.nbytes for b in update.ref.buckets)

    loads: list[list[str]] = []
    got: dict[str, torch.Tensor] = {}

    def load(tensors: list[tuple[str, torch.Tensor]]) -> None:
        loads.append([n for n, _ in tensors])
        got.update({n: t.clone() for n, t in tensors})

    n = nccl.receive(ReplayGroup(sender.sent), update.ref, load, "cpu")
    assert n == len(state) and len(loads) == len(update.ref.buckets)
    assert [name for names in loads for name in names] == list(state)
    for k, t in state.items():
        assert got[k].dtype == t.dtype and torch.equal(got[k], t), k


# -- restarts: the group is rebuilt for every member, or the sync goes through the object store ---------
class Ref:
    """A finished call, as the fake actors return it (the value, or the error it raised)."""

    def __init__(self, fn, args, kwargs) -> None:
        args = [a.value() if isinstance(a, Ref) else a for a in args]  # Ray resolves ref arguments
        try:
            self._value, self._error = fn(*args, **kwargs), None
        except Exception as e:  # re-raised by `value`, as ray.get would
            self._value, self._error = None, e

    def value(self):
        if self._error is not None:
            raise self._error
        return self._value


class Handle:
    """An actor handle over a plain object: ``handle.method.remote(...)`` runs it now."""

    def __init__(self, obj) -> None:
        self.obj = obj

    def __getattr__(self, name):
        return SimpleNamespace(remote=lambda *a, **kw: Ref(getattr(self.obj, name), a, kw))


class Group:
    """What a transport uses of an `ActorGroup`: handles, ``call`` and a ``wait`` that names the failure."""

    def __init__(self, *objs) -> None:
        self.handles = [Handle(o) for o in objs]

    def __getitem__(self, i: int) -> Handle:
        return self.handles[i]

    def __len__(self) -> int:
        return len(self.handles)

    def wait(self, refs, method, timeout_s=None):
        try:
            return [r.value() for r in refs]
        except Exception as e:
            raise RemoteCallError(f"rollout.{method} failed: {e!r}") from e

    def call(self, method, *args, **kwargs):
        return self.wait([getattr(h, method).remote(*args, **kwargs) for h in self.handles], method)


class FakeLearner:
    def __init__(self) -> None:
        self.version, self.next_port = 0, 30000
        self.joined: list[dict] = []
        self.broadcasts = 0

    def master_address(self):
        self.next_port += 1  # a free port: never the one the live group's store holds
        return "10.0.0.1", self.next_port

    def init_weight_group(self, **kw) -> bool:
        self.joined.append(kw)
        return True

    def publish_weights(self, transport: str = "object_store") -> WeightUpdate:
        self.version += 1
        return WeightUpdate(self.version, f"weights-{self.version}", 8, kind=transport)

    def current_weights(self) -> WeightUpdate:
        return WeightUpdate(self.version, f"weights-{self.version}", 8, kind="object_store")

    def broadcast_weights(self, update: WeightUpdate) -> int:
        self.broadcasts += 1
        return update.version


class FakeEngine:
    def __init__(self, uuid: str) -> None:
        self.uuid, self.generation, self.refuse_join = uuid, None, False
        self.loaded: list[tuple[str, int]] = []

    def weight_group_size(self) -> int:
        return 1

    def weight_group_devices(self) -> list[str]:
        return [self.uuid]

    def init_weight_group(self, address, port, rank_offset, world_size, generation) -> bool:
        if self.refuse_join:
            raise RuntimeError("rendezvous timed out")
        self.generation, self.port = generation, port
        return True

    def load_weights(self, update: WeightUpdate) -> int:
        self.loaded.append((update.kind, update.version))
        return update.version

    def restart(self) -> None:  # what Ray's restart leaves: a fresh instance, in no group
        self.generation, self.loaded = None, []


def fake_transport(n: int = 2) -> tuple[NcclTransport, FakeLearner, list[FakeEngine]]:
    learner, engines = FakeLearner(), [FakeEngine(f"GPU-{i}") for i in range(n)]
    transport = NcclTransport(Group(learner), Group(*engines))
    transport.setup()
    return transport, learner, engines


def sync(transport: NcclTransport) -> None:
    transport.end(transport.begin())


def test_a_restart_rebuilds_the_group_for_every_member_on_a_new_port():
    transport, learner, engines = fake_transport()
    first_port = learner.joined[-1]["port"]
    sync(transport)
    assert learner.broadcasts == 1 and [e.loaded[-1][0] for e in engines] == ["nccl", "nccl"]
    engines[1].restart()
    transport.recover(1)
    assert {e.generation for e in engines} == {2} and transport.generation == 2
    assert learner.joined[-1]["port"] != first_port and {e.port for e in engines} == {learner.joined[-1]["port"]}
    assert engines[1].loaded == [("object_store", 1)]  # the weights it missed, through the object store
    sync(transport)
    assert learner.broadcasts == 2 and [e.loaded[-1] for e in engines] == [("nccl", 2), ("nccl", 2)]
    assert transport.sync_metrics() == {"sync/object_store_fallbacks": 0.0, "sync/group_rebuilds": 1.0}


def test_while_the_group_cannot_be_rebuilt_syncs_go_through_the_object_store_and_are_counted():
    transport, learner, engines = fake_transport()
    engines[1].restart()
    engines[1].refuse_join = True
    transport.recover(1)  # the rebuild fails: no broadcast may wait for engine 1
    assert not transport.intact
    sync(transport)
    sync(transport)
    assert learner.broadcasts == 0
    assert [k for k, _ in engines[0].loaded[-2:]] == ["object_store"] * 2
    assert engines[1].loaded[-1] == ("object_store", 2)
    assert transport.sync_metrics() == {"sync/object_store_fallbacks": 2.0, "sync/group_rebuilds": 0.0}
    engines[1].refuse_join = False
    sync(transport)  # one more through the object store, after which the rebuild succeeds
    assert transport.intact and {e.generation for e in engines} == {transport.generation}
    sync(transport)
    assert learner.broadcasts == 1 and engines[1].loaded[-1] == ("nccl", 4)
    assert transport.sync_metrics() == {"sync/object_store_fallbacks": 1.0, "sync/group_rebuilds": 1.0}


def test_a_member_failing_mid_sync_stops_broadcasts_to_that_group():
    transport, learner, engines = fake_transport()
    engines[0].load_weights = lambda update: (_ for _ in ()).throw(RuntimeError("engine died"))
    with pytest.raises(RemoteCallError, match="engine died"):
        sync(transport)
    assert not transport.intact
    del engines[0].load_weights
    sync(transport)
    assert engines[0].loaded[-1][0] == "object_store"


def test_a_policy_counts_a_fallback_sync_as_a_fault_and_reports_it():
    from troupe.algorithms.grpo.config import GRPOConfig
    from troupe.algorithms.policy_graph import PolicyGraph
    from troupe.platform.config import resolve

    cfg = resolve(GRPOConfig, None, None, ["rollout.backend=vllm", "rollout.weight_transport=nccl",
                                          "rollout.num_gpus=1", "learner.num_gpus=1",
                                          "learner.recompute_old_logprobs=true"])
    policy = PolicyGraph(cfg, model_path="unused")
    learner, engine = FakeLearner(), FakeEngine("GPU-0")
    policy._transport = NcclTransport(Group(learner), Group(engine))  # never set up: no intact group
    metrics = policy.sync_end(policy.sync_begin())
    assert metrics["sync/object_store_fallbacks"] == 1.0 and policy.pop_faults() == 1
    assert engine.loaded == [("object_store", 1)]


def test_engines_on_one_gpu_are_refused_before_any_communicator_exists():
    nccl.check_distinct_devices({"rollout engine 0": ["GPU-a"], "rollout engine 1": ["GPU-b", "GPU-c"]})
    with pytest.raises(ConfigError, match="rollout engine 0 and rollout engine 1 are on the same GPU.*rollout.num_gpus"):
        nccl.check_distinct_devices({"rollout engine 0": ["GPU-a"], "rollout engine 1": ["GPU-a"]})
    learner, engines = FakeLearner(), [FakeEngine("GPU-0"), FakeEngine("GPU-0")]
    with pytest.raises(ConfigError, match="same GPU"):
        NcclTransport(Group(learner), Group(*engines)).setup()
    assert learner.joined == [] and all(e.generation is None for e in engines)
