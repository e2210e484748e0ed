"""Fused roles (`troupe.platform.fused`): roles hosted by one process keep what a separate
actor guarantees its callers: order per caller, resolved arguments, errors, calls between roles."""

from __future__ import annotations

import os
import time

import pytest

from troupe.platform.errors import RemoteCallError
from troupe.platform.fused import is_fused
from troupe.platform.placement import ActorGraph, Role


class Box:
    def __init__(self, fail: bool = False) -> None:
        if fail:
            raise ValueError("no box today")
        self.value = None
        self.log: list[str] = []

    def put(self, value):
        self.log.append(f"put {value}")
        self.value = value

    def get(self):
        self.log.append("get")
        return self.value

    def history(self) -> list[str]:
        return self.log

    def kind(self, arg) -> str:
        import ray

        return "ref" if isinstance(arg, ray.ObjectRef) else type(arg).__name__

    def first_kind(self, args: list) -> str:
        return self.kind(args[0])

    def boom(self) -> None:
        raise KeyError("the key that was not there")

    def pid(self) -> int:
        return os.getpid()

    def ask(self, other) -> object:
        """Call another role and wait for it, from inside this one's call."""
        import ray

        return ray.get(other.get.remote(), timeout=30)


def _slow(value, seconds: float):
    time.sleep(seconds)
    return value


def test_only_one_rank_cpu_only_unordered_roles_can_be_fused():
    assert Role("a", Box).can_fuse()
    assert not Role("a", Box, count=2).can_fuse()
    assert not Role("a", Box, num_gpus=1).can_fuse()
    assert not Role("a", Box, max_concurrency=4).can_fuse()
    assert not Role("a", Box, ready_first=True).can_fuse()
    assert not Role("a", Box, colocate="policy").can_fuse()
    assert not Role("a", Box, resources={"accelerator": 1}).can_fuse()
    assert not Role("a", Box, fusable=False).can_fuse()


@pytest.mark.timeout(180)
def test_fused_roles_share_a_process_and_keep_each_callers_order(ray_local):
    ray = ray_local
    roles = [Role("a", Box, num_cpus=0.1), Role("b", Box, num_cpus=0.1), Role("c", Box, num_cpus=0.1, count=2)]
    graph = ActorGraph(roles, 60, 60, fuse=None).start()  # one node without GPUs: fused
    try:
        a, b = graph["a"][0], graph["b"][0]
        assert is_fused(a) and is_fused(b) and not is_fused(graph["c"][0])
        assert len(graph.hosts) == 1
        assert graph["a"].call("pid") == graph["b"].call("pid")
        assert graph["c"].call("pid")[0] != graph["a"].call("pid")[0]
        # A call whose argument is still being computed is not overtaken by the next call.
        slow = ray.remote(_slow).remote(7, 1.0)
        a.put.remote(slow)
        assert ray.get(a.get.remote(), timeout=30) == 7
        assert ray.get(a.history.remote(), timeout=30)[-2:] == ["put 7", "get"]
        # Top-level refs arrive resolved, nested ones as refs.
        ref = ray.put(3)
        assert ray.get([a.kind.remote(ref), a.first_kind.remote([ref])], timeout=30) == ["int", "ref"]
        # A role may call another and wait for it.
        b.put.remote("from b")
        assert ray.get(a.ask.remote(b), timeout=30) == "from b"
        # A role's error reaches the caller as a separate actor's would, naming the call.
        with pytest.raises(RemoteCallError, match=r"a\.boom failed: KeyError"):
            graph["a"].call("boom")
        assert graph["a"].call("get") == [7]  # and the role lives on
        host = graph.hosts[0]
    finally:
        graph.shutdown()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(host.ready.remote("a"), timeout=30)


@pytest.mark.timeout(180)
def test_a_fused_constructor_that_raises_names_its_role(ray_local):
    roles = [Role("fine", Box, num_cpus=0.1), Role("broken", Box, num_cpus=0.1, kwargs={"fail": True})]
    with pytest.raises(RemoteCallError, match=r"role 'broken'.*no box today"):
        ActorGraph(roles, 60, 60, fuse=True).start()


@pytest.mark.timeout(180)
def test_fuse_false_gives_each_role_its_process(ray_local):
    graph = ActorGraph([Role("a", Box, num_cpus=0.1), Role("b", Box, num_cpus=0.1)], 60, 60, fuse=False).start()
    try:
        assert not graph.hosts and not is_fused(graph["a"][0])
        assert graph["a"].call("pid") != graph["b"].call("pid")
    finally:
        graph.shutdown()
