"""Rollout engine, learner, scorer and reward actors on a local Ray cluster with the tiny model."""

import pytest
import torch

from troupe.actors.learner import Learner
from troupe.actors.models import load_tokenizer
from troupe.actors.reward import RuleReward
from troupe.actors.rollout_hf import HFRolloutEngine, completion_mask
from troupe.actors.sampling import SamplingConfig, chat_format
from troupe.actors.scorer import Scorer
from troupe.platform.batch import Batch
from troupe.platform.errors import RemoteCallError
from troupe.platform.placement import ActorGraph, Role

PROMPTS = ["12+34=", "5+7=", "99+1=", "40+2="]
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=6)


def test_completion_mask_stops_after_eos_and_drops_trailing_pad():
    eos, pad = 2, 0
    c = torch.tensor([[5, 6, 2, 7], [5, 0, 0, 0], [5, 0, 6, 0], [5, 6, 7, 8]])
    assert completion_mask(c, eos, pad).tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 0], [1, 1, 1, 1]]


def test_repeated_prompts_encode_as_if_each_were_tokenized(tiny_model_dir):
    engine = HFRolloutEngine(tiny_model_dir)
    prompts = [p for p in PROMPTS for _ in range(3)] + ["7+8="]  # groups of 3, then a single
    enc = engine._encode(prompts)
    want = engine.tokenizer(engine.format_prompts(prompts), return_tensors="pt", padding=True,
                            add_special_tokens=False)
    assert torch.equal(enc["input_ids"], want["input_ids"])
    assert torch.equal(enc["attention_mask"], want["attention_mask"])


def graph(roles, ray_local, timeout=120):
    return ActorGraph(roles, timeout_s=timeout, call_timeout_s=120).start()


def learner_role(path, count=1, **cfg):
    return Role("learner", Learner, count=count, num_cpus=1,
                kwargs={"model_path": path, "config": {"lr": 1e-2, **cfg}, "world_size": count, "max_len": 6},
                rank_kwargs=[{"rank": r} for r in range(count)])


@pytest.mark.timeout(240)
def test_sampled_logprobs_equal_learner_and_scorer_recompute(ray_local, tiny_model_dir):
    g = graph([Role("rollout", HFRolloutEngine, num_cpus=0.5, kwargs={"model_path": tiny_model_dir}),
               learner_role(tiny_model_dir),
               Role("ref", Scorer, num_cpus=0.5, kwargs={"model_path": tiny_model_dir})], ray_local)
    try:
        batch = g["rollout"].call("generate", PROMPTS * 2, SAMPLING, None, seed=7)[0]
        assert isinstance(batch, Batch) and len(batch) == 8
        assert batch["completion_ids"].shape == batch["logprobs"].shape
        assert batch["completion_mask"][:, 0].all()
        again = g["rollout"].call("generate", PROMPTS * 2, SAMPLING, None, seed=7)[0]
        assert torch.equal(batch["completion_ids"], again["completion_ids"])  # seeded sampling
        m = batch["completion_mask"].bool()
        learner_lp = g["learner"].call("logprobs", batch)[0]
        ref_lp = g["ref"].call("logprobs", batch)[0]["logprobs"]
        assert torch.allclose(learner_lp[m], batch["logprobs"][m], atol=1e-4)
        assert torch.allclose(ref_lp[m], batch["logprobs"][m], atol=1e-4)
        # Chat rows: the engine renders each row's turns; the learner and scorer score those ids.
        chat = [r for p in PROMPTS for r in 2 * [{"messages": chat_turns(p), "answer": "0"}]]
        batch = g["rollout"].call("generate", [r["messages"][-1]["content"] for r in chat], SAMPLING, chat,
                                  seed=7)[0]
        tok = load_tokenizer(tiny_model_dir)
        shown = tok.decode(batch["prompt_ids"][0][batch["prompt_mask"][0].bool()])
        assert shown == chat_format(tok, [PROMPTS[0]], rows=chat[:1])[0] and shown.startswith("<|im_start|>system")
        m = batch["completion_mask"].bool()
        assert torch.allclose(g["learner"].call("logprobs", batch)[0][m], batch["logprobs"][m], atol=1e-4)
        assert torch.allclose(g["ref"].call("logprobs", batch)[0]["logprobs"][m], batch["logprobs"][m], atol=1e-4)
    finally:
        g.shutdown()


def chat_turns(prompt: str) -> list[dict]:
    return [{"role": "system", "content": "Add the numbers."}, {"role": "user", "content": prompt}]


@pytest.mark.timeout(240)
def test_weight_sync_makes_rollout_match_updated_learner(ray_local, tiny_model_dir):
    g = graph([Role("rollout", HFRolloutEngine, num_cpus=0.5, kwargs={"model_path": tiny_model_dir}),
               learner_role(tiny_model_dir)], ray_local)
    try:
        batch = g["rollout"].call("generate", PROMPTS, SAMPLING, None, seed=1)[0]
        before = g["learner"].call("logprobs", batch)[0]
        metrics = g["learner"].call("update", batch, {"advantages": torch.tensor([1.0, -1.0, 1.0, -1.0])})[0]
        assert metrics["grad_norm"] > 0
        after = g["learner"].call("logprobs", batch)[0]
        assert not torch.allclose(before, after)
        update = g["learner"][0].publish_weights.remote()
        assert g["rollout"].wait([g["rollout"][0].load_weights.remote(update)], "load_weights")[0] == 1
        # the engine now samples from the updated policy: its log-probs equal the learner's
        fresh = g["rollout"].call("generate", PROMPTS, SAMPLING, None, seed=2)[0]
        assert fresh.meta["version"] == 1
        m = fresh["completion_mask"].bool()
        assert torch.allclose(g["learner"].call("logprobs", fresh)[0][m], fresh["logprobs"][m], atol=1e-4)
    finally:
        g.shutdown()


@pytest.mark.timeout(120)
def test_shared_weight_install_points_at_the_update_and_keeps_ties(ray_local, tiny_model_dir):
    from troupe.actors.models import load_causal_lm
    from troupe.actors.transport import object_store

    source, _ = load_causal_lm(tiny_model_dir)
    engine, _ = load_causal_lm(tiny_model_dir)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.5)
    for version in (1, 2):  # a second update replaces the buffers the first one installed
        update = object_store.publish(source.state_dict(), version)
        shared = object_store.receive(engine, update, share=True)
        packed = ray_local.get(update.ref)
        assert shared == len(packed)
        embed = engine.get_input_embeddings().weight
        assert engine.get_output_embeddings().weight is embed  # still tied
        for name, p in engine.named_parameters():
            assert torch.equal(p, source.state_dict()[name])
            assert p.data_ptr() == packed[name][0].ctypes.data  # the update's buffer, not a copy
        with torch.no_grad():
            for p in source.parameters():
                p.mul_(-1.0)  # the published snapshot must not follow the learner's later steps
        assert not torch.equal(embed, source.get_input_embeddings().weight)
    # A parameter whose dtype differs from the update's is copied, never shared.
    half, _ = load_causal_lm(tiny_model_dir, dtype="bfloat16")
    assert object_store.receive(half, object_store.publish(source.state_dict(), 3), share=True) == 0
    assert torch.allclose(half.get_input_embeddings().weight.float(), source.get_input_embeddings().weight,
                          atol=0.05, rtol=0.01)


@pytest.mark.timeout(300)
def test_two_ddp_ranks_take_the_same_step_as_one(ray_local, tiny_model_dir):
    one = graph([Role("rollout", HFRolloutEngine, num_cpus=0.5, kwargs={"model_path": tiny_model_dir}),
                 learner_role(tiny_model_dir, aggregation="grpo")], ray_local)
    try:
        batch = one["rollout"].call("generate", PROMPTS * 2, SAMPLING, None, seed=3)[0]
        adv = torch.linspace(-1, 1, 8)
        one["learner"].call("update", batch, {"advantages": adv})
        w1 = one["learner"][0].get_state.remote()
        w1 = one["learner"].wait([w1], "get_state")[0][0]
    finally:
        one.shutdown()
    two = graph([learner_role(tiny_model_dir, count=2, aggregation="grpo")], ray_local)
    try:
        learners = two["learner"]
        addr, port = learners.wait([learners[0].master_address.remote()], "master_address")[0]
        learners.call("init_distributed", addr, port)
        learners.call("update", batch, {"advantages": adv})
        states = learners.call("get_state")
        # Adam divides by sqrt(v) + eps: float32 roundoff in a gradient near eps moves a weight by up
        # to about 2e-5 here (2 of 16,576 embedding entries on this CPU), against a step of lr = 1e-2.
        for k, (a, _) in w1.items():
            if k.startswith("model/"):
                assert torch.allclose(torch.from_numpy(a.copy()), torch.from_numpy(states[0][0][k][0].copy()), atol=5e-5), k
                assert torch.equal(torch.from_numpy(states[0][0][k][0].copy()), torch.from_numpy(states[1][0][k][0].copy()))
    finally:
        two.shutdown()


@pytest.mark.timeout(240)
def test_lora_learner_publishes_only_the_adapter(ray_local, tiny_model_dir):
    lora = {"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}
    g = graph([Role("rollout", HFRolloutEngine, num_cpus=0.5, kwargs={"model_path": tiny_model_dir}),
               learner_role(tiny_model_dir, lora=lora)], ray_local)
    try:
        batch = g["rollout"].call("generate", PROMPTS, SAMPLING, None, seed=4)[0]
        g["learner"].call("update", batch, {"advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])})
        update = g["learner"].wait([g["learner"][0].publish_weights.remote()], "publish")[0]
        assert update.kind == "lora"
        from troupe.actors.models import load_causal_lm

        full = sum(t.numel() * t.element_size() for t in load_causal_lm(tiny_model_dir)[0].state_dict().values())
        assert update.nbytes < full / 5
        g["rollout"].call("load_weights", update)
        fresh = g["rollout"].call("generate", PROMPTS, SAMPLING, None, seed=5)[0]
        m = fresh["completion_mask"].bool()
        assert torch.allclose(g["learner"].call("logprobs", fresh)[0][m], fresh["logprobs"][m], atol=1e-4)
    finally:
        g.shutdown()


def _fails_on_five(completion, prompt, **_):
    if prompt.startswith("5"):
        raise ValueError("cannot score")
    return 1.0


@pytest.mark.timeout(120)
def test_reward_failure_names_the_row_or_is_counted(ray_local):
    batch = Batch(objects={"prompt": ["1+1=", "5+5="], "completion": ["2", "10"], "row": [{}, {}]})
    g = graph([Role("reward", RuleReward, num_cpus=0.1, kwargs={"fn": f"{__name__}:_fails_on_five"}),
               Role("lenient", RuleReward, num_cpus=0.1,
                    kwargs={"fn": f"{__name__}:_fails_on_five", "on_error": -1.0})], ray_local)
    try:
        with pytest.raises(RemoteCallError, match=r"row 1 \(prompt '5\+5='.*cannot score"):
            g["reward"].call("score", batch)
        out = g["lenient"].call("score", batch)[0]
        assert out["rewards"].tolist() == [1.0, -1.0] and out["errors"][0]["row"] == 1
    finally:
        g.shutdown()


@pytest.mark.timeout(120)
def test_reward_import_path_that_does_not_import_fails_at_creation(ray_local):
    with pytest.raises(RemoteCallError, match="no_such_module"):
        graph([Role("reward", RuleReward, num_cpus=0.1, kwargs={"fn": "no_such_module:fn"})], ray_local)
