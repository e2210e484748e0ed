"""The split-context task of ALGORITHMS.md §D for tiny LMs: a main agent M holds a document, a
bounded executor E holds a local view and must pick one of K actions.

A pure data generator (numpy and the standard library only): it draws episodes, writes the
reference contents M may send, the exact prompts each agent sees, the SFT rows that teach a tiny
M to write messages and a tiny E to act, and the exact checkers of §D.1's failure stages. It is
no `Task`: that contract trains one policy, and this task has two.

**A step.** The episode has fixed slot names (``doc_facts`` of `SLOTS`); each step draws fresh
true values, one digit ``1..K`` per slot (the state moves between steps), and one slot is the
step's key. A fact is written ``door=3``. The step's correct action is a deterministic function
of the key's true value, set by its step type (`STEP_TYPES`): ``copy`` acts on the value itself
(``door=3`` → ``3``), ``next`` on the action after it, cyclically (``door=3`` → ``4``; ``K`` → ``1``),
so that acting is a computation on the belief and not only a copy.

**The parameters** (as in `troupe.algorithms.comm.simulator`, per step):

* ``q_L``: P(E's local view holds the key fact with its true value). Otherwise the local view
  holds, by ``local_miss``, distractors only (other slots: E has no belief about the key, the
  simulator's case) or ``stale``: the key with a wrong value among distractors (a wrong belief);
* ``q_M``: P(M's belief is right). Otherwise M's document holds a wrong value for the key
  (uniform over the K-1 others). The raw slice is verbatim from that document, so it holds the
  true value exactly when M is right: this task's q_C is q_M (the simulator allows q_C > q_M);
* ``raw_length`` and ``budget``, counted in facts (so they do not depend on a tokenizer; a fact
  is a handful of tokens): the raw slice has ``raw_length`` consecutive facts of M's document,
  with the key at a position the generator draws (``raw_key_position``). E reads only the first
  ``budget`` facts of what it receives, so a slice longer than the budget loses the key exactly
  when the key lies at or past position ``budget`` (0-based): raw fails for long slices;
* ``K`` actions (the digits ``1..K``) and ``steps`` steps per episode (joint success needs all).

**Contents** (`KINDS`), the reference forms M's engine will be trained to write:

* ``none``: nothing;
* ``plain``: the key fact from M's belief, stated: ``key door is 3``;
* ``cryptic``: two characters, the key slot's index in `SLOTS` as a letter (``a`` is
  ``SLOTS[0]``, ``b`` is ``SLOTS[1]``, ...) then the value: ``door=3`` is ``a3``, ``lamp=5`` is
  ``b5``. An ideal decoder, which knows the fixed table, recovers the fact exactly (Bayes-
  sufficient); a bounded executor has to have learned the table;
* ``raw``: the verbatim slice of M's document, facts separated by spaces.

**Stages** (§D.1, `first_failing_stage`): a failed step's first failing stage on E's way to the
right action. ``closure`` when E's restated belief was right (it knew the key, from the content
or its local view, and did not act on it); otherwise ``externalisation`` when the sent content
does not hold the true key fact (nothing sent, or M's wrong value: `misleading` tells those
apart), ``absorption`` when it does and E's belief still is not the key. A right belief ahead of
an empty content is closure, not externalisation, as in the simulator's `stage_flags`: no
better content could have saved that step.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

import numpy as np

from troupe.platform.errors import ConfigError

# Slot names; a slot's index is its cryptic code letter (a..l), so the list is fixed.
SLOTS = ("door", "lamp", "gate", "box", "cup", "map", "ring", "bell", "coin", "ship", "tree", "fan")
KINDS = ("none", "plain", "cryptic", "raw")
STEP_TYPES = ("copy", "next")
LOCAL_MISSES = ("distractors", "stale")
KEY_POSITIONS = ("uniform", "first", "last")
STAGES = ("externalisation", "absorption", "closure")
ROLES = ("main", "executor")
MAIN_VIEWS = ("belief", "document")
MAX_K = 8  # one digit per value and action
NO_CONTENT = "-"  # what E's prompt shows when nothing was sent
UNKNOWN = "?"  # E's restated value when it has no belief

Fact = tuple[str, int]

_CODE_LETTERS = "abcdefghijkl"[: len(SLOTS)]
_PLAIN = re.compile(r"\bkey\s+([a-z]+)\s+is\s+(\d+)\b")
_ASSIGN = re.compile(r"\b([a-z]+)\s*=\s*(\d+)\b")
_CODE = re.compile(rf"\b([{_CODE_LETTERS}])(\d)\b")
_ASK = {"copy": "act on", "next": "act after"}  # the question of each step type
_ACTION = re.compile(r"(?<!\d)([1-8])(?!\d)")


@dataclasses.dataclass(frozen=True)
class SplitContextConfig:
    """The task's parameters (see the module docstring); errors name the key ``task.<field>``.
    The defaults are the weak-local regime with a long raw slice, as the simulator's are."""

    K: int = 8  # actions, the digits 1..K; also the values a slot takes
    steps: int = 4  # steps per episode
    q_L: float = 0.6  # P(E's local view holds the key fact)
    q_M: float = 0.9  # P(M's belief about the key is right)
    doc_facts: int = 8  # facts in M's document: the episode's slots
    local_facts: int = 2  # facts in E's local view
    raw_length: int = 8  # facts in the raw slice
    budget: int = 2  # facts E reads of what it receives
    raw_key_position: str = "uniform"  # where the key sits in the raw slice: uniform, first, last
    local_miss: str = "distractors"  # a local view without the key: distractors only, or stale
    step_types: tuple[str, ...] = ("copy",)  # each step draws one uniformly
    # What M's prompt shows: its whole document ("document": M finds the key itself) or only
    # the key's fact as its document holds it ("belief": M writes it up; a tiny M learns that in
    # a few hundred SFT steps, where looking a key up among 8 facts takes it thousands).
    main_view: str = "belief"

    def __post_init__(self) -> None:
        _check(_is_int(self.K) and 2 <= self.K <= MAX_K, "K", self.K, f"an integer in 2..{MAX_K}")
        _check(_is_int(self.steps) and 1 <= self.steps <= 8, "steps", self.steps, "an integer in 1..8")
        for name in ("q_L", "q_M"):
            v = getattr(self, name)
            _check(isinstance(v, (int, float)) and 0.0 <= v <= 1.0, name, v, "a probability in [0, 1]")
        _check(_is_int(self.doc_facts) and 2 <= self.doc_facts <= len(SLOTS), "doc_facts", self.doc_facts,
               f"an integer in 2..{len(SLOTS)}")
        # a local view without the key still needs local_facts other slots
        _check(_is_int(self.local_facts) and 1 <= self.local_facts < self.doc_facts, "local_facts",
               self.local_facts, f"an integer in 1..doc_facts-1 ({self.doc_facts - 1})")
        _check(_is_int(self.raw_length) and 1 <= self.raw_length <= self.doc_facts, "raw_length",
               self.raw_length, f"an integer in 1..doc_facts ({self.doc_facts})")
        _check(_is_int(self.budget) and self.budget > 0, "budget", self.budget, "an integer > 0")
        _check(self.raw_key_position in KEY_POSITIONS, "raw_key_position", self.raw_key_position,
               f"one of {KEY_POSITIONS}")
        _check(self.local_miss in LOCAL_MISSES, "local_miss", self.local_miss, f"one of {LOCAL_MISSES}")
        _check(self.main_view in MAIN_VIEWS, "main_view", self.main_view, f"one of {MAIN_VIEWS}")
        types = tuple(self.step_types) if isinstance(self.step_types, (list, tuple)) else ()
        _check(bool(types) and all(t in STEP_TYPES for t in types), "step_types", self.step_types,
               f"a non-empty list of {STEP_TYPES}")
        object.__setattr__(self, "step_types", types)

    # The simulator's regimes (§D.5), with a raw slice that overflows the budget (long: the
    # whole document against a 2-fact budget, the key lost 6 times in 8) or fits it (short).
    @classmethod
    def weak_local(cls, raw: str = "long", **overrides) -> SplitContextConfig:
        """ContextBench-like: the local view is weak (q_L 0.6), M is strong (q_M 0.9)."""
        return cls(**{"q_L": 0.6, "q_M": 0.9, **_raw_regime(raw), **overrides})

    @classmethod
    def strong_local(cls, raw: str = "long", **overrides) -> SplitContextConfig:
        """ToolSandbox-like: the local view is strong (q_L 0.92), M lacks the live state (q_M 0.55)."""
        return cls(**{"q_L": 0.92, "q_M": 0.55, **_raw_regime(raw), **overrides})


RAW_REGIMES = {"long": {"raw_length": 8, "budget": 2}, "short": {"raw_length": 2, "budget": 2}}


def _raw_regime(raw: str) -> dict:
    if raw not in RAW_REGIMES:
        raise ConfigError(f"config key 'task.raw' = {raw!r} is not allowed: expected one of {tuple(RAW_REGIMES)}")
    return RAW_REGIMES[raw]


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _check(ok: bool, field: str, value: object, allowed: str) -> None:
    if not ok:
        raise ConfigError(f"config key 'task.{field}' = {value!r} is not allowed: expected {allowed}")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"content kind {kind!r} is unknown: expected one of {KINDS}")


# -- facts, messages and their parsers ------------------------------------------------------------
def fact_text(fact: Fact) -> str:
    return f"{fact[0]}={fact[1]}"


def facts_text(facts: Sequence[Fact]) -> str:
    return " ".join(fact_text(f) for f in facts)


def plain_message(fact: Fact) -> str:
    """The plain message of a fact: ``key door is 3``."""
    return f"key {fact[0]} is {fact[1]}"


def cryptic_message(fact: Fact) -> str:
    """The cryptic code of a fact: its slot's index in `SLOTS` as a letter, then the value (``a3``)."""
    return f"{_CODE_LETTERS[SLOTS.index(fact[0])]}{fact[1]}"


def decode_cryptic(text: str) -> Fact | None:
    """The fact of the first cryptic code in ``text``, or None."""
    m = _CODE.search(text.lower())
    return (SLOTS[_CODE_LETTERS.index(m.group(1))], int(m.group(2))) if m else None


def _fact_spans(text: str, cryptic: bool = True) -> list[tuple[int, int, str, int]]:
    """(start, end, name, value) of every fact stated in ``text``, in order of appearance."""
    text = text.lower()  # case does not matter; the patterns allow any spacing
    found = [(m.start(), m.end(), m.group(1), int(m.group(2))) for m in _PLAIN.finditer(text)]
    found += [(m.start(), m.end(), m.group(1), int(m.group(2))) for m in _ASSIGN.finditer(text)]
    if cryptic:
        found += [(m.start(), m.end(), SLOTS[_CODE_LETTERS.index(m.group(1))], int(m.group(2)))
                  for m in _CODE.finditer(text)]
    return [f for f in sorted(found) if f[2] in SLOTS]


def parse_facts(text: str, cryptic: bool = True) -> list[Fact]:
    """Every fact stated in ``text`` in any form (``door=3``, ``key door is 3``, and with
    ``cryptic`` the code ``a3``), in order of appearance; names outside `SLOTS` are not facts."""
    return [(name, value) for _, _, name, value in _fact_spans(text, cryptic)]


def truncate(content: str, budget: int) -> str:
    """What E reads of ``content``: the text up to the end of its ``budget``-th fact (a message is
    one fact and always fits; a raw slice loses the facts past the budget)."""
    spans = _fact_spans(content)
    return content if len(spans) <= budget else content[:spans[budget - 1][1]]


def parse_action(text: str) -> str | None:
    """The first action (a standalone digit 1..8) in ``text``, or None."""
    m = _ACTION.search(text)
    return m.group(1) if m else None


def parse_restated_key(text: str) -> Fact | None:
    """The fact E restated when probed (``door=3``), or None (no fact, or ``door=?``)."""
    facts = parse_facts(text, cryptic=False)
    return facts[0] if facts else None


def action_for(step_type: str, value: int, K: int) -> str:
    """The action a belief ``value`` about the key calls for under ``step_type``."""
    if step_type == "copy":
        return str(value)
    if step_type == "next":
        return str(value % K + 1)
    raise ValueError(f"step type {step_type!r} is unknown: expected one of {STEP_TYPES}")


# -- episodes -------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Step:
    """One step: the truth, M's document (with M's belief about the key), E's local view."""

    index: int
    step_type: str
    K: int
    key: str
    value: int  # the key's true value
    document: tuple[Fact, ...]  # M's document, in order; the key holds M's belief
    local: tuple[Fact, ...]  # E's local view
    raw_start: int  # the raw slice is document[raw_start : raw_start + raw_length]
    raw_key_pos: int  # the key's position in the raw slice (0-based)
    raw_length: int
    budget: int

    @property
    def action(self) -> str:
        """The correct action: a function of the key's true value."""
        return action_for(self.step_type, self.value, self.K)

    @property
    def key_fact(self) -> Fact:
        return (self.key, self.value)

    @property
    def m_belief(self) -> int:
        return dict(self.document)[self.key]

    @property
    def m_right(self) -> bool:
        return self.m_belief == self.value

    @property
    def local_has_key(self) -> bool:
        return self.key_fact in self.local

    @property
    def raw_slice(self) -> tuple[Fact, ...]:
        return self.document[self.raw_start:self.raw_start + self.raw_length]

    def content(self, kind: str) -> str:
        """The reference content of ``kind`` M sends (from its belief)."""
        _check_kind(kind)
        belief = (self.key, self.m_belief)
        return {"none": "", "plain": plain_message(belief), "cryptic": cryptic_message(belief),
                "raw": facts_text(self.raw_slice)}[kind]

    def received(self, kind: str) -> str:
        """What E reads of the reference content: truncated to its budget."""
        return truncate(self.content(kind), self.budget)


@dataclasses.dataclass(frozen=True)
class Episode:
    slots: tuple[str, ...]
    steps: tuple[Step, ...]


class SplitContext:
    """The seeded generator of episodes and of the prompts each agent sees."""

    def __init__(self, config: SplitContextConfig | None = None, **overrides) -> None:
        config = SplitContextConfig() if config is None else config
        self.config = dataclasses.replace(config, **overrides) if overrides else config

    def episode(self, rng: np.random.Generator, q_L: float | None = None, q_M: float | None = None) -> Episode:
        """One episode; ``q_L``, ``q_M`` override the config's for this episode (per-instance heterogeneity)."""
        c = self.config
        q_L = c.q_L if q_L is None else q_L
        q_M = c.q_M if q_M is None else q_M
        for name, v in (("q_L", q_L), ("q_M", q_M)):
            _check(0.0 <= v <= 1.0, name, v, "a probability in [0, 1]")
        slots = tuple(SLOTS[i] for i in sorted(rng.permutation(len(SLOTS))[:c.doc_facts]))
        return Episode(slots, tuple(self._step(t, slots, q_L, q_M, rng) for t in range(c.steps)))

    def episodes(self, n: int, rng: np.random.Generator) -> list[Episode]:
        return [self.episode(rng) for _ in range(n)]

    def steps(self, n: int, rng: np.random.Generator) -> list[Step]:
        """``n`` steps, from as many episodes as that takes."""
        out: list[Step] = []
        while len(out) < n:
            out.extend(self.episode(rng).steps)
        return out[:n]

    def _step(self, t: int, slots: tuple[str, ...], q_L: float, q_M: float, rng: np.random.Generator) -> Step:
        c = self.config
        step_type = c.step_types[int(rng.integers(len(c.step_types)))]
        truth = {s: int(v) for s, v in zip(slots, rng.integers(1, c.K + 1, len(slots)), strict=True)}
        key = slots[int(rng.integers(len(slots)))]
        m_value = truth[key] if rng.random() < q_M else _wrong(truth[key], c.K, rng)
        local_has_key = rng.random() < q_L
        # M's document in a random order, the key moved to its drawn position in the raw slice
        order = [slots[i] for i in rng.permutation(len(slots))]
        pos = {"uniform": int(rng.integers(c.raw_length)), "first": 0, "last": c.raw_length - 1}[c.raw_key_position]
        start = int(rng.integers(c.doc_facts - c.raw_length + 1))
        i, j = order.index(key), start + pos
        order[i], order[j] = order[j], order[i]
        document = tuple((s, m_value if s == key else truth[s]) for s in order)
        # E's local view: the key (true, stale or absent) among distractors, in a random order
        others = [s for s in slots if s != key]
        picks = [others[k] for k in rng.permutation(len(others))[:c.local_facts]]
        if local_has_key:
            local = [(key, truth[key])] + [(s, truth[s]) for s in picks[1:]]
        elif c.local_miss == "stale":
            local = [(key, _wrong(truth[key], c.K, rng))] + [(s, truth[s]) for s in picks[1:]]
        else:
            local = [(s, truth[s]) for s in picks]
        local = [local[k] for k in rng.permutation(len(local))]
        return Step(t, step_type, c.K, key, truth[key], document, tuple(local), start, pos, c.raw_length, c.budget)

    # -- prompts ----------------------------------------------------------------------------------
    def main_prompt(self, step: Step, kind: str) -> str:
        """M's prompt for a message of ``kind`` (``plain`` or ``cryptic``; the others are not
        written): with ``main_view="document"`` its whole document, where it must find the key;
        with ``"belief"`` the key's fact as its document holds it (M then only writes it)."""
        _check_kind(kind)
        if kind not in ("plain", "cryptic"):
            raise ValueError(f"content kind {kind!r} is not written by M: main prompts are for 'plain' or 'cryptic'")
        how = "plain" if kind == "plain" else "code"
        seen = facts_text(step.document) if self.config.main_view == "document" else fact_text((step.key, step.m_belief))
        head = "doc" if self.config.main_view == "document" else "note"
        return f"{head}: {seen}\nsend {step.key} {how}:"

    @staticmethod
    def executor_prompt(step: Step, received: str) -> str:
        """E's prompt to act: its local view, the content it read, the question."""
        if step.step_type not in _ASK:
            raise ValueError(f"step type {step.step_type!r} is unknown: expected one of {STEP_TYPES}")
        return f"{_executor_context(step, received)}\n{_ASK[step.step_type]} {step.key}:"

    @staticmethod
    def probe_prompt(step: Step, received: str) -> str:
        """The absorption probe: E restates the key (``door=3``, or ``door=?``) before acting."""
        return f"{_executor_context(step, received)}\nrestate {step.key}:"

    # -- SFT --------------------------------------------------------------------------------------
    def sft_rows(self, role: str, n: int, rng: np.random.Generator, kinds: Sequence[str] | None = None) -> list[dict]:
        """``n`` SFT rows ``{"prompt", "answer", ...}`` for ``role``, as `troupe.algorithms.sft` fits
        them. ``main``: a plain or cryptic message of M's belief from its document. ``executor``:
        from its local view and the reference content of each kind, the action (``question="act"``)
        or the restated key (``"restate"``) of the ideal executor: what its inputs show, a uniform
        guess without a belief. The rows also carry ``role``, ``kind``, ``question``, ``key``, ``value``
        (the truth) and ``action`` (the correct one)."""
        if role not in ROLES:
            raise ValueError(f"SFT role {role!r} is unknown: expected one of {ROLES}")
        kinds = tuple(kinds) if kinds is not None else (("plain", "cryptic") if role == "main" else KINDS)
        for kind in kinds:
            _check_kind(kind)
            if role == "main" and kind not in ("plain", "cryptic"):
                raise ValueError(f"content kind {kind!r} is not written by M: main rows are 'plain' or 'cryptic'")
        rows = []
        for step in self.steps(n, rng):
            kind = kinds[int(rng.integers(len(kinds)))]
            meta = {"role": role, "kind": kind, "key": step.key, "value": step.value, "action": step.action}
            if role == "main":
                rows.append({"prompt": self.main_prompt(step, kind), "answer": step.content(kind),
                             "question": "message", **meta})
                continue
            received = step.received(kind)
            restated, action = ideal_executor(step, received, rng)
            if rng.random() < 0.5:
                rows.append({"prompt": self.executor_prompt(step, received), "answer": action,
                             "question": "act", **meta})
            else:
                rows.append({"prompt": self.probe_prompt(step, received), "answer": restated,
                             "question": "restate", **meta})
        return rows


def _wrong(value: int, K: int, rng: np.random.Generator) -> int:
    """A value uniform over the K-1 others."""
    v = int(rng.integers(1, K))
    return v if v < value else v + 1


def _executor_context(step: Step, received: str) -> str:
    # The key is named first as well as in the question: a tiny executor then finds it in its
    # view in about half the SFT steps (the question alone sits after what it must search).
    return f"about {step.key}\nview: {facts_text(step.local)}\nmsg: {received or NO_CONTENT}"


class SplitContextSFT:
    """One agent's SFT rows as an `SFTTask` (``sample`` and ``corpus``), for the existing SFT path."""

    def __init__(self, task: SplitContext, role: str, kinds: Sequence[str] | None = None) -> None:
        if role not in ROLES:
            raise ValueError(f"SFT role {role!r} is unknown: expected one of {ROLES}")
        self.task, self.role, self.kinds = task, role, kinds

    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]:
        if split != "train":
            raise ValueError(f"SFT samples the 'train' split, got {split!r}")
        return self.task.sft_rows(self.role, n, rng, self.kinds)

    def corpus(self, n: int = 4000, seed: int = 0) -> list[str]:
        """Text to train the agent's tokenizer on."""
        return [f"{r['prompt']}\n{r['answer']}" for r in self.sample(n, "train", np.random.default_rng(seed))]


# -- the ideal executor and the stage checkers -----------------------------------------------------
def ideal_belief(step: Step, received: str, decodes_cryptic: bool = True) -> int | None:
    """An ideal executor's value for the key: the content's (it trusts what M sent), else its local
    view's, else None. With ``decodes_cryptic=False`` it cannot read the code (a bounded executor)."""
    for facts in (parse_facts(received, decodes_cryptic), step.local):
        values = [v for name, v in facts if name == step.key]
        if values:
            return values[0]
    return None


def ideal_executor(step: Step, received: str, rng: np.random.Generator,
                   decodes_cryptic: bool = True) -> tuple[str, str]:
    """(restated key, action) of the ideal executor: it acts on its belief, or guesses uniformly."""
    belief = ideal_belief(step, received, decodes_cryptic)
    if belief is None:
        return f"{step.key}={UNKNOWN}", str(int(rng.integers(1, step.K + 1)))
    return fact_text((step.key, belief)), action_for(step.step_type, belief, step.K)


def externalised(content: str, step: Step) -> bool:
    """The externalisation check: the key's true fact is stated, exactly, in what was sent."""
    return step.key_fact in parse_facts(content)


def misleading(content: str, step: Step) -> bool:
    """What was sent states a wrong value for the key (the weak-M share of externalisation failures)."""
    return any(name == step.key and v != step.value for name, v in parse_facts(content))


def first_failing_stage(step: Step, content: str, restated: str, action: str) -> str | None:
    """§D.1's first failing stage of a step from what M sent, E's probe answer and E's action
    text: None on success, else exactly one of `STAGES` (see the module docstring)."""
    if parse_action(action) == step.action:
        return None
    if parse_restated_key(restated) == step.key_fact:
        return "closure"
    return "absorption" if externalised(content, step) else "externalisation"
