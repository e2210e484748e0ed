"""The bandit agent: the only place rewards exist. A learner sends batches and bit rules; the
agent pulls the arms, applies each rule to the rewards it names, and answers one bit per batch.

The protocol is three small serialisable types:

* `Batch`: the ``B`` pulls of one batch as contiguous blocks ``(arm, count)``;
* `BitRule`: which pulls of the batch the rule reads (``reads = (start, stop)`` positions)
  and how it maps them to a bit (``threshold``: ``1[mean >= threshold]``; ``argmax_half``:
  least squares on the read pulls, then ``1[max over halves[1] >= max over halves[0]]``);
* `BitQuery`: ``len(thresholds)`` consecutive batches of one layout, one threshold each.

A learner reaches the agent only through a channel (`LocalChannel` in-process,
`RemoteChannel` to a Ray actor). A channel returns bits, never rewards; an agent built with
``feedback="bit"`` refuses `observe`, and the regret report needs the key that only whoever
called `reset` holds. With ``feedback="full"`` (the unquantised baselines) `observe` returns
per-arm sample means.

Rewards are drawn either pull by pull (``mode="exact"``) or, for Gaussian noise only, as one
Gaussian draw per block of a batch (``mode="closed_form"``), which has the same distribution
for every rule here because each reads only per-arm averages of its pulls.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from typing import Any, Literal

import numpy as np

from troupe.platform.errors import ConfigError, DataError, RemoteCallError, TroupeError
from troupe.platform.registry import ENVIRONMENTS

RULE_KINDS = ("threshold", "argmax_half")
Feedback = Literal["bit", "full"]
Mode = Literal["closed_form", "exact"]


class RewardAccessError(TroupeError, PermissionError):
    """Something asked the agent for rewards (or the regret report) it may not have."""


class BudgetExceededError(TroupeError, RuntimeError):
    """A learner asked for more pulls than the horizon has left."""


@dataclasses.dataclass(frozen=True)
class Batch:
    """Pulls laid out as blocks: ``counts[i]`` pulls of arm ``arms[i]``, in order."""

    arms: tuple[int, ...]
    counts: tuple[int, ...]

    @property
    def size(self) -> int:
        return int(sum(self.counts))

    def positions(self) -> np.ndarray:
        """The arm pulled at each position ``0..size-1``."""
        return np.repeat(np.asarray(self.arms, dtype=np.int64), np.asarray(self.counts, dtype=np.int64))

    def read_blocks(self, reads: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """(arms, counts) of the blocks cut to positions ``[start, stop)``."""
        start, stop = reads
        edges = np.concatenate([[0], np.cumsum(self.counts)])
        lo = np.clip(edges[:-1], start, stop)
        hi = np.clip(edges[1:], start, stop)
        keep = hi > lo
        return np.asarray(self.arms, dtype=np.int64)[keep], (hi - lo)[keep]


@dataclasses.dataclass(frozen=True)
class BitRule:
    """The rule ``Q_j``: the pull positions it reads and how it turns them into one bit."""

    reads: tuple[int, int]
    kind: str = "threshold"
    threshold: float = 0.0
    halves: tuple[tuple[int, ...], tuple[int, ...]] | None = None


@dataclasses.dataclass(frozen=True)
class BitQuery:
    """``len(thresholds)`` batches of layout ``batch``; batch i answers ``rule`` with ``thresholds[i]``."""

    batch: Batch
    rule: BitRule
    thresholds: np.ndarray | None = None  # None: one batch with rule.threshold

    @property
    def repeat(self) -> int:
        return 1 if self.thresholds is None else len(self.thresholds)

    def threshold_array(self) -> np.ndarray:
        if self.thresholds is None:
            return np.array([self.rule.threshold], dtype=float)
        return np.asarray(self.thresholds, dtype=float)


def validate_query(q: BitQuery, batch_size: int, k: int) -> None:
    """Refuse a malformed query before any pull happens, naming the bad field."""
    b, r = q.batch, q.rule
    if len(b.arms) != len(b.counts) or not b.arms:
        raise DataError(f"batch {b}: arms and counts must be non-empty and of equal length")
    if any(c < 1 for c in b.counts) or any(not 0 <= a < k for a in b.arms):
        raise DataError(f"batch {b}: counts must be >= 1 and arms in [0, {k})")
    if b.size != batch_size:
        raise DataError(f"batch {b} has {b.size} pulls; every batch has exactly B={batch_size}")
    if r.kind not in RULE_KINDS:
        raise DataError(f"bit rule kind {r.kind!r}: expected one of {', '.join(RULE_KINDS)}")
    start, stop = r.reads
    if not 0 <= start < stop <= batch_size:
        raise DataError(f"bit rule reads positions [{start}, {stop}): must satisfy 0 <= start < stop <= B={batch_size}")
    th = q.threshold_array()
    if th.size < 1 or not np.isfinite(th).all():
        raise DataError(f"bit rule thresholds must be finite and non-empty, got {th[:5].tolist()}...")
    if r.kind == "argmax_half":
        if r.halves is None or not r.halves[0] or not r.halves[1]:
            raise DataError("an argmax_half rule needs two non-empty halves of arm indices")
        if any(not 0 <= a < k for h in r.halves for a in h):
            raise DataError(f"argmax_half halves name arms outside [0, {k})")


# Bit rule on rewards: Z = mean of the read pulls; Q = 1[Z >= tau].
def threshold_bit(block_counts: np.ndarray, block_means: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Bits for ``(repeat, blocks)`` read-block means: ``1[sum_j c_j mean_j / n >= tau]``."""
    z = block_means @ block_counts / block_counts.sum()
    return (z >= thresholds).astype(np.int8)


# Halving rule: theta~ = (sum_a n_a a a^T)^+ sum_a n_a a Xbar_a; Q = 1[max_{H1} <theta~,a> >= max_{H0} <theta~,a>].
def argmax_half_bit(
    arm_vectors: np.ndarray, block_arms: np.ndarray, block_counts: np.ndarray, block_means: np.ndarray,
    halves: tuple[tuple[int, ...], tuple[int, ...]],
) -> np.ndarray:
    """One bit per row of ``block_means`` (shape ``(repeat, blocks)``)."""
    x = arm_vectors[block_arms]
    v = x.T @ (block_counts[:, None] * x)
    rhs = (block_means * block_counts) @ x  # (repeat, d)
    theta = rhs @ np.linalg.pinv(v).T
    h0 = theta @ arm_vectors[list(halves[0])].T
    h1 = theta @ arm_vectors[list(halves[1])].T
    return (h1.max(axis=1) >= h0.max(axis=1)).astype(np.int8)


def evaluate_bit_rule(rule: BitRule, batch: Batch, rewards: np.ndarray, arm_vectors: np.ndarray) -> int:
    """The bit of ``rule`` on one batch's per-pull ``rewards``; reads only ``rewards[start:stop]``."""
    start, stop = rule.reads
    read = np.asarray(rewards, dtype=float)[start:stop]
    if not np.isfinite(read).all():
        j = int(np.flatnonzero(~np.isfinite(read))[0])
        raise DataError(f"non-finite reward {float(read[j])!r} at batch position {start + j}")
    arms, counts = batch.read_blocks(rule.reads)
    edges = np.concatenate([[0], np.cumsum(counts)])
    means = np.array([read[edges[i]:edges[i + 1]].mean() for i in range(len(arms))])[None, :]
    if rule.kind == "threshold":
        return int(threshold_bit(counts.astype(float), means, np.array([rule.threshold]))[0])
    return int(argmax_half_bit(arm_vectors, arms, counts.astype(float), means, rule.halves)[0])


class BanditAgent:
    """Holds a linear bandit and its rewards; answers bit queries and accounts regret.

    The platform makes this a Ray actor; tests and in-process sweeps use it directly.
    """

    def __init__(self) -> None:
        self._key = ""  # empty until `reset` starts an experiment

    def reset(self, env: str, env_kwargs: dict[str, Any], batch_size: int, horizon: int,
              feedback: Feedback = "bit", mode: Mode = "closed_form", seed: int = 0) -> str:
        """Start a new experiment on ``env`` (a registered name or ``"module:Class"``) built from
        ``env_kwargs``; returns the key that `report` asks for, which only the caller holds."""
        if batch_size < 1 or horizon < 1:
            raise ConfigError(f"batch size B={batch_size} and horizon T={horizon} must both be >= 1")
        if horizon % batch_size:
            lower, upper = horizon // batch_size * batch_size, (horizon // batch_size + 1) * batch_size
            raise ConfigError(f"batch size B={batch_size} does not divide the horizon T={horizon}; "
                              f"use T={lower or upper} or T={upper}, or a B that divides T")
        if feedback not in ("bit", "full"):
            raise ConfigError(f"agent feedback={feedback!r}: expected 'bit' or 'full'")
        if mode not in ("closed_form", "exact"):
            raise ConfigError(f"sweep.mode={mode!r}: expected 'closed_form' or 'exact'")
        env_cls = ENVIRONMENTS.get(env)
        self.env = env_cls(**env_kwargs)
        if mode == "closed_form" and self.env.noise != "gaussian":
            raise ConfigError(f"sweep.mode='closed_form' is exact only for Gaussian noise, not env.noise="
                              f"{self.env.noise!r}; use sweep.mode=exact")
        self.env.reset(seed=int(seed))
        self.batch_size, self.horizon = int(batch_size), int(horizon)
        self.feedback, self.mode = feedback, mode
        self.pulls = 0
        self.bits = 0
        self.regret = 0.0
        self._events_t: list[int] = [0]
        self._events_r: list[float] = [0.0]
        self._key = secrets.token_hex(16)
        return self._key

    # -- what a learner may know --------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Public facts: the arm vectors, B, T and the feedback kind (no θ, no rewards)."""
        self._require_reset()
        return {"arms": self.env.arms.copy(), "batch_size": self.batch_size, "horizon": self.horizon,
                "feedback": self.feedback}

    def batches_left(self) -> int:
        """Whole batches left before the horizon."""
        return (self.horizon - self.pulls) // self.batch_size

    # -- the learner's calls -------------------------------------------------------
    def answer(self, queries: list[BitQuery]) -> list[np.ndarray]:
        """Pull every batch of every query (in order); one array of bits per query."""
        self._require_reset()
        k = self.env.k
        for q in queries:
            validate_query(q, self.batch_size, k)
        self._spend(sum(q.repeat for q in queries))
        return [self._answer_one(q) for q in queries]

    def pull(self, batch: Batch, repeat: int = 1) -> None:
        """Pull the segment ``batch`` (a whole number of batches) ``repeat`` times, with no feedback."""
        self._require_reset()
        self._check_segment(batch, repeat)
        self._spend(repeat * batch.size // self.batch_size)
        self._account(batch, repeat)

    def observe(self, batch: Batch, repeat: int = 1) -> dict[str, np.ndarray]:
        """Full information: pull the segment ``repeat`` times; per-arm counts and sample means."""
        self._require_reset()
        if self.feedback != "full":
            raise RewardAccessError("this agent gives one bit per batch; rewards are never returned "
                                    "(build it with feedback='full' for an unquantised baseline)")
        self._check_segment(batch, repeat)
        self._spend(repeat * batch.size // self.batch_size)
        self._account(batch, repeat)
        arms = np.asarray(batch.arms, dtype=np.int64)
        counts = np.asarray(batch.counts, dtype=np.int64) * repeat
        uniq, inv = np.unique(arms, return_inverse=True)
        tot = np.bincount(inv, weights=counts).astype(np.int64)
        if self.mode == "closed_form":
            means = self.env.sample_means(uniq, tot)
        else:
            pos_arm = np.tile(batch.positions(), repeat)
            rewards = self.env.pull(pos_arm)
            means = np.array([rewards[pos_arm == a].mean() for a in uniq])
        return {"arms": uniq, "counts": tot, "means": means}

    # -- the experimenter's report -------------------------------------------------
    def report(self, key: str) -> dict[str, Any]:
        """Regret and counts; only for the holder of the key `reset` returned."""
        if not self._key or not secrets.compare_digest(str(key), self._key):
            raise RewardAccessError("the regret report needs the key returned by reset(); "
                                    "learners never hold it")
        return {"pulls": self.pulls, "batches": self.pulls // self.batch_size, "bits": self.bits,
                "regret": self.regret, "best_arm": self.env.best_arm,
                "events_t": np.asarray(self._events_t, dtype=np.int64),
                "events_regret": np.asarray(self._events_r, dtype=float),
                "min_gap": float(np.min(self.env.gaps[self.env.gaps > 0], initial=math.inf))}

    # -- internals -----------------------------------------------------------------
    def _require_reset(self) -> None:
        if not self._key:
            raise ConfigError("the bandit agent has no experiment yet: call reset(...) first")

    def _check_segment(self, batch: Batch, repeat: int) -> None:
        if repeat < 1:
            raise DataError(f"repeat={repeat}: expected >= 1 batches")
        if batch.size < self.batch_size or batch.size % self.batch_size:
            raise DataError(f"segment {batch} has {batch.size} pulls; a segment is a whole number of "
                            f"batches of B={self.batch_size}")
        if any(not 0 <= a < self.env.k for a in batch.arms) or any(c < 1 for c in batch.counts):
            raise DataError(f"batch {batch}: arms must lie in [0, {self.env.k}) and counts be >= 1")

    def _spend(self, n_batches: int) -> None:
        need = n_batches * self.batch_size
        if self.pulls + need > self.horizon:
            raise BudgetExceededError(
                f"asked for {n_batches} batches ({need} pulls) with {self.horizon - self.pulls} of T="
                f"{self.horizon} left; a learner must stop at T")

    def _account(self, batch: Batch, repeat: int) -> None:
        per_segment = float(np.dot(self.env.gaps[list(batch.arms)], batch.counts))
        self.pulls += repeat * batch.size
        self.regret += repeat * per_segment
        self._events_t.append(self.pulls)
        self._events_r.append(self.regret)

    def _answer_one(self, q: BitQuery) -> np.ndarray:
        rule, th = q.rule, q.threshold_array()
        r = th.size
        arms, counts = q.batch.read_blocks(rule.reads)
        if self.mode == "closed_form":
            means = self.env.sample_means(np.tile(arms, r), np.tile(counts, r)).reshape(r, len(arms))
        else:
            start, stop = rule.reads
            # Every pull of the batch happens; the rule is then applied to its own positions only.
            rewards = self.env.pull(np.tile(q.batch.positions(), (r, 1)))[:, start:stop]
            edges = np.concatenate([[0], np.cumsum(counts)])
            means = np.stack([rewards[:, edges[i]:edges[i + 1]].mean(axis=1) for i in range(len(arms))], axis=1)
        if rule.kind == "threshold":
            bits = threshold_bit(counts.astype(float), means, th)
        else:
            bits = argmax_half_bit(self.env.arms, arms, counts.astype(float), means, rule.halves)
        self._account(q.batch, r)
        self.bits += r
        return bits


class LocalChannel:
    """A learner's view of an in-process agent: bits, pulls and (full feedback only) means."""

    def __init__(self, agent: BanditAgent) -> None:
        self._agent = agent
        info = agent.describe()
        self.arms: np.ndarray = info["arms"]
        self.batch_size: int = info["batch_size"]
        self.horizon: int = info["horizon"]
        self.feedback: str = info["feedback"]
        self.batches_left: int = agent.batches_left()

    def query(self, queries: list[BitQuery]) -> list[np.ndarray]:
        """One array of bits per query."""
        bits = self._agent.answer(queries)
        self.batches_left -= sum(q.repeat for q in queries)
        return bits

    def pull(self, batch: Batch, repeat: int = 1) -> None:
        """Pull a segment (a whole number of batches) ``repeat`` times, with no feedback."""
        self._agent.pull(batch, repeat)
        self.batches_left -= repeat * batch.size // self.batch_size

    def observe(self, batch: Batch, repeat: int = 1) -> dict[str, np.ndarray]:
        """Full feedback only: per-arm counts and sample means of the segment's pulls."""
        out = self._agent.observe(batch, repeat)
        self.batches_left -= repeat * batch.size // self.batch_size
        return out


class RemoteChannel(LocalChannel):
    """The same view of an agent that is a Ray actor; every wait has a timeout."""

    def __init__(self, handle: Any, timeout_s: float = 300.0) -> None:
        self._handle = handle
        self.timeout_s = timeout_s
        info = self._get(handle.describe.remote(), "describe")
        self.arms, self.batch_size = info["arms"], info["batch_size"]
        self.horizon, self.feedback = info["horizon"], info["feedback"]
        self.batches_left = self._get(handle.batches_left.remote(), "batches_left")

    def _get(self, ref: Any, method: str) -> Any:
        import ray

        try:
            return ray.get(ref, timeout=self.timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            raise RemoteCallError(f"agent.{method} did not answer within {self.timeout_s:.0f}s") from e
        except ray.exceptions.RayTaskError as e:
            raise e.cause from None
        except ray.exceptions.RayActorError as e:
            raise RemoteCallError(f"agent.{method}: the agent actor died: {e}") from e

    def query(self, queries: list[BitQuery]) -> list[np.ndarray]:
        bits = self._get(self._handle.answer.remote(queries), "answer")
        self.batches_left -= sum(q.repeat for q in queries)
        return bits

    def pull(self, batch: Batch, repeat: int = 1) -> None:
        self._get(self._handle.pull.remote(batch, repeat), "pull")
        self.batches_left -= repeat * batch.size // self.batch_size

    def observe(self, batch: Batch, repeat: int = 1) -> dict[str, np.ndarray]:
        out = self._get(self._handle.observe.remote(batch, repeat), "observe")
        self.batches_left -= repeat * batch.size // self.batch_size
        return out
