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

The noise kernel ν (``kernel``) is ``uniform`` over the vocabulary, ``step`` (uniform over the
actions other than the clean one) or ``confusion`` (a fixed row-stochastic matrix: row a* is ν
at a state whose clean action is a*; by default the cyclic a* → a*+1 mod |V|). `kernel_margin`
is the mode-preservation margin γ that sizes the majority vote; the cyclic confusion loses the
mode at ε ≥ 1/2, and every mode-seeking method then learns the wrong action.

`run_approx` replaces the table with `MLPStudent`, which sees a state only through hashed
n-grams of its last tokens and its depth, so it must find whatever structure the expert has
rather than be keyed on it (§B.5's function-approximation variant).

J is computed exactly along the clean path: at temperature 1 it is Π_h π(a*_h|s*_h); greedy, it
is the probability that argmax (ties broken uniformly) picks a*_h at every depth.
"""

from __future__ import annotations

import dataclasses
import hashlib
import zlib
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import scipy.sparse

from troupe.algorithms.opd import noise

METHODS = ("bc", "clean_bc", "seq_kd", "opd_kl", "tm_opd", "ne_opd", "ne_opd_rkl", "ne_opd_vote")
APPROX_METHODS = ("bc", "opd_kl", "ne_opd")
KERNELS = ("uniform", "confusion", "step")
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
    kernel: str = "uniform"  # ν: uniform, confusion or step (see `kernel_matrix`)
    confusion: list[list[float]] | None = None  # the confusion kernel's rows; None = the cyclic a -> a+1 mod |V|

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
        if self.kernel not in KERNELS:
            raise ValueError(f"opd.kernel={self.kernel!r}: expected one of {KERNELS}")
        if self.confusion is not None:
            if self.kernel != "confusion":
                raise ValueError(f"opd.confusion is read by opd.kernel=confusion only (opd.kernel={self.kernel!r}): "
                                 "set opd.kernel=confusion or drop opd.confusion")
            check_confusion(self.confusion, self.vocab)

    def nu(self) -> np.ndarray:
        """ν given each clean action, [|V|, |V|]."""
        return kernel_matrix(self.kernel, self.vocab, self.confusion)

    def teacher_rows(self) -> np.ndarray:
        """π̃ given each clean action, [|V|, |V|]: row a* is (1-ε)·onehot(a*) + ε·ν(·|a*)."""
        return noise.noisy_expert(np.eye(self.vocab), self.eps, self.nu())


# -- noise kernels ----------------------------------------------------------------------------------
def cyclic_confusion(vocab: int) -> list[list[float]]:
    """The default confusion: noise replaces the clean action a by (a+1) mod |V|."""
    return np.roll(np.eye(vocab), 1, axis=1).tolist()


def check_confusion(confusion: list[list[float]], vocab: int) -> None:
    """A confusion matrix is |V| rows of |V| non-negative numbers, each row summing to 1."""
    try:
        c = np.asarray(confusion, dtype=float)
    except (TypeError, ValueError) as e:
        raise ValueError(f"opd.confusion: expected {vocab} rows of {vocab} numbers ({e})") from None
    if c.shape != (vocab, vocab):
        raise ValueError(f"opd.confusion has shape {list(c.shape)}: expected {vocab} rows of {vocab} numbers, "
                         f"row a being the noise at a state whose clean action is a (|V| = opd.vocab = {vocab})")
    if (c < 0).any() or not np.isfinite(c).all():
        raise ValueError("opd.confusion: expected non-negative probabilities")
    sums = c.sum(1)
    bad = np.flatnonzero(np.abs(sums - 1.0) > 1e-6)
    if len(bad):
        raise ValueError(f"opd.confusion row {int(bad[0])} sums to {sums[bad[0]]:.6g}: each row is a "
                         "distribution over the actions and must sum to 1")


def kernel_matrix(kernel: str, vocab: int, confusion: list[list[float]] | None = None) -> np.ndarray:
    """ν(·|s) as a function of the clean action at s: row a* of a [|V|, |V|] row-stochastic matrix."""
    if kernel == "uniform":
        return np.full((vocab, vocab), 1.0 / vocab)
    if kernel == "step":  # a wrong action, uniform over the other |V|-1
        return (1.0 - np.eye(vocab)) / (vocab - 1)
    if kernel == "confusion":
        c = cyclic_confusion(vocab) if confusion is None else confusion
        check_confusion(c, vocab)
        return np.asarray(c, dtype=float)
    raise ValueError(f"opd.kernel={kernel!r}: expected one of {KERNELS}")


def kernel_margin(eps: float, nu: np.ndarray) -> float:
    """γ = min over clean actions j of π̃(j|j) - max_{k≠j} π̃(k|j), with π̃(·|j) = (1-ε)·onehot(j) + ε·ν(·|j).

    Uniform ν: 1-ε; step: 1-ε-ε/(|V|-1); confusion C: min_j (1-ε+εC_jj) - max_{k≠j} εC_jk.
    The mode is preserved (and majority votes converge to the clean action) iff γ > 0."""
    vocab = len(nu)
    return float(noise.mode_margin(noise.noisy_expert(np.eye(vocab), eps, nu), np.arange(vocab)).min())


class Expert:
    """The clean expert (a deterministic function of the prefix) and its noisy version."""

    def __init__(self, vocab: int, eps: float, salt: int = 0, context: int = 0, nu: np.ndarray | None = None) -> None:
        self.vocab, self.eps, self.salt, self.context = vocab, eps, salt, context
        self._cache: dict[State, int] = {}
        self._rows = noise.noisy_expert(np.eye(vocab), eps, nu)  # π̃ given each clean action (ν: `kernel_matrix`)

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


class Policy(Protocol):
    """What roll-ins and `success` read of a student: its distribution at a state and its argmax."""

    vocab: int

    def __call__(self, s: State) -> np.ndarray: ...

    def greedy(self, s: State, rng: np.random.Generator) -> int: ...


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


def success(student: Policy, expert: Expert, horizon: int) -> dict[str, float]:
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


def bc_on_clean_path(episodes: int, clean_actions: np.ndarray, rows: np.ndarray,
                     rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Tabular BC's J (T=1 and greedy) from ``episodes`` noisy trajectories, one value per expert,
    with the distribution of `run_method("bc")` at ``context`` 0, for O(H) vector draws.

    J reads BC's table on the clean path only, and the counts there form a chain: all N
    trajectories visit s*_1; the n_h that visit s*_h split Multinomial(n_h, π̃(·|s*_h)), and the
    ones that took a*_h are the n_{h+1} that visit s*_{h+1}. ``clean_actions`` [experts, H] holds
    a*_h, ``rows`` π̃ given each clean action (`TabularConfig.teacher_rows`)."""
    experts, horizon = clean_actions.shape
    vocab = rows.shape[1]
    idx = np.arange(experts)
    n = np.full(experts, episodes)
    j1, jg = np.ones(experts), np.ones(experts)
    for h in range(horizon):
        a = clean_actions[:, h]
        counts = rng.multinomial(n, rows[a])
        j1 *= np.where(n > 0, counts[idx, a] / np.maximum(n, 1), 1.0 / vocab)
        best = counts == counts.max(1, keepdims=True)  # an unvisited state is all ties: 1/|V|
        jg *= best[idx, a] / best.sum(1)
        n = counts[idx, a]
    return {"j_t1": j1, "j_greedy": jg}


# N = 1 to 2^15 in steps of 2^(1/8) (9%): fine enough to fit log N against H
EPISODES_GRID = tuple(int(n) for n in np.unique(np.round(2.0 ** (np.arange(15 * 8 + 1) / 8))))


def bc_episodes_needed(horizon: int, cfg: TabularConfig, experts: int = 2000, target: float = 0.9,
                       grid: Sequence[int] = EPISODES_GRID, seed: int = 0) -> int | None:
    """The smallest N of ``grid`` at which tabular BC's greedy J, averaged over ``experts``
    experts (salts 0, 1, ...), reaches ``target``; None if no N of the grid does. The search
    strides 8 grid points at a time, then walks back: J grows with N (in expectation)."""
    if cfg.context:
        raise ValueError(f"opd.context={cfg.context}: the clean-path chain of BC holds for the whole-prefix expert (0) only")
    rows = cfg.teacher_rows()
    clean = np.array([[e.clean(s) for s in e.clean_path(horizon)]
                      for e in (Expert(cfg.vocab, cfg.eps, salt=i) for i in range(experts))])
    rng = np.random.default_rng(seed)

    def reached(i: int) -> bool:
        return bool(bc_on_clean_path(grid[i], clean, rows, rng)["j_greedy"].mean() >= target)

    stride = 8
    hi = next((i for i in range(0, len(grid), stride) if reached(i)), None)
    if hi is None:
        hi = len(grid) - 1
        if not reached(hi):
            return None
    lo = max(hi - stride + 1, 0)
    return int(grid[next((i for i in range(lo, hi) if reached(i)), hi)])


def tempered(p: np.ndarray, temperature: float) -> np.ndarray:
    """p^(1/T), renormalised (T → 0: the mode)."""
    logp = np.log(np.clip(p, 1e-300, None)) / temperature
    q = np.exp(logp - logp.max())
    return q / q.sum()


# -- online: the student rolls in, the teacher labels the states it visits -----------------------------
def roll_in(student: Policy, horizon: int, rng: np.random.Generator, greedy: bool, explore: float = 0.0) -> list[tuple[State, int]]:
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


def votes_per_visit(cfg: TabularConfig, horizon: int) -> int:
    """``opd.votes``, or the Hoeffding m for the kernel's margin γ (which must then be > 0)."""
    if cfg.votes:
        return cfg.votes
    gamma = kernel_margin(cfg.eps, cfg.nu())
    if gamma <= 0:
        raise ValueError(f"opd.kernel={cfg.kernel} at opd.eps={cfg.eps} does not preserve the mode (margin {gamma:.3g}), "
                         "so no number of votes finds it: set opd.votes to the draws per visit")
    return noise.votes_needed(gamma, cfg.vocab, horizon, cfg.delta)


def run_method(method: str, horizon: int, cfg: TabularConfig, seed: int) -> dict[str, float]:
    """Train ``method`` on one expert (salted by ``seed``) and return J, agreement and the
    teacher cost: tokens the teacher generated (offline) or scored (online), and draws (votes)."""
    if method not in METHODS:
        raise ValueError(f"opd method {method!r}: expected one of {METHODS}")
    rng = np.random.default_rng(seed)
    expert = Expert(cfg.vocab, cfg.eps, salt=seed, context=cfg.context, nu=cfg.nu())
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
        m = votes_per_visit(cfg, horizon) if method == "ne_opd_vote" else 1
        greedy = method.startswith("ne_opd")
        for _ in range(N):
            episode = roll_in(student, horizon, rng, greedy, cfg.explore if greedy else 0.0)
            cost += horizon * m
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


def sweep(methods: tuple[str, ...], horizons: tuple[int, ...], seeds: int, cfg: TabularConfig,
          run: Callable[[str, int, TabularConfig, int], dict[str, float]] = run_method,
          ) -> dict[str, dict[str, dict[str, list[float]]]]:
    """``{method: {H: {metric: [per seed]}}}`` of ``run`` (`run_method`, or `run_approx` with its config bound)."""
    out: dict[str, dict[str, dict[str, list[float]]]] = {}
    for method in methods:
        for h in horizons:
            cell = out.setdefault(method, {}).setdefault(str(h), defaultdict(list))
            for seed in range(seeds):
                for k, v in run(method, h, cfg, seed).items():
                    cell[k].append(v)
            out[method][str(h)] = dict(cell)
    return out


# -- function approximation: a student that must find the shared structure (§B.5's variant) -------------
@dataclasses.dataclass
class ApproxConfig:
    """The MLP student of `run_approx`. Every method gets the same ``steps``: BC all on its data
    set, an online method spread over its N episodes, each after a roll-in."""

    buckets: int = 256  # hashed feature dimension
    ngrams: int = 3  # the last 1..ngrams tokens are hashed, each n-gram a feature, and so is the depth
    hidden: int = 64
    lr: float = 0.03  # Adam
    steps: int = 400

    def __post_init__(self) -> None:
        for key in ("buckets", "ngrams", "hidden", "steps"):
            if getattr(self, key) < 1:
                raise ValueError(f"opd.approx.{key}={getattr(self, key)}: expected an integer >= 1")
        if self.lr <= 0:
            raise ValueError(f"opd.approx.lr={self.lr}: expected a step size > 0")


def ngram_features(s: State, buckets: int, ngrams: int) -> tuple[int, ...]:
    """The buckets of the depth and of the last n tokens for n = 1..ngrams, sorted and distinct
    (crc32, so the same on every run and machine)."""
    keys = [f"depth:{len(s)}"] + [f"{n}:" + ",".join(map(str, s[-n:])) for n in range(1, ngrams + 1) if len(s) >= n]
    return tuple(sorted({zlib.crc32(k.encode()) % buckets for k in keys}))


def cross_entropy_grads(params: dict[str, np.ndarray], x: scipy.sparse.csr_matrix, w: np.ndarray,
                        xt: scipy.sparse.csr_matrix | None = None) -> tuple[float, dict[str, np.ndarray]]:
    """L = -Σ_k Σ_a w_ka log π_θ(a|x_k) and ∂L/∂θ for the one-hidden-layer tanh MLP; ``w`` [K, |V|]
    holds the target mass (counts, or summed teacher distributions: then L is the forward KL
    to the teacher up to a constant). ``xt`` is x.T, passed in to build it once per fit."""
    hid = np.tanh(x @ params["w1"] + params["b1"])
    z = hid @ params["w2"] + params["b2"]
    z -= z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    dz = np.exp(logp) * w.sum(1, keepdims=True) - w  # ∂L/∂z = π·Σ_a w_a - w
    dh = (dz @ params["w2"].T) * (1.0 - hid**2)
    grads = {"w1": (x.T if xt is None else xt) @ dh, "b1": dh.sum(0), "w2": hid.T @ dz, "b2": dz.sum(0)}
    return float(-(w * logp).sum()), grads


class MLPStudent:
    """π_θ(·|s) = softmax(W2·tanh(W1·x(s) + b1) + b2), x(s) the 0/1 indicator of `ngram_features`(s):
    the student sees a state only through what it shares with other states, trained with Adam."""

    def __init__(self, vocab: int, cfg: ApproxConfig, rng: np.random.Generator) -> None:
        self.vocab, self.cfg = vocab, cfg
        self.params = {"w1": rng.normal(0.0, 1.0 / np.sqrt(cfg.ngrams + 1), (cfg.buckets, cfg.hidden)),
                       "b1": np.zeros(cfg.hidden),
                       "w2": rng.normal(0.0, 0.01, (cfg.hidden, vocab)),  # near uniform at the start
                       "b2": np.zeros(vocab)}
        self._moments = {k: (np.zeros_like(v), np.zeros_like(v)) for k, v in self.params.items()}
        self._t = 0
        self._features: dict[State, tuple[int, ...]] = {}

    def features(self, s: State) -> tuple[int, ...]:
        f = self._features.get(s)
        if f is None:
            f = self._features[s] = ngram_features(s, self.cfg.buckets, self.cfg.ngrams)
        return f

    def __call__(self, s: State) -> np.ndarray:
        p = self.params
        z = np.tanh(p["w1"][list(self.features(s))].sum(0) + p["b1"]) @ p["w2"] + p["b2"]
        e = np.exp(z - z.max())
        return e / e.sum()

    def greedy(self, s: State, rng: np.random.Generator) -> int:
        p = self(s)
        best = np.flatnonzero(p == p.max())
        return int(best[0] if len(best) == 1 else rng.choice(best))

    def fit(self, x: scipy.sparse.csr_matrix, targets: np.ndarray, steps: int) -> None:
        """``steps`` Adam steps on the cross-entropy to ``targets``, normalised to total mass 1 so
        that the step size does not depend on how much data there is."""
        w, xt = targets / targets.sum(), x.T.tocsr()
        b1, b2 = 0.9, 0.999
        for _ in range(steps):
            _, grads = cross_entropy_grads(self.params, x, w, xt)
            self._t += 1
            for k, g in grads.items():
                m, v = self._moments[k]
                m *= b1
                m += (1 - b1) * g
                v *= b2
                v += (1 - b2) * g**2
                self.params[k] -= self.cfg.lr * (m / (1 - b1**self._t)) / (np.sqrt(v / (1 - b2**self._t)) + 1e-8)


class Aggregate:
    """DAgger's data set D as summed targets per feature set: states the student cannot tell apart
    share a row, which leaves the loss unchanged."""

    def __init__(self, buckets: int, vocab: int) -> None:
        self.buckets, self.vocab = buckets, vocab
        self.rows: dict[tuple[int, ...], int] = {}
        self._targets = np.zeros((64, vocab))  # grown by doubling
        self._indices: list[int] = []  # x in CSR form, row by row
        self._indptr = [0]
        self._x: scipy.sparse.csr_matrix | None = None

    def add(self, features: tuple[int, ...], target: np.ndarray) -> None:
        i = self.rows.get(features)
        if i is None:
            i = self.rows[features] = len(self.rows)
            if i == len(self._targets):
                self._targets = np.concatenate([self._targets, np.zeros_like(self._targets)])
            self._indices.extend(features)
            self._indptr.append(len(self._indices))
            self._x = None
        self._targets[i] += target

    def arrays(self) -> tuple[scipy.sparse.csr_matrix, np.ndarray]:
        """x [K, buckets] (0/1) and the targets [K, |V|]."""
        if self._x is None:
            self._x = scipy.sparse.csr_matrix((np.ones(len(self._indices)), self._indices, self._indptr),
                                              shape=(len(self.rows), self.buckets))
        return self._x, self._targets[: len(self.rows)]


def run_approx(method: str, horizon: int, cfg: TabularConfig, seed: int,
               approx: ApproxConfig | None = None) -> dict[str, float]:
    """`run_method` with an `MLPStudent` in place of the table, for ``bc`` (cross-entropy on N
    noisy trajectories), ``ne_opd`` (cross-entropy to the teacher's argmax at greedy roll-in
    states, aggregated) and ``opd_kl`` (forward KL to π̃ at T=1 roll-in states, aggregated).
    ``cfg.context`` shapes the expert only: the student always sees hashed n-grams and the depth."""
    if method not in APPROX_METHODS:
        raise ValueError(f"opd method {method!r} with a function-approximation student: expected one of {APPROX_METHODS}")
    approx = approx or ApproxConfig()
    rng = np.random.default_rng(seed)
    expert = Expert(cfg.vocab, cfg.eps, salt=seed, context=cfg.context, nu=cfg.nu())
    student = MLPStudent(cfg.vocab, approx, rng)
    data = Aggregate(approx.buckets, cfg.vocab)
    N, V = cfg.episodes, cfg.vocab
    if method == "bc":
        for _ in range(N):
            for s, a in sample_trajectory(expert.noisy, horizon, rng):
                data.add(student.features(s), noise.one_hot(a, V))
        student.fit(*data.arrays(), approx.steps)
    else:
        greedy = method == "ne_opd"
        for i in range(N):
            for s, _ in roll_in(student, horizon, rng, greedy, cfg.explore if greedy else 0.0):
                teacher = expert.noisy(s)
                data.add(student.features(s), noise.one_hot(int(teacher.argmax()), V) if greedy else teacher)
            # this episode's share of the step budget, so that all N episodes together take approx.steps
            student.fit(*data.arrays(), approx.steps * (i + 1) // N - approx.steps * i // N)
    return {**success(student, expert, horizon), "teacher_tokens": float(N * horizon)}
