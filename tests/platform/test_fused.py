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
    assert not Role("a", Box, niceness=10).can_fuse()  # its priority is its own process's


@pytest.mark.timeout(180)
def test_fused_roles_share_a_process_and_keep_each_callers_order(ray_local):
    ray = ray_local
    roles = [Role("a", Box, num_cpus=0.1), Role("b", Box, num_cpus=0.2), Role("c", Box, num_cpus=0.1, count=2),
             Role("d", Box, num_cpus=0.1), Role("e", Box, num_cpus=0.1, colocate="d"),
             # a group of its own (an arm of a comparison) fuses apart; a group of one is not fused
             Role("f", Box, num_cpus=0.1, fuse_group="arm"), Role("g", Box, num_cpus=0.3, fuse_group="arm"),
             Role("h", Box, num_cpus=0.1, fuse_group="alone")]
    graph = ActorGraph(roles, 60, 60, fuse=None).start()  # one node without GPUs: fused
    try:
        a, b = graph["a"][0], graph["b"][0]
        assert is_fused(a) and is_fused(b) and not is_fused(graph["c"][0])
        assert not is_fused(graph["d"][0])  # another role shares its bundle
        assert is_fused(graph["f"][0]) and is_fused(graph["g"][0]) and not is_fused(graph["h"][0])
        assert len(graph.hosts) == 2
        # each fused process holds one bundle with its roles' shares, under its first role's name
        assert sorted(graph.placement_groups) == ["a", "c", "d", "f", "h"]
        assert graph.placement_groups["a"].bundle_specs == [{"CPU": pytest.approx(0.3)}]
        assert graph.placement_groups["f"].bundle_specs == [{"CPU": pytest.approx(0.4)}]
        assert graph["a"].call("pid") == graph["b"].call("pid")
        assert graph["f"].call("pid") == graph["g"].call("pid") != graph["a"].call("pid")
        assert graph["h"].call("pid") != graph["f"].call("pid")
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


class Dice:
    """Draws from torch's global random stream, as dropout does."""

    uses_global_rng = True

    def __init__(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    def roll(self, n: int, pause: float = 0.0) -> list[float]:
        import torch

        out = [torch.rand(1).item()]
        time.sleep(pause)  # another role's call would interleave its draws here
        return out + torch.rand(n - 1).tolist()


@pytest.mark.timeout(180)
def test_fused_roles_that_use_the_global_rng_each_keep_their_own_stream(ray_local):
    import torch

    ray = ray_local
    alone = {}
    for seed in (1, 2):
        torch.manual_seed(seed)
        alone[seed] = [torch.rand(1).item() for _ in range(1)] + torch.rand(3).tolist()
        alone[seed] += [torch.rand(1).item()] + torch.rand(3).tolist()
    roles = [Role("a", Dice, num_cpus=0.1, kwargs={"seed": 1}), Role("b", Dice, num_cpus=0.1, kwargs={"seed": 2})]
    graph = ActorGraph(roles, 60, 60, fuse=True).start()
    try:
        a, b = graph["a"][0], graph["b"][0]
        refs = [a.roll.remote(4, 0.3), b.roll.remote(4, 0.0), a.roll.remote(4), b.roll.remote(4, 0.2)]
        ra1, rb1, ra2, rb2 = ray.get(refs, timeout=60)
        assert ra1 + ra2 == pytest.approx(alone[1]) and rb1 + rb2 == pytest.approx(alone[2])
    finally:
        graph.shutdown()
