"""The GPU paths' config checks, on CPU: a vLLM policy or an nccl sync that cannot work is one
`ConfigError` naming the key and the fix, raised when the config resolves (before any actor
starts); and the rules of vLLM's processed log-probs, as read in its sampler, are troupe's."""

from __future__ import annotations

import pytest
import torch

from troupe.actors import rollout_vllm
from troupe.actors.logit_processing import process_logits, seen_tokens
from troupe.actors.sampling import SamplingConfig
from troupe.algorithms.bpo.config import BPOConfig
from troupe.algorithms.grpo.config import GRPOConfig
from troupe.algorithms.policy_graph import PolicyGraph
from troupe.platform.config import resolve
from troupe.platform.errors import ConfigError

VLLM = ["rollout.backend=vllm", "rollout.num_gpus=0.5", "learner.recompute_old_logprobs=true"]


def grpo(*overrides: str) -> GRPOConfig:
    return resolve(GRPOConfig, None, None, list(overrides))


def refused(*overrides: str, cls: type = GRPOConfig) -> str:
    with pytest.raises(ConfigError) as e:
        resolve(cls, None, None, list(overrides))
    return str(e.value)


@pytest.fixture(autouse=True)
def no_vllm_in_the_driver(monkeypatch):
    """The driver of these tests has no vLLM (as a CPU head node may not): only the range of an installed one is checked."""
    monkeypatch.setattr(rollout_vllm, "installed_vllm_version", lambda: None)


def test_a_vllm_policy_with_a_gpu_share_and_recomputed_logprobs_resolves():
    cfg = grpo(*VLLM)
    assert cfg.rollout.dtype is None and rollout_vllm.engine_dtype(cfg.rollout) == "bfloat16"  # the GPU default
    kwargs = PolicyGraph(cfg, model_path="m")._rollout_kwargs()
    assert kwargs["dtype"] == "bfloat16" and kwargs["enforce_eager"] is False
    assert PolicyGraph(grpo(*VLLM, "rollout.enforce_eager=true"), "m")._rollout_kwargs()["enforce_eager"] is True
    grpo("rollout.backend=hf")  # the hf engine has none of these rules


def test_vllm_without_a_gpu_share_names_rollout_num_gpus():
    msg = refused("rollout.backend=vllm", "learner.recompute_old_logprobs=true")
    assert "'rollout.num_gpus' = 0.0" in msg and "rollout.backend=hf" in msg


def test_gpu_memory_utilization_above_the_roles_gpu_share_is_refused():
    msg = refused(*VLLM, "rollout.gpu_memory_utilization=0.6")
    assert "'rollout.gpu_memory_utilization' = 0.6" in msg and "rollout.num_gpus=0.5" in msg
    assert "whole GPU" in msg
    grpo(*VLLM, "rollout.gpu_memory_utilization=0.5")
    grpo(*VLLM, "rollout.num_gpus=1", "rollout.gpu_memory_utilization=0.9")


def test_a_bf16_engine_with_an_fp32_learner_needs_recomputed_old_logprobs():
    base = ["rollout.backend=vllm", "rollout.num_gpus=0.5"]
    msg = refused(*base)
    assert "'learner.recompute_old_logprobs'" in msg and "bfloat16" in msg and "float32" in msg
    assert "learner.recompute_old_logprobs=true" in msg
    grpo(*base, "rollout.dtype=float32")  # the same dtype on both sides
    grpo(*base, "learner.dtype=bfloat16")
    assert "rollout.dtype" in refused(*VLLM, "rollout.dtype=fp8")


@pytest.mark.parametrize("sampling", [["rollout.sampling.top_p=0.9"], ["rollout.sampling.top_k=5"],
                                      ["rollout.sampling.min_p=0.1"], ["rollout.sampling.repetition_penalty=1.2"]])
def test_truncation_and_penalties_follow_the_same_rule_as_temperature(sampling):
    # vLLM's processed log-probs apply every one of these as troupe does (test below): only the
    # precision rule decides, for each option alike.
    assert "learner.recompute_old_logprobs" in refused("rollout.backend=vllm", "rollout.num_gpus=0.5", *sampling)
    grpo(*VLLM, *sampling)
    grpo("rollout.backend=vllm", "rollout.num_gpus=0.5", "rollout.dtype=float32", *sampling)


def test_an_installed_vllm_outside_the_pinned_range_is_refused_by_the_config(monkeypatch):
    monkeypatch.setattr(rollout_vllm, "installed_vllm_version", lambda: "0.33.0")
    msg = refused(*VLLM)
    assert "rollout.backend=vllm" in msg and ">=0.10.2,<0.13" in msg and "found 0.33.0" in msg
    grpo("rollout.backend=hf")
    monkeypatch.setattr(rollout_vllm, "installed_vllm_version", lambda: "0.11.2")
    grpo(*VLLM)


def test_nccl_needs_whole_gpus_for_the_learner_and_the_engines():
    nccl = ["rollout.weight_transport=nccl", *VLLM]
    for key, bad in (("rollout.num_gpus", "0.5"), ("learner.num_gpus", "0.5"), ("learner.num_gpus", "0"),
                     ("rollout.num_gpus", "1.5")):
        msg = refused(*nccl, "rollout.num_gpus=1", "learner.num_gpus=1", f"{key}={bad}")
        assert f"'{key}'" in msg and "whole GPUs" in msg and "object_store" in msg
    grpo(*nccl, "rollout.num_gpus=1", "learner.num_gpus=2")
    msg = refused(*nccl, "rollout.num_gpus=1", "learner.num_gpus=1", "rollout.colocate_with_learner=true")
    assert "rollout.weight_transport" in msg and "two ranks on one GPU" in msg
    # LoRA sends the adapter through the object store whatever the config names: GPU shares are fine.
    grpo(*nccl, "learner.num_gpus=0.5", "learner.lora.enabled=true")


def test_bpo_runs_the_same_checks():
    assert "rollout.num_gpus" in refused("rollout.backend=vllm", "learner.recompute_old_logprobs=true", cls=BPOConfig)


def test_a_colocated_vllm_engine_is_created_and_ready_before_its_learner():
    roles = PolicyGraph(grpo(*VLLM, "rollout.colocate_with_learner=true", "learner.num_gpus=0.4"), "m").roles()
    assert [r.name for r in roles[:2]] == ["rollout", "learner"] and roles[0].ready_first
    assert roles[0].colocate == roles[1].colocate == "policy"
    apart = PolicyGraph(grpo(*VLLM), "m").roles()
    assert [r.name for r in apart[:2]] == ["learner", "rollout"] and not any(r.ready_first for r in apart)
    hf = PolicyGraph(grpo("rollout.colocate_with_learner=true"), "m").roles()
    assert [r.name for r in hf[:2]] == ["learner", "rollout"] and not any(r.ready_first for r in hf)


# -- vLLM's processed log-probs, as read in its sampler, against troupe's processing ----------------------
def vllm_processed_logits(logits: torch.Tensor, prompt: torch.Tensor, output: torch.Tensor, s: SamplingConfig):
    """One decode step of vLLM's sampler (``logprobs_mode="processed_logprobs"``), written from the
    facts read in its source: the repetition penalty on tokens of the prompt or the output so far
    (positive logits divided, others multiplied), temperature, min-p against the tempered
    p_max, top-k on the sorted logits keeping ties, then top-p over what top-k kept: ascending
    cumulative probability ``<= 1 - p`` removed, the largest token never."""
    z = logits.clone().float()
    seen = torch.zeros_like(z, dtype=torch.bool)
    seen[torch.arange(len(z)).unsqueeze(1), prompt] = True
    if output.numel():
        seen[torch.arange(len(z)).unsqueeze(1), output] = True
    pen = torch.where(seen, torch.full_like(z, s.repetition_penalty), torch.ones_like(z))
    z = z * torch.where(z > 0, 1.0 / pen, pen)
    z = z / s.temperature
    if s.min_p > 0:
        p = z.softmax(-1)
        z = z.masked_fill(p < s.min_p * p.amax(-1, keepdim=True), float("-inf"))
    srt, idx = z.sort(dim=-1)
    if s.top_k > 0:
        kth = srt.gather(1, torch.full((len(z), 1), z.shape[1] - s.top_k))
        srt = srt.masked_fill(srt < kth, float("-inf"))
    if s.top_p < 1:
        mask = srt.softmax(-1).cumsum(-1) <= 1 - s.top_p
        mask[:, -1] = False
        srt = srt.masked_fill(mask, float("-inf"))
    return srt.scatter(-1, idx, srt)


def test_vllm_processed_logprobs_apply_troupes_options_in_troupes_order():
    assert rollout_vllm.PROCESSED_ORDER == ("repetition_penalty", "temperature", "min_p", "top_k", "top_p")
    g = torch.Generator().manual_seed(0)
    B, P, C, V = 6, 5, 4, 40
    prompt = torch.randint(0, V, (B, P), generator=g)
    completion = torch.randint(0, V, (B, C), generator=g)
    logits = 3 * torch.randn(B, C, V, generator=g)
    for s in (SamplingConfig(temperature=0.7, top_p=0.8, top_k=12, min_p=0.05, repetition_penalty=1.3),
              SamplingConfig(temperature=1.3, top_p=0.6), SamplingConfig(temperature=0.5, top_k=3),
              SamplingConfig(temperature=1.0, min_p=0.2, repetition_penalty=0.8)):
        seen = seen_tokens(prompt, torch.ones_like(prompt), completion, V)
        ours = process_logits(logits, s, seen=seen).log_softmax(-1)
        for t in range(C):
            theirs = vllm_processed_logits(logits[:, t], prompt, completion[:, :t], s).log_softmax(-1)
            assert torch.equal(ours[:, t].isinf(), theirs.isinf()), (s, t)  # the same tokens kept
            kept = ~theirs.isinf()
            assert torch.allclose(ours[:, t][kept], theirs[kept], atol=1e-5), (s, t)
