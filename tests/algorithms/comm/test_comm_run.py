"""``troupe run comm`` end to end at smoke scale: both agents fitted, episodes logged on engine
actors, the selector fitted and run live, a readable run directory, an exact resume; and the
config's bad input."""

from __future__ import annotations

import json
import shutil

import pytest

from troupe import Run
from troupe.platform.errors import ConfigError

FAST = ["run.progress=false"]


def _logs(run_dir):
    files = sorted((run_dir / "comm" / "logs").glob("step-*.jsonl"))
    assert files, "no logs"
    return [f.read_text() for f in files]


@pytest.mark.timeout(600)
def test_smoke_run_reports_every_policy_and_claim_and_resumes_exactly(ray_local, troupe_cache, tmp_path):
    full = tmp_path / "full"
    with Run("comm", preset="smoke", overrides=[*FAST, "run.steps=2"], out=full) as r:
        summary = r.run()
    for name in ("report.md", "summary.json", "metrics.jsonl", "config.yaml", "comm/results.json",
                 "plots/comm_frontier_weak_local.png", "plots/comm_frontier_strong_local.png",
                 "plots/comm_failure_stages.png"):
        assert (full / name).is_file(), name
    results = json.loads((full / "comm" / "results.json").read_text())
    assert [c["claim"][:2] for c in results["claims"]] == ["1.", "2.", "3.", "4.", "5.", "6."]
    assert all(isinstance(c["holds"], bool) and c["measured"] != "" for c in results["claims"])
    for regime in ("weak_local", "strong_local"):
        r = results["regimes"][regime]
        assert r["test_steps"] == 2 * 8 * 2 and r["train_steps"] == 2 * 12 * 2  # steps × episodes × task steps
        assert set(r["fixed"]) == {"none", "plain", "cryptic", "raw"}
        live = r["live"]
        assert live["steps"] == r["test_steps"] and live["failed_episodes"] == 0
        # greedy agents: the live selector's steps come out as their logged forks did
        assert live["outcome_agrees_with_logged_fork"] >= 0.95
        assert 0.0 <= r["fixed"]["none"]["accuracy"] <= 1.0 and r["fixed"]["none"]["mean_tax"] == 0.0
    report = (full / "report.md").read_text()
    assert "## Communication result" in report and "### Claims of §D.5 on the LM task" in report
    assert "live in the graph" in report and "![comm_failure_stages](plots/comm_failure_stages.png)" in report
    assert summary["claims"] == 6 and "weak_local/plain/accuracy" in summary

    # Interrupted after its first step's checkpoint, then resumed: the same logs.
    part = tmp_path / "part"
    shutil.copytree(full, part)
    shutil.rmtree(part / "checkpoints" / "step-00000002")
    (part / "checkpoints" / "latest").write_text("step-00000001\n")
    with Run("comm", resume=part) as r:
        assert r.step_index == 1
        r.run()
    assert _logs(part) == _logs(full)
    assert json.loads((part / "comm" / "results.json").read_text())["claims"] == results["claims"]


def test_bad_config_is_refused_by_key(troupe_cache, tmp_path):
    cases = [
        (["task.regimes={weak_local: {q_L: 0.6, q_m: 0.9}}"], "task.regimes.weak_local"),
        (["task.regimes={weak_local: {q_L: 1.5, q_M: 0.9}}"], "task.regimes.weak_local.q_L"),
        (["task.step_types=[copy, jump]"], "task.step_types"),
        (["task.budget=0"], "task.budget"),
        (["executor.sft_kinds={none: 1, gist: 1}"], "executor.sft_kinds"),
        (["main.sft_kinds={raw: 1}"], "main.sft_kinds"),
        (["main.rollout.backend=vllm"], "main.rollout.num_gpus"),
        (["task.main_view=summary"], "task.main_view"),
    ]
    for overrides, key in cases:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            Run("comm", preset="smoke", overrides=[*FAST, *overrides], out=tmp_path / "bad")


@pytest.mark.timeout(600)
def test_the_gpu_preset_runs_with_tiny_stand_ins_for_its_hub_models(ray_local, troupe_cache, tmp_path):
    """The GPU preset's graph with local stand-ins for its hub ids: models by path (no SFT,
    loaded as a user's own), M reading its whole document, the hf backend on CPU."""
    from troupe.algorithms.comm.algorithm import Comm
    from troupe.platform.config import resolve

    gpu = resolve(Comm.Config, Comm.presets_dir(), "gpu")
    assert gpu.main.rollout.backend == gpu.executor.rollout.backend == "vllm"
    assert gpu.main.rollout.num_gpus == 1 and gpu.main.model.path.startswith("Qwen/")
    assert gpu.task.main_view == "document"
    # stand-ins: the smoke preset's agents, fitted here (and cached), then given by path
    with Run("comm", preset="smoke", overrides=[*FAST, "run.steps=0", "task.main_view=document"],
             out=tmp_path / "fit") as r:
        paths = {role: r.algo.paths[role] for role in ("main", "executor")}
    over = [*FAST, "run.steps=1"]
    for role in ("main", "executor"):
        over += [f"{role}.model.path={paths[role]}", f"{role}.model.dtype=float32", f"{role}.model.device=cpu",
                 f"{role}.model.sft.enabled=false", f"{role}.rollout.backend=hf", f"{role}.rollout.num_gpus=0",
                 f"{role}.rollout.num_cpus=0.5"]
    over += ["comm.train_episodes=8", "comm.test_episodes=6", "comm.upstream_episodes=2", "task.steps=2"]
    out = tmp_path / "gpu"
    with Run("comm", preset="gpu", overrides=over, out=out) as r:
        r.run()
    prepared = json.loads((out / "prepare.json").read_text())
    assert {prepared[role]["sft"] for role in ("main", "executor")} == {"none"}
    results = json.loads((out / "comm" / "results.json").read_text())
    assert len(results["claims"]) == 6 and results["regimes"]["weak_local"]["test_steps"] == 6 * 2
