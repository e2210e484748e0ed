"""Multi-attribute preference data and its episodes (ALGORITHMS.md §C.2, "episode construction").

An `AttributeSet` is what the loaders of HelpSteer2, UltraFeedback and PKU-SafeRLHF return: groups of
responses to one prompt, each response with a score per attribute (NaN where the dataset has
none). An objective is a weight vector w over attributes; it prefers a to b by
``1[wᵀ(s_a − s_b) > 0]`` (``labels="threshold"``, pairs with a zero margin are ties and left out),
or by Bradley–Terry sampling, P(a ≻ b) = σ(β wᵀ(s_a − s_b)) (``labels="bt"``). A pair counts for an
objective only when both responses are scored on every attribute it weights.

An episode (`AttributeSet.episodes`) draws an objective, a query pair of one prompt and k demos
from pairs of other prompts, all labelled by that objective; each pair is shown in a random order
(the label flips with it). Held-out weightings and attributes are the caller's choice of
objectives for each split.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.special import expit

from troupe.envs.preferences.episodes import Comparison, Episode, draw_k
from troupe.platform.errors import ConfigError, DataError

LABELS = ("threshold", "bt")


@dataclasses.dataclass(frozen=True)
class ResponseGroup:
    """The responses of one prompt, ``scores[i, j]`` response i's score on attribute j (NaN: none)."""

    prompt: str
    responses: tuple[str, ...]
    scores: np.ndarray


@dataclasses.dataclass
class AttributeSet:
    """Scored responses grouped by prompt; ``source`` names the data in errors."""

    attributes: tuple[str, ...]
    groups: list[ResponseGroup]
    source: str = "<memory>"
    # (weights, labels) -> the labelled pairs of `pairs`: an episode stream asks for them every batch
    _tables: dict = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.groups:
            raise DataError(f"{self.source}: no prompt with two or more responses; a preference pair needs two")

    @property
    def prompts(self) -> list[str]:
        """The distinct prompt texts, in the order of their first group."""
        return list(dict.fromkeys(g.prompt for g in self.groups))

    def texts(self) -> list[tuple[str, str]]:
        """Every (prompt, response) of the set, group by group."""
        return [(g.prompt, r) for g in self.groups for r in g.responses]

    def split_by_prompt(self, fractions: Sequence[float], seed: int) -> list[list[ResponseGroup]]:
        """The groups in parts of about ``fractions`` of the prompts each (they sum to 1): a prompt's
        part is fixed by `prompt_hash` of its text, so every group of one prompt lands in one part
        and a part does not depend on the order or the other contents of the file."""
        edges = np.cumsum(fractions)
        if len(edges) == 0 or abs(edges[-1] - 1) > 1e-9 or min(fractions) < 0:
            raise ValueError(f"fractions {list(fractions)}: expected shares >= 0 that sum to 1")
        parts: list[list[ResponseGroup]] = [[] for _ in fractions]
        for g in self.groups:
            i = int(np.searchsorted(edges[:-1], prompt_hash(g.prompt, seed), side="right"))
            parts[i].append(g)
        return parts

    def limited(self, max_prompts: int, seed: int) -> AttributeSet:
        """The groups of ``max_prompts`` prompts chosen by `prompt_hash` (all of them if there are fewer),
        by a hash apart from `split_by_prompt`'s: the prompts kept spread over all of its parts."""
        prompts = self.prompts
        if len(prompts) <= max_prompts:
            return self
        keep = set(sorted(prompts, key=lambda p: prompt_hash(p, f"keep/{seed}"))[:max_prompts])
        return AttributeSet(self.attributes, [g for g in self.groups if g.prompt in keep], self.source)

    def objective(self, weights: Mapping[str, float]) -> np.ndarray:
        """The weight vector of ``{attribute: weight}``; an attribute the data lacks is an error that
        lists the ones it has."""
        if not isinstance(weights, Mapping) or not weights:
            raise ConfigError(f"{self.source}: objective {weights!r}: expected a non-empty mapping "
                              f"{{attribute: weight}} over {list(self.attributes)}")
        unknown = [a for a in weights if a not in self.attributes]
        if unknown:
            raise ConfigError(f"{self.source}: objective names attribute(s) {unknown} the dataset does not "
                              f"have; its attributes: {list(self.attributes)}")
        w = np.zeros(len(self.attributes))
        for a, v in weights.items():
            w[self.attributes.index(a)] = float(v)
        if not np.any(w):
            raise ConfigError(f"{self.source}: objective {dict(weights)} weights nothing; give a nonzero weight")
        return w

    def pairs(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every within-prompt pair an objective can label: (m, 3) ints (group, i, j), i < j, and the
        (m,) margins wᵀ(s_i − s_j)."""
        used = w != 0
        index, margins = [], []
        for g, group in enumerate(self.groups):
            s = group.scores
            ok = ~np.isnan(s[:, used]).any(1)
            for i in range(len(s)):
                for j in range(i + 1, len(s)):
                    if ok[i] and ok[j]:
                        index.append((g, i, j))
                        margins.append(float(w[used] @ (s[i, used] - s[j, used])))
        return np.array(index, dtype=np.int64).reshape(-1, 3), np.array(margins)

    def episodes(self, objectives: Mapping[str, Mapping[str, float]], n: int, rng: np.random.Generator,
                 k: int | tuple[int, int] = (0, 32), labels: str = "threshold", beta: float = 1.0) -> list[Episode]:
        """n episodes; each draws an objective of ``objectives`` (name → weights) uniformly, then a query
        pair and ``k`` demos (int or ``(lo, hi)`` uniform) from other prompts, labelled by it."""
        return self.labelled_episodes(objectives, n, rng, k, labels, beta)[0]

    def labelled_episodes(self, objectives: Mapping[str, Mapping[str, float]], n: int, rng: np.random.Generator,
                          k: int | tuple[int, int] = (0, 32), labels: str = "threshold",
                          beta: float = 1.0) -> tuple[list[Episode], np.ndarray]:
        """`episodes` (the same draws), and each query's P(a ≻ b) under its objective in the order it
        is shown: σ(β wᵀ(s_a − s_b)) for ``bt``, the label itself for ``threshold`` (it is exact)."""
        if labels not in LABELS:
            raise ConfigError(f"labels={labels!r}: expected one of {LABELS}")
        if not objectives:
            raise ConfigError(f"{self.source}: no objectives; give at least one {{name: {{attribute: weight}}}}")
        table = {name: self._table(name, weights, labels) for name, weights in objectives.items()}
        names = list(table)
        ks = draw_k(n, k, rng)
        out, p_true = [], np.zeros(n)
        for e in range(n):
            name = names[int(rng.integers(len(names)))]
            index, margins = table[name]
            q = int(rng.integers(len(index)))
            others = np.flatnonzero(index[:, 0] != index[q, 0])  # demos from other prompts: no leak of the query
            if ks[e] and not len(others):
                raise DataError(f"{self.source}: objective {name!r} has labelled pairs of one prompt only; "
                                "demos come from other prompts, so give data with more prompts or k=0")
            picks = others[rng.integers(len(others), size=int(ks[e]))] if ks[e] else []
            demos = tuple(self._comparison(index[p], margins[p], labels, beta, rng)[0] for p in picks)
            query, p_true[e] = self._comparison(index[q], margins[q], labels, beta, rng)
            out.append(Episode(demos, query, name))
        return out, p_true

    def _table(self, name: str, weights: Mapping[str, float], labels: str) -> tuple[np.ndarray, np.ndarray]:
        w = self.objective(weights)
        key = (tuple(w.tolist()), labels)
        if key not in self._tables:
            index, margins = self.pairs(w)
            if labels == "threshold":  # a zero margin is a tie: no preference to learn from
                index, margins = index[margins != 0], margins[margins != 0]
            if not len(index):
                raise DataError(f"{self.source}: objective {name!r} labels no pair (every pair is tied or "
                                "lacks a score it weights); give weights over attributes the data scores")
            self._tables[key] = (index, margins)
        return self._tables[key]

    def _comparison(self, pair: np.ndarray, margin: float, labels: str, beta: float,
                    rng: np.random.Generator) -> tuple[Comparison, float]:
        """The pair labelled by one draw, in a random order, and P(first shown ≻ second)."""
        group = self.groups[int(pair[0])]
        p = float(margin > 0) if labels == "threshold" else float(expit(beta * margin))
        c = Comparison(group.prompt, group.responses[int(pair[1])], group.responses[int(pair[2])],
                       int(rng.random() < p))
        if rng.random() < 0.5:  # §C.2: random swap with label flip
            return c.swapped(), 1.0 - p
        return c, p


def prompt_hash(prompt: str, seed: int | str) -> float:
    """A number in [0, 1), uniform over prompts, fixed by the prompt's text and ``seed``."""
    digest = hashlib.sha256(f"{seed}\x00{prompt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def group_rows(rows: Sequence[tuple[str, str, Sequence[float]]], attributes: Sequence[str],
               source: str) -> AttributeSet:
    """An `AttributeSet` from (prompt, response, scores) rows: responses of the same prompt text are
    one group; prompts with a single response are dropped (no pair)."""
    by_prompt: dict[str, list[tuple[str, Sequence[float]]]] = {}
    for prompt, response, scores in rows:
        by_prompt.setdefault(prompt, []).append((response, scores))
    groups = [ResponseGroup(p, tuple(r for r, _ in rs), np.array([s for _, s in rs], dtype=float).reshape(len(rs), -1))
              for p, rs in by_prompt.items() if len(rs) >= 2]
    return AttributeSet(tuple(attributes), groups, source)
