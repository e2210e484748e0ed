"""The nccl weight transport's handshake, manifest and bucket packing, checked on CPU.

The broadcast itself needs GPUs (tests/actors/test_rollout_vllm.py); here a recording group
and a replaying group stand in for learner rank 0's and an engine's communicators.
"""

from __future__ import annotations

import inspect
import sys

import pytest
import torch

from troupe.actors.rollout_vllm import VLLMRolloutEngine
from troupe.actors.transport import nccl
from troupe.platform.errors import ConfigError


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
    assert plan.engine_args(1) == {"address": "10.0.0.1", "port": 29500, "rank_offset": 2, "world_size": 5}
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
