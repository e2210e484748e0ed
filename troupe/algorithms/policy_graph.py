"""The rollout → reward → learner graph that LLM algorithms share (GRPO, BPO, OPD, ...).

`PolicyGraph` declares the roles from the common config sections and offers the calls an
algorithm's `step` is written with: `rollout` (generate and score, see `rollout.py`) or
`rollout_at` (a step's rollout, which ``run.staleness > 0`` starts ahead of the step, see
`lookahead.py`), `update_and_sync`, `evaluate`, `save` and `load`. Data moves as object refs;
the driver pulls only rewards and metrics.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from troupe.actors.learner import Learner
from troupe.actors.models import chat_template_text
from troupe.actors.reward import RuleReward
from troupe.actors.reward_model import RewardModel
from troupe.actors.scorer import Scorer
from troupe.actors.transport.base import (
    PendingSync,
    Transport,
    choose_transport,
    pack_state_dict,
    unpack_state_dict,
)
from troupe.algorithms.icrm.reward import ICRMReward
from troupe.algorithms.judge.reward import JudgeReward, judge_reward_kwargs
from troupe.algorithms.lookahead import FinishedRollout, Lookahead, RolloutRequest, check_sync_checkpoint
from troupe.algorithms.rollout import PendingUpdate, Rollout
from troupe.platform.checkpoint import atomic_write_json, load_state_dict, save_state_dict
from troupe.platform.config import to_dict
from troupe.platform.errors import ConfigError, RemoteCallError
from troupe.platform.fused import is_fused
from troupe.platform.placement import ActorGraph, Role
from troupe.platform.registry import ROLLOUT_BACKENDS, TRANSPORTS


def rollout_class(backend: str) -> type:
    """The engine class registered as ``backend`` in ROLLOUT_BACKENDS; its module (vLLM's
    included) is imported only when chosen."""
    return ROLLOUT_BACKENDS.resolve(backend, "rollout.backend")


def check_policy_config(cfg: Any) -> None:
    """The checks that need several sections of a policy config: the rollout backend's own
    (``check_config(cfg)`` on its engine class, e.g. vLLM's GPU memory and dtype rules), those
    of the weight transport the policy will use, and whether that transport can serve
    ``run.staleness``; each a `ConfigError` naming the key."""
    engine_check = getattr(rollout_class(cfg.rollout.backend), "check_config", None)
    if callable(engine_check):
        engine_check(cfg)
    transport = choose_transport(cfg.rollout.weight_transport, cfg.learner.lora.enabled)
    if cfg.run.staleness > 0 and transport == "nccl":
        # nccl keeps no copy of a version once it is sent: a restarted engine gets the newest.
        raise ConfigError(f"run.staleness={cfg.run.staleness} with rollout.weight_transport=nccl: an engine "
                          "restarted while generating ahead would be given the learner's newest weights, not the "
                          "older ones its batch was sampled with; set rollout.weight_transport=object_store, or "
                          "run.staleness=0")
    TRANSPORTS.get(transport).check_policy_config(cfg)


def step_seed(seed: int, step: int, salt: str = "") -> int:
    """A 31-bit seed that depends only on (run seed, step, salt): resumed runs resample identically."""
    h = hashlib.blake2b(f"{seed}:{step}:{salt}".encode(), digest_size=4).digest()
    return int.from_bytes(h, "little") & 0x7FFFFFFF


class PolicyGraph:
    """Roles and calls of a policy-optimisation graph built from a config with ``model``,
    ``rollout``, ``reward``, ``learner`` and ``reference`` sections."""

    def __init__(self, cfg: Any, model_path: str, reward_kwargs: dict[str, Any] | None = None, prefix: str = "",
                 shared_roles: bool = True, reward_role: str = "reward", checker_role: str = "checker",
                 learner_cls: type = Learner, num_steps: int | None = None) -> None:
        """``prefix`` names this policy's learner and rollout roles, so several policies (the arms
        of a comparison) live in one graph; they share one reward and one reference role, which
        only the policy built with ``shared_roles=True`` declares. ``reward_role`` names the role
        that scores this policy's rollouts and ``checker_role`` the one `evaluate` scores with, when
        arms are trained against different rewards and evaluated by one gold reward.
        ``learner_cls`` is the learner's actor class: `Learner` or a subclass with more calls
        (a distillation learner's). ``num_steps`` bounds generation ahead (``run.staleness``): no
        rollout is started for a step at or past it (default ``run.steps``; lower for an arm whose
        budget ends before the run does)."""
        self.cfg = cfg
        self.prefix = prefix
        self.shared_roles = shared_roles
        self.names = {"learner": f"{prefix}learner", "rollout": f"{prefix}rollout", "reward": reward_role,
                      "checker": checker_role, "reference": "reference"}
        self.model_path = str(model_path)
        self.reward_kwargs = reward_kwargs or {}
        self.learner_cls = learner_cls
        self.graph: ActorGraph | None = None
        self.faults = 0  # rollout calls re-issued after an engine died or timed out
        self.max_reissues = 2
        self._transport: Transport | None = None  # how weights reach the engines: see `transport`
        # run.staleness > 0: the rollouts started ahead of their steps (None: each step after the update before it).
        staleness = cfg.run.staleness
        last = cfg.run.steps if num_steps is None else min(cfg.run.steps, num_steps)
        self.lookahead = Lookahead(staleness, last, lambda r: self.rollout(**vars(r))) if staleness else None

    def role(self, name: str) -> Any:
        """This policy's actor group for ``name`` (learner, rollout, reward or reference)."""
        return self.graph[self.names[name]]

    # -- roles ------------------------------------------------------------------------
    def roles(self) -> list[Role]:
        c = self.cfg
        device = c.model.device
        template = chat_template_text(getattr(c.model, "chat_template", None))  # read here, in the driver
        rc = c.rollout
        learner_kwargs = {"model_path": self.model_path, "config": to_dict(c.learner), "world_size": c.learner.num_ranks,
                          "seed": c.run.seed, "sampling": to_dict(rc.sampling), "run_steps": c.run.steps,
                          "max_len": rc.sampling.max_new_tokens, "device": device, "chat_template": template}
        colocate = f"{self.prefix}policy" if rc.colocate_with_learner else None
        engine_cls = rollout_class(rc.backend)
        learner = Role(self.names["learner"], self.learner_cls, count=c.learner.num_ranks, num_cpus=c.learner.num_cpus,
                       num_gpus=c.learner.num_gpus, colocate=colocate,
                       kwargs=learner_kwargs, rank_kwargs=[{"rank": r} for r in range(c.learner.num_ranks)])
        # An engine that sizes its memory at start-up (vLLM) starts, and is ready, before a
        # learner on its GPU loads anything.
        first = colocate is not None and getattr(engine_cls, "starts_before_colocated", False)
        rollout = Role(self.names["rollout"], engine_cls, count=rc.num_engines, num_cpus=rc.num_cpus,
                       num_gpus=rc.num_gpus, colocate=colocate, kwargs=self._rollout_kwargs(),
                       max_restarts=rc.max_restarts, ready_first=first, niceness=rc.niceness)
        # Several policies (the arms of a comparison) step side by side: each fuses apart.
        learner.fuse_group = rollout.fuse_group = self.prefix or None
        if c.run.staleness:  # the engines generate while the learner updates: not in one process
            learner.fusable = rollout.fusable = False
        roles = [rollout, learner] if first else [learner, rollout]
        if not self.shared_roles:
            return roles
        roles += self._reward_roles()
        if c.learner.kl_coef > 0:
            roles.append(Role("reference", Scorer, num_cpus=c.reference.num_cpus, num_gpus=c.reference.num_gpus,
                              kwargs={"model_path": self.model_path, "dtype": c.model.dtype, "device": device,
                                      "chat_template": template}))
        return roles

    def _reward_roles(self) -> list[Role]:
        """The "reward" role: `RuleReward` (``reward.kind=rule``), `RewardModel` (``model``),
        `JudgeReward` (``judge``) or `ICRMReward` (``icrm``), each restarted when it dies. A reward model or judge is no exact
        checker, so it comes with a "checker" role (the rule ``reward.fn``) that `evaluate` scores
        held-out accuracy with."""
        r = self.cfg.reward
        rule = {"fn": r.fn, "on_error": r.on_error, "kwargs": self.reward_kwargs}
        if r.kind == "rule":
            return [Role("reward", RuleReward, num_cpus=r.num_cpus, kwargs=rule, max_restarts=r.max_restarts)]
        if r.kind == "model":
            cls, kwargs = RewardModel, {"path": r.path, "dtype": r.dtype, "device": r.device,
                                        "batch_size": r.batch_size, "max_length": r.max_length}
        elif r.kind == "icrm":
            cls, kwargs = ICRMReward, {"path": r.path, "estimate": r.icrm_estimate, "reference": r.icrm_reference,
                                       "device": r.device, "batch_size": r.batch_size}
        else:
            cls, kwargs = JudgeReward, judge_reward_kwargs(r, self.cfg.run.seed)
        return [Role("reward", cls, num_cpus=r.num_cpus, num_gpus=r.num_gpus, kwargs=kwargs,
                     max_restarts=r.max_restarts),
                Role("checker", RuleReward, num_cpus=0.05, kwargs=rule, max_restarts=r.max_restarts)]

    def _rollout_kwargs(self) -> dict[str, Any]:
        return {"model_path": self.model_path, **rollout_class(self.cfg.rollout.backend).config_kwargs(self.cfg)}

    def setup(self, graph: ActorGraph) -> None:
        self.graph = graph
        learners = graph[self.names["learner"]]
        if len(learners) > 1:
            addr, port = learners.wait([learners[0].master_address.remote()], "master_address")[0]
            learners.call("init_distributed", addr, port)
        self.transport.setup()

    @property
    def transport(self) -> Transport:
        """How this policy's weights reach its engines (`choose_transport` names it), built on first use."""
        if self._transport is None:
            c = self.cfg
            cls = TRANSPORTS.get(choose_transport(c.rollout.weight_transport, c.learner.lora.enabled))
            # `groups.get`: a graph assembled by hand may hold only engines, which recovery needs alone.
            self._transport = cls(self.graph.groups.get(self.names["learner"]), self.role("rollout"))
        return self._transport

    # -- the calls ----------------------------------------------------------------------
    def rollout(self, prompts: list[str], rows: list[dict], sampling: Any, seed: int,
                option_letters: list[str] | None = None, score: bool = True, reward: str = "reward") -> Rollout:
        """Start generating ``prompts`` on the engines and scoring the result; returns at once,
        and `Rollout.result()` waits. ``option_letters`` asks the engines for multiple-choice
        letter log-probs; ``score=False`` skips the reward; ``reward`` names the role that scores
        ("reward", or "checker" for the exact checker beside a reward model)."""
        return Rollout(self, prompts, rows, sampling, seed, option_letters, score, reward)

    def rollout_at(self, step: int, request: Callable[[int], RolloutRequest]) -> Rollout | FinishedRollout:
        """The rollout of ``step``, where ``request(s)`` says what step s generates. With
        ``run.staleness = k > 0`` it was started during the update of an earlier step (at most k
        back), and `update_and_sync` starts the next ones; with 0 it starts now (`rollout`)."""
        if self.lookahead is None:
            return self.rollout(**vars(request(step)))
        return self.lookahead.take(step, request)

    def wait_generate(self, i: int, args: tuple, kwargs: dict[str, Any], ref: Any) -> tuple[Any, int]:
        """Wait for engine ``i``'s generate call; a call lost to a dead engine is re-issued once
        the engine is back (restarted with its weights reset, so the last weights are reloaded
        first). An engine that does not answer within the call timeout is a straggler: it is
        restarted and its call re-issued the same way. Returns the Batch ref and the number of
        re-issues, which are also counted in `faults`."""
        import ray

        engines = self.role("rollout")
        for attempt in range(self.max_reissues + 1):
            try:
                ray.get(ref, timeout=engines.timeout_s)
                return ref, attempt
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as e:
                if attempt == self.max_reissues:
                    raise RemoteCallError(f"rollout engine {i}: generate failed {attempt + 1} times; "
                                          f"last error: {e}") from e
                if is_fused(engines[i]):
                    raise RemoteCallError(
                        f"rollout engine {i}: generate {'timed out' if isinstance(e, ray.exceptions.GetTimeoutError) else 'failed'}"
                        f" ({e}); the engine shares one process with other roles and is not restarted on its own: "
                        "set run.fuse_roles=false for per-role restarts, or raise run.call_timeout_s") from e
                self.faults += 1
                if isinstance(e, ray.exceptions.GetTimeoutError):
                    # A straggler is still busy with the call, and any call queues behind it.
                    ray.kill(engines[i], no_restart=False)
                self._recover_engine(i)
                ref = engines[i].generate.remote(*args, **kwargs)
        raise AssertionError("unreachable")

    def wait_score(self, role: str, batches: list[Any], ref: Any) -> dict[str, Any]:
        """Wait for a reward role's score call; a call lost to a dead reward actor is re-issued once
        Ray has restarted it (its constructor reloads the function or model), and counted in
        `faults`. A reward that does not answer within the call timeout stops the step with an
        error naming the call."""
        import ray

        group = self.graph[self.names[role]]
        for attempt in range(self.max_reissues + 1):
            try:
                return group.wait([ref], "score")[0]
            except RemoteCallError as e:
                if not isinstance(e.__cause__, ray.exceptions.RayActorError) or attempt == self.max_reissues:
                    raise
                self.faults += 1
                self._await_restart(group, role)
                ref = group[0].score.remote(batches)
        raise AssertionError("unreachable")

    def _await_restart(self, group: Any, role: str) -> None:
        """Wait until a restarted actor of ``group`` has run its constructor again."""
        import ray

        patience = self.graph.timeout_s + group.timeout_s
        deadline = time.monotonic() + patience
        while True:
            try:
                ray.get(group[0].__ray_ready__.remote(), timeout=10)
                return
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                if time.monotonic() > deadline:
                    raise RemoteCallError(
                        f"{role} actor did not come back within {patience:.0f}s (run.placement_timeout_s + "
                        "run.call_timeout_s)") from None
                time.sleep(0.5)

    def _recover_engine(self, i: int) -> None:
        """Wait until a restarted engine answers, then give it the current weights."""
        import ray

        engines = self.role("rollout")
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
        self.transport.recover(i)

    def _recover_sync(self, pending: PendingSync, error: RemoteCallError) -> float:
        """An engine died between its generate and the weight sync (Ray restarts it): wait for
        it, give it the newest weights (`_recover_engine`), count a fault; the bytes the update
        carried. A fused engine, or a failure that is not an engine's, raises ``error``."""
        import ray

        engines = self.role("rollout")
        lost = []
        for i, ref in enumerate(pending.loads[:len(engines)]):
            try:
                ray.get(ref, timeout=engines.timeout_s)
            except ray.exceptions.RayActorError:
                lost.append(i)
            except ray.exceptions.GetTimeoutError:
                raise error from None
        if not lost or any(is_fused(engines[i]) for i in lost):
            raise error
        for i in lost:
            self.faults += 1
            self._recover_engine(i)
        learners = self.role("learner")
        return float(learners.wait([pending.update_ref], "publish_weights")[0].nbytes)

    def pop_faults(self) -> int:
        """Re-issues since the last call: a step reports them, so each is counted once."""
        n, self.faults = self.faults, 0
        return n

    def reference_logprobs(self, batch_refs: list[Any]) -> Any:
        """An object ref of the reference log-probs (the driver does not pull them)."""
        ref = self.role("reference")
        return ref[0].logprobs.remote(batch_refs, to_dict(self.cfg.rollout.sampling))

    def update_and_sync(self, batch_refs: list[Any], extras: dict[str, Any]) -> PendingUpdate:
        """Start the update on every learner rank and the weight sync behind it; returns at once,
        and `PendingUpdate.result()` waits for the metrics. With ``learner.kl_coef > 0`` the
        reference log-probs go straight from the reference scorer to the learners. With
        ``run.staleness > 0`` the next steps' rollouts start beside the update, and the metrics
        hold the step's ``staleness``."""
        if self.cfg.learner.kl_coef > 0 and "ref_logprobs" not in extras:
            extras = {**extras, "ref_logprobs": self.reference_logprobs(batch_refs)}
        if self.lookahead is None:
            return PendingUpdate(self, batch_refs, extras)
        # The sync waits for the generation started here: see `Lookahead.confirm`.
        pending = PendingUpdate(self, batch_refs, extras, before_sync=self.lookahead.confirm)
        self.lookahead.fill()
        return pending

    def start_ahead(self) -> None:
        """For a step that updates its learners itself rather than through `update_and_sync`:
        once the update is submitted, start the next steps' rollouts (``run.staleness > 0``)."""
        if self.lookahead is not None:
            self.lookahead.fill()

    def confirm_ahead(self) -> dict[str, float]:
        """Before that step's weight sync: wait for the rollouts `start_ahead` started; the
        step's ``staleness`` ({} with ``run.staleness = 0``)."""
        return {} if self.lookahead is None else self.lookahead.confirm()

    def sync_weights(self) -> dict[str, float]:
        """Publish from learner rank 0 and install on every engine; returns bytes and seconds."""
        return self.sync_end(self.sync_begin())

    def sync_begin(self) -> PendingSync:
        """Start publishing from learner rank 0 and installing on every engine; `sync_end` waits."""
        return self.transport.begin()

    def sync_end(self, pending: PendingSync, since: float | None = None) -> dict[str, float]:
        """Wait for `sync_begin`'s installs; ``time/sync_s`` counts from ``since`` (default: the begin).
        An engine lost before its install is recovered here (`_recover_sync`)."""
        import ray

        try:
            nbytes = self.transport.end(pending)
        except RemoteCallError as e:
            if not isinstance(e.__cause__, ray.exceptions.RayActorError):
                raise
            nbytes = self._recover_sync(pending, e)
        counts = self.transport.sync_metrics()
        # A sync that had to leave its transport (nccl after a restart) is a fault, counted in the report.
        self.faults += int(counts.get("sync/object_store_fallbacks", 0))
        return {"sync/bytes": nbytes, "time/sync_s": time.perf_counter() - (pending.t if since is None else since),
                **counts}

    @property
    def last_update(self) -> Any:
        """Ref of the newest WeightUpdate in the object store: what a restarted engine is given."""
        return None if self._transport is None else self._transport.last_update

    @last_update.setter
    def last_update(self, ref: Any) -> None:
        self.transport.last_update = ref

    def evaluate(self, rows: list[dict], sampling: Any, seed: int = 0) -> dict[str, float]:
        """Mean reward on ``rows`` (accuracy for a 0/1 reward), scored by the exact checker when the
        training reward is a reward model."""
        role = "checker" if self.names["checker"] in self.graph.groups else "reward"
        out = self.rollout([r["prompt"] for r in rows], rows, sampling, seed, reward=role).result()
        return {"reward": float(out.rewards.mean())}

    # -- checkpoints -----------------------------------------------------------------------
    def save(self, ckpt_dir: Path) -> None:
        learners = self.role("learner")
        packed, meta = learners.wait([learners[0].get_state.remote()], "get_state")[0]
        save_learner_state(ckpt_dir, packed, meta)
        if self.lookahead is not None:  # the rollouts generated ahead are part of the state
            self.lookahead.save(ckpt_dir, self.prefix)

    def load(self, ckpt_dir: Path) -> None:
        if self.lookahead is None:
            check_sync_checkpoint(ckpt_dir, self.prefix)
        else:
            self.lookahead.load(ckpt_dir, self.prefix)
        tensors, meta = load_learner_state(ckpt_dir)
        self.role("learner").call("set_state", pack_state_dict(tensors), meta)
        self.sync_weights()


def save_learner_state(ckpt_dir: Path, packed: dict[str, Any], meta: dict[str, Any]) -> None:
    """Write a learner's `get_state` as ``learner.safetensors`` (``model/`` weights and ``optim/``
    moments, each in its own dtype: bf16 stays bf16) and ``learner.json`` (the rest)."""
    # A copy: tied weights share memory, which safetensors refuses to write.
    tensors = {k: t.clone() for k, t in unpack_state_dict(packed).items()}
    save_state_dict(ckpt_dir / "learner.safetensors", tensors)
    atomic_write_json(ckpt_dir / "learner.json", meta)


def load_learner_state(ckpt_dir: Path, prefix: str = "") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """``(tensors, json_state)`` of a checkpoint written by `save_learner_state`, tensors in their
    own dtype; ``prefix="model/"`` reads the weights only. Checkpoints written before bf16 was
    stored as bf16 hold int16 bit patterns, named with their dtype in learner.json's ``views``."""
    meta = json.loads((ckpt_dir / "learner.json").read_text())
    views = meta.pop("views", {})
    tensors = load_state_dict(ckpt_dir / "learner.safetensors", prefix)
    return {k: t.view(getattr(torch, views[k])) if k in views else t for k, t in tensors.items()}, meta


def group_rows(rows: list[dict], group_size: int) -> tuple[list[str], list[dict], torch.Tensor]:
    """Repeat each row ``group_size`` times; returns prompts, rows and group ids."""
    prompts = [r["prompt"] for r in rows for _ in range(group_size)]
    rep = [r for r in rows for _ in range(group_size)]
    gids = torch.arange(len(rows)).repeat_interleave(group_size)
    return prompts, rep, gids
