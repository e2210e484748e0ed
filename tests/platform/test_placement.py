import dataclasses
import json
import logging
import shutil
import tempfile
import time

import pytest

from troupe.platform.algorithm import Algorithm
from troupe.platform.config import RunConfig
from troupe.platform.errors import PlacementInfeasible, PlacementTimeout
from troupe.platform.placement import (
    ALLOCATOR_ENV,
    ActorGraph,
    Role,
    bundle_misfit,
    can_grow_from_report,
    infeasible_groups,
    overcommitted,
    plan_bundles,
    torch_threads_for,
)
from troupe.platform.registry import ALGORITHMS


class Echo:
    def threads(self):
        import os

        import torch

        return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")

    def env(self, name):
        import os

        return os.environ.get(name)


def test_colocated_roles_share_bundles():
    roles = [Role("learner", Echo, count=2, num_cpus=1, num_gpus=0.5, colocate="policy"),
             Role("rollout", Echo, count=1, num_cpus=0.5, num_gpus=0.5, colocate="policy"),
             Role("reward", Echo, num_cpus=0.1)]
    plan = plan_bundles(roles)
    assert plan["policy"] == [{"CPU": 1.5, "GPU": 1.0}, {"CPU": 1.0, "GPU": 0.5}]
    assert plan["reward"] == [{"CPU": 0.1}]


def test_torch_threads_from_cpus():
    assert [torch_threads_for(c) for c in (0.1, 1, 2.5)] == [1, 1, 2]


@pytest.mark.timeout(120)
def test_actors_get_threads_from_their_cpus(ray_local):
    g = ActorGraph([Role("echo", Echo, num_cpus=2)], timeout_s=60).start()
    try:
        assert g["echo"].call("threads")[0] == (2, "2")
        # and keep freed memory in the heap (see ALLOCATOR_ENV)
        for name, value in ALLOCATOR_ENV.items():
            assert g["echo"].call("env", name)[0] == value
    finally:
        g.shutdown()


@pytest.mark.timeout(120)
def test_infeasible_placement_times_out_naming_bundles_and_releases_groups(ray_local):
    ray = ray_local
    total = ray.cluster_resources().get("CPU")
    t = time.monotonic()
    with pytest.raises(PlacementTimeout) as e:
        # can_grow=True: as on an autoscaling cluster, where a pending group is what adds a node
        ActorGraph([Role("giant", Echo, num_cpus=64), Role("small", Echo, num_cpus=0.5)], timeout_s=3,
                   can_grow=True).start()
    assert time.monotonic() - t < 30
    msg = str(e.value)
    assert "'giant'" in msg and "CPU': 64" in msg and "run.placement_timeout_s" in msg and "run.num_cpus=65" in msg
    # Nothing left reserved: every CPU comes back (releases, also an earlier test's, are asynchronous).
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU") != total and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("CPU") == total


def test_bundle_fits_when_some_node_type_holds_all_of_it():
    types = {"cpu": {"CPU": 16}, "gpu": {"CPU": 8, "GPU": 1}}
    assert bundle_misfit({"CPU": 4, "GPU": 1}, types) is None
    assert "GPU: 2 needed, the most any node type offers is 1 (gpu)" in bundle_misfit({"GPU": 2}, types)
    assert "no single node type" in bundle_misfit({"CPU": 12, "GPU": 1}, types)


def test_infeasible_groups_name_each_bundle_and_strict_pack_sums():
    plan = {"policy": [{"CPU": 4, "GPU": 1}, {"CPU": 4, "GPU": 1}], "reward": [{"CPU": 0.1}]}
    types = {"gpu": {"CPU": 8, "GPU": 1}}
    assert infeasible_groups(plan, {"policy": "PACK"}, types) == []
    lines = infeasible_groups(plan, {"policy": "STRICT_PACK"}, types)
    assert len(lines) == 1 and "group 'policy' (STRICT_PACK" in lines[0] and "GPU: 2 needed" in lines[0]


@pytest.mark.timeout(120)
def test_bundle_no_node_type_can_hold_is_refused_before_any_group_is_created(ray_local):
    from ray.util.placement_group import placement_group_table

    before = {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"}
    t = time.monotonic()
    with pytest.raises(PlacementInfeasible) as e:
        ActorGraph([Role("rollout", Echo, num_cpus=1, num_gpus=4), Role("reward", Echo, num_cpus=0.1)],
                   timeout_s=60, node_types={"gpu_worker": {"CPU": 8, "GPU": 2}}).start()
    assert time.monotonic() - t < 10  # no waiting for a group that can never be granted
    msg = str(e.value)
    assert "group 'rollout' bundle 0 {CPU: 1, GPU: 4}" in msg and "the most any node type offers is 2 (gpu_worker)" in msg
    assert "reward" not in msg.split("node types")[0]
    assert {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"} == before


@pytest.mark.timeout(120)
def test_resources_requested_from_the_autoscaler_ahead_are_cleared_at_shutdown(ray_local):
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental.internal_kv import _internal_kv_get

    g = ActorGraph([Role("echo", Echo, num_cpus=0.5, count=2)], timeout_s=60, request_resources=True,
                   node_types={"cpu": {"CPU": 4}}).start()
    try:
        assert json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)) == [{"CPU": 0.5}, {"CPU": 0.5}]
    finally:
        g.shutdown()
    assert json.loads(_internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)) == []


@pytest.mark.timeout(120)
def test_pending_groups_are_reported_while_waiting(ray_local, caplog):
    with caplog.at_level(logging.INFO, logger="troupe.platform.placement"):
        with pytest.raises(PlacementTimeout):
            ActorGraph([Role("giant", Echo, num_cpus=64)], timeout_s=3, report_every_s=1, can_grow=True).start()
    reports = [r.getMessage() for r in caplog.records if "waiting for placement groups" in r.getMessage()]
    assert reports and "group 'giant'" in reports[0] and "cluster available" in reports[0]


def test_bundles_that_ask_more_than_the_whole_cluster_are_named_per_resource():
    plan = {"learner": [{"CPU": 1.5}, {"CPU": 1.5}], "rollout": [{"CPU": 1, "GPU": 0.5}]}
    assert overcommitted(plan, {"CPU": 4, "GPU": 1}) == []
    assert overcommitted(plan, {"CPU": 2}) == ["CPU: 4 needed by all bundles together, the whole cluster has 2",
                                               "GPU: 0.5 needed by all bundles together, the whole cluster has 0"]


def test_a_cluster_whose_nodes_all_have_anonymous_types_cannot_grow():
    # What Ray's autoscaler publishes with no autoscaling config: each node its own type node_<id>.
    a, b = "ab" * 28, "cd" * 28
    assert can_grow_from_report({"node_type_mapping": {a: f"node_{a}", b: f"node_{b}"}}) is False
    # A configured type on any node (keyed by IP there): an autoscaler that can launch nodes of it.
    assert can_grow_from_report({"node_type_mapping": {"10.0.0.1": "ray.head.default", "10.0.0.2": f"node_{b}"}})
    assert can_grow_from_report({"node_type_mapping": {"10.0.0.1": "ray.head.default", "10.0.0.2": "gpu_worker"}})
    assert can_grow_from_report({}) is None and can_grow_from_report(None) is None


def _wait_for_autoscaler_status(ray, timeout_s: float = 30) -> dict:
    from troupe.platform.ray_internal import autoscaling_status

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        report = autoscaling_status().get("autoscaler_report")
        if report and report.get("node_type_mapping"):
            return report
        time.sleep(0.5)
    pytest.fail("the autoscaler published no status")


@pytest.mark.timeout(60)
def test_bundles_that_can_never_all_fit_a_cluster_with_no_autoscaler_fail_at_once(ray_local):
    from ray.util.placement_group import placement_group_table

    # The session's cluster is a ray.init() one (4 CPUs): no autoscaling config, nothing can grow.
    assert can_grow_from_report(_wait_for_autoscaler_status(ray_local)) is False
    before = {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"}
    # Each bundle fits the node; together they ask 6 CPUs of 4 (learner.num_ranks=2 on a laptop).
    roles = [Role("learner", Echo, count=2, num_cpus=2), Role("rollout", Echo, num_cpus=1.5),
             Role("reward", Echo, num_cpus=0.5)]
    with pytest.raises(PlacementInfeasible) as e:
        ActorGraph(roles, timeout_s=120).start()  # fails long before the placement timeout
    msg = str(e.value)
    assert "can never be granted on this cluster, which has no autoscaler" in msg
    assert "group 'learner': bundles [{'CPU': 2.0}, {'CPU': 2.0}]" in msg and "group 'reward'" in msg
    assert "CPU: 6 needed by all bundles together, the whole cluster has 4" in msg
    assert "run.num_cpus=6" in msg and "cluster total: CPU=4" in msg
    assert {k for k, v in placement_group_table().items() if v["state"] != "REMOVED"} == before


@dataclasses.dataclass
class CrowdConfig:
    ranks: int = 3
    run: RunConfig = dataclasses.field(default_factory=lambda: RunConfig(steps=1, placement_timeout_s=120))


class Crowd(Algorithm):
    """More 2-CPU actors than the session's 4-CPU cluster holds."""

    Config = CrowdConfig
    summary_line = "asks for too many CPUs"

    def roles(self) -> list[Role]:
        return [Role("worker", Echo, count=self.config.ranks, num_cpus=2)]

    def step(self, step: int) -> dict[str, float]:
        return {}


ALGORITHMS.register("crowd_test", Crowd)


@pytest.mark.timeout(60)
def test_a_run_whose_roles_never_fit_a_fixed_cluster_fails_at_once_naming_run_num_cpus(ray_local, tmp_path):
    from troupe import Run

    _wait_for_autoscaler_status(ray_local)
    with pytest.raises(PlacementInfeasible, match=r"(?s)no autoscaler.*group 'worker'.*run\.num_cpus=6"):
        with Run("crowd_test", out=tmp_path / "run", overrides=["run.progress=false"]) as run:
            run.run()


@pytest.mark.timeout(120)
def test_an_autoscaling_cluster_keeps_waiting_for_bundles_it_does_not_have_yet(ray_local):
    t = time.monotonic()
    with pytest.raises(PlacementTimeout, match="not granted within 3s"):
        ActorGraph([Role("learner", Echo, count=2, num_cpus=2), Role("rollout", Echo, num_cpus=1.5)],
                   timeout_s=3, can_grow=True).start()
    assert time.monotonic() - t >= 3


@pytest.mark.cluster  # its own local cluster, in a process of its own
@pytest.mark.timeout(180)
def test_troupe_run_on_the_local_cluster_it_starts_fails_at_once_when_the_roles_never_fit(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    here = Path(__file__).resolve().parent
    ray_tmp = Path(tempfile.mkdtemp(prefix="trp-", dir="/tmp"))  # short: Unix socket paths are limited
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAY_ADDRESS", None)
    script = ("import sys, test_placement; from troupe.cli import main; "
              f"sys.exit(main(['run', 'crowd_test', '--out', {str(tmp_path / 'run')!r}, 'run.progress=false', "
              "'run.num_cpus=2', 'run.placement_timeout_s=300']))")
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=150)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode != 0, done.stdout[-2000:]
    # Three 2-CPU workers on a 2-CPU local cluster: said at once, not after run.placement_timeout_s=300.
    assert "no autoscaler" in done.stderr and "CPU: 6 needed by all bundles together, the whole cluster has 2" in done.stderr
    assert "run.num_cpus=6" in done.stderr, done.stderr[-3000:]
