"""The README's fault table, row by row: each fault injected into a real GRPO smoke run (the HF
engine, the config keys a user sets), and every metric but the timings and the fault count
compared with one uninterrupted run of the same config.

The faults are injected by wrapping the real components (an engine's `generate`, the reward
function, the driver process), never by replacing them. The killed-driver rows run `troupe run`
in a process of its own (with its own local cluster) and SIGKILL it there; the node rows are in
tests/cluster/test_node_loss.py.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import fault_fixtures
import pytest

from troupe import Run
from troupe.platform.errors import RemoteCallError
from troupe.platform.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]
# A call timeout long enough for any legitimate call on a busy 2-core machine, short enough for a test.
CALL_TIMEOUT_S = 20
# Where the hanging reward finds its cue: the reward actor's environment is the session cluster's,
# set before this module runs, so the cue is a file at a fixed place.
REWARD_HANG_FLAG = Path(tempfile.gettempdir()) / f"troupe-fault-table-{os.getuid()}-reward-hang"

# The injections are the fault benchmark's own, so the table's tests and its figures inject alike.
FAULTS = fault_fixtures.faults_benchmark()
comparable_rows, before_step = FAULTS.comparable_rows, FAULTS.before_step


# The session's uninterrupted run's config: each role in a process of its own (a fused role is never
# restarted alone).
SMOKE = [*FAULTS.OVERRIDES, *fault_fixtures.SMOKE]


@pytest.fixture(scope="module")
def uninterrupted(fault_reference) -> list[dict[str, Any]]:
    """The rows of the session's uninterrupted GRPO run: what every faulted run must reproduce."""
    assert fault_reference.overrides == SMOKE
    return fault_reference.rows


# -- a rollout engine killed with its generate call in flight ---------------------------------------
def test_an_injection_into_engines_built_without_its_mixin_is_refused_naming_the_fix():
    from troupe.actors.rollout_hf import HFRolloutEngine

    with pytest.raises(TypeError, match=r"with_engine_mixin\(DyingEngine\)"):
        FAULTS.require_engine_method([HFRolloutEngine], "die_in_next_generate", FAULTS.DyingEngine)
    FAULTS.require_engine_method([FAULTS.engine_with(FAULTS.DyingEngine)], "die_in_next_generate",
                                 FAULTS.DyingEngine)
    # The straggler row checks its mixin the same way.
    with pytest.raises(TypeError, match=r"with_engine_mixin\(StragglingEngine\)"):
        FAULTS.require_engine_method([FAULTS.engine_with(FAULTS.DyingEngine)], "straggle", FAULTS.StragglingEngine)
    FAULTS.require_engine_method([FAULTS.engine_with(FAULTS.StragglingEngine)], "straggle", FAULTS.StragglingEngine)


@pytest.mark.timeout(900)  # the first test of the module also makes the uninterrupted run (and the SFT)
def test_engine_killed_mid_generate_is_restarted_with_metrics_identical_to_an_uninterrupted_run(
        uninterrupted, ray_local, monkeypatch, tmp_path):
    from troupe.algorithms import policy_graph

    engine_cls = FAULTS.engine_with(FAULTS.DyingEngine)
    monkeypatch.setattr(policy_graph, "rollout_class", lambda backend: engine_cls)  # the graph is built with it
    with Run("grpo", preset="smoke", overrides=SMOKE, out=tmp_path / "run") as run:
        FAULTS.kill_engine_in_flight(run, 1)
        summary = run.run()
    assert summary["faults"] == 1
    assert [r.get("faults") for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r] == [
        0.0, 1.0, 0.0, 0.0]
    assert comparable_rows(tmp_path / "run") == uninterrupted


@pytest.mark.timeout(600)
def test_engine_killed_after_its_generate_is_recovered_at_the_weight_sync_with_identical_metrics(
        uninterrupted, ray_local, tmp_path):
    # The engine dies once its batch is in, before the step's weight sync reaches it: the sync
    # waits for Ray's restart, gives it the newest weights and counts the fault, as a re-issued
    # generate does.
    with Run("grpo", preset="smoke", overrides=SMOKE, out=tmp_path / "run") as run:
        FAULTS.kill_engine_before_sync(run, 1)
        summary = run.run()
    assert summary["faults"] == 1
    assert [r.get("faults") for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "reward/mean" in r] == [
        0.0, 1.0, 0.0, 0.0]
    assert comparable_rows(tmp_path / "run") == uninterrupted


# -- a rollout engine that stops answering ------------------------------------------------------------
@pytest.mark.timeout(600)
def test_hanging_engine_is_cut_off_by_run_call_timeout_s_and_restarted_with_identical_metrics(
        uninterrupted, monkeypatch, tmp_path):
    from troupe.algorithms import policy_graph

    engine_cls = FAULTS.engine_with(FAULTS.StragglingEngine)
    monkeypatch.setattr(policy_graph, "rollout_class", lambda backend: engine_cls)  # the graph is built with it
    with Run("grpo", preset="smoke", overrides=[*SMOKE, f"run.call_timeout_s={CALL_TIMEOUT_S}"],
             out=tmp_path / "run") as run:
        engines = run.graph["rollout"]
        before_step(run, 1, lambda: engines.wait([engines[0].straggle.remote(3600)], "straggle"))
        summary = run.run()
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    step_1 = next(r for r in rows if r["step"] == 1 and "reward/mean" in r)
    assert step_1["faults"] == 1.0 and summary["faults"] == 1
    assert CALL_TIMEOUT_S <= step_1["time/step_s"] < 600  # cut off at the timeout, not after the hour's hang
    assert comparable_rows(tmp_path / "run") == uninterrupted


# -- the reward actor hangs: a clear error, then --resume -------------------------------------------
def hanging_exact(**row: Any) -> float:
    """The task's exact-match reward, except that it hangs once while REWARD_HANG_FLAG exists."""
    from troupe.platform.registry import REWARDS

    if REWARD_HANG_FLAG.exists():
        REWARD_HANG_FLAG.unlink(missing_ok=True)
        time.sleep(3600)
    return REWARDS.get("arithmetic_exact")(**row)


@pytest.mark.timeout(600)
def test_hanging_reward_stops_the_run_naming_the_call_and_resume_gives_identical_metrics(uninterrupted, tmp_path):
    REWARD_HANG_FLAG.unlink(missing_ok=True)
    run_dir = tmp_path / "run"
    overrides = [*SMOKE, f"run.call_timeout_s={CALL_TIMEOUT_S}", "reward.fn=test_fault_table:hanging_exact"]
    try:
        with pytest.raises(RemoteCallError, match=rf"reward\.score did not answer within {CALL_TIMEOUT_S}s.*"
                                                  r"run\.call_timeout_s"):
            with Run("grpo", preset="smoke", overrides=overrides, out=run_dir) as run:
                before_step(run, 3, REWARD_HANG_FLAG.touch)  # after the checkpoint of step 2
                run.run()
    finally:
        REWARD_HANG_FLAG.unlink(missing_ok=True)
    with Run("grpo", resume=run_dir, overrides=["run.call_timeout_s=600"]) as run:
        assert run.step_index == 2
        summary = run.run()
    assert summary["faults"] == 0 and summary["resumes"] == 1
    assert comparable_rows(run_dir) == uninterrupted


# -- `troupe run` SIGKILLed inside a step, or while writing a checkpoint --------------------------------
def _driver_env(ray_tmp: Path) -> dict[str, str]:
    # Its own local cluster, in a private temp dir (never found by another ray.init on the machine);
    # TROUPE_CACHE (the session's SFT cache) is inherited.
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp)}
    env.pop("RAY_ADDRESS", None)
    return env


def _sigkill_when_paused(argv: list[str], pause_at: str, env: dict[str, str], tmp_path: Path, name: str) -> None:
    """`troupe <argv>` in a process of its own, SIGKILLed with every process it started once it
    stops dead at ``pause_at``."""
    marker, log_path = tmp_path / f"{name}.paused", tmp_path / f"{name}.log"
    log = open(log_path, "wb")
    proc = subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "faults.py"), "--paused-troupe-run",
                             pause_at, "--marker", str(marker), "--", *argv],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 400
        while not marker.is_file():
            assert proc.poll() is None and time.monotonic() < deadline, (
                f"the run never reached {pause_at}: " + log_path.read_text()[-3000:])
            time.sleep(0.2)
        FAULTS.kill_tree(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            FAULTS.kill_tree(proc.pid, signal.SIGKILL)
        log.close()


@pytest.mark.timeout(600)
def test_driver_sigkilled_inside_a_step_then_while_resuming_gives_metrics_identical_to_an_uninterrupted_run(
        uninterrupted, tmp_path):
    """`troupe run` in a process of its own stops dead inside step 3 (after the learner's update,
    before the engines get the weights) and is SIGKILLed there with every process it started;
    `troupe run --resume` restarts from checkpoint 2 and is SIGKILLed in turn with the files of
    checkpoint 4 written but not moved into place; a second `--resume` finishes the run from
    checkpoint 2 again. A resume that is itself killed loses nothing either."""
    run_dir, ckpts = tmp_path / "run", tmp_path / "run" / "checkpoints"
    ray_tmp = Path(tempfile.mkdtemp(prefix="trp-", dir="/tmp"))  # short: Unix socket paths are limited
    env = _driver_env(ray_tmp)
    try:
        # run.num_cpus: the session cluster's size, so that the graph fits as it does there. What is
        # killed is the driver, so the roles share one process (fused, the default on one node):
        # each of the three runs starts one actor process instead of three, with the same metrics.
        fused = [o for o in SMOKE if o != "run.fuse_roles=false"]
        _sigkill_when_paused(["run", "grpo", "--preset", "smoke", "--out", str(run_dir), *fused, "run.num_cpus=4"],
                             "step:3", env, tmp_path, "killed-in-step")
        before_kill = comparable_rows(run_dir)
        assert (ckpts / "latest").read_text().strip() == "step-00000002"
        assert not list(ckpts.glob(".step-*.tmp")) and len(before_kill) == 5  # steps 0-2, evaluations at 0 and 2
        assert before_kill == uninterrupted[: len(before_kill)]

        _sigkill_when_paused(["run", "grpo", "--resume", str(run_dir)], "checkpoint:4", env, tmp_path,
                             "killed-in-checkpoint")
        before_kill = comparable_rows(run_dir)
        assert (ckpts / "latest").read_text().strip() == "step-00000002"
        partials = sorted(p.name for p in ckpts.glob(".step-*.tmp"))
        assert len(partials) == 1 and partials[0].startswith(".step-00000004.")
        assert len(before_kill) == 7  # steps 0-3 and the evaluations at 0, 2 and 4
        assert before_kill == uninterrupted[: len(before_kill)]

        done = subprocess.run([sys.executable, "-m", "troupe.cli", "run", "grpo", "--resume", str(run_dir)],
                              capture_output=True, text=True, env=env, timeout=400)
    finally:
        import shutil

        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert comparable_rows(run_dir) == uninterrupted
    assert not list(ckpts.glob(".step-*.tmp"))
    assert (ckpts / "latest").read_text().strip() == "step-00000004"
