"""GRPO end to end at smoke scale, and exact resume."""

import json

import pytest

from troupe import Run
from troupe.platform.metrics import read_metrics

FAST = ["run.progress=false", "eval.num_prompts=16", "grpo.prompts_per_step=4",
        "grpo.group_size=4", "learner.kl_coef=0.05"]


def _train_rows(run_dir):
    # Timings differ between runs; everything else must not.
    return [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_metrics(run_dir / "metrics.jsonl")]


@pytest.mark.timeout(600)
def test_smoke_run_writes_a_complete_run_directory_and_resumes_exactly(ray_local, troupe_cache, tmp_path):
    full = tmp_path / "full"
    with Run("grpo", preset="smoke", overrides=[*FAST, "run.steps=4", "run.eval_every=2", "run.checkpoint_every=2"], out=full) as r:
        summary = r.run()
    for name in ("report.md", "summary.json", "metrics.jsonl", "config.yaml", "plots/reward.png", "plots/eval.png"):
        assert (full / name).is_file(), name
    assert list((full / "tensorboard").glob("events.out.tfevents.*"))
    assert (full / "checkpoints" / "latest").read_text().strip() == "step-00000004"
    assert json.loads((full / "summary.json").read_text())["steps"] == 4
    assert summary["eval_accuracy_start"] is not None
    report = (full / "report.md").read_text()
    assert "held-out accuracy" in report and "![reward](plots/reward.png)" in report
    assert any("kl/ref" in row for row in read_metrics(full / "metrics.jsonl"))

    # Interrupted after 2 steps (its checkpoint at 2), then resumed to 4.
    part = tmp_path / "part"
    with Run("grpo", preset="smoke", overrides=[*FAST, "run.steps=2", "run.eval_every=2", "run.checkpoint_every=2"], out=part) as r:
        r.run()
    with Run("grpo", resume=part, overrides=["run.steps=4"]) as r:
        assert r.step_index == 2
        r.run()
    assert _train_rows(part) == _train_rows(full)
