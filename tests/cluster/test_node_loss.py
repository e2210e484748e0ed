"""Node loss on a multi-node cluster on one machine (`ray.cluster_utils.Cluster`), compared
metric by metric with an uninterrupted run of the same config.

- The worker node that hosts the rollout engine is removed mid-run, a spare node left: the
  engine restarts on the node that is left, its work is re-issued, and the run completes.
- The only node that can host the engine is removed: the run stops with an error naming the
  engine, a node is added back, and ``--resume`` finishes it. The "GPU" here is simulated: the
  worker nodes advertise one GPU each that this machine does not have (the engine asks for it
  with ``rollout.num_gpus=1`` and runs on the CPU), so what is shown is the loss of the only
  node with the resource the engine needs, not of a real GPU.

The scenarios are `benchmarks/faults.py node_lost` and `node_lost_no_spare` (the fault table
runs them too), each in a process of its own: a `Cluster` needs the driver connection that this
session's private cluster holds, and that process stops only the nodes it started.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from fault_fixtures import SMOKE

FAULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "faults.py"
CALL_TIMEOUT_S = 20


def run_scenario(name: str, work: Path, reference, *args: str) -> dict:
    """The scenario in a process of its own at the reference run's smoke size, compared with it."""
    out = work / f"{name}.json"
    done = subprocess.run([sys.executable, str(FAULTS), "--scenario", name, "--json", str(out), "--work", str(work),
                           "--timeout-s", "500", "--reference", str(reference.path), *args, *SMOKE, "run.num_cpus=2"],
                          capture_output=True, text=True, timeout=560)
    assert done.returncode == 0 and out.is_file(), done.stdout[-3000:] + done.stderr[-5000:]
    return json.loads(out.read_text())


@pytest.mark.cluster
@pytest.mark.timeout(1200)  # with the session's uninterrupted run (and the SFT) first, if no test made it yet
def test_run_continues_on_the_node_left_with_identical_metrics_when_the_rollout_engines_node_is_removed(
        tmp_path: Path, fault_reference):
    row = run_scenario("node_lost", tmp_path, fault_reference)
    assert row["survived"] == "continued" and row["steps"] == 4 and row["error"] is None
    assert row["faults_counted"] == 1  # the re-issued rollout, in summary.json and report.md
    assert row["matches_uninterrupted_run"], row.get("first_difference")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["faults"] == 1 and summary["steps"] == 4


@pytest.mark.cluster
@pytest.mark.timeout(900)
def test_losing_the_only_gpu_node_stops_the_run_naming_the_engine_and_resume_gives_identical_metrics(
        tmp_path: Path, fault_reference):
    # The engine's restart waits placement + call timeout for a node: 25 s, not the benchmark's 120.
    row = run_scenario("node_lost_no_spare", tmp_path, fault_reference, "--call-timeout-s", str(CALL_TIMEOUT_S),
                       "--placement-timeout-s", "5")
    assert row["error"].startswith("RemoteCallError: rollout engine 0 did not come back within"), row["error"]
    assert row["resumed_from_step"] == 2 and row["survived"] == "resumed" and row["steps"] == 4
    assert row["matches_uninterrupted_run"], row.get("first_difference")
