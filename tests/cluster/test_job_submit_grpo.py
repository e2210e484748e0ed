"""`ray job submit --working-dir . -- troupe run grpo --preset smoke` and `troupe submit
--follow` against a `ray start` cluster with token authentication on: the paths the README
documents, with the run kept at a storage URI (``file://`` standing for shared storage) rather
than in the job's temporary working directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from troupe.cluster.local import LocalCluster, ray_executable

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.cluster
@pytest.mark.timeout(480)
def test_grpo_smoke_runs_as_a_ray_job_with_authentication(local_cluster: LocalCluster, tmp_path: Path, troupe_cache):
    run_dir = tmp_path / "shared" / "run"
    # The session's SFT cache: the job's SFT checkpoint is the GRPO smoke tests' (fitted here if it is not there).
    runtime_env = {"env_vars": {"TROUPE_CACHE": str(troupe_cache)}}
    cmd = [ray_executable(), "job", "submit", "--address", local_cluster.address, "--working-dir", ".",
           "--runtime-env-json", json.dumps(runtime_env), "--",
           "troupe", "run", "grpo", "--preset", "smoke", "--out", f"file://{run_dir}", "run.progress=false"]
    done = subprocess.run(cmd, cwd=REPO, env=local_cluster.subprocess_env(), capture_output=True, text=True,
                          timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 4 and (run_dir / "report.md").is_file()
    assert summary["run_dir"] == f"file://{run_dir}" and f"run directory: file://{run_dir}" in done.stdout
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step-00000004"


@pytest.mark.cluster
@pytest.mark.timeout(300)
def test_troupe_submit_follow_says_where_the_run_is_and_troupe_fetch_brings_it_back(
        local_cluster: LocalCluster, tmp_path: Path):
    shared = tmp_path / "shared"
    troupe = [sys.executable, "-m", "troupe.cli"]
    cmd = [*troupe, "submit", "--follow", "--", "bandit", "--preset", "smoke", "run.progress=false",
           f"run.out=file://{shared}/runs"]
    done = subprocess.run(cmd, cwd=REPO, env=local_cluster.subprocess_env(), capture_output=True, text=True,
                          timeout=240)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    job_id = done.stdout.split()[1].rstrip(":")  # "submitted <id>: troupe run ..."
    last = done.stdout.strip().splitlines()[-2:]
    (run_dir,) = (shared / "runs").iterdir()
    assert last == [f"run directory: file://{run_dir}", f"copy it here: troupe fetch file://{run_dir} ./{run_dir.name}"]

    fetched = tmp_path / "here"
    got = subprocess.run([*troupe, "fetch", "--job", job_id, str(fetched)], cwd=tmp_path,
                         env=local_cluster.subprocess_env(), capture_output=True, text=True, timeout=60)
    assert got.returncode == 0, got.stdout + got.stderr
    assert json.loads((fetched / "summary.json").read_text())["run_dir"] == f"file://{run_dir}"
    assert (fetched / "report.md").read_text() == (run_dir / "report.md").read_text()
