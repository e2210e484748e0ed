"""ALGORITHMS.md §B.5: distillation from a noisy expert in a tabular token MDP.

A prompt-free MDP over a vocabulary of |V| tokens and horizon H. The clean expert's action at
``s = a_{1:h-1}`` is ``md5(salt, a_{1:h-1}) mod |V|``: a function of the whole prefix, so nothing
learnt at one state transfers to another. The noisy expert mixes it with uniform noise
(`noise.noisy_expert`). Success is 1 when the whole sequence equals the clean expert's.

The student is a table with one distribution per state (uniform where it has seen nothing).
Each method's update sets a visited state to its loss's minimiser over an unrestricted
table, which the tests check against gradient descent on the loss functions of `losses`:

| method | data | state update |
|---|---|---|
| ``bc`` | N noisy-expert trajectories | empirical action frequencies (cross-entropy's minimiser) |
| ``clean_bc`` | N clean-expert trajectories (oracle) | as ``bc`` |
| ``seq_kd`` | N trajectories of the noisy expert at temperature ``kd_temperature`` | as ``bc`` |
| ``opd_kl`` | N student roll-outs at T=1, the teacher's distribution at every visited state | π̃(·|s): FKL, RKL and JSD share it |
| ``tm_opd`` | as ``opd_kl``, the teacher's log-prob of the sampled token only | one policy-gradient step on the logits with advantage log π̃(a) − log π(a) |
| ``ne_opd`` | N greedy student roll-ins, logit access | one-hot on argmax π̃ (``hard`` and ``tl`` share it) |
| ``ne_opd_rkl`` | as ``ne_opd`` | π̃(·|s) |
| ``ne_opd_vote`` | as ``ne_opd``, m teacher samples per visit | one-hot on the majority of every draw at s so far |

With ``context`` k > 0 the expert hashes only the last k tokens and the student's table is
keyed the same way: §B.5's function-approximation caveat, where what one state teaches carries
to every prefix that ends alike.

J is computed exactly along the clean path: at temperature 1 it is Π_h π(a*_h|s*_h); greedy, it
is the probability that argmax (ties broken uniformly) picks a*_h at every depth.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections import defaultdict
from collections.abc import Callable

import numpy as np

from troupe.algorithms.opd import noise

METHODS = ("bc", "clean_bc", "seq_kd", "opd_kl", "tm_opd", "ne_opd", "ne_opd_rkl", "ne_opd_vote")
State = tuple[int, ...]


def view(s: State, context: int) -> State:
    """What the expert and the student condition on: the whole prefix (``context`` 0, §B.5's
    tabular hardness) or its last ``context`` tokens (an expert a student can generalise over)."""
    return s if context == 0 else s[-context:]


@dataclasses.dataclass
class TabularConfig:
    vocab: int = 3
    eps: float = 0.3  # uniform noise weight of the teacher
    episodes: int = 200  # N: trajectories (offline) or student roll-outs (online)
    kd_temperature: float = 0.3  # seq_kd's teacher temperature [ASM]
    tm_lr: float = 1.0  # tm_opd's step on the logits [ASM]
    explore: float = 0.0  # NE-OPD: chance of a uniform action during the greedy roll-in [ASM, 0.05 optional]
    context: int = 0  # 0: the expert hashes the whole prefix; k: only its last k tokens, which the student shares
    delta: float = 0.1  # ne_opd_vote: m from the Hoeffding bound at this failure probability
    votes: int = 0  # ne_opd_vote: draws per visit; 0 = the Hoeffding m

    def __post_init__(self) -> None:
        if self.vocab < 2:
            raise ValueError(f"opd.vocab={self.vocab}: expected an integer >= 2")
        if self.episodes < 1:
            raise ValueError(f"opd.episodes={self.episodes}: expected an integer >= 1")
        if self.context < 0:
            raise ValueError(f"opd.context={self.context}: expected 0 (the whole prefix) or a number of tokens >= 1")
        if not 0.0 <= self.eps < 1.0:
            raise ValueError(f"opd.eps={self.eps}: expected a number in [0, 1) (at 1 the teacher is pure noise)")
        if self.kd_temperature <= 0:
            raise ValueError(f"opd.kd_temperature={self.kd_temperature}: expected a number > 0")
        if not 0.0 <= self.explore <= 1.0:
            raise ValueError(f"opd.explore={self.explore}: expected a probability in [0, 1]")
        if not 0.0 < self.delta < 1.0:
            raise ValueError(f"opd.delta={self.delta}: expected a probability in (0, 1)")
        if self.votes < 0:
            raise ValueError(f"opd.votes={self.votes}: expected draws per visit >= 1, or 0 for the Hoeffding number")


class Expert:
    """The clean expert (a deterministic function of the prefix) and its noisy version."""

    def __init__(self, vocab: int, eps: float, salt: int = 0, context: int = 0) -> None:
        self.vocab, self.eps, self.salt, self.context = vocab, eps, salt, context
        self._cache: dict[State, int] = {}
        self._rows = noise.noisy_expert(np.eye(vocab), eps)  # π̃ given each clean action

    def clean(self, s: State) -> int:
        s = view(s, self.context)
        a = self._cache.get(s)
        if a is None:
            key = f"{self.salt}:" + ",".join(map(str, s))
            a = self._cache[s] = int(hashlib.md5(key.encode()).hexdigest(), 16) % self.vocab
        return a

    def noisy(self, s: State) -> np.ndarray:
        """π̃(·|s) (read-only: a row shared by every state with the same clean action)."""
        return self._rows[self.clean(s)]

    def clean_path(self, horizon: int) -> list[State]:
        path, s = [], ()
        for _ in range(horizon):
            path.append(s)
            s = (*s, self.clean(s))
        return path


class Table:
    """A tabular policy: a distribution per state, uniform where nothing was learnt."""

    def __init__(self, vocab: int, context: int = 0) -> None:
        self.vocab, self.context = vocab, context
        self.probs: dict[State, np.ndarray] = {}  # by view(s, context)

    def __call__(self, s: State) -> np.ndarray:
        p = self.probs.get(view(s, self.context))
        return p if p is not None else np.full(self.vocab, 1.0 / self.vocab)

    def set(self, s: State, p: np.ndarray) -> None:
        self.probs[view(s, self.context)] = p

    def greedy(self, s: State, rng: np.random.Generator) -> int:
        p = self(s)
        best = np.flatnonzero(p == p.max())
        return int(best[0] if len(best) == 1 else rng.choice(best))


def success(student: Table, expert: Expert, horizon: int) -> dict[str, float]:
    """Exact J at temperature 1 and greedy, and the share of clean-path states whose unique argmax is clean."""
    j1 = jg = 1.0
    agree = 0
    for s in expert.clean_path(horizon):
        p, a = student(s), expert.clean(s)
        j1 *= p[a]
        best = np.flatnonzero(p == p.max())
        jg *= (a in best) / len(best)
        agree += len(best) == 1 and best[0] == a
    return {"j_t1": float(j1), "j_greedy": float(jg), "agreement": agree / horizon}


def sample(p: np.ndarray, rng: np.random.Generator) -> int:
    """One draw from the distribution ``p`` (inverse CDF: `Generator.choice` costs several times more)."""
    return min(int(np.searchsorted(np.cumsum(p), rng.random() * p.sum(), side="right")), len(p) - 1)


# -- offline: behaviour cloning on trajectories --------------------------------------------------------
def sample_trajectory(policy: Callable[[State], np.ndarray], horizon: int, rng: np.random.Generator) -> list[tuple[State, int]]:
    s: State = ()
    out = []
    for _ in range(horizon):
        a = sample(policy(s), rng)
        out.append((s, a))
        s = (*s, a)
    return out


def behaviour_cloning(trajectories: list[list[tuple[State, int]]], vocab: int,
                      context: int = 0) -> tuple[Table, dict[State, np.ndarray]]:
    """Cross-entropy's minimiser over a table: the empirical action frequencies per state (per
    ``view`` of it). Also returns the counts (the visits per state)."""
    counts: dict[State, np.ndarray] = defaultdict(lambda: np.zeros(vocab))
    for traj in trajectories:
        for s, a in traj:
            counts[view(s, context)][a] += 1
    table = Table(vocab, context)
    table.probs = {s: c / c.sum() for s, c in counts.items()}
    return table, dict(counts)


def tempered(p: np.ndarray, temperature: float) -> np.ndarray:
    """p^(1/T), renormalised (T → 0: the mode)."""
    logp = np.log(np.clip(p, 1e-300, None)) / temperature
    q = np.exp(logp - logp.max())
    return q / q.sum()


# -- online: the student rolls in, the teacher labels the states it visits -----------------------------
def roll_in(student: Table, horizon: int, rng: np.random.Generator, greedy: bool, explore: float = 0.0) -> list[tuple[State, int]]:
    """One student episode: greedy (with ``explore`` chance of a uniform action) or sampled at T=1."""
    s: State = ()
    out = []
    for _ in range(horizon):
        if greedy:
            a = int(rng.integers(student.vocab)) if explore and rng.random() < explore else student.greedy(s, rng)
        else:
            a = sample(student(s), rng)
        out.append((s, a))
        s = (*s, a)
    return out


def run_method(method: str, horizon: int, cfg: TabularConfig, seed: int) -> dict[str, float]:
    """Train ``method`` on one expert (salted by ``seed``) and return J, agreement and the
    teacher cost: tokens the teacher generated (offline) or scored (online), and draws (votes)."""
    if method not in METHODS:
        raise ValueError(f"opd method {method!r}: expected one of {METHODS}")
    rng = np.random.default_rng(seed)
    expert = Expert(cfg.vocab, cfg.eps, salt=seed, context=cfg.context)
    N, V, k = cfg.episodes, cfg.vocab, cfg.context
    cost = 0
    if method in ("bc", "clean_bc", "seq_kd"):
        teacher = {"bc": expert.noisy,
                   "clean_bc": lambda s: noise.one_hot(expert.clean(s), V),
                   "seq_kd": lambda s: tempered(expert.noisy(s), cfg.kd_temperature)}[method]
        student, _ = behaviour_cloning([sample_trajectory(teacher, horizon, rng) for _ in range(N)], V, k)
        cost = N * horizon
    else:
        student = Table(V, k)
        logits: dict[State, np.ndarray] = {}  # tm_opd's parameters
        draws: dict[State, np.ndarray] = defaultdict(lambda: np.zeros(V))  # ne_opd_vote's counts
        m = cfg.votes or noise.votes_needed(1.0 - cfg.eps, V, horizon, cfg.delta)
        greedy = method.startswith("ne_opd")
        for _ in range(N):
            episode = roll_in(student, horizon, rng, greedy, cfg.explore if greedy else 0.0)
            cost += horizon * (m if method == "ne_opd_vote" else 1)
            for s, a in episode:
                teacher = expert.noisy(s)
                if method in ("opd_kl", "ne_opd_rkl"):
                    student.set(s, teacher)
                elif method == "ne_opd":
                    student.set(s, noise.one_hot(int(teacher.argmax()), V))
                elif method == "ne_opd_vote":
                    votes = draws[view(s, k)]
                    votes += rng.multinomial(m, teacher)
                    student.set(s, noise.one_hot(noise.vote_of_counts(votes, rng), V))
                else:  # tm_opd: ∇_θ log π(a) = onehot(a) - π, scaled by the advantage
                    z = logits.setdefault(view(s, k), np.zeros(V))
                    p = np.exp(z - z.max())
                    p /= p.sum()
                    advantage = np.log(teacher[a]) - np.log(p[a])
                    z += cfg.tm_lr * advantage * (noise.one_hot(a, V) - p)
                    q = np.exp(z - z.max())
                    student.set(s, q / q.sum())
    return {**success(student, expert, horizon), "teacher_tokens": float(cost)}


def sweep(methods: tuple[str, ...], horizons: tuple[int, ...], seeds: int, cfg: TabularConfig) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``{method: {H: {metric: [per seed]}}}``."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for method in methods:
        for h in horizons:
            cell = out.setdefault(method, {}).setdefault(str(h), defaultdict(list))
            for seed in range(seeds):
                for k, v in run_method(method, h, cfg, seed).items():
                    cell[k].append(v)
            out[method][str(h)] = dict(cell)
    return out
