"""The rollout → reward → learner graph that LLM algorithms share (GRPO, BPO, OPD, ...).

`PolicyGraph` declares the roles from the common config sections and offers the fan-out
calls an algorithm's `step` is written with: generate, score, reference log-probs, update,
weight sync, evaluate, save and load. Data moves as object refs; the driver pulls only
rewards and metrics.
"""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from troupe.actors.learner import Learner
from troupe.actors.reward import RuleReward
from troupe.actors.scorer import Scorer
from troupe.platform.checkpoint import atomic_write_json, load_state_dict, save_state_dict
from troupe.platform.config import to_dict
from troupe.platform.errors import RemoteCallError
from troupe.platform.placement import ActorGraph, Role


@dataclasses.dataclass
class PendingRollout:
    """Generate calls in flight: (engine index, args, kwargs, ref) per engine."""

    calls: list[tuple[int, tuple, int, Any]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PendingScore:
    """A score call started on a rollout's Batch refs before they were ready."""

    batch_refs: list[Any]
    ref: Any


@dataclasses.dataclass
class PendingSync:
    """A weight sync in flight: its start time, the install calls, and the update's ref (object
    store) or byte count (nccl, whose manifest the driver already holds)."""

    t: float
    loads: list[Any]
    update_ref: Any = None
    nbytes: float | None = None


def rollout_class(backend: str) -> type:
    """The engine class for a backend; vLLM is imported only when chosen."""
    if backend == "hf":
        from troupe.actors.rollout_hf import HFRolloutEngine

        return HFRolloutEngine
    if backend == "vllm":
        from troupe.actors.rollout_vllm import VLLMRolloutEngine

        return VLLMRolloutEngine
    raise ValueError(f"rollout.backend={backend!r}: expected 'hf' or 'vllm'")


def step_seed(seed: int, step: int, salt: str = "") -> int:
    """A 31-bit seed that depends only on (run seed, step, salt): resumed runs resample identically."""
    h = hashlib.blake2b(f"{seed}:{step}:{salt}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


class PolicyGraph:
    """Roles and calls of a policy-optimisation graph built from a config with ``model``,
    ``rollout``, ``reward``, ``learner`` and ``reference`` sections."""

    def __init__(self, cfg: Any, model_path: str, reward_kwargs: dict[str, Any] | None = None, prefix: str = "",
                 shared_roles: bool = True) -> None:
        """``prefix`` names this policy's learner and rollout roles, so several policies (the arms
        of a comparison) live in one graph; they share one reward and one reference role, which
        only the policy built with ``shared_roles=True`` declares."""
        self.cfg = cfg
        self.prefix = prefix
        self.shared_roles = shared_roles
        self.names = {"learner": f"{prefix}learner", "rollout": f"{prefix}rollout", "reward": "reward",
                      "reference": "reference"}
        self.model_path = str(model_path)
        self.reward_kwargs = reward_kwargs or {}
        self.graph: ActorGraph | None = None
        self.faults = 0  # rollout calls re-issued after an engine died or timed out
        self.max_reissues = 2
        self.last_update: Any = None  # ref of the newest WeightUpdate, for restarted engines

    def _role(self, name: str) -> Any:
        return self.graph[self.names[name]]

    # -- roles ------------------------------------------------------------------------
    def roles(self) -> list[Role]:
        c = self.cfg
        device = c.model.device
        rc = c.rollout
        learner_kwargs = {"model_path": self.model_path, "config": to_dict(c.learner), "world_size": c.learner.num_ranks,
                          "seed": c.run.seed, "temperature": rc.sampling.temperature,
                          "max_len": rc.sampling.max_new_tokens, "device": device}
        colocate = f"{self.prefix}policy" if rc.colocate_with_learner else None
        roles = [
            Role(self.names["learner"], Learner, count=c.learner.num_ranks, num_cpus=c.learner.num_cpus,
                 num_gpus=c.learner.num_gpus, colocate=colocate,
                 kwargs=learner_kwargs, rank_kwargs=[{"rank": r} for r in range(c.learner.num_ranks)]),
            Role(self.names["rollout"], rollout_class(rc.backend), count=rc.num_engines, num_cpus=rc.num_cpus,
                 num_gpus=rc.num_gpus, colocate=colocate, kwargs=self._rollout_kwargs(), max_restarts=rc.max_restarts),
        ]
        if not self.shared_roles:
            return roles
        roles.append(Role("reward", RuleReward, num_cpus=c.reward.num_cpus,
                          kwargs={"fn": c.reward.fn, "on_error": c.reward.on_error, "kwargs": self.reward_kwargs}))
        if c.learner.kl_coef > 0:
            roles.append(Role("reference", Scorer, num_cpus=c.reference.num_cpus, num_gpus=c.reference.num_gpus,
                              kwargs={"model_path": self.model_path, "dtype": c.model.dtype, "device": device}))
        return roles

    def _rollout_kwargs(self) -> dict[str, Any]:
        c = self.cfg
        kw: dict[str, Any] = {"model_path": self.model_path, "dtype": c.model.dtype, "seed": c.run.seed}
        if c.rollout.backend == "vllm":
            kw["gpu_memory_utilization"] = c.rollout.gpu_memory_utilization
            kw["max_model_len"] = c.rollout.max_model_len
        else:
            kw["device"] = c.model.device
        return kw

    def setup(self, graph: ActorGraph) -> None:
        self.graph = graph
        learners = graph[self.names["learner"]]
        if len(learners) > 1:
            addr, port = learners.wait([learners[0].master_address.remote()], "master_address")[0]
            learners.call("init_distributed", addr, port)
        if self.nccl:
            self._init_weight_group()

    @property
    def nccl(self) -> bool:
        return self.cfg.rollout.weight_transport == "nccl" and not self.cfg.learner.lora.enabled

    def _init_weight_group(self) -> None:
        """One nccl group: learner rank 0 is rank 0, then every engine's workers."""
        from troupe.actors.transport import nccl

        learners, engines = self._role("learner"), self._role("rollout")
        addr, port = learners.wait([learners[0].master_address.remote()], "master_address")[0]
        plan = nccl.plan_group(addr, port, engines.call("weight_group_size"))
        # Launch every member before waiting: rank 0 hosts the rendezvous.
        refs = [h.init_weight_group.remote(**plan.engine_args(i)) for i, h in enumerate(engines.handles)]
        refs.append(learners[0].init_weight_group.remote(**plan.trainer_args()))
        engines.wait(refs, "init_weight_group")

    # -- the calls ----------------------------------------------------------------------
    def generate(self, prompts: list[str], rows: list[dict], sampling: Any, seed: int,
                 option_letters: list[str] | None = None) -> PendingRollout:
        """Spread prompts over the rollout engines; `wait_batches` collects the results.
        ``option_letters`` asks the engines for multiple-choice letter log-probs."""
        engines = self._role("rollout")
        n = len(engines)
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        pending = PendingRollout()
        for i in range(n):
            lo, hi = bounds[i], bounds[i + 1]
            if hi > lo:
                args = (prompts[lo:hi], sampling, rows[lo:hi])
                kwargs = {"seed": seed + i}
                if option_letters is not None:
                    kwargs["option_letters"] = option_letters[lo:hi]
                pending.calls.append((i, args, kwargs, engines[i].generate.remote(*args, **kwargs)))
        return pending

    def wait_batches(self, pending: PendingRollout | list[Any]) -> list[Any]:
        """Wait for every engine's Batch; a call lost to a dead engine is re-issued once the
        engine is back (restarted with its weights reset, so the last weights are reloaded
        first) and counted in `faults`. An engine that does not answer within the call timeout
        is a straggler: it is restarted and its call re-issued the same way. Returns the Batch
        refs in prompt order."""
        import ray

        if isinstance(pending, list):
            return pending
        engines = self._role("rollout")
        refs = []
        for i, args, kwargs, ref in pending.calls:
            for attempt in range(self.max_reissues + 1):
                try:
                    ray.get(ref, timeout=engines.timeout_s)
                    break
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                    if attempt == self.max_reissues:
                        raise RemoteCallError(f"rollout engine {i}: generate failed {attempt + 1} times; "
                                              f"last error: {e}") from e
                    self.faults += 1
                    if isinstance(e, ray.exceptions.GetTimeoutError):
                        # A straggler is still busy with the call, and any call queues behind it.
                        ray.kill(engines[i], no_restart=False)
                    self._recover_engine(i)
                    ref = engines[i].generate.remote(*args, **kwargs)
            refs.append(ref)
        return refs

    def _recover_engine(self, i: int) -> None:
        """Wait until a restarted engine answers, then give it the current weights."""
        import ray

        engines = self._role("rollout")
        # A restart first waits for resources (a lost node may have to come back), then runs
        # the constructor: the placement timeout plus the call timeout bound it.
        patience = self.graph.timeout_s + engines.timeout_s
        deadline = time.monotonic() + patience
        while True:
            try:
                ray.get(engines[i].get_version.remote(), timeout=10)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise RemoteCallError(
                        f"rollout engine {i} did not come back within {patience:.0f}s (run.placement_timeout_s "
                        "+ run.call_timeout_s): its node may be gone with no other node able to host it"
                    ) from None
                time.sleep(0.5)
        if self.nccl:
            # A restarted engine lost its group: rebuild it, then send the weights it missed.
            self._init_weight_group()
            current = self._role("learner")[0].current_weights.remote()
            engines.wait([engines[i].load_weights.remote(current)], "load_weights")
        elif self.last_update is not None:
            engines.wait([engines[i].load_weights.remote(self.last_update)], "load_weights")

    def pop_faults(self) -> int:
        n, self.faults = self.faults, 0
        return n

    def score_begin(self, pending: PendingRollout) -> PendingScore:
        """Ask the reward actor to score a rollout still in flight: it starts the moment the
        batches exist, with no round trip through the driver. Hand the result to `score`."""
        refs = [ref for *_, ref in pending.calls]
        return PendingScore(refs, self._role("reward")[0].score.remote(refs))

    def score(self, batch_refs: list[Any], started: PendingScore | None = None) -> dict[str, Any]:
        """Rewards of the batches. ``started`` (from `score_begin`) is used when `wait_batches`
        re-issued nothing; after a re-issue the batches are scored anew."""
        reward = self._role("reward")
        if started is not None and started.batch_refs == batch_refs:
            ref = started.ref
        else:
            ref = reward[0].score.remote(batch_refs)
        return reward.wait([ref], "score")[0]

    def reference_logprobs(self, batch_refs: list[Any]) -> Any:
        """An object ref of the reference log-probs (the driver does not pull them)."""
        ref = self._role("reference")
        return ref[0].logprobs.remote(batch_refs, self.cfg.rollout.sampling.temperature or 1.0)

    def update(self, batch_refs: list[Any], extras: dict[str, Any]) -> dict[str, float]:
        return self.update_end(self.update_begin(batch_refs, extras))

    def update_begin(self, batch_refs: list[Any], extras: dict[str, Any]) -> list[Any]:
        """Start the update on every learner rank; `update_end` waits. Several policies' updates
        then run at the same time."""
        return [h.update.remote(batch_refs, extras) for h in self._role("learner").handles]

    def update_end(self, refs: list[Any]) -> dict[str, float]:
        per_rank = self._role("learner").wait(refs, "update")
        return {k: float(np.mean([m[k] for m in per_rank])) for k in per_rank[0]}

    def update_and_sync(self, batch_refs: list[Any], extras: dict[str, Any]) -> dict[str, float]:
        """`update`, then `sync_weights`, submitted together: the publish queues behind the
        update on learner rank 0 and the engines install it as soon as it exists, with no round
        trip through the driver in between. ``time/update_s`` runs until the update's metrics
        arrive, ``time/sync_s`` is the wait after that."""
        t = time.perf_counter()
        refs = self.update_begin(batch_refs, extras)
        sync = self.sync_begin()
        metrics = self.update_end(refs)
        metrics["time/update_s"] = time.perf_counter() - t
        metrics.update(self.sync_end(sync, since=time.perf_counter()))
        return metrics

    def sync_weights(self) -> dict[str, float]:
        """Publish from learner rank 0 and install on every engine; returns bytes and seconds."""
        return self.sync_end(self.sync_begin())

    def sync_begin(self) -> PendingSync:
        """Start publishing from learner rank 0 and installing on every engine; `sync_end` waits."""
        t = time.perf_counter()
        learners, engines = self._role("learner"), self._role("rollout")
        if self.nccl:
            update = learners.wait([learners[0].publish_weights.remote("nccl")], "publish_weights")[0]
            loads = ([h.load_weights.remote(update) for h in engines.handles]
                     + [learners[0].broadcast_weights.remote(update)])
            return PendingSync(t, loads, nbytes=float(update.nbytes))
        update_ref = learners[0].publish_weights.remote()
        self.last_update = update_ref
        return PendingSync(t, [h.load_weights.remote(update_ref) for h in engines.handles], update_ref=update_ref)

    def sync_end(self, pending: PendingSync, since: float | None = None) -> dict[str, float]:
        """Wait for `sync_begin`'s installs; ``time/sync_s`` counts from ``since`` (default: the begin)."""
        learners, engines = self._role("learner"), self._role("rollout")
        engines.wait(pending.loads, "load_weights")
        nbytes = pending.nbytes
        if nbytes is None:  # fetch the update itself: a small message, its arrays stay in the store
            nbytes = float(learners.wait([pending.update_ref], "publish_weights")[0].nbytes)
        return {"sync/bytes": nbytes, "time/sync_s": time.perf_counter() - (pending.t if since is None else since)}

    def evaluate(self, rows: list[dict], sampling: Any, seed: int = 0) -> dict[str, float]:
        """Mean reward on ``rows`` (accuracy for a 0/1 reward)."""
        refs = self.wait_batches(self.generate([r["prompt"] for r in rows], rows, sampling, seed))
        return {"reward": float(self.score(refs)["rewards"].mean())}

    # -- checkpoints -----------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        learners = self._role("learner")
        packed, meta = learners.wait([learners[0].get_state.remote()], "get_state")[0]
        tensors = {k: torch.from_numpy(np.array(a)) for k, (a, _) in packed.items()}
        dtypes = {k: name for k, (_, name) in packed.items() if name}
        save_state_dict(ckpt_dir / "learner.safetensors", tensors)
        atomic_write_json(ckpt_dir / "learner.json", {**meta, "views": dtypes})

    def load(self, ckpt_dir: Path) -> None:
        import json

        meta = json.loads((ckpt_dir / "learner.json").read_text())
        views = meta.pop("views", {})
        tensors = load_state_dict(ckpt_dir / "learner.safetensors")
        packed = {k: (t.numpy(), views.get(k)) for k, t in tensors.items()}
        self._role("learner").call("set_state", packed, meta)
        self.sync_weights()


def group_rows(rows: list[dict], group_size: int) -> tuple[list[str], list[dict], torch.Tensor]:
    """Repeat each row ``group_size`` times; returns prompts, rows and group ids."""
    prompts = [r["prompt"] for r in rows for _ in range(group_size)]
    rep = [r for r in rows for _ in range(group_size)]
    gids = torch.arange(len(rows)).repeat_interleave(group_size)
    return prompts, rep, gids
