"""`Role.ready_first`: a role's actors are ready before the roles after it are created (a vLLM
engine sizes its KV cache from the GPU memory free when it starts, before its learner loads)."""

from __future__ import annotations

import time

import pytest

from troupe.platform.placement import ActorGraph, Role


class SlowStart:
    def __init__(self, seconds: float) -> None:
        self.started = time.time()
        time.sleep(seconds)
        self.ready = time.time()

    def times(self) -> tuple[float, float]:
        return self.started, self.ready


@pytest.mark.timeout(180)
def test_roles_after_a_ready_first_role_start_once_it_is_ready(ray_local):
    roles = [Role("engine", SlowStart, num_cpus=0.1, colocate="policy", kwargs={"seconds": 1.5}, ready_first=True),
             Role("learner", SlowStart, num_cpus=0.1, colocate="policy", kwargs={"seconds": 0.0})]
    graph = ActorGraph(roles, 60, 60).start()
    try:
        (_, engine_ready), = graph["engine"].call("times")
        (learner_started, _), = graph["learner"].call("times")
        assert learner_started >= engine_ready
    finally:
        graph.shutdown()
