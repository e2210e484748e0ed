"""Autoscaling on one machine: a head without GPUs, an autoscaler with Ray's fake multi-node
provider and a GPU worker type that scales from zero. A GRPO run whose rollout engine asks
for a GPU starts, the autoscaler adds a GPU node, the run completes, and the idle node goes.

The cluster is a `LocalCluster` (``ray start --head`` with its own temp dir and token
authentication); stopping it ends only the processes it started, fake nodes included.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest

from troupe.cluster.local import LocalCluster, fake_autoscaling_config

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(420)]

GPU_WORKER = {"CPU": 1, "GPU": 1}
FAST = ["run.progress=false", "run.steps=2", "run.eval_every=0", "run.checkpoint_every=0",
        "eval.num_prompts=8", "grpo.prompts_per_step=4", "grpo.group_size=4"]
# A loaded machine starts a fake node's agents slowly; the raylet's default wait is 30 s.
SLOW_MACHINE_ENV = {"RAY_agent_register_timeout_ms": "120000"}


def _nodes(cluster: LocalCluster) -> list[dict[str, Any]]:
    """Every node the cluster has had (alive and dead), from the state API."""
    req = urllib.request.Request(f"{cluster.address}/api/v0/nodes?limit=100&detail=true",
                                 headers=cluster.auth_headers())
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())["data"]["result"]["result"]


def _alive(cluster: LocalCluster) -> list[dict[str, Any]]:
    return [n for n in _nodes(cluster) if n["state"] == "ALIVE"]


def test_graph_asking_for_a_gpu_the_head_lacks_grows_the_cluster_completes_and_the_idle_node_goes(
    tmp_path: Path, troupe_cache: Path
):
    config = fake_autoscaling_config({"CPU": 2}, {"gpu_worker": GPU_WORKER}, idle_timeout_s=5)
    with LocalCluster(num_cpus=2, autoscaling_config=config, env=SLOW_MACHINE_ENV) as cluster:
        assert [n["resources_total"].get("GPU", 0) for n in _alive(cluster)] == [0]

        run_dir, log = tmp_path / "run", tmp_path / "run.log"
        cmd = [sys.executable, "-m", "troupe.cli", "run", "grpo", "--preset", "smoke", "--out", str(run_dir),
               f"run.address={cluster.gcs_address}", "rollout.num_gpus=1",
               "run.node_types={gpu_worker: {CPU: 1, GPU: 1}}", "run.request_resources=true",
               "run.placement_timeout_s=240", *FAST]
        head = psutil.Process(cluster._proc.pid)
        tree: dict[int, psutil.Process] = {}
        most_gpu_nodes = 0
        with open(log, "wb") as out:
            driver = subprocess.Popen(cmd, env=cluster.subprocess_env(), stdout=out, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 330
            try:
                while driver.poll() is None and time.monotonic() < deadline:
                    # The cluster's processes, the fake nodes' too, and how many GPU nodes are up.
                    tree.update((p.pid, p) for p in head.children(recursive=True))
                    gpus = [n for n in _alive(cluster) if n["resources_total"].get("GPU", 0) >= 1]
                    most_gpu_nodes = max(most_gpu_nodes, len(gpus))
                    time.sleep(1)
            finally:
                if driver.poll() is None:
                    driver.kill()
                driver.wait()
        assert driver.returncode == 0, log.read_text()[-5000:]
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["steps"] == 2 and summary["faults"] == 0
        # The engine could only run on the GPU node the autoscaler added for it.
        assert most_gpu_nodes == 1
        assert len([n for n in _nodes(cluster) if n["resources_total"].get("GPU", 0) >= 1]) == 1

        # The run cleared its resource request, so the node goes once idle.
        deadline = time.monotonic() + 90
        while len(_alive(cluster)) > 1 and time.monotonic() < deadline:
            time.sleep(1)
        alive = _alive(cluster)
        assert len(alive) == 1 and alive[0]["is_head_node"], alive
    # Stopping the cluster ended every process it started, the fake nodes' included.
    assert [p.pid for p in tree.values() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE] == []
