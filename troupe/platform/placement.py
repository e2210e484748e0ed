"""Roles and placement: turn an algorithm's declared roles into placement groups and actors.

A role is an actor class, a count, CPUs and GPUs per actor, and a colocation group. Roles in
the same group share placement-group bundles (bundle i holds rank i of each role), so a
learner and a rollout engine can sit on the same GPU; each group is one placement group.

Placement never checks the cluster's size now: a pending placement group is what makes an
autoscaler add nodes. What it checks, before creating anything, is whether each bundle fits
some node the cluster *can* have (``node_types``, e.g. a cluster YAML's node types, plus the
nodes alive now); a bundle that fits none would stay pending forever, so it is an error
(`PlacementInfeasible`) naming the bundle and the largest offer. It can ask the autoscaler for
every bundle ahead (``request_resources``) and clears that request at `ActorGraph.shutdown`.
On a cluster that cannot grow (no autoscaler: the local cluster `troupe run` starts, or a fixed
cluster whose autoscaler only mirrors the nodes it has), bundles that can never all fit (one
larger than every node, or more of a resource than the whole cluster has) are
`PlacementInfeasible` at once instead of a wait of ``timeout_s``.
While groups are pending it logs what is pending every ``report_every_s``, with what the
autoscaler is launching; after ``timeout_s`` it removes the groups and raises
`PlacementTimeout` naming the bundles it could not get and what the cluster has.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from troupe.platform import ray_internal
from troupe.platform.errors import PlacementInfeasible, PlacementTimeout, RemoteCallError

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Role:
    """One kind of actor in an algorithm's graph."""

    name: str
    actor_class: type
    count: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = dataclasses.field(default_factory=dict)
    colocate: str | None = None  # roles with the same name share bundles; None: a group of its own
    strategy: str = "PACK"  # PACK, SPREAD, STRICT_PACK or STRICT_SPREAD for this role's group
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    rank_kwargs: list[dict[str, Any]] | None = None  # per-rank extra kwargs (e.g. DDP rank)
    max_restarts: int = 0
    max_task_retries: int = 0
    max_concurrency: int = 1
    # Wait until this role's actors are ready before creating the roles listed after it (a vLLM
    # engine sizes its KV cache from the GPU memory free when it starts, so it goes before a
    # learner that shares its GPU).
    ready_first: bool = False
    # Whether this role may share a process with other roles (troupe.platform.fused) where the
    # graph fuses them; a role that must overlap another's compute says False.
    fusable: bool = True
    # Roles fused on one node share a process with the roles of their group: roles that run one
    # after another (one policy's engine and learner) lose nothing by it, roles that run side by
    # side (the arms of a comparison) keep the cores apart in processes of their own. None: the
    # graph's common group.
    fuse_group: str | None = None
    # The OS priority (nice, 0-19) this role's processes run at. Above 0 a role takes only the
    # cycles the others leave: rollout engines generating ahead (``rollout.niceness``).
    niceness: int = 0

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError(f"role {self.name!r}: count must be >= 1, got {self.count}")
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"role {self.name!r}: num_cpus and num_gpus must be >= 0")
        if not 0 <= self.niceness <= 19:
            raise ValueError(f"role {self.name!r}: niceness must be in 0..19, got {self.niceness}")
        if self.rank_kwargs is not None and len(self.rank_kwargs) != self.count:
            raise ValueError(f"role {self.name!r}: rank_kwargs needs one entry per rank ({self.count})")

    def can_fuse(self) -> bool:
        """One rank, no GPU, no concurrency, no ordering before others: nothing a process of
        its own gives this role (restarts aside, which a fused role gives up)."""
        # A lower OS priority belongs to a process of the role's own, not to roles beside it.
        return (self.fusable and self.count == 1 and self.num_gpus == 0 and not self.resources
                and self.max_concurrency == 1 and not self.ready_first and self.colocate is None
                and self.niceness == 0)

    def bundle_share(self) -> dict[str, float]:
        share = {"CPU": float(self.num_cpus), "GPU": float(self.num_gpus), **self.resources}
        return {k: v for k, v in share.items() if v > 0}


def torch_threads_for(num_cpus: float) -> int:
    """Threads an actor's torch should use: its whole CPUs, at least one."""
    return max(1, int(num_cpus))


def plan_bundles(roles: Sequence[Role]) -> dict[str, list[dict[str, float]]]:
    """Bundles per colocation group: bundle i sums the shares of every role's rank i."""
    groups: dict[str, list[dict[str, float]]] = {}
    for role in roles:
        key = role.colocate or role.name
        bundles = groups.setdefault(key, [])
        while len(bundles) < role.count:
            bundles.append({})
        for i in range(role.count):
            for res, amount in role.bundle_share().items():
                bundles[i][res] = bundles[i].get(res, 0.0) + amount
    # Ray rejects empty bundles; a zero-resource actor still gets a tiny CPU share.
    for bundles in groups.values():
        for b in bundles:
            if not b:
                b["CPU"] = 0.01
    return groups


def bundle_misfit(bundle: Mapping[str, float], node_types: Mapping[str, Mapping[str, float]]) -> str | None:
    """Why no node type can hold ``bundle`` (None when one can).

    ``node_types`` maps a node type to the resources one node of it offers. The reason names,
    for each resource that is short, the most any node type offers and which type that is.
    """
    eps = 1e-9  # fractional shares summed in floating point
    need = {k: float(v) for k, v in bundle.items() if float(v) > 0}
    if any(all(res.get(k, 0.0) + eps >= v for k, v in need.items()) for res in node_types.values()):
        return None
    if not node_types:
        return "no node types are known"
    short = []
    for k, v in need.items():
        best_name, best = max(((n, float(r.get(k, 0.0))) for n, r in node_types.items()), key=lambda t: t[1])
        if best + eps < v:
            offer = f"{fmt_amount(best)} ({best_name})" if best > 0 else "none"
            short.append(f"{k}: {fmt_amount(v)} needed, the most any node type offers is {offer}")
    if short:
        return "; ".join(short)
    return "no single node type offers all of it at once (" + ", ".join(
        f"{n} has {fmt_bundle(r)}" for n, r in node_types.items()) + ")"


def infeasible_groups(
    plan: Mapping[str, Sequence[Mapping[str, float]]],
    strategies: Mapping[str, str],
    node_types: Mapping[str, Mapping[str, float]],
) -> list[str]:
    """One line per bundle of ``plan`` that no node type can hold (and per STRICT_PACK group
    whose bundles together fit no single node): such a group would stay pending forever."""
    lines = []
    for key, bundles in plan.items():
        for i, bundle in enumerate(bundles):
            reason = bundle_misfit(bundle, node_types)
            if reason:
                lines.append(f"group {key!r} bundle {i} {fmt_bundle(bundle)}: {reason}")
        if strategies.get(key, "PACK").upper() == "STRICT_PACK" and len(bundles) > 1:
            total: dict[str, float] = {}
            for b in bundles:
                for k, v in b.items():
                    total[k] = total.get(k, 0.0) + float(v)
            reason = bundle_misfit(total, node_types)
            if reason:
                lines.append(f"group {key!r} (STRICT_PACK, all {len(bundles)} bundles on one node) "
                             f"{fmt_bundle(total)}: {reason}")
    return lines


def overcommitted(plan: Mapping[str, Sequence[Mapping[str, float]]], total: Mapping[str, float]) -> list[str]:
    """One line per resource that the bundles of ``plan`` together ask more of than ``total``
    (a cluster's whole resources) holds: then they can never all be placed at once."""
    eps = 1e-9
    need: dict[str, float] = {}
    for bundles in plan.values():
        for b in bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + float(v)
    return [f"{k}: {fmt_amount(v)} needed by all bundles together, the whole cluster has "
            f"{fmt_amount(float(total.get(k, 0.0)))}" for k, v in need.items() if v > float(total.get(k, 0.0)) + eps]


# The type Ray's autoscaler gives each node of a cluster without an autoscaling config:
# ``node_`` and the node's id (28 bytes in hex).
_ANONYMOUS_NODE_TYPE = re.compile(r"node_[0-9a-f]{56}")


def can_grow_from_report(report: Mapping[str, Any] | None) -> bool | None:
    """Whether an autoscaler status report (`ray_internal.autoscaling_status`'s
    ``autoscaler_report``) shows a cluster that can add nodes: False when every node has the
    anonymous type ``node_<id>`` that Ray gives the nodes of a cluster with no autoscaling config
    (its autoscaler only mirrors them), True when a node has a configured type, None when no
    report says (none published yet, or a format Ray no longer uses)."""
    mapping = (report or {}).get("node_type_mapping")  # node (its id or IP) -> node type
    if not mapping or not isinstance(mapping, Mapping):
        return None
    return not all(_ANONYMOUS_NODE_TYPE.fullmatch(str(t)) for t in mapping.values())


def cluster_can_grow() -> bool | None:
    """`can_grow_from_report` for the connected cluster (None when its status cannot be read)."""
    try:
        return can_grow_from_report(ray_internal.autoscaling_status().get("autoscaler_report"))
    except Exception:  # not connected, or a status Ray no longer publishes: assume it may grow
        return None


def fmt_amount(v: float) -> str:
    """``2`` for a whole amount, else ``0.5``."""
    return str(int(round(v))) if math.isclose(v, round(v)) else f"{v:g}"


def fmt_bundle(res: Mapping[str, float]) -> str:
    """``{CPU: 1, GPU: 0.5}``: a bundle or a node's resources, for messages."""
    return "{" + ", ".join(f"{k}: {fmt_amount(float(v))}" for k, v in res.items()) + "}"


class ActorGroup:
    """The ranks of one role, with fan-out calls that always carry a timeout."""

    def __init__(self, role: Role, handles: list[Any], timeout_s: float) -> None:
        self.role = role
        self.handles = handles
        self.timeout_s = timeout_s

    def __len__(self) -> int:
        return len(self.handles)

    def __getitem__(self, i: int) -> Any:
        return self.handles[i]

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` on every rank with the same arguments and wait for all results."""
        refs = [getattr(h, method).remote(*args, **kwargs) for h in self.handles]
        return self.wait(refs, method)

    def call_each(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list[Any]:
        """Call ``method`` on rank i with ``per_rank_args[i]``."""
        if len(per_rank_args) != len(self.handles):
            raise ValueError(f"{self.role.name}.{method}: {len(per_rank_args)} argument sets for {len(self)} ranks")
        refs = [getattr(h, method).remote(*a, **kwargs) for h, a in zip(self.handles, per_rank_args, strict=True)]
        return self.wait(refs, method)

    def wait(self, refs: list[Any], method: str, timeout_s: float | None = None) -> list[Any]:
        import ray

        timeout = self.timeout_s if timeout_s is None else timeout_s
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError as e:
            raise RemoteCallError(
                f"{self.role.name}.{method} did not answer within {timeout:.0f}s "
                f"(raise run.call_timeout_s if the step is legitimately slow)"
            ) from e
        except ray.exceptions.RayActorError as e:
            raise RemoteCallError(f"{self.role.name}.{method}: an actor of this role died: {e}") from e
        except ray.exceptions.RayTaskError as e:
            raise RemoteCallError(f"{self.role.name}.{method} failed: {e.cause!r}") from e.cause


class ActorGraph:
    """The placed actors of an algorithm, by role name; tears itself down on `shutdown`.

    Args:
        roles: the roles to place.
        timeout_s: how long to wait for every placement group before `PlacementTimeout`.
        call_timeout_s: the timeout of every call made through an `ActorGroup`.
        node_types: node type → the resources one node of it offers (what the cluster can
            grow to); when given, a bundle that fits neither a type nor a node alive now
            raises `PlacementInfeasible` before anything is created. None skips the check.
        request_resources: ask the autoscaler for every bundle before waiting, so that it
            launches all the nodes at once; the request is cleared at `shutdown`. An
            autoscaler keeps one such request per cluster: the last caller's wins.
        can_grow: whether the cluster can add nodes. False (e.g. a local cluster the caller
            started) makes bundles that can never all fit an error at once; None asks the
            cluster's autoscaler status (`cluster_can_grow`) and waits when it cannot tell.
            ``node_types`` imply True.
        report_every_s: how often to log what is still pending while waiting.
        fuse: host the roles that `Role.can_fuse` in one process per `Role.fuse_group`
            (`troupe.platform.fused`): True always, False never, None when the cluster is one
            node without GPUs that cannot grow.
    """

    def __init__(
        self,
        roles: Sequence[Role],
        timeout_s: float = 300.0,
        call_timeout_s: float = 900.0,
        *,
        node_types: Mapping[str, Mapping[str, float]] | None = None,
        request_resources: bool = False,
        can_grow: bool | None = None,
        report_every_s: float = 15.0,
        fuse: bool | None = False,
    ) -> None:
        names = [r.name for r in roles]
        if len(set(names)) != len(names):
            raise ValueError(f"role names must be unique, got {names}")
        self.roles = list(roles)
        self.timeout_s = timeout_s
        self.call_timeout_s = call_timeout_s
        self.node_types = {k: dict(v) for k, v in (node_types or {}).items()}
        self.request_resources = request_resources
        self.can_grow = can_grow
        self.report_every_s = report_every_s
        self.fuse = fuse
        self.hosts: list[Any] = []  # the processes of fused roles
        self.placement_groups: dict[str, Any] = {}
        self._fused: list[list[Role]] = []  # the roles each fused process hosts, chosen when placing
        self.groups: dict[str, ActorGroup] = {}
        self._requested = False

    def __getitem__(self, name: str) -> ActorGroup:
        if name not in self.groups:
            raise KeyError(f"no role {name!r} in this graph; roles: {', '.join(self.groups)}")
        return self.groups[name]

    def __contains__(self, name: str) -> bool:
        return name in self.groups

    def start(self) -> ActorGraph:
        try:
            self._place()
            self._create_actors()
        except BaseException:
            self.shutdown()
            raise
        return self

    def _place(self) -> None:
        from ray.util.placement_group import placement_group

        plan = plan_bundles(self.roles)
        strategies = {(r.colocate or r.name): r.strategy for r in self.roles}
        self._fused = self._fused_groups()
        for fused in self._fused:
            # One process, so one bundle holding every fused role's share, on one node.
            merged: dict[str, float] = {}
            for role in fused:
                strategies.pop(role.name)
                for k, v in plan.pop(role.name)[0].items():
                    merged[k] = merged.get(k, 0.0) + v
            plan[fused[0].name] = [merged]
            strategies[fused[0].name] = fused[0].strategy
        if self.node_types:
            self._check_feasible(plan, strategies)
        elif not self._may_grow():
            self._check_fits_now(plan, strategies)
        if self.request_resources:
            _request_resources([b for bundles in plan.values() for b in bundles])
            self._requested = True
        for key, bundles in plan.items():
            self.placement_groups[key] = placement_group(bundles, strategy=strategies[key], name="")
        self._wait_placed(plan, strategies)

    def _check_feasible(self, plan: dict[str, list[dict[str, float]]], strategies: dict[str, str]) -> None:
        """Raise `PlacementInfeasible` if a bundle fits no node the cluster can have."""
        shapes = {**live_node_types(), **self.node_types}
        lines = infeasible_groups(plan, strategies, shapes)
        if lines:
            raise PlacementInfeasible(
                "these bundles fit no node this cluster can have, so their placement groups would "
                "wait forever:\n  " + "\n  ".join(lines)
                + "\nnode types (run.node_types and the nodes alive now): "
                + "; ".join(f"{n} {fmt_bundle(r)}" for n, r in shapes.items())
                + ".\nLower the roles' num_cpus/num_gpus, or add a node type that holds them."
            )

    def _may_grow(self) -> bool:
        """Whether waiting can help: the cluster may add nodes (also when its status cannot tell)."""
        return self.can_grow if self.can_grow is not None else cluster_can_grow() is not False

    def _check_fits_now(self, plan: dict[str, list[dict[str, float]]], strategies: dict[str, str]) -> None:
        """On a cluster that cannot grow: raise `PlacementInfeasible` if the bundles can never all
        fit its nodes (the message `_wait_placed` gives after its timeout, given at once)."""
        import ray

        total = ray.cluster_resources()
        nodes = live_node_types()
        reasons = infeasible_groups(plan, strategies, nodes) + overcommitted(plan, total)
        if not reasons:
            return
        lines = [f"  group {k!r}: bundles {plan[k]} (strategy {strategies[k]})" for k in plan]
        raise PlacementInfeasible(
            "placement groups can never be granted on this cluster, which has no autoscaler to add nodes:\n"
            + "\n".join(lines) + "\n  " + "\n  ".join(reasons)
            + f"\ncluster total: {_fmt_resources(total)}; available: {_fmt_resources(ray.available_resources())}.\n"
            + unplaced_fixes(plan)
        )

    def _wait_placed(self, plan: dict[str, list[dict[str, float]]], strategies: dict[str, str]) -> None:
        import ray

        deadline = time.monotonic() + self.timeout_s
        pending = dict(self.placement_groups)
        last_report = time.monotonic()
        while pending:
            for key, pg in list(pending.items()):
                if pg.wait(timeout_seconds=1):
                    del pending[key]
            if not pending:
                break
            now = time.monotonic()
            lines = [f"  group {k!r}: bundles {plan[k]} (strategy {strategies[k]})" for k in pending]
            if now > deadline:
                available = ray.available_resources()
                total = ray.cluster_resources()
                activity = autoscaler_activity()
                raise PlacementTimeout(
                    f"placement groups not granted within {self.timeout_s:.0f}s:\n"
                    + "\n".join(lines)
                    + f"\ncluster total: {_fmt_resources(total)}; available: {_fmt_resources(available)}.\n"
                    + (f"{activity}.\n" if activity else "")
                    + unplaced_fixes(plan) + " Or raise run.placement_timeout_s."
                )
            if now - last_report >= self.report_every_s:
                last_report = now
                activity = autoscaler_activity()
                log.info("waiting for placement groups (%.0fs left):\n%s\ncluster available: %s%s",
                         deadline - now, "\n".join(lines), _fmt_resources(ray.available_resources()),
                         f"; {activity}" if activity else "")

    def _fused_groups(self) -> list[list[Role]]:
        """The roles each fused process hosts: per `Role.fuse_group`, the groups of two or more."""
        hosts_others = {r.colocate for r in self.roles if r.colocate}  # its bundle is shared: not fused
        groups: dict[str | None, list[Role]] = {}
        for r in self.roles:
            if r.can_fuse() and r.name not in hosts_others:
                groups.setdefault(r.fuse_group, []).append(r)
        fused = [g for g in groups.values() if len(g) >= 2]
        if not fused or self.fuse is False:
            return []
        return fused if self.fuse or self._one_cpu_node() else []

    def _one_cpu_node(self) -> bool:
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        # A cluster whose status does not say (none published yet) counts as one that cannot grow.
        grows = self.can_grow if self.can_grow is not None else cluster_can_grow() is True
        return (len(nodes) == 1 and not float(nodes[0].get("Resources", {}).get("GPU", 0))
                and not self.node_types and not grows)

    def _create_fused(self, roles: list[Role]) -> None:
        """One `FusedHost` for ``roles`` in their one bundle (placed under the first role's
        name, holding every role's share: the host does their work), and a `FusedHandle` per role."""
        import uuid

        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from troupe.platform.fused import FusedHandle, FusedHost

        specs = []
        for role in roles:
            cls = role.actor_class
            modified = getattr(getattr(cls, "__ray_metadata__", None), "modified_class", None)
            specs.append((role.name, modified or cls, {**role.kwargs, **(role.rank_kwargs or [{}])[0]}))
        cpus = sum(r.num_cpus for r in roles)
        host = _as_remote(FusedHost).options(
            num_cpus=0, max_restarts=0, max_task_retries=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(
                placement_group=self.placement_groups[roles[0].name], placement_group_bundle_index=0),
            # The roles' blocking ray.get runs in their own threads, not on the host's event
            # loop, which Ray's once-per-process warning about it assumes.
            runtime_env={"env_vars": {**_thread_env(cpus), "RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0"}},
        ).remote(specs)
        self.hosts.append(host)
        key = uuid.uuid4().hex
        for role in roles:
            self.groups[role.name] = ActorGroup(role, [FusedHandle(host, key, role.name)], self.call_timeout_s)
        log.info("roles %s share one process", ", ".join(r.name for r in roles))

    def _create_actors(self) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        host_of = {r.name: g for g in self._fused for r in g}
        for role in self.roles:
            if role.name in host_of:
                if role is host_of[role.name][0]:
                    self._create_fused(host_of[role.name])
                continue
            pg = self.placement_groups[role.colocate or role.name]
            remote_cls = _as_remote(role.actor_class)
            handles = []
            for i in range(role.count):
                kwargs = dict(role.kwargs)
                if role.rank_kwargs is not None:
                    kwargs.update(role.rank_kwargs[i])
                opts: dict[str, Any] = dict(
                    num_cpus=role.num_cpus,
                    num_gpus=role.num_gpus,
                    resources=role.resources or None,
                    max_restarts=role.max_restarts,
                    max_task_retries=role.max_task_retries,
                    max_concurrency=role.max_concurrency,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        placement_group=pg, placement_group_bundle_index=i
                    ),
                    runtime_env={"env_vars": _thread_env(role.num_cpus, role.niceness)},
                )
                handles.append(remote_cls.options(**opts).remote(**kwargs))
            self.groups[role.name] = ActorGroup(role, handles, self.call_timeout_s)
            if role.ready_first:
                self.groups[role.name].wait([h.__ray_ready__.remote() for h in handles], "__init__")
        # Fail here, naming the role, if a constructor raises (not later inside a step).
        for name, group in self.groups.items():
            group.wait([h.__ray_ready__.remote() for h in group.handles], "__init__")
            log.debug("role %s ready (%d)", name, len(group))

    def shutdown(self) -> None:
        """Kill every actor, remove every placement group this graph created and clear its
        autoscaler request."""
        try:
            import ray
            from ray.util.placement_group import remove_placement_group
        except ImportError:
            return
        if not ray.is_initialized():
            return
        if self._requested:
            try:
                _request_resources([])
            except Exception as e:  # teardown goes on; an autoscaler keeps the request until overridden
                log.warning("could not clear the autoscaler resource request: %s", e)
            self._requested = False
        from troupe.platform.fused import is_fused

        handles = [h for group in self.groups.values() for h in group.handles if not is_fused(h)]
        for h in handles + self.hosts:
            try:
                ray.kill(h, no_restart=True)
            except Exception:  # already dead: nothing to release
                pass
        self.hosts.clear()
        for pg in self.placement_groups.values():
            try:
                remove_placement_group(pg)
            except Exception:  # already removed
                pass
        self.groups.clear()
        self.placement_groups.clear()


def unplaced_fixes(plan: Mapping[str, Sequence[Mapping[str, float]]]) -> str:
    """What a user can do about bundles that are not granted, the laptop's fix among them."""
    cpus = sum(float(b.get("CPU", 0.0)) for bundles in plan.values() for b in bundles)
    return ("Lower the roles' num_cpus/num_gpus or counts, or add nodes (an autoscaling cluster grows on pending "
            f"groups); on a laptop, run.num_cpus={max(1, math.ceil(cpus - 1e-9))} gives the local cluster that "
            "troupe run starts enough CPUs for every bundle (its actors then share the cores).")


def live_node_types() -> dict[str, dict[str, float]]:
    """The resources of each node alive now, as node types named ``node <id prefix>``."""
    import ray

    out = {}
    for node in ray.nodes():
        if node.get("Alive"):
            res = {k: float(v) for k, v in (node.get("Resources") or {}).items()
                   if not k.startswith(("node:", "memory", "object_store_memory"))}
            out[f"node {str(node.get('NodeID', '?'))[:8]}"] = res
    return out


def autoscaler_activity() -> str:
    """What the autoscaler reports launching, starting or failing to start ("" when no
    autoscaler status is published, e.g. on a fixed-size cluster)."""
    try:
        report = ray_internal.autoscaling_status().get("autoscaler_report") or {}
    except Exception:  # not connected, or a status Ray no longer publishes: only the hint is lost
        return ""
    if not report:
        return ""
    parts = [f"launching {n} {t}" for t, n in (report.get("pending_launches") or {}).items()]
    starting = report.get("pending_nodes") or []
    if starting:
        parts.append(f"{len(starting)} node(s) starting")
    failed = report.get("failed_nodes") or []
    if failed:
        parts.append(f"{len(failed)} node(s) failed to start ({', '.join(sorted({str(f[-1]) for f in failed}))})")
    return "autoscaler: " + ("; ".join(parts) if parts else "launching nothing")


def _request_resources(bundles: list[dict[str, float]]) -> None:
    from ray.autoscaler.sdk import request_resources

    request_resources(bundles=[dict(b) for b in bundles])


# glibc serves an allocation above its mmap threshold (128 KiB at first) with fresh pages and
# unmaps them on free, so each step's activations, logits and every token's grown KV cache fault
# their memory in again. Actors keep freed memory in the heap instead: a 150k-parameter model's
# CPU update and generate ran about 10% faster (neutral at 4M). A value set in the driver's
# environment wins; the variables mean nothing off glibc.
ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": str(64 << 20), "MALLOC_TRIM_THRESHOLD_": str(256 << 20)}


def _thread_env(num_cpus: float, niceness: int = 0) -> dict[str, str]:
    n = str(torch_threads_for(num_cpus))
    # Ray starts workers at nice 15; a role's actors are the run's compute, so they run at normal
    # priority (as Ray does for a job's driver), or any other busy process on the node starves
    # them; a role that asks for a lower priority (`Role.niceness`) gets it.
    return {"OMP_NUM_THREADS": n, "MKL_NUM_THREADS": n, "TROUPE_TORCH_THREADS": n, "TOKENIZERS_PARALLELISM": "false",
            "RAY_worker_niceness": str(niceness), **{k: os.environ.get(k, v) for k, v in ALLOCATOR_ENV.items()}}


def _as_remote(cls: type) -> Any:
    import ray

    if isinstance(cls, ray.actor.ActorClass):
        return cls
    return ray.remote(cls)


def _fmt_resources(res: dict[str, float]) -> str:
    keep = {k: v for k, v in res.items() if not k.startswith(("node:", "memory", "object_store_memory"))}
    return ", ".join(f"{k}={v:g}" for k, v in sorted(keep.items())) or "(none)"
