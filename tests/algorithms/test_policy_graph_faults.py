"""Failure isolation of the rollout → reward → learner graph."""

import pytest

from troupe import Run

FAST = ["run.progress=false", "eval.num_prompts=16", "grpo.prompts_per_step=4",
        "grpo.group_size=4", "rollout.sampling.max_new_tokens=24"]


@pytest.mark.timeout(600)
def test_rollout_engine_killed_mid_generate_is_restarted_and_its_work_reissued(ray_local, troupe_cache, tmp_path):
    with Run("grpo", preset="smoke", overrides=[*FAST, "run.fuse_roles=false", "run.steps=3", "run.eval_every=0",
                                                   "run.checkpoint_every=0"],
             out=tmp_path / "run") as run:
        run.step()  # the engines now hold weights version 1
        policy = run.algo.policy
        rows = run.algo.sample_prompts(99)
        prompts, sampling = [r["prompt"] for r in rows] * 8, run.config.rollout.sampling
        # Without a fault, the reward call started with the rollout scores the batches it returns.
        rollout = policy.rollout(prompts, rows * 8, sampling, seed=4)
        out = rollout.result()
        assert rollout.early_batches == out.batches
        assert len(out.rewards) == 32
        rollout = policy.rollout(prompts, rows * 8, sampling, seed=5)
        ray_local.kill(run.graph["rollout"][0], no_restart=False)  # dies with the call in flight
        refs = rollout.batches()
        batch = ray_local.get(refs[0])
        assert len(batch) == 32
        assert batch.meta["version"] == 1  # the restarted engine was given the current weights first
        assert policy.faults == 1
        # The early reward call failed with the lost batch; the re-issued one is scored anew.
        assert rollout.early_batches != refs
        out = rollout.result()
        assert len(out.rewards) == 32 and not out.errors
        assert out.faults == 1
        m = run.step()
        assert m["faults"] == 1.0  # counted in the step that follows, and in the report
        summary = run.finish()
    assert summary["faults"] == 1
