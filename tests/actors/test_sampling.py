"""Sampling options: the processing rules on hand-made logits, and the hf engine, the learner and
the scorer agreeing on the log-probs of the distribution actually sampled."""

import math

import pytest
import torch

from troupe.actors.learner import Learner
from troupe.actors.logit_processing import (
    is_identity,
    process_logits,
    seen_tokens,
)
from troupe.actors.logprobs import positions_from_mask
from troupe.actors.rollout_hf import HFRolloutEngine
from troupe.actors.rollout_vllm import sampling_kwargs
from troupe.actors.sampling import SamplingConfig
from troupe.actors.scorer import Scorer
from troupe.platform.config import to_dict
from troupe.platform.errors import ConfigError

INF = float("inf")
PROMPTS = ["12+34=", "5+7=", "99+1=", "40+2="]


def logprobs_of(probs: list[float], **sampling) -> list[float]:
    """Log-softmax of the processed logits of a distribution given by its probabilities."""
    z = torch.tensor(probs).log().unsqueeze(0)
    return torch.log_softmax(process_logits(z, SamplingConfig(**sampling)), -1)[0].tolist()


def close(got: list[float], want: list[float]) -> bool:
    return all((g == w == -INF) or abs(g - w) < 1e-6 for g, w in zip(got, want, strict=True))


# -- the rules, exactly --------------------------------------------------------------------
def test_top_k_keeps_the_k_most_likely_and_renormalises():
    assert close(logprobs_of([0.4, 0.3, 0.2, 0.1], top_k=2), [math.log(4 / 7), math.log(3 / 7), -INF, -INF])


def test_min_p_keeps_tokens_with_p_at_least_min_p_times_the_largest():
    # threshold 0.3 · 0.4 = 0.12: 0.1 goes
    assert close(logprobs_of([0.4, 0.3, 0.2, 0.1], min_p=0.3), [math.log(4 / 9), math.log(3 / 9), math.log(2 / 9), -INF])


def test_top_p_keeps_the_smallest_set_with_mass_at_least_top_p():
    # ascending cumulative mass 0.1, 0.3, 0.6, 1.0: tokens whose mass below is <= 1 - 0.6 go
    assert close(logprobs_of([0.4, 0.3, 0.2, 0.1], top_p=0.6), [math.log(4 / 7), math.log(3 / 7), -INF, -INF])
    assert close(logprobs_of([0.4, 0.3, 0.2, 0.1], top_p=0.75), [math.log(4 / 9), math.log(3 / 9), math.log(2 / 9), -INF])


def test_temperature_applies_before_truncation():
    # T = 0.5 squares the probabilities: 0.16, 0.09, 0.04, 0.01 (sum 0.3); top-2 keeps 16 : 9
    assert close(logprobs_of([0.4, 0.3, 0.2, 0.1], temperature=0.5, top_k=2),
                 [math.log(16 / 25), math.log(9 / 25), -INF, -INF])


def test_top_p_applies_to_what_min_p_kept_as_vllm_does():
    # min-p 0.5 keeps 0.4 and 0.35 (renormalised 8/15, 7/15); top-p 0.5 then keeps the first only.
    # (top-p before min-p, transformers' order, would keep both.)
    assert close(logprobs_of([0.4, 0.35, 0.15, 0.1], min_p=0.5, top_p=0.5), [0.0, -INF, -INF, -INF])


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    z = torch.tensor([[2.0, -1.0, 0.5, 0.0]])
    seen = torch.tensor([[True, True, False, False]])
    out = process_logits(z, SamplingConfig(repetition_penalty=2.0), seen)
    assert out.tolist() == [[1.0, -2.0, 0.5, 0.0]]
    with pytest.raises(ValueError, match="repetition_penalty"):
        process_logits(z, SamplingConfig(repetition_penalty=2.0))


def test_seen_tokens_are_the_prompt_without_padding_and_the_earlier_completion():
    prompt, mask = torch.tensor([[0, 5, 6]]), torch.tensor([[0, 1, 1]])  # id 0 is left padding
    seen = seen_tokens(prompt, mask, torch.tensor([[7, 5, 8]]), vocab_size=10)
    assert [torch.nonzero(seen[0, t]).flatten().tolist() for t in range(3)] == [[5, 6], [5, 6, 7], [5, 6, 7]]


def test_the_kept_token_survives_truncation_and_greedy_only_penalises():
    z = torch.tensor([[3.0, 2.0, 1.0, 0.0]])
    out = process_logits(z, SamplingConfig(top_k=1), keep=torch.tensor([2]))
    assert torch.isfinite(out).tolist() == [[True, False, True, False]]
    assert torch.equal(process_logits(z, SamplingConfig(temperature=0, top_k=1, top_p=0.1)), z)
    assert is_identity(SamplingConfig()) and is_identity(SamplingConfig(temperature=0, top_k=5))
    assert not is_identity(SamplingConfig(temperature=0, repetition_penalty=1.2))


def test_bad_sampling_values_name_their_key_under_rollout_sampling():
    for kw, key in [({"top_k": -1}, "top_k"), ({"min_p": 1.5}, "min_p"), ({"repetition_penalty": 0.0}, "repetition_penalty"),
                    ({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"max_new_tokens": 0}, "max_new_tokens")]:
        with pytest.raises(ConfigError, match=rf"'rollout\.sampling\.{key}'"):
            SamplingConfig(**kw)


def test_vllm_sampling_params_carry_the_new_options_with_vllm_off_values_by_default():
    kw = sampling_kwargs(SamplingConfig(top_k=50, min_p=0.05, repetition_penalty=1.1), 1, seed=0, eos_id=2)[0]
    assert (kw["top_k"], kw["min_p"], kw["repetition_penalty"]) == (50, 0.05, 1.1)
    off = sampling_kwargs(SamplingConfig(), 1, seed=0, eos_id=2)[0]
    assert (off["top_k"], off["min_p"], off["repetition_penalty"]) == (0, 0.0, 1.0)


# -- the engine, the learner and the scorer -----------------------------------------------------
def raw_logits(model, batch) -> torch.Tensor:
    """``[B, C, V]`` logits at the completion positions (float32, no processing)."""
    ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
    attn = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=attn, position_ids=positions_from_mask(attn), use_cache=False)
    P = batch["prompt_ids"].shape[1]
    return out.logits[:, P - 1 : -1].float()


TRUNCATED = SamplingConfig(temperature=0.7, top_p=0.9, top_k=20, min_p=0.05, repetition_penalty=1.3, max_new_tokens=6)


@pytest.mark.timeout(180)
def test_truncated_penalised_sampling_logprobs_equal_learner_and_scorer_recompute(tiny_model_dir):
    engine = HFRolloutEngine(tiny_model_dir)
    batch = engine.generate(PROMPTS * 2, TRUNCATED, seed=7)
    m = batch["completion_mask"].bool()
    # The tokens were drawn from the truncated distribution: each is in the set the rule keeps
    # (an untruncated draw from the untrained model's near-uniform 384 tokens would rarely be).
    logits = raw_logits(engine.model, batch)
    seen = seen_tokens(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], logits.shape[-1])
    kept = torch.isfinite(process_logits(logits, TRUNCATED, seen))
    assert kept.gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)[m].all()
    assert (kept.sum(-1)[m] <= 20).all()
    # ... and the log-probs are those of that distribution, renormalised: above the raw ones.
    raw = torch.log_softmax(logits, -1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    assert (batch["logprobs"][m] > raw[m]).all()
    learner = Learner(tiny_model_dir, {"lr": 1e-2}, sampling=to_dict(TRUNCATED), max_len=6)
    scorer = Scorer(tiny_model_dir)
    # Full forward vs generate's cached steps: float32 roundoff only (the existing T = 1 test's 1e-4).
    assert torch.allclose(learner.logprobs(batch)[m], batch["logprobs"][m], atol=1e-4)
    assert torch.allclose(scorer.logprobs(batch, to_dict(TRUNCATED))["logprobs"][m], batch["logprobs"][m], atol=1e-4)
    # the PPO ratio at the engine's own weights is 1: the learner applies the same truncation
    metrics = learner.update(batch, {"advantages": torch.linspace(-1, 1, 8)})
    assert metrics["ratio/mean"] == pytest.approx(1.0, abs=1e-4) and math.isfinite(metrics["entropy"])


@pytest.mark.timeout(120)
def test_greedy_decoding_applies_the_repetition_penalty_and_reports_its_logprobs(tiny_model_dir):
    engine = HFRolloutEngine(tiny_model_dir)
    sampling = SamplingConfig(temperature=0, repetition_penalty=1.5, max_new_tokens=6)
    batch = engine.generate(PROMPTS, sampling)
    m = batch["completion_mask"].bool()
    logits = raw_logits(engine.model, batch)
    seen = seen_tokens(batch["prompt_ids"], batch["prompt_mask"], batch["completion_ids"], logits.shape[-1])
    z = process_logits(logits, sampling, seen)
    assert torch.equal(z.argmax(-1)[m], batch["completion_ids"][m])  # the argmax of the penalised logits
    lp = torch.log_softmax(z, -1).gather(-1, batch["completion_ids"].unsqueeze(-1)).squeeze(-1)
    assert torch.allclose(lp[m], batch["logprobs"][m], atol=1e-4)
    learner = Learner(tiny_model_dir, {"lr": 1e-2}, sampling=sampling, max_len=6)
    assert torch.allclose(learner.logprobs(batch)[m], batch["logprobs"][m], atol=1e-4)


# -- ε-greedy exploration ------------------------------------------------------------------------
def test_explore_mixes_the_argmax_with_the_distribution_exactly():
    # p = (0.5, 0.3, 0.2), ε = 0.2: (0.8 + 0.1, 0.06, 0.04)
    assert close(logprobs_of([0.5, 0.3, 0.2], explore=0.2), [math.log(0.9), math.log(0.06), math.log(0.04)])
    assert close(logprobs_of([0.5, 0.3, 0.2], explore=1.0), [math.log(0.5), math.log(0.3), math.log(0.2)])
    # applied after truncation: top-k 2 keeps (0.625, 0.375), then the mixture; -inf stays -inf
    got = logprobs_of([0.5, 0.3, 0.2], top_k=2, explore=0.5)
    assert close(got, [math.log(0.5 + 0.3125), math.log(0.1875), -INF])
    assert not is_identity(SamplingConfig(explore=0.1)) and is_identity(SamplingConfig())


def test_explore_needs_a_temperature_and_is_refused_by_vllm():
    with pytest.raises(ConfigError, match=r"'rollout\.sampling\.explore'.*temperature"):
        SamplingConfig(temperature=0, explore=0.1)
    with pytest.raises(ConfigError, match=r"'rollout\.sampling\.explore'"):
        SamplingConfig(explore=1.5)
    with pytest.raises(ConfigError, match="rollout.sampling.explore=0.1.*rollout.backend=hf"):
        sampling_kwargs(SamplingConfig(explore=0.1), 1, seed=0, eos_id=2)


@pytest.mark.timeout(120)
def test_explore_rollouts_mostly_follow_the_argmax_with_the_mixtures_logprobs(tiny_model_dir):
    engine = HFRolloutEngine(tiny_model_dir)
    sampling = SamplingConfig(temperature=1.0, explore=0.1, max_new_tokens=6)
    batch = engine.generate(PROMPTS * 4, sampling, seed=3)
    m = batch["completion_mask"].bool()
    logits = raw_logits(engine.model, batch)
    # about 1 - ε + ε·p_max of tokens are the argmax; at T = 1 the untrained model's 384 tokens
    # would almost never give one
    share = (logits.argmax(-1) == batch["completion_ids"])[m].float().mean().item()
    assert share > 0.75
    lp = torch.log_softmax(process_logits(logits, sampling), -1).gather(-1, batch["completion_ids"].unsqueeze(-1))
    assert torch.allclose(lp.squeeze(-1)[m], batch["logprobs"][m], atol=1e-4)
    learner = Learner(tiny_model_dir, {"lr": 1e-2}, sampling=to_dict(sampling), max_len=6)
    assert torch.allclose(learner.logprobs(batch)[m], batch["logprobs"][m], atol=1e-4)


# -- the engine's own random stream --------------------------------------------------------------
@pytest.mark.timeout(120)
def test_a_seeded_generate_draws_what_transformers_sampler_draws_whatever_else_uses_the_global_rng(tiny_model_dir):
    engine = HFRolloutEngine(tiny_model_dir)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6)
    first = engine.generate(PROMPTS * 2, sampling, seed=11)
    torch.manual_seed(12345)
    torch.rand(1000)  # another user of torch's global stream, between the two calls
    again = engine.generate(PROMPTS * 2, sampling, seed=11)
    assert torch.equal(first["completion_ids"], again["completion_ids"])
    # the tokens are those `generate(do_sample=True)` draws after torch.manual_seed(11)
    enc = {"input_ids": first["prompt_ids"], "attention_mask": first["prompt_mask"]}
    torch.manual_seed(11)
    ref = engine.model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=6,
                                pad_token_id=engine.tokenizer.pad_token_id, eos_token_id=engine.tokenizer.eos_token_id)
    P = enc["input_ids"].shape[1]
    m = first["completion_mask"].bool()
    assert torch.equal(ref[:, P:][m], first["completion_ids"][m])
    # unseeded calls continue the engine's stream instead of repeating it
    assert not torch.equal(engine.generate(PROMPTS * 2, sampling)["completion_ids"],
                           engine.generate(PROMPTS * 2, sampling)["completion_ids"])
