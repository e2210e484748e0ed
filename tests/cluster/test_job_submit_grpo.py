"""`ray job submit --working-dir . -- troupe run grpo --preset smoke` against a `ray start`
cluster with token authentication on: the path the README documents."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from troupe.cluster.local import LocalCluster, ray_executable

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.cluster
@pytest.mark.timeout(480)
def test_grpo_smoke_runs_as_a_ray_job_with_authentication(local_cluster: LocalCluster, tmp_path: Path):
    run_dir = tmp_path / "run"
    runtime_env = {"env_vars": {"TROUPE_CACHE": str(tmp_path / "cache")}}
    cmd = [ray_executable(), "job", "submit", "--address", local_cluster.address, "--working-dir", ".",
           "--runtime-env-json", json.dumps(runtime_env), "--",
           "troupe", "run", "grpo", "--preset", "smoke", "--out", str(run_dir), "run.progress=false"]
    done = subprocess.run(cmd, cwd=REPO, env=local_cluster.subprocess_env(), capture_output=True, text=True,
                          timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and (run_dir / "report.md").is_file()
