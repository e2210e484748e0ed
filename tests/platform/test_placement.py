import time

import pytest

from troupe.platform.errors import PlacementTimeout
from troupe.platform.placement import ActorGraph, Role, plan_bundles, torch_threads_for


class Echo:
    def threads(self):
        import os

        import torch

        return torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")


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
    finally:
        g.shutdown()


@pytest.mark.timeout(120)
def test_infeasible_placement_times_out_naming_bundles_and_releases_groups(ray_local):
    ray = ray_local
    before = ray.available_resources().get("CPU")
    t = time.monotonic()
    with pytest.raises(PlacementTimeout) as e:
        ActorGraph([Role("giant", Echo, num_cpus=64), Role("small", Echo, num_cpus=0.5)], timeout_s=3).start()
    assert time.monotonic() - t < 30
    msg = str(e.value)
    assert "'giant'" in msg and "CPU': 64" in msg and "run.placement_timeout_s" in msg
    time.sleep(1)
    assert ray.available_resources().get("CPU") == before  # nothing left reserved
