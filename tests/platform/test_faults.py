"""Fault tolerance of the runtime: a straggling call is cut off by its timeout, naming the role,
the method and the config key. (A driver killed while writing a checkpoint, and every other
row of the README's fault table, is in tests/algorithms/test_fault_table.py.)"""

from __future__ import annotations

import time

import pytest

from troupe.platform.errors import RemoteCallError
from troupe.platform.placement import ActorGraph, Role


class Sleeper:
    def nap(self, seconds: float) -> float:
        time.sleep(seconds)
        return seconds


@pytest.mark.timeout(120)
def test_straggling_call_is_cut_off_by_the_call_timeout_naming_role_and_method(ray_local):
    graph = ActorGraph([Role("judge", Sleeper, num_cpus=0.1)], timeout_s=60, call_timeout_s=60).start()
    try:
        graph["judge"].timeout_s = 1  # as if run.call_timeout_s=1 (the actor has started by now)
        t = time.monotonic()
        with pytest.raises(RemoteCallError, match=r"judge\.nap did not answer within 1s.*run\.call_timeout_s"):
            graph["judge"].call("nap", 600)
        assert time.monotonic() - t < 15
    finally:
        graph.shutdown()  # ends the straggler too
