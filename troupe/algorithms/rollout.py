"""One rollout and one update, as calls that return at once and are waited on later.

`PolicyGraph.rollout` starts the engines' generate calls and, in the same breath, the reward
call on their batches: the reward actor waits for the batches itself, so scoring starts the
moment they exist, with no round trip through the driver. `Rollout.result()` waits. A
generate call lost to a dead or straggling engine is re-issued once the engine is back, and
the batches are then scored anew; so is a score call lost to a dead reward actor. Several rollouts (the arms of a comparison) can be in flight
at once; so can several updates (`PendingUpdate`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from troupe.algorithms.policy_graph import PolicyGraph


@dataclasses.dataclass
class RolloutResult:
    """A finished rollout: Batch refs in prompt order (the driver does not pull them), the
    rewards and per-row reward extras, the rows whose reward raised, and the timings."""

    batches: list[Any]
    rewards: torch.Tensor | None
    extras: dict[str, torch.Tensor]
    errors: list[dict[str, Any]]
    faults: int  # generate calls re-issued in this rollout
    generate_s: float
    reward_s: float


@dataclasses.dataclass
class _Call:
    engine: int
    args: tuple
    kwargs: dict[str, Any]
    ref: Any


class Rollout:
    """A rollout in flight on one policy's engines (and its reward call, unless ``score=False``)."""

    def __init__(self, policy: PolicyGraph, prompts: list[str], rows: list[dict], sampling: Any, seed: int,
                 option_letters: list[str] | None = None, score: bool = True, reward: str = "reward") -> None:
        self.policy = policy
        self.reward = reward
        self.t0 = time.perf_counter()
        engines = policy.role("rollout")
        n = len(engines)
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        self.calls: list[_Call] = []
        for i in range(n):
            lo, hi = bounds[i], bounds[i + 1]
            if hi > lo:
                kwargs: dict[str, Any] = {"seed": seed + i}
                if option_letters is not None:
                    kwargs["option_letters"] = option_letters[lo:hi]
                args = (prompts[lo:hi], sampling, rows[lo:hi])
                self.calls.append(_Call(i, args, kwargs, engines[i].generate.remote(*args, **kwargs)))
        # The batches the early reward call was started on; a re-issue replaces some of them.
        self.early_batches = [c.ref for c in self.calls]
        self._score_ref = policy.role(reward)[0].score.remote(self.early_batches) if score else None
        self._batches: list[Any] | None = None
        self._faults = 0
        self._generate_s = 0.0
        self._result: RolloutResult | None = None

    def batches(self) -> list[Any]:
        """Wait for every engine's Batch, re-issuing lost calls; the refs in prompt order."""
        if self._batches is None:
            out = []
            for call in self.calls:
                ref, reissued = self.policy.wait_generate(call.engine, call.args, call.kwargs, call.ref)
                self._faults += reissued
                out.append(ref)
            self._batches = out
            self._generate_s = time.perf_counter() - self.t0
        return self._batches

    def result(self) -> RolloutResult:
        """Wait for the batches and their rewards (scored anew after a re-issue)."""
        if self._result is not None:
            return self._result
        batches = self.batches()
        t1 = time.perf_counter()
        scored: dict[str, Any] = {"rewards": None, "extras": {}, "errors": []}
        if self._score_ref is not None:
            fresh = batches != self.early_batches
            ref = self.policy.role(self.reward)[0].score.remote(batches) if fresh else self._score_ref
            scored = self.policy.wait_score(self.reward, batches, ref)
        self._result = RolloutResult(batches, scored["rewards"], scored.get("extras", {}), scored["errors"],
                                     self._faults, self._generate_s, time.perf_counter() - t1)
        return self._result


class PendingUpdate:
    """An update on every learner rank and the weight sync queued behind it, submitted together:
    the publish waits for the update on learner rank 0 and the engines install it as soon as it
    exists, with no round trip through the driver in between."""

    def __init__(self, policy: PolicyGraph, batches: list[Any], extras: dict[str, Any],
                 before_sync: Callable[[], dict[str, float]] | None = None) -> None:
        """``before_sync`` holds the sync back until the update is done and it has returned (its
        metrics join the update's): the engines generating ahead (`Lookahead.confirm`)."""
        self.policy = policy
        self.t0 = time.perf_counter()
        self.refs = [h.update.remote(batches, extras) for h in policy.role("learner").handles]
        self.before_sync = before_sync
        self.sync = policy.sync_begin() if before_sync is None else None
        self._metrics: dict[str, float] | None = None

    def result(self) -> dict[str, float]:
        """The learner's metrics (mean over ranks); ``time/update_s`` runs until they arrive,
        ``time/sync_s`` is the wait for the installs after that."""
        if self._metrics is None:
            per_rank = self.policy.role("learner").wait(self.refs, "update")
            metrics = {k: float(sum(m[k] for m in per_rank) / len(per_rank)) for k in per_rank[0]}
            now = time.perf_counter()
            metrics["time/update_s"] = now - self.t0
            if self.sync is None:
                metrics.update(self.before_sync())
                self.sync = self.policy.sync_begin()
                now = self.sync.t
            metrics.update(self.policy.sync_end(self.sync, since=now))
            self._metrics = metrics
        return self._metrics
