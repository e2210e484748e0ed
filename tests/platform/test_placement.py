import json
import logging
import time

import pytest

from troupe.platform.errors import PlacementInfeasible, PlacementTimeout
from troupe.platform.placement import (
    ALLOCATOR_ENV,
    ActorGraph,
    Role,
    bundle_misfit,
    infeasible_groups,
    plan_bundles,
    torch_threads_for,
)


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
        ActorGraph([Role("giant", Echo, num_cpus=64), Role("small", Echo, num_cpus=0.5)], timeout_s=3).start()
    assert time.monotonic() - t < 30
    msg = str(e.value)
    assert "'giant'" in msg and "CPU': 64" in msg and "run.placement_timeout_s" in msg
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
            ActorGraph([Role("giant", Echo, num_cpus=64)], timeout_s=3, report_every_s=1).start()
    reports = [r.getMessage() for r in caplog.records if "waiting for placement groups" in r.getMessage()]
    assert reports and "group 'giant'" in reports[0] and "cluster available" in reports[0]
