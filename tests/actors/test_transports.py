"""Weight transports: chosen by registry, one `Transport` per file; and rollout backends, whose
engine classes take their own constructor arguments from the config. Pure: no Ray, no model."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch

from troupe.actors.rollout_hf import HFRolloutEngine
from troupe.actors.rollout_vllm import VLLMRolloutEngine
from troupe.actors.transport import Transport, WeightUpdate, choose_transport, nccl
from troupe.actors.transport.lora import LoraTransport
from troupe.actors.transport.nccl import NcclTransport
from troupe.actors.transport.object_store import ObjectStoreTransport
from troupe.algorithms.grpo.config import GRPOConfig, RolloutConfig
from troupe.algorithms.policy_graph import PolicyGraph, rollout_class
from troupe.platform.config import resolve
from troupe.platform.errors import ConfigError
from troupe.platform.registry import TRANSPORTS


def grpo(*overrides: str) -> GRPOConfig:
    return resolve(GRPOConfig, None, None, list(overrides))


# What a vLLM policy needs to pass its own checks (tests/actors/test_gpu_config_checks.py).
VLLM = ("rollout.backend=vllm", "rollout.num_gpus=1", "learner.num_gpus=1", "learner.recompute_old_logprobs=true")


def test_registry_holds_the_three_transports_under_the_names_their_updates_carry():
    expected = {"object_store": ObjectStoreTransport, "nccl": NcclTransport, "lora": LoraTransport}
    assert set(expected) <= set(TRANSPORTS.names())
    for name, cls in expected.items():
        assert TRANSPORTS.get(name) is cls and issubclass(cls, Transport) and cls.name == name


def test_lora_sends_the_adapter_whatever_the_config_names_else_the_configured_transport():
    assert choose_transport("object_store", lora_enabled=True) == "lora"
    assert choose_transport("nccl", lora_enabled=True) == "lora"
    assert choose_transport("object_store", lora_enabled=False) == "object_store"
    assert choose_transport("nccl", lora_enabled=False) == "nccl"


def test_unknown_weight_transport_is_a_config_error_naming_the_key_the_value_and_the_registered_names():
    with pytest.raises(ConfigError) as e:
        grpo("rollout.weight_transport=carrier_pigeon")
    msg = str(e.value)
    assert "rollout.weight_transport" in msg and "carrier_pigeon" in msg
    assert all(name in msg for name in ("object_store", "nccl", "lora"))


def test_unknown_rollout_backend_is_a_config_error_naming_the_key_and_the_registered_backends():
    with pytest.raises(ConfigError, match=r"rollout\.backend.*'carrier_pigeon'.*hf, vllm"):
        grpo("rollout.backend=carrier_pigeon")


def test_nccl_needs_vllm_engines_on_gpus_of_their_own():
    for bad in (["rollout.weight_transport=nccl"],  # the hf engine receives no broadcast
                ["rollout.weight_transport=nccl", *VLLM, "rollout.colocate_with_learner=true"]):
        with pytest.raises(ConfigError, match=r"rollout\.weight_transport.*'nccl'.*two ranks on one GPU"):
            grpo(*bad)
    assert grpo("rollout.weight_transport=nccl", *VLLM).rollout.weight_transport == "nccl"
    NcclTransport.check_config(RolloutConfig(backend="vllm", weight_transport="nccl"))
    with pytest.raises(ConfigError, match="rollout.weight_transport"):
        NcclTransport.check_config(RolloutConfig(backend="hf", weight_transport="nccl"))
    ObjectStoreTransport.check_config(RolloutConfig(backend="hf", colocate_with_learner=True))


class FakeGraph:
    """What `PolicyGraph.transport` reads of an `ActorGraph`: its groups by role name."""

    def __init__(self, **groups: Any) -> None:
        self.groups = groups

    def __getitem__(self, name: str) -> Any:
        return self.groups[name]


@pytest.mark.parametrize(("overrides", "expected"), [
    ((), ObjectStoreTransport),
    (("rollout.weight_transport=nccl", *VLLM), NcclTransport),
    (("rollout.weight_transport=nccl", *VLLM, "learner.lora.enabled=true"), LoraTransport),
    (("learner.lora.enabled=true",), LoraTransport),
])
def test_a_policy_holds_the_chosen_transport_with_its_learner_and_engine_groups(overrides, expected):
    policy = PolicyGraph(grpo(*overrides), model_path="unused")
    assert policy.last_update is None  # nothing published yet
    policy.graph = FakeGraph(learner="learners", rollout="engines")
    assert type(policy.transport) is expected
    assert (policy.transport.learners, policy.transport.engines) == ("learners", "engines")


class InstallRecorder:
    """An engine's install primitives, recording what a transport hands them."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def install_state(self, state: Any) -> None:
        self.calls.append(("install_state", state))

    def install_adapter(self, adapter: Any, config: Any) -> None:
        self.calls.append(("install_adapter", (adapter, config)))

    def install_broadcast(self, manifest: Any) -> None:
        self.calls.append(("install_broadcast", manifest))


def test_an_engine_loads_an_update_with_the_transport_its_kind_names():
    manifest = nccl.build_manifest({"w": torch.zeros(4)})
    engine = InstallRecorder()
    assert HFRolloutEngine.load_weights(engine, WeightUpdate(7, manifest, manifest.nbytes, kind="nccl")) == 7
    assert engine.calls == [("install_broadcast", manifest)] and engine.version == 7


@pytest.mark.parametrize(("engine_cls", "own", "not_taken"), [
    (HFRolloutEngine, {"device"}, {"gpu_memory_utilization", "max_model_len"}),
    (VLLMRolloutEngine, {"gpu_memory_utilization", "max_model_len"}, {"device"}),
])
def test_each_engine_takes_its_own_constructor_arguments_from_the_config(engine_cls, own, not_taken):
    backend = {HFRolloutEngine: "hf", VLLMRolloutEngine: "vllm"}[engine_cls]
    assert rollout_class(backend) is engine_cls
    kwargs = PolicyGraph(grpo(*(VLLM if backend == "vllm" else ())), model_path="m")._rollout_kwargs()
    assert kwargs["model_path"] == "m" and own <= kwargs.keys() and not kwargs.keys() & not_taken
    inspect.signature(engine_cls).bind(**kwargs)  # every one is a constructor argument
