"""GRPO with bounded staleness (run.staleness): the math and bookkeeping as pure functions, then
smoke runs on a local Ray cluster: staleness recorded, exact resume, an engine lost while
generating ahead."""

import json
import math

import pytest
import torch

from troupe import Run
from troupe.actors.losses import policy_objective, truncated_is_weights
from troupe.algorithms.lookahead import (
    Lookahead,
    RolloutRequest,
    check_sync_checkpoint,
    staleness_of,
    steps_ahead,
)
from troupe.platform.driver import resolve_config
from troupe.platform.errors import ConfigError
from troupe.platform.metrics import read_metrics

# -- truncated importance weights ------------------------------------------------------------


def test_truncated_is_weights_are_the_proximal_to_behaviour_ratio_capped_and_masked():
    proximal = torch.log(torch.tensor([[0.5, 0.2, 0.9]]))
    behaviour = torch.log(torch.tensor([[0.25, 0.4, 0.1]]))
    w = truncated_is_weights(proximal, behaviour, cap=2.0, mask=torch.tensor([[1, 1, 0]]))
    # ratios 2.0, 0.5, 9.0 → capped at 2, the padded token 0
    assert torch.allclose(w, torch.tensor([[2.0, 0.5, 0.0]]))


def test_truncated_is_weights_carry_no_gradient():
    proximal = torch.zeros(1, 2, requires_grad=True)
    w = truncated_is_weights(proximal, torch.zeros(1, 2), cap=2.0)
    assert not w.requires_grad and torch.equal(w, torch.ones(1, 2))


def test_is_weights_scale_each_tokens_policy_loss():
    logprobs = torch.zeros(1, 2, requires_grad=True)
    old = torch.zeros(1, 2)
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    plain, _ = policy_objective("reinforce", logprobs, old, adv, mask)
    weighted, m = policy_objective("reinforce", logprobs, old, adv, mask, is_weights=torch.tensor([[3.0, 0.0]]))
    # reinforce at ratio 1: per-token loss -1; grpo aggregation 1/(|o|·N) = 1/2 per token
    assert plain.item() == -1.0 and weighted.item() == -1.5  # (-1·3 + -1·0) / 2
    assert m["is/weight_mean"] == 1.5 and m["loss/policy"] == -1.5


@pytest.mark.timeout(120)
def test_learner_weights_a_stale_batch_by_its_capped_ratio_to_the_learners_own_policy(tiny_model_dir):
    from troupe.actors.learner import Learner, LearnerConfig
    from troupe.actors.rollout_hf import HFRolloutEngine
    from troupe.actors.sampling import SamplingConfig

    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6)
    batch = HFRolloutEngine(tiny_model_dir).generate(["12+34=", "5+7="] * 2, sampling, seed=3)
    adv = {"advantages": torch.tensor([1.0, -1.0, 0.5, -0.5])}

    def update(logprobs):
        learner = Learner(tiny_model_dir, LearnerConfig(tis_cap=2.0), sampling=sampling, max_len=6)
        return learner.update(batch.with_fields(logprobs=logprobs), adv)

    # Sampled by these very weights: every weight is 1 (up to the engine's float error).
    assert update(batch["logprobs"])["is/weight_mean"] == pytest.approx(1.0, abs=1e-3)
    # Sampled by a policy that gave each token a quarter of the learner's probability: 4, capped at 2.
    stale = (batch["logprobs"] - math.log(4)) * batch["completion_mask"]
    assert update(stale)["is/weight_mean"] == pytest.approx(2.0, abs=1e-6)


def test_tis_cap_must_be_positive():
    with pytest.raises(ConfigError, match="learner.tis_cap"):
        resolve_config("grpo", overrides=["learner.tis_cap=0"])
    assert resolve_config("grpo", overrides=["learner.tis_cap=2"]).learner.tis_cap == 2.0


# -- staleness bookkeeping --------------------------------------------------------------------


def test_steps_ahead_reach_staleness_steps_and_stop_at_the_run_end():
    assert list(steps_ahead(0, 1, 10)) == [1]
    assert list(steps_ahead(3, 2, 10)) == [4, 5]
    assert list(steps_ahead(8, 2, 10)) == [9]
    assert list(steps_ahead(9, 2, 10)) == []
    assert staleness_of(5, 4) == 1


class FakeRollout:
    def __init__(self, request):
        self.request, self.waited = request, False

    def batches(self):
        self.waited = True
        return []


def run_schedule(staleness, num_steps):
    """Drive a `Lookahead` as `PolicyGraph` does, with rollouts that only record their request."""
    started = []

    def start(request):
        started.append(request.seed)
        return FakeRollout(request)

    ahead = Lookahead(staleness, num_steps, start)
    sampled, logged = [], []
    for step in range(num_steps):
        rollout = ahead.take(step, lambda s: RolloutRequest([], [], None, seed=s))
        assert rollout.request.seed == step
        sampled.append(ahead.taken.version)
        ahead.fill()
        logged.append(ahead.confirm()["staleness"])
        assert all(a.rollout.waited for a in ahead.queue.values())  # the sync waits for what runs ahead
    return started, sampled, logged


def test_one_step_off_samples_step_s_with_the_weights_of_update_s_minus_1():
    started, sampled, logged = run_schedule(staleness=1, num_steps=5)
    assert started == [0, 1, 2, 3, 4]  # each step once, none past the run's end
    assert sampled == [0, 0, 1, 2, 3]
    assert logged == [0.0, 1.0, 1.0, 1.0, 1.0]


def test_staleness_k_is_a_bounded_queue_of_k_rollouts_ahead():
    started, sampled, logged = run_schedule(staleness=2, num_steps=6)
    assert started == [0, 1, 2, 3, 4, 5]
    assert sampled == [0, 0, 0, 1, 2, 3]
    assert logged == [0.0, 1.0, 2.0, 2.0, 2.0, 2.0]


def test_update_without_a_step_rollout_is_refused_in_async_mode():
    ahead = Lookahead(1, 4, FakeRollout)
    with pytest.raises(ConfigError, match="run.staleness"):
        ahead.fill()


# -- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "1.5", "one", "true"])
def test_staleness_must_be_a_non_negative_integer(value):
    with pytest.raises(ConfigError, match="run.staleness") as e:
        resolve_config("grpo", overrides=[f"run.staleness={value}"])
    assert "integer" in str(e.value)


@pytest.mark.parametrize("value", ["-1", "20", "2.5"])
def test_engine_niceness_must_be_an_os_priority(value):
    with pytest.raises(ConfigError, match="rollout.niceness") as e:
        resolve_config("grpo", overrides=[f"rollout.niceness={value}"])
    assert "integer" in str(e.value)


@pytest.mark.parametrize("algorithm", ["bandit", "ivdesign", "icrm"])
def test_an_algorithm_that_does_not_generate_ahead_refuses_staleness_before_it_starts(algorithm, tmp_path):
    from troupe import Run

    with pytest.raises(ConfigError, match=f"run.staleness=1: {algorithm}'s step") as e:
        Run(algorithm, overrides=["run.staleness=1"], out=tmp_path / "run")
    assert "bpo, grpo, opd" in str(e.value) and "set run.staleness=0" in str(e.value)
    assert not (tmp_path / "run").exists()


def test_async_mode_refuses_the_nccl_transport_naming_the_fix():
    gpu = ["rollout.backend=vllm", "rollout.num_gpus=1", "learner.num_gpus=1", "learner.recompute_old_logprobs=true"]
    with pytest.raises(ConfigError, match="rollout.weight_transport=object_store"):
        resolve_config("grpo", overrides=[*gpu, "run.staleness=1", "rollout.weight_transport=nccl"])
    assert resolve_config("grpo", overrides=[*gpu, "rollout.weight_transport=nccl"]).run.staleness == 0


def test_a_sync_checkpoint_is_refused_in_async_mode_and_the_reverse(tmp_path):
    with pytest.raises(ConfigError, match="resume with run.staleness=0"):
        Lookahead(1, 4, FakeRollout).load(tmp_path)
    (tmp_path / "lookahead.json").write_text(json.dumps({"staleness": 1, "version": 2, "ahead": []}))
    with pytest.raises(ConfigError, match="resume with run.staleness=1"):
        check_sync_checkpoint(tmp_path)
    with pytest.raises(ConfigError, match="resume with run.staleness=1"):
        Lookahead(2, 4, FakeRollout).load(tmp_path)


# -- smoke runs on a local Ray cluster ------------------------------------------------------------

ASYNC = ["run.progress=false", "eval.num_prompts=8", "grpo.prompts_per_step=4", "grpo.group_size=4",
         "rollout.sampling.max_new_tokens=24", "run.staleness=1", "learner.tis_cap=2",
         "run.steps=4", "run.eval_every=2", "run.checkpoint_every=2"]


def _rows(run_dir, drop=("time/",)):
    # Timings differ between runs; everything else must not.
    return [{k: v for k, v in r.items() if not k.startswith(drop)} for r in read_metrics(run_dir / "metrics.jsonl")]


@pytest.fixture(scope="module")
def uninterrupted(ray_local, troupe_cache, tmp_path_factory):
    """An async run of 4 steps, start to end: what the interrupted runs must reproduce."""
    out = tmp_path_factory.mktemp("async") / "full"
    with Run("grpo", preset="smoke", overrides=ASYNC, out=out) as r:
        summary = r.run()
    return out, summary


@pytest.mark.timeout(600)
def test_one_step_off_run_records_staleness_one_after_the_first_step(uninterrupted):
    out, summary = uninterrupted
    train = [r for r in read_metrics(out / "metrics.jsonl") if "reward/mean" in r]
    assert [r["staleness"] for r in train] == [0.0, 1.0, 1.0, 1.0]
    assert all(math.isfinite(r["reward/mean"]) and math.isfinite(r["loss/policy"]) for r in train)
    assert all(0 < r["is/weight_mean"] <= 2 for r in train)
    assert summary["staleness_max"] == 1 and summary["faults"] == 0
    assert "staleness" in (out / "report.md").read_text()


@pytest.mark.timeout(600)
def test_async_run_killed_after_a_checkpoint_resumes_to_the_same_metrics(uninterrupted, tmp_path):
    part = tmp_path / "part"
    # Engines at a lower OS priority (rollout.niceness) change when they run, never what they draw.
    with Run("grpo", preset="smoke", overrides=[*ASYNC, "rollout.niceness=5"], out=part) as r:
        assert [i["niceness"] for i in r.graph["rollout"].call("info")] == [5]
        r.evaluate()  # as `run` does first
        for _ in range(3):  # the checkpoint at 2 holds step 2's rollout, generated during step 1
            r.step()
    assert json.loads((part / "checkpoints" / "step-00000002" / "lookahead.json").read_text())["ahead"] == [
        {"step": 2, "version": 1}]
    with Run("grpo", resume=part) as r:
        assert r.step_index == 2
        r.run()
    assert _rows(part) == _rows(uninterrupted[0])


@pytest.mark.timeout(600)
def test_engine_lost_while_generating_ahead_is_restarted_and_its_batch_reissued(uninterrupted, tmp_path):
    import ray

    with Run("grpo", preset="smoke", overrides=ASYNC, out=tmp_path / "run") as r:
        policy = r.algo.policy
        update_and_sync = policy.update_and_sync

        def update_then_kill_engine(*args, **kwargs):
            engine = r.graph["rollout"][0]
            if policy.lookahead.taken.step == 1:
                # A long call first, so that step 2's rollout is still queued behind it when the engine dies.
                engine.generate.remote(["1+1="] * 512, r.config.rollout.sampling, seed=0)
            pending = update_and_sync(*args, **kwargs)  # step 2's rollout is now on the engine
            if policy.lookahead.taken.step == 1:
                ray.kill(engine, no_restart=False)
            return pending

        policy.update_and_sync = update_then_kill_engine
        summary = r.run()
    assert summary["faults"] == 1
    faulted = _rows(tmp_path / "run", drop=("time/", "faults"))
    assert faulted == _rows(uninterrupted[0], drop=("time/", "faults"))
    assert [r.get("faults") for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r] == [
        0.0, 1.0, 0.0, 0.0]
