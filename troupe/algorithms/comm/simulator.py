"""ALGORITHMS.md §D.5: the synthetic benchmark of receiver-relative communication.

A main agent M holds broad context; a bounded executor E holds a local view. At each step M
either sends nothing (``none``), a short message (``msg_plain``, or the compressed-sufficient
``msg_cryptic``), or a raw context slice (``raw``). The step succeeds when E picks the one
right option out of K.

The generative process (`sample_state`, then `run_action` per action; option 0 is the key):

1. the fork's shared state: E's local view contains the key w.p. q_L; M's belief is right w.p.
   q_M, else uniform over the K-1 wrong options; the raw slice contains the evidence w.p. q_C;
2. ``none``: E believes the key iff its local view contains it, else it has no belief;
3. ``msg`` (absorption a): externalised w.p. e, then absorbed w.p. a. An absorbed message
   sets E's belief to M's, except on conflict (the local view holds the key, M is wrong),
   where E trusts the message w.p. w and keeps its local view otherwise. Not externalised or
   not absorbed: E acts as under ``none``;
4. ``raw``: absorbed w.p. a_raw(c); absorbed with the evidence E believes the key, absorbed
   without it E falls back on its local view. Not absorbed, the slice distracts E w.p. d_r
   (no belief: a uniform guess), else E acts on its local view;
5. closure: E with a belief acts on it w.p. p_c, else (and always without a belief) it picks
   uniformly over the K options.

Its success probabilities are exactly the closed forms `p_none`, `p_msg` and `p_raw`.

Each failed step gets one label, the first failing stage on E's way to a correct action
(`stage_flags`): ``closure`` when E's belief was right (no better content could have fixed
the step); otherwise ``misleading`` when the content carried M's wrong belief instead of the
key (the externalisation stage failing on a weak M, §D.5 claim 6), ``absorption`` when the
content held the key but E's belief did not, ``externalisation`` when nothing carrying the
key reached the content (no message written, ``none``, or a raw slice without the evidence).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy.special import expit

ACTIONS = ("none", "msg_plain", "msg_cryptic", "raw")
STAGES = ("externalisation", "misleading", "absorption", "closure")
SUCCESS = -1  # the stage label of a step that succeeded
NO_BELIEF = -1  # E's belief when it has none (it then guesses)


def sigmoid(x: np.ndarray | float) -> np.ndarray | float:
    return expit(np.asarray(x, dtype=float))  # no overflow at capacities far from the threshold


@dataclasses.dataclass(frozen=True)
class CommParams:
    """§D.5's parameters; the defaults are §D.5's, with the weak-local regime and a long raw slice."""

    K: int = 8  # options the executor chooses among
    q_L: float = 0.6  # P(local view contains the key)
    q_M: float = 0.9  # P(M's belief is correct)
    q_C: float = 0.95  # P(raw slice contains the evidence); §D.5 assumes q_C >= q_M
    e: float = 0.95  # P(M externalises its belief in the message)
    p_c: float = 0.95  # closure: P(E acts on its belief)
    w: float = 0.8  # P(E trusts the message over a conflicting local view)
    d_r: float = 0.3  # P(an unabsorbed raw slice distracts E into a uniform guess)
    a_plain: float = 0.95  # absorption of a plain message
    s: float = 4.0  # slope of the capacity sigmoids
    c_cryp: float = 3.0  # capacity at which a cryptic message is absorbed half the time
    l0: float = 1.0  # the length unit of raw slices
    capacity: float = 1.5  # c: the executor's capacity
    l_r: float = 4.0  # raw slice length, in units of l0 (§D.5: 1 short, 4 long)

    def __post_init__(self) -> None:
        if not (isinstance(self.K, (int, np.integer)) and self.K >= 2):
            raise ValueError(f"comm.K={self.K}: expected an integer >= 2 (options to choose among)")
        for name in ("q_L", "q_M", "q_C", "e", "p_c", "w", "d_r", "a_plain"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"comm.{name}={v}: expected a probability in [0, 1]")
        if not (math.isfinite(self.s) and self.s >= 0):
            raise ValueError(f"comm.s={self.s}: expected a slope >= 0")
        if not math.isfinite(self.c_cryp):
            raise ValueError(f"comm.c_cryp={self.c_cryp}: expected a finite capacity")
        for name in ("l0", "capacity", "l_r"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ValueError(f"comm.{name}={v}: expected a number > 0")

    @classmethod
    def weak_local(cls, **overrides: float) -> CommParams:
        """ContextBench-like: the executor's local view is weak, M is strong."""
        return cls(**{"q_L": 0.6, "q_M": 0.9, "q_C": 0.95, **overrides})

    @classmethod
    def strong_local(cls, **overrides: float) -> CommParams:
        """ToolSandbox-like: the local view is strong, M lacks the live state."""
        return cls(**{"q_L": 0.92, "q_M": 0.55, "q_C": 0.95, **overrides})


# -- absorption and closure -----------------------------------------------------------------------
def a_cryp(p: CommParams, capacity: float | None = None) -> float:
    # a_cryp(c) = σ(s(c − c_cryp))
    c = p.capacity if capacity is None else capacity
    return float(sigmoid(p.s * (c - p.c_cryp)))


def a_raw(p: CommParams, capacity: float | None = None, l_r: np.ndarray | float | None = None) -> np.ndarray | float:
    # a_raw(c) = σ(s(c − ℓ_r/ℓ_0))
    c = p.capacity if capacity is None else capacity
    length = p.l_r if l_r is None else np.asarray(l_r, dtype=float)
    return sigmoid(p.s * (c - length / p.l0))


def absorption(p: CommParams, action: str) -> float:
    """a of a message action: a_plain, or a_cryp at the executor's capacity."""
    if action == "msg_plain":
        return p.a_plain
    if action == "msg_cryptic":
        return a_cryp(p)
    raise ValueError(f"absorption: {action!r} is not a message action (msg_plain, msg_cryptic)")


def closure_rates(p: CommParams) -> tuple[float, float, float]:
    """(h1, h0, hu): success with a right belief, with a wrong one, and with none."""
    # h1 = p_c + (1−p_c)/K, h0 = (1−p_c)/K, hu = 1/K
    return p.p_c + (1 - p.p_c) / p.K, (1 - p.p_c) / p.K, 1.0 / p.K


# -- closed forms ---------------------------------------------------------------------------------
def _or(value, default):
    return default if value is None else np.asarray(value, dtype=float)


def p_none(p: CommParams, q_L: np.ndarray | float | None = None) -> np.ndarray | float:
    """P_∅ = q_L h1 + (1−q_L) hu."""
    q_L = _or(q_L, p.q_L)
    h1, _, hu = closure_rates(p)
    return q_L * h1 + (1 - q_L) * hu


def p_msg(p: CommParams, a: float, q_L: np.ndarray | float | None = None,
          q_M: np.ndarray | float | None = None) -> np.ndarray | float:
    """P_MSG for absorption ``a`` (a_plain or a_cryp: the same formula)."""
    q_L, q_M = _or(q_L, p.q_L), _or(q_M, p.q_M)
    h1, h0, _ = closure_rates(p)
    ea = p.e * a
    delivered = (q_L * (q_M * h1 + (1 - q_M) * (p.w * h0 + (1 - p.w) * h1))
                 + (1 - q_L) * (q_M * h1 + (1 - q_M) * h0))
    return ea * delivered + (1 - ea) * p_none(p, q_L)


def p_raw(p: CommParams, q_L: np.ndarray | float | None = None, l_r: np.ndarray | float | None = None,
          q_C: np.ndarray | float | None = None) -> np.ndarray | float:
    """P_RAW = a_raw[q_C h1 + (1−q_C) P_∅] + (1−a_raw)[d_r hu + (1−d_r) P_∅]."""
    q_L, q_C = _or(q_L, p.q_L), _or(q_C, p.q_C)
    h1, _, hu = closure_rates(p)
    ar = a_raw(p, l_r=l_r)
    local = p_none(p, q_L)
    return ar * (q_C * h1 + (1 - q_C) * local) + (1 - ar) * (p.d_r * hu + (1 - p.d_r) * local)


def dp_msg_dq_m(p: CommParams, a: float, q_L: np.ndarray | float | None = None) -> np.ndarray | float:
    """∂P_MSG/∂q_M = e a (h1 − h0)(1 − q_L(1−w)): small when q_L is high and w low."""
    q_L = _or(q_L, p.q_L)
    h1, h0, _ = closure_rates(p)
    return p.e * a * (h1 - h0) * (1 - q_L * (1 - p.w))


def success_probability(p: CommParams, action: str, q_L=None, q_M=None, l_r=None,
                        q_C=None) -> np.ndarray | float:
    """The closed-form success probability of ``action`` (arrays broadcast: one per instance)."""
    if action == "none":
        return p_none(p, q_L)
    if action in ("msg_plain", "msg_cryptic"):
        return p_msg(p, absorption(p, action), q_L, q_M)
    if action == "raw":
        return p_raw(p, q_L, l_r, q_C)
    raise ValueError(f"unknown action {action!r}; expected one of {ACTIONS}")


def closed_form_table(p: CommParams) -> dict[str, float]:
    """Every action's closed-form success at ``p``."""
    return {a: float(success_probability(p, a)) for a in ACTIONS}


# -- the generative process -----------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class State:
    """What forking a step copies: shared by every action run from it."""

    local_has_key: np.ndarray
    m_belief: np.ndarray  # the option M believes (0, the key, when M is right)
    raw_has_evidence: np.ndarray

    @property
    def m_right(self) -> np.ndarray:
        return self.m_belief == 0


@dataclasses.dataclass(frozen=True)
class Step:
    """One action run from a state: its success, E's belief and the failure stage flags."""

    success: np.ndarray
    belief: np.ndarray  # E's belief before acting (NO_BELIEF when it has none)
    flags: np.ndarray  # [n, len(STAGES)] booleans, see `stage_flags`

    @property
    def stage(self) -> np.ndarray:
        """The stage index of each failure in STAGES, SUCCESS for a success."""
        return np.where(self.flags.any(1), self.flags.argmax(1), SUCCESS)


def sample_state(p: CommParams, n: int, rng: np.random.Generator, q_L=None, q_M=None, q_C=None) -> State:
    """Step 1 of the process for ``n`` steps (per-step q_L, q_M, q_C arrays, or the parameters')."""
    q_L, q_M, q_C = (np.broadcast_to(_or(v, d), (n,)) for v, d in ((q_L, p.q_L), (q_M, p.q_M), (q_C, p.q_C)))
    local_has_key = rng.random(n) < q_L
    m_right = rng.random(n) < q_M
    m_belief = np.where(m_right, 0, rng.integers(1, p.K, n))
    return State(local_has_key, m_belief, rng.random(n) < q_C)


def stage_flags(fail: np.ndarray, belief_correct: np.ndarray, content_has_key: np.ndarray,
                content_wrong: np.ndarray) -> np.ndarray:
    """[n, 4] flags in STAGES order, each from its own condition (at most one holds per step)."""
    wrong = fail & ~belief_correct
    return np.stack([wrong & ~content_has_key & ~content_wrong,  # externalisation
                     wrong & content_wrong,  # misleading
                     wrong & content_has_key,  # absorption
                     fail & belief_correct], axis=1)  # closure


def run_action(p: CommParams, action: str, state: State, rng: np.random.Generator, l_r=None) -> Step:
    """Steps 2–5 of the process: ``action`` run from ``state`` (a per-step ``l_r`` array, or p.l_r)."""
    n = state.local_has_key.shape[0]
    local = np.where(state.local_has_key, 0, NO_BELIEF)
    no = np.zeros(n, dtype=bool)
    if action == "none":
        belief, has_key, wrong = local, no, no
    elif action in ("msg_plain", "msg_cryptic"):
        externalised = rng.random(n) < p.e
        absorbed = externalised & (rng.random(n) < absorption(p, action))
        conflict = state.local_has_key & ~state.m_right
        keeps_local = conflict & ~(rng.random(n) < p.w)
        belief = np.where(absorbed, np.where(keeps_local, 0, state.m_belief), local)
        has_key, wrong = externalised & state.m_right, externalised & ~state.m_right
    elif action == "raw":
        absorbed = rng.random(n) < np.broadcast_to(a_raw(p, l_r=l_r), (n,))
        distracted = rng.random(n) < p.d_r
        belief = np.where(absorbed, np.where(state.raw_has_evidence, 0, local),
                          np.where(distracted, NO_BELIEF, local))
        has_key, wrong = state.raw_has_evidence, no
    else:
        raise ValueError(f"unknown action {action!r}; expected one of {ACTIONS}")
    # closure: act on the belief w.p. p_c, else (or with no belief) pick uniformly
    closes = (belief != NO_BELIEF) & (rng.random(n) < p.p_c)
    chosen = np.where(closes, belief, rng.integers(0, p.K, n))
    success = chosen == 0
    return Step(success, belief, stage_flags(~success, belief == 0, has_key, wrong))


def monte_carlo(p: CommParams, action: str, n: int, seed: int = 0) -> dict[str, float]:
    """The process's success rate and each stage's share of all steps, over ``n`` draws."""
    rng = np.random.default_rng(seed)
    step = run_action(p, action, sample_state(p, n, rng), rng)
    out = {"success": float(step.success.mean())}
    out.update({s: float(step.flags[:, i].mean()) for i, s in enumerate(STAGES)})
    return out


def failure_shares(p: CommParams, action: str, n: int, seed: int = 0) -> dict[str, float]:
    """Each stage's share of the failed steps."""
    mc = monte_carlo(p, action, n, seed)
    fail = 1.0 - mc["success"]
    return {s: (mc[s] / fail if fail > 0 else 0.0) for s in STAGES}


# -- protocol tax ---------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class TaxModel:
    """tax(c) = κ_tok (tokens written + read) + κ_lat · latency. Every default is an assumption [ASM]."""

    kappa_tok: float = 1.0  # tax per token: tax is counted in tokens
    kappa_lat: float = 100.0  # a second of latency costs as much as 100 tokens
    tokens_per_unit: float = 1000.0  # tokens in one l0 of raw slice: l_r=1 is a 1k-token slice
    msg_plain_tokens: float = 100.0  # a plain message spells the key facts out
    msg_cryptic_tokens: float = 30.0  # a compressed-sufficient message refers to them by index
    write_s_per_token: float = 0.02  # M decodes a message at 50 tokens/s
    read_s_per_token: float = 1e-4  # E prefills what it reads at 10k tokens/s

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"comm.tax.{f.name}={v}: expected a number >= 0")


def action_tokens(action: str, l_r: np.ndarray | float, tax: TaxModel = TaxModel()) -> tuple:
    """(tokens written, tokens read) by ``action``: a message is written by M and read by E; a
    raw slice is copied (nothing generated) and read; ``none`` moves nothing."""
    l_r = np.asarray(l_r, dtype=float)
    zero = np.zeros_like(l_r)
    if action == "none":
        return zero, zero
    if action in ("msg_plain", "msg_cryptic"):
        m = tax.msg_plain_tokens if action == "msg_plain" else tax.msg_cryptic_tokens
        return zero + m, zero + m
    if action == "raw":
        return zero, l_r * tax.tokens_per_unit
    raise ValueError(f"unknown action {action!r}; expected one of {ACTIONS}")


def latency_s(written: np.ndarray | float, read: np.ndarray | float, tax: TaxModel = TaxModel()):
    """Seconds added to the step: M's decoding plus E's prefill."""
    return np.asarray(written) * tax.write_s_per_token + np.asarray(read) * tax.read_s_per_token


def protocol_tax(written: np.ndarray | float, read: np.ndarray | float, tax: TaxModel = TaxModel()):
    """tax = κ_tok (written + read) + κ_lat · latency; 0 for no tokens, increasing in each count."""
    w, r = np.asarray(written, dtype=float), np.asarray(read, dtype=float)
    return tax.kappa_tok * (w + r) + tax.kappa_lat * latency_s(w, r, tax)


def tax_matrix(l_r: np.ndarray, tax: TaxModel = TaxModel(), actions: Sequence[str] = ACTIONS) -> np.ndarray:
    """[n, len(actions)] tax of each action at each step's raw length."""
    return np.stack([protocol_tax(*action_tokens(a, l_r, tax), tax) for a in actions], axis=1)


# -- per-instance heterogeneity and counterfactual logging -------------------------------------------
@dataclasses.dataclass(frozen=True)
class Instances:
    """Per-step parameters: q_L and q_M drawn around the regime's values, the raw length."""

    q_L: np.ndarray
    q_M: np.ndarray
    q_C: np.ndarray
    l_r: np.ndarray


def beta_around(mean: float, concentration: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Beta(κ m, κ (1−m)): mean m, concentration κ (at m ∈ {0, 1} the point mass)."""
    if mean <= 0.0 or mean >= 1.0:
        return np.full(n, float(mean))
    return rng.beta(concentration * mean, concentration * (1 - mean), n)


def sample_instances(p: CommParams, n: int, rng: np.random.Generator, concentration: float = 20.0,
                     raw_lengths: Sequence[float] = (1.0, 4.0)) -> Instances:
    """§D.5's heterogeneity: q_L, q_M ~ Beta centred on the regime (concentration 20), l_r uniform
    over ``raw_lengths``. q_C is kept >= q_M, §D.5's assumption: the raw slice holds at least the
    evidence M's belief rests on."""
    q_L = beta_around(p.q_L, concentration, n, rng)
    q_M = beta_around(p.q_M, concentration, n, rng)
    return Instances(q_L, q_M, np.maximum(p.q_C, q_M), rng.choice(np.asarray(raw_lengths, dtype=float), n))


FEATURES = ("self_sufficiency", "m_confidence", "raw_length")


def noisy_features(inst: Instances, rng: np.random.Generator, noise: float = 0.1) -> np.ndarray:
    """[n, 3] in FEATURES order: E's self-assessed sufficiency q_L + N(0, σ), M's confidence
    q_M + N(0, σ), and l_r (known exactly)."""
    n = inst.q_L.shape[0]
    return np.stack([inst.q_L + rng.normal(0, noise, n), inst.q_M + rng.normal(0, noise, n), inst.l_r], axis=1)


@dataclasses.dataclass(frozen=True)
class LoggedSteps:
    """Counterfactual logs: every step forked and run under every action (columns: ACTIONS)."""

    instances: Instances
    features: np.ndarray  # [n, len(FEATURES)]
    success: np.ndarray  # [n, A] realised outcomes
    p_success: np.ndarray  # [n, A] each step's closed-form success probability under each action
    stage: np.ndarray  # [n, A] failure stage index (SUCCESS where the step succeeded)
    written: np.ndarray  # [n, A] tokens
    read: np.ndarray  # [n, A] tokens
    latency_s: np.ndarray  # [n, A]
    tax: np.ndarray  # [n, A]

    @property
    def n(self) -> int:
        return self.success.shape[0]


def log_steps(p: CommParams, n: int, rng: np.random.Generator, tax: TaxModel = TaxModel(),
              concentration: float = 20.0, noise: float = 0.1,
              raw_lengths: Sequence[float] = (1.0, 4.0)) -> LoggedSteps:
    """``n`` heterogeneous steps, each forked once per action (the shared `State`)."""
    inst = sample_instances(p, n, rng, concentration, raw_lengths)
    z = noisy_features(inst, rng, noise)
    state = sample_state(p, n, rng, inst.q_L, inst.q_M, inst.q_C)
    steps = [run_action(p, a, state, rng, inst.l_r) for a in ACTIONS]
    probs = [success_probability(p, a, inst.q_L, inst.q_M, inst.l_r, inst.q_C) for a in ACTIONS]
    tokens = [action_tokens(a, inst.l_r, tax) for a in ACTIONS]
    written = np.stack([t[0] for t in tokens], 1)
    read = np.stack([t[1] for t in tokens], 1)
    return LoggedSteps(inst, z, np.stack([s.success for s in steps], 1),
                       np.stack([np.broadcast_to(q, (n,)) for q in probs], 1), np.stack([s.stage for s in steps], 1),
                       written, read, latency_s(written, read, tax), protocol_tax(written, read, tax))


def train_test(p: CommParams, n_train: int = 20_000, n_test: int = 20_000, seed: int = 0,
               **kwargs) -> tuple[LoggedSteps, LoggedSteps]:
    """§D.5's logged training steps and test steps, from independent streams of one seed."""
    train_rng, test_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(2))
    return log_steps(p, n_train, train_rng, **kwargs), log_steps(p, n_test, test_rng, **kwargs)
