"""Node loss on a multi-node cluster on one machine (`ray.cluster_utils.Cluster`): the worker
node that hosts the rollout engine is removed mid-run; the engine restarts on the node that
is left, its work is re-issued, and the run completes with the fault counted.

The scenario is `benchmarks/faults.py node_lost` (the fault table runs it too). It runs in a
process of its own: a `Cluster` needs the driver connection that this session's private
cluster holds, and that process stops only the nodes it started.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

FAULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "faults.py"


@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_run_continues_on_the_node_left_when_the_rollout_engines_node_is_removed(tmp_path: Path, troupe_cache: Path):
    out = tmp_path / "row.json"
    done = subprocess.run([sys.executable, str(FAULTS), "--scenario", "node_lost", "--json", str(out),
                           "--work", str(tmp_path), "--timeout-s", "500"],
                          capture_output=True, text=True, timeout=560)
    assert done.returncode == 0 and out.is_file(), done.stdout[-3000:] + done.stderr[-5000:]
    row = json.loads(out.read_text())
    assert row["survived"] == "continued" and row["steps"] == 4 and row["error"] is None
    assert row["faults_counted"] == 1  # the re-issued rollout, in summary.json and report.md
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["faults"] == 1 and summary["steps"] == 4
