"""Failure isolation of the rollout → reward → learner graph."""

import os
from pathlib import Path

import pytest

from troupe import Run
from troupe.actors.rollout_hf import HFRolloutEngine


class DiesInGenerate(HFRolloutEngine):
    """The HF engine, whose process exits inside the generate call of rows that name an existing
    marker file (removed first, so the restarted engine serves the re-issued call). A kill from
    the driver races the call: a call of 32 prompts takes about 15 ms and once finished before
    the kill reached the engine."""

    def generate(self, prompts, sampling, rows=None, seed=None, option_letters=None):
        marker = (rows or [{}])[0].get("die_marker")
        if marker and Path(marker).exists():
            Path(marker).unlink()
            os._exit(1)
        return super().generate(prompts, sampling, rows, seed, option_letters)

FAST = ["run.progress=false", "eval.num_prompts=16", "grpo.prompts_per_step=4",
        "grpo.group_size=4", "rollout.sampling.max_new_tokens=24"]


@pytest.mark.timeout(600)
def test_rollout_engine_killed_mid_generate_is_restarted_and_its_work_reissued(ray_local, troupe_cache, tmp_path):
    with Run("grpo", preset="smoke", overrides=[*FAST, "run.fuse_roles=false", "run.steps=3", "run.eval_every=0",
                                                   "run.checkpoint_every=0",
                                                   "rollout.backend=test_policy_graph_faults:DiesInGenerate"],
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
        marker = tmp_path / "die"
        marker.touch()
        dying = [{**r, "die_marker": str(marker)} for r in rows * 8]
        rollout = policy.rollout(prompts, dying, sampling, seed=5)  # the engine dies inside this call
        refs = rollout.batches()
        assert not marker.exists()
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
