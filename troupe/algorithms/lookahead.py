"""Bounded staleness: rollouts generated ahead of the update that trains on them (``run.staleness``).

With ``run.staleness = k >= 1``, `PolicyGraph.update_and_sync` of step t starts the rollouts of
steps t+1 … t+k that are not yet in flight, on the weights the engines hold (those the update
of step t starts from), so generation runs while the learner updates. Step s is then
sampled with weight version ``max(0, s - k)`` (the number of updates the engines had installed)
and trained at learner version s: its staleness, logged per step, is at most k. The engines'
log-probs travel in the batch as the behaviour policy of the loss (PPO's ratio against them,
and ``learner.tis_cap`` for truncated importance weights).

The weight sync of step t waits until the generation it started is in hand. That costs little
(an engine installs the new weights only after its queued generation anyway) and keeps one
version per engine in play: an engine lost while generating ahead is restarted with the
newest update the driver sent through the object store, which is exactly what the lost call
sampled with, and the call is re-issued with its own seed (`PolicyGraph.wait_generate`). The
nccl transport keeps no such copy, so ``run.staleness > 0`` refuses it (`check_policy_config`).
So one step of generation overlaps one update whatever k is: k > 1 makes the data older, not
the step shorter.

Exact resume: a checkpoint holds the rollouts generated ahead as they were generated (their
batches, rewards and versions), and a resumed run trains on those. Regenerating them instead
would need the older weights they were sampled with, which the learner no longer has, and an
engine that samples bit for bit alike after a restart, which vLLM does not promise. A run
extended past its last step (``--resume`` with a larger ``run.steps``) had nothing in flight at
its end, so its first extended step is sampled with the newest weights.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from troupe.algorithms.rollout import RolloutResult
from troupe.platform.checkpoint import atomic_write_bytes, atomic_write_json
from troupe.platform.errors import ConfigError


@dataclasses.dataclass
class RolloutRequest:
    """What `PolicyGraph.rollout` is called with for one step: an algorithm's ``request(step)``
    returns it, so the rollouts of later steps can be started ahead of them."""

    prompts: list[str]
    rows: list[dict]
    sampling: Any
    seed: int
    option_letters: list[str] | None = None
    score: bool = True
    reward: str = "reward"


def steps_ahead(step: int, staleness: int, num_steps: int) -> range:
    """The steps whose rollouts run while step ``step`` updates: up to ``staleness`` ahead, none
    at or past ``num_steps`` (the run's end)."""
    return range(step + 1, min(step + staleness, num_steps - 1) + 1)


def staleness_of(learner_version: int, sample_version: int) -> int:
    """Updates the learner is ahead of the weights a batch was sampled with (0: on-policy)."""
    return learner_version - sample_version


class FinishedRollout:
    """A rollout whose result is known already (restored from a checkpoint): `Rollout`'s calls."""

    def __init__(self, result: RolloutResult) -> None:
        self._result = result

    def batches(self) -> list[Any]:
        return self._result.batches

    def result(self) -> RolloutResult:
        return self._result


@dataclasses.dataclass
class AheadRollout:
    """The rollout of ``step``, sampled with weight ``version`` (the updates the engines held)."""

    step: int
    version: int
    rollout: Any  # a `Rollout` in flight, or a `FinishedRollout`


class Lookahead:
    """The rollouts of one policy started ahead of their steps, and the weight version its engines hold.

    ``start(request)`` starts a rollout (`PolicyGraph.rollout`). Per step: `take` the step's
    rollout, submit the update, `fill` (start the next steps' rollouts), then `confirm` before
    the weight sync (wait for that generation; returns the step's staleness).
    """

    def __init__(self, staleness: int, num_steps: int, start: Callable[[RolloutRequest], Any]) -> None:
        self.staleness, self.num_steps, self.start = staleness, num_steps, start
        self.version = 0  # updates whose weights the engines hold
        self.queue: dict[int, AheadRollout] = {}
        self.taken: AheadRollout | None = None  # the rollout the current step trains on
        self.request: Callable[[int], RolloutRequest] | None = None
        self._unconfirmed: list[AheadRollout] = []

    def take(self, step: int, request: Callable[[int], RolloutRequest]) -> Any:
        """The rollout of ``step``: the one started ahead, or one started now with the current weights."""
        self.request = request
        ahead = self.queue.pop(step, None)
        if ahead is None:
            ahead = AheadRollout(step, self.version, self.start(request(step)))
        self.taken = ahead
        return ahead.rollout

    def fill(self) -> None:
        """Start the rollouts of the steps ahead of the one taken that are not in flight yet."""
        if self.taken is None or self.request is None:
            raise ConfigError("run.staleness > 0 needs a step that takes its rollout with PolicyGraph.rollout_at "
                              "(this algorithm's step calls PolicyGraph.rollout): set run.staleness=0")
        for s in steps_ahead(self.taken.step, self.staleness, self.num_steps):
            if s not in self.queue:
                self.queue[s] = AheadRollout(s, self.version, self.start(self.request(s)))
                self._unconfirmed.append(self.queue[s])

    def confirm(self) -> dict[str, float]:
        """Before the weight sync: wait for the generation `fill` started (re-issuing calls lost
        to an engine, on the weights it sampled with), count the update the sync installs, and
        return the step's ``staleness`` and ``time/ahead_wait_s`` (the wait for that generation)."""
        t = time.perf_counter()
        for ahead in self._unconfirmed:
            ahead.rollout.batches()
        self._unconfirmed = []
        learner_version, self.version = self.version, self.version + 1
        return {"staleness": float(staleness_of(learner_version, self.taken.version)),
                "time/ahead_wait_s": time.perf_counter() - t}

    # -- checkpoints ----------------------------------------------------------------------
    def save(self, ckpt_dir: Path, prefix: str = "") -> None:
        """``<prefix>lookahead.json`` (the versions) and ``<prefix>lookahead.pkl`` (each rollout's
        batches, rewards and errors, as generated and scored)."""
        import ray

        rollouts = []
        for s in sorted(self.queue):
            out = self.queue[s].rollout.result()
            # Pickled: a Batch's rows hold any Python object a task puts there (video frames, ...).
            rollouts.append({"step": s, "version": self.queue[s].version,
                             "result": dataclasses.replace(out, batches=ray.get(out.batches))})
        atomic_write_bytes(ckpt_dir / f"{prefix}lookahead.pkl", pickle.dumps(rollouts))
        atomic_write_json(ckpt_dir / f"{prefix}lookahead.json",
                          {"staleness": self.staleness, "version": self.version,
                           "ahead": [{"step": r["step"], "version": r["version"]} for r in rollouts]})

    def load(self, ckpt_dir: Path, prefix: str = "") -> None:
        """Restore what `save` wrote; a checkpoint of a run with ``run.staleness = 0`` is refused."""
        import ray

        path = ckpt_dir / f"{prefix}lookahead.json"
        if not path.is_file():
            raise ConfigError(f"run.staleness={self.staleness}, but the checkpoint {ckpt_dir} was written with "
                              "run.staleness=0 (it holds no rollouts generated ahead): resume with run.staleness=0")
        state = json.loads(path.read_text())
        if state["staleness"] != self.staleness:
            raise ConfigError(f"run.staleness={self.staleness}, but the checkpoint {ckpt_dir} was written with "
                              f"run.staleness={state['staleness']}: resume with run.staleness={state['staleness']}")
        self.version = int(state["version"])
        rollouts = pickle.loads((ckpt_dir / f"{prefix}lookahead.pkl").read_bytes())
        self.queue = {r["step"]: AheadRollout(r["step"], r["version"], FinishedRollout(
            dataclasses.replace(r["result"], batches=[ray.put(b) for b in r["result"].batches])))
            for r in rollouts}


def check_sync_checkpoint(ckpt_dir: Path, prefix: str = "") -> None:
    """A run with ``run.staleness = 0`` refuses a checkpoint that holds rollouts generated ahead."""
    path = ckpt_dir / f"{prefix}lookahead.json"
    if path.is_file():
        k = json.loads(path.read_text())["staleness"]
        raise ConfigError(f"run.staleness=0, but the checkpoint {ckpt_dir} was written with run.staleness={k} "
                          f"(it holds rollouts generated ahead): resume with run.staleness={k}")
