"""A rollout engine that stops answering is cut off by the call timeout, restarted, given the
current weights and its call re-issued: the step completes instead of hanging."""

from __future__ import annotations

import time

import pytest

from troupe.platform.placement import ActorGraph, Role


class StubEngine:
    """The rollout-engine calls `PolicyGraph` makes, with no model; `straggle` makes the next
    generate hang, as a stuck engine does (a restarted engine has its state reset)."""

    def __init__(self) -> None:
        self.version = 0
        self.straggle_s = 0.0

    def straggle(self, seconds: float) -> None:
        self.straggle_s = seconds

    def generate(self, prompts: list[str], sampling: object, rows: list[dict] | None = None, seed: int = 0) -> dict:
        time.sleep(self.straggle_s)
        return {"completions": [p + "!" for p in prompts], "version": self.version, "seed": seed}

    def get_version(self) -> int:
        return self.version

    def load_weights(self, update: int) -> int:
        self.version = update
        return update


@pytest.mark.timeout(180)
def test_straggling_rollout_engine_is_restarted_and_its_call_reissued(ray_local):
    from troupe.algorithms.policy_graph import PolicyGraph
    from troupe.platform.driver import resolve_config

    graph = ActorGraph([Role("rollout", StubEngine, count=2, num_cpus=0.1, max_restarts=2)],
                       timeout_s=60, call_timeout_s=120).start()
    try:
        # As if run.call_timeout_s=3, now that the engines have started; a restart may take
        # up to the placement timeout (60 s) plus that.
        graph["rollout"].timeout_s = 3
        policy = PolicyGraph(resolve_config("grpo", "smoke"), model_path="unused")
        policy.graph = graph
        policy.last_update = ray_local.put(3)  # the weights a restarted engine must be given first
        graph["rollout"].call("load_weights", 3)
        graph["rollout"].wait([graph["rollout"][0].straggle.remote(600)], "straggle")

        t = time.monotonic()
        rollout = policy.rollout(["a", "b", "c", "d"], [{}] * 4, sampling=None, seed=10, score=False)
        batches = ray_local.get(rollout.batches(), timeout=30)
        elapsed = time.monotonic() - t

        assert [b["completions"] for b in batches] == [["a!", "b!"], ["c!", "d!"]]
        assert [b["seed"] for b in batches] == [10, 11]  # re-issued with the same seed
        assert batches[0]["version"] == 3  # the restarted engine got the current weights first
        assert policy.faults == 1
        assert elapsed < 60  # cut off at the 3 s call timeout, not after the 600 s straggle
    finally:
        graph.shutdown()
