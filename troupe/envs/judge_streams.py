"""Pairwise-judgment streams for BayesJudge (ALGORITHMS.md §G.6): the synthetic generator and SummEval.

`synthetic_stream` draws §G.6's benchmark: verdicts from π, experts and crowd workers with
confusion rows set by (diag, tie), and an LLM judge whose two presentation orders are each right
with probability `judge_accuracy`, except that with probability β_ord the pair says "first" in
both orders; that makes β_ord(v) = β_ord exactly for every v (β_ord = 0: the null condition).

`load_summeval` reads SummEval's `model_annotations.aligned.jsonl` (one summary per line, with
`expert_annotations` and `turker_annotations` lists of coherence/consistency/fluency/relevance
scores) and turns two systems' summaries of one document into pairwise labels: each rater's label
is the sign of their score difference, T when equal. The file names no annotators, so the k-th
entry of each list is taken to be the same rater on every summary ("expert0", "turker0", ...).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from troupe.algorithms.judge.model import FIRST_CONSISTENT, VERDICTS, Comparison, HumanLabel, JudgePair
from troupe.platform.errors import ConfigError, DataError

DIMENSIONS = ("coherence", "consistency", "fluency", "relevance")


def confusion(diag: float, tie: float) -> np.ndarray:
    """(3, 3) a rater's rows: Θ[v,v] = diag; for v ∈ {A,B} Θ[v,T] = tie and the rest to the other side;
    for v = T the rest splits evenly between A and B."""
    if not (0 < diag < 1 and 0 <= tie and diag + tie <= 1):
        raise ConfigError(f"rater diag={diag}, tie={tie}: expected 0 < diag < 1, tie >= 0, diag + tie <= 1")
    return np.array(
        [[diag, 1 - diag - tie, tie], [1 - diag - tie, diag, tie], [(1 - diag) / 2, (1 - diag) / 2, diag]]
    )


def judge_phi(accuracy: float, beta: float) -> np.ndarray:
    """(3, 9) Φ[v,·]: (1 − β) × two independent orders right w.p. accuracy, + β × the (A,B) cell."""
    if not (0 < accuracy < 1 and 0 <= beta <= 1):
        raise ConfigError(f"judge accuracy={accuracy}, beta_ord={beta}: expected 0 < accuracy < 1, 0 <= beta <= 1")
    q = np.full((3, 3), (1 - accuracy) / 2)
    np.fill_diagonal(q, accuracy)
    phi = (1 - beta) * (q[:, :, None] * q[:, None, :]).reshape(3, 9)
    phi[:, FIRST_CONSISTENT] += beta
    return phi


@dataclasses.dataclass(frozen=True)
class SyntheticConfig:
    """§G.6's defaults."""

    n: int = 1500
    pi: tuple[float, float, float] = (0.4, 0.4, 0.2)
    n_experts: int = 3
    expert_diag: float = 0.85
    expert_tie: float = 0.05
    experts_per_item: int = 3
    n_crowd: int = 30
    crowd_diag: float = 0.65
    crowd_tie: float = 0.2
    crowd_per_item: int = 3
    judge_accuracy: float = 0.8
    beta_ord: float = 0.15  # 0: the null condition
    rater_concentration: float | None = None  # Θ_r ~ Dir(c · group rows); None: every rater at its group's rows
    late_fraction: float = 0.0  # share of human labels that arrive later, as late events
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError(f"synthetic n={self.n}: expected >= 1")
        if self.experts_per_item > self.n_experts or self.crowd_per_item > self.n_crowd:
            raise ConfigError("synthetic: raters per item exceed the raters of that group")
        if abs(sum(self.pi) - 1) > 1e-9 or min(self.pi) < 0:
            raise ConfigError(f"synthetic pi={self.pi}: expected a probability vector over (A, B, T)")
        if not 0 <= self.late_fraction < 1:
            raise ConfigError(f"synthetic late_fraction={self.late_fraction}: expected [0, 1)")


@dataclasses.dataclass
class SyntheticStream:
    comparisons: list[Comparison]  # in arrival order, late labels included
    verdicts: np.ndarray  # (n,) the latent truth, indices into VERDICTS
    raters: list[str]
    rater_groups: list[str]
    theta: np.ndarray  # (R, 3, 3) true rows, in the order of `raters`
    phi: np.ndarray  # (3, 9) the judge's true pair model
    pi: np.ndarray
    disagreement: np.ndarray  # (n,) 1 − the largest share of one verdict among the item's human labels
    config: SyntheticConfig


def synthetic_stream(config: SyntheticConfig = SyntheticConfig()) -> SyntheticStream:
    c = config
    rng = np.random.default_rng(c.seed)
    raters = [f"expert{k}" for k in range(c.n_experts)] + [f"crowd{k}" for k in range(c.n_crowd)]
    groups = ["expert"] * c.n_experts + ["crowd"] * c.n_crowd
    rows = [confusion(c.expert_diag, c.expert_tie)] * c.n_experts + [confusion(c.crowd_diag, c.crowd_tie)] * c.n_crowd
    if c.rater_concentration is not None:
        rows = [np.stack([rng.dirichlet(c.rater_concentration * r + 1e-6) for r in m]) for m in rows]
    theta = np.asarray(rows).reshape(-1, 3, 3)
    phi = judge_phi(c.judge_accuracy, c.beta_ord)
    pi = np.asarray(c.pi, dtype=float)
    v = rng.choice(3, size=c.n, p=pi)
    now: list[Comparison] = []
    later: list[tuple[int, Comparison]] = []
    disagreement = np.zeros(c.n)
    for i in range(c.n):
        who = list(rng.choice(c.n_experts, c.experts_per_item, replace=False))
        who += list(c.n_experts + rng.choice(c.n_crowd, c.crowd_per_item, replace=False))
        labels, held = [], []
        for r in sorted(who):
            lab = HumanLabel(raters[r], VERDICTS[rng.choice(3, p=theta[r, v[i]])], groups[r])
            (held if rng.random() < c.late_fraction else labels).append(lab)
        ys = [lab.label for lab in labels + held]
        disagreement[i] = 1 - max(ys.count(x) for x in VERDICTS) / len(ys) if ys else 0.0
        pair = rng.choice(9, p=phi[v[i]])
        cid = f"syn{i}"
        now.append(Comparison(cid, tuple(labels), JudgePair(VERDICTS[pair // 3], VERDICTS[pair % 3]), (f"a{i}", f"b{i}")))
        for lab in held:
            later.append((int(rng.integers(i + 1, c.n + 1)), Comparison(cid, (lab,))))
    # late labels join the stream after the comparison they belong to, at their drawn position
    order = sorted([(k, 0, k) for k in range(len(now))] + [(pos, 1, k) for k, (pos, _) in enumerate(later)])
    stream = [now[k] if kind == 0 else later[k][1] for _, kind, k in order]
    return SyntheticStream(stream, v, raters, groups, theta, phi, pi, disagreement, c)


# -- SummEval ----------------------------------------------------------------------------------------
@dataclasses.dataclass
class PairMeta:
    document: str
    dimension: str
    system_a: str
    system_b: str
    disagreement: float  # 1 − the largest share of one verdict among the human labels


@dataclasses.dataclass
class SummEvalPairs:
    comparisons: list[Comparison]
    meta: list[PairMeta]
    counts: dict[str, int]


def _scores(rec: dict, field: str, dims: Sequence[str], where: str) -> list[dict[str, float]]:
    anns = rec.get(field)
    if not isinstance(anns, list):
        raise DataError(f"{where}: field {field!r} is missing or not a list of score objects")
    out = []
    for k, a in enumerate(anns):
        if not isinstance(a, dict):
            raise DataError(f"{where}: {field}[{k}] is not an object of scores")
        row = {}
        for d in dims:
            if d not in a:
                raise DataError(f"{where}: {field}[{k}] lacks the score {d!r}")
            try:
                row[d] = float(a[d])
            except (TypeError, ValueError):
                raise DataError(f"{where}: {field}[{k}].{d}={a[d]!r} is not a number") from None
        out.append(row)
    return out


def _sign(a: float, b: float) -> str:
    return "A" if a > b else "B" if b > a else "T"


def load_summeval(
    path: str | os.PathLike,
    dimensions: Sequence[str] = DIMENSIONS,
    pairs_per_document: int | None = 20,
    seed: int = 0,
) -> SummEvalPairs:
    """Pairwise labels from SummEval's aligned annotations (§G.6 GPU-scale), per document and dimension.

    pairs_per_document system pairs are drawn per document (None: every pair); each comparison
    holds one label per expert and per turker. A line repeating a (document, system) with another
    summary raises; an exact repeat is skipped and counted.
    """
    bad = [d for d in dimensions if d not in DIMENSIONS]
    if bad:
        raise ConfigError(f"SummEval dimensions {bad}: expected a subset of {DIMENSIONS}")
    docs: dict[str, dict[str, tuple[str, dict[str, list[dict[str, float]]]]]] = {}
    counts = {"lines": 0, "duplicate_lines": 0, "pairs": 0}
    for where, rec in _jsonl_records(path):
        for field in ("id", "model_id", "decoded"):
            if not isinstance(rec, dict) or field not in rec:
                raise DataError(f"{where}: lacks the field {field!r} (a SummEval aligned-annotation line)")
        anns = {g: _scores(rec, f"{g}_annotations", dimensions, where) for g in ("expert", "turker")}
        doc, system, text = str(rec["id"]), str(rec["model_id"]), str(rec["decoded"])
        counts["lines"] += 1
        prev = docs.setdefault(doc, {}).get(system)
        if prev is not None:
            if prev[0] != text:
                raise DataError(
                    f"{where}: document {doc!r}, system {system!r} repeats with a different summary; "
                    "keep one summary per system and document"
                )
            counts["duplicate_lines"] += 1
            continue
        docs[doc][system] = (text, anns)
    rng = np.random.default_rng(seed)
    comparisons, meta = [], []
    for doc in sorted(docs):
        systems = sorted(docs[doc])
        pairs = list(itertools.combinations(systems, 2))
        if pairs_per_document is not None and len(pairs) > pairs_per_document:
            pairs = [pairs[k] for k in sorted(rng.choice(len(pairs), pairs_per_document, replace=False))]
        for sa, sb in pairs:
            (ta, aa), (tb, ab) = docs[doc][sa], docs[doc][sb]
            for d in dimensions:
                labels = [
                    HumanLabel(f"{g}{k}", _sign(x[d], y[d]), g)
                    for g in ("expert", "turker")
                    for k, (x, y) in enumerate(zip(aa[g], ab[g], strict=False))
                ]
                ys = [lab.label for lab in labels]
                dis = 1 - max(ys.count(x) for x in VERDICTS) / len(ys) if ys else 0.0
                comparisons.append(Comparison(f"{doc}:{d}:{sa}|{sb}", tuple(labels), None, (ta, tb)))
                meta.append(PairMeta(doc, d, sa, sb, dis))
    counts["pairs"] = len(comparisons)
    return SummEvalPairs(comparisons, meta, counts)


# -- the user's own streams --------------------------------------------------------------------------
@dataclasses.dataclass
class StreamFile:
    comparisons: list[Comparison]  # in file order; a repeated id is a late arrival
    truth: dict[str, str]  # comparison id -> "A", "B" or "T", for the lines that give one


def load_stream_jsonl(path: str | os.PathLike) -> StreamFile:
    """A judgment stream in JSONL, one arrival per line, for ``troupe run judge`` (``streams.files``)::

        {"id": "c1", "labels": [{"rater": "e1", "label": "A", "group": "expert"},
                                {"rater": "w3", "label": ["A", "T"], "group": "crowd"}],
         "judge": {"ab": "A", "ba": null}, "responses": ["...", "..."], "truth": "A"}

    ``labels`` (a verdict or a list of them, a set-valued label), ``judge`` (content-space verdicts
    of the two orders; null for an answer that parsed to no verdict), ``responses`` and ``truth``
    are optional. The shape of each line is checked here, naming the line; the labels themselves
    (verdicts outside A/B/T, empty sets, missing groups, a repeated id with other responses) are
    checked by `encode_stream`, which names the comparison.
    """
    comparisons: list[Comparison] = []
    truth: dict[str, str] = {}
    for where, rec in _jsonl_records(path):
        if not isinstance(rec, dict) or "id" not in rec:
            raise DataError(f"{where}: expected an object with an 'id' (and 'labels', 'judge', 'responses')")
        cid = str(rec["id"])
        labels = []
        raw = rec.get("labels") or []
        if not isinstance(raw, list):
            raise DataError(f"{where}: 'labels' must be a list of {{'rater', 'label', 'group'}} objects")
        for k, lab in enumerate(raw):
            if not isinstance(lab, dict) or "rater" not in lab or "label" not in lab:
                raise DataError(f"{where}: labels[{k}] = {lab!r}; expected an object with 'rater' and 'label'")
            value = lab["label"]
            if not isinstance(value, str | list):
                raise DataError(f"{where}: labels[{k}].label = {value!r}; expected A, B, T or a list of them")
            group = lab.get("group")
            labels.append(HumanLabel(str(lab["rater"]), value if isinstance(value, str) else frozenset(value),
                                     None if group is None else str(group)))
        judge = rec.get("judge")
        if judge is not None:
            if not isinstance(judge, dict) or set(judge) - {"ab", "ba"}:
                raise DataError(f"{where}: 'judge' must be {{'ab': verdict or null, 'ba': verdict or null}}")
            judge = JudgePair(judge.get("ab"), judge.get("ba"))
        responses = rec.get("responses")
        if responses is not None:
            if not isinstance(responses, list) or len(responses) != 2:
                raise DataError(f"{where}: 'responses' must be the two responses compared, [A, B]")
            responses = (str(responses[0]), str(responses[1]))
        if rec.get("truth") is not None:
            if rec["truth"] not in VERDICTS:
                raise DataError(f"{where}: truth {rec['truth']!r} is not one of {VERDICTS}")
            truth.setdefault(cid, rec["truth"])
        comparisons.append(Comparison(cid, tuple(labels), judge, responses))
    return StreamFile(comparisons, truth)


def _jsonl_records(path: str | os.PathLike) -> Iterator[tuple[str, Any]]:
    """(``"path: line n"``, the parsed object) of every non-empty line of a JSONL file."""
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}: line {n}"
            try:
                yield where, json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: not JSON ({e.msg})") from None
