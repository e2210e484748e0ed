"""The aggregator role of ``troupe run judge``: an actor that owns a share of the streams and keeps
each one's online BayesJudge posterior (§G.3b), a chunk of arrivals per step.

A stream is a `StreamSpec`: a §G.6 synthetic stream (drawn in the actor from its config and
seed), a user's stream (its comparisons, read and checked in the driver), or the LM judge's stream,
which grows by the comparisons the driver sends each step (its raters come from a roster, so the
filter's arrays keep their shape while it grows). The filter is seeded per stream, so a stream's
posterior does not depend on which actor runs it, and replaying the same arrivals rebuilds it
exactly: that is how a resumed run restores it (`replay`).
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from troupe.algorithms.judge.agreement import smc_vs_exact
from troupe.algorithms.judge.evaluation import score_stream, true_group_signatures
from troupe.algorithms.judge.model import (
    VERDICTS,
    Comparison,
    EncodedStream,
    JudgePrior,
    encode_stream,
    prior_arrays,
)
from troupe.algorithms.judge.smc import RBSMC
from troupe.envs.judge_streams import SyntheticConfig, synthetic_stream

if TYPE_CHECKING:
    from troupe.algorithms.judge.config import InferenceConfig

KINDS = ("synthetic", "file", "lm")


@dataclasses.dataclass
class StreamSpec:
    name: str
    kind: str  # one of KINDS
    seed: int  # the filter's
    synthetic: SyntheticConfig | None = None
    comparisons: list[Comparison] | None = None  # a file stream's
    truth: dict[str, str] | None = None  # comparison id -> verdict, where known
    roster: tuple[tuple[str, str], ...] = ()
    true_theta: dict[str, list[list[float]]] | None = None
    true_pi: list[float] | None = None
    true_beta: float | None = None
    meta: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class StreamState:
    spec: StreamSpec
    comparisons: list[Comparison]
    encoded: EncodedStream
    smc: RBSMC
    done: int = 0  # events applied
    seconds: float = 0.0  # in the filter


class JudgeAggregator:
    """Online BayesJudge posteriors of its streams, advanced a chunk per step."""

    def __init__(self, prior: JudgePrior, inference: InferenceConfig, judge_model: str = "joint",
                 require_groups: bool = True) -> None:
        self.prior, self.inference = prior, inference
        self.judge_model, self.require_groups = judge_model, require_groups
        self.streams: dict[str, StreamState] = {}

    def _encode(self, spec: StreamSpec, comparisons: list[Comparison]) -> EncodedStream:
        return encode_stream(comparisons, self.judge_model, self.require_groups, roster=spec.roster)

    def attach(self, specs: list[StreamSpec]) -> list[str]:
        """Build each stream's arrivals and a fresh filter; returns the stream names."""
        for spec in specs:
            if spec.kind == "synthetic":
                syn = synthetic_stream(spec.synthetic)
                comparisons = syn.comparisons
                spec.truth = {f"syn{i}": VERDICTS[v] for i, v in enumerate(syn.verdicts)}
                spec.true_theta = {r: syn.theta[k].tolist() for k, r in enumerate(syn.raters)}
                spec.true_pi = syn.pi.tolist()
                spec.meta["true_groups"] = true_group_signatures(syn.pi, syn.theta, syn.rater_groups)
            else:
                comparisons = list(spec.comparisons or [])
            encoded = self._encode(spec, comparisons)
            smc = RBSMC(prior_arrays(self.prior, encoded), self.inference.model(spec.seed))
            self.streams[spec.name] = StreamState(spec, comparisons, encoded, smc)
        return list(self.streams)

    def _apply(self, st: StreamState, until: int) -> None:
        t0 = time.perf_counter()
        for e in st.encoded.events[st.done:until]:
            st.smc.update(e.item, e.obs, late=e.late)
        st.done = max(st.done, until)
        st.seconds += time.perf_counter() - t0

    def advance(self, step: int, steps: int) -> list[dict[str, Any]]:
        """Apply each fixed stream's arrivals up to its share after step ``step`` of ``steps``."""
        out = []
        for name, st in self.streams.items():
            if st.spec.kind == "lm":
                continue
            before = st.done
            self._apply(st, round((step + 1) * len(st.encoded.events) / steps))
            out.append(self._progress(name, st, before))
        return out

    def extend(self, name: str, comparisons: list[Comparison], truth: dict[str, str]) -> dict[str, Any]:
        """New arrivals on a growing stream (the LM judge's): encoded with the ones before, then filtered."""
        st = self.streams[name]
        st.comparisons = st.comparisons + list(comparisons)
        st.spec.truth = {**(st.spec.truth or {}), **truth}
        st.encoded = self._encode(st.spec, st.comparisons)
        before = st.done
        self._apply(st, len(st.encoded.events))
        return self._progress(name, st, before)

    def _progress(self, name: str, st: StreamState, before: int) -> dict[str, Any]:
        ess = np.asarray(st.smc.ess_history[before:], float) / st.smc.n
        items = len(st.smc.filtered)
        truth = self._truth(st)[:items]
        known = truth >= 0
        filtered = np.asarray(st.smc.filtered).reshape(-1, 3)
        acc = float((filtered[known].argmax(-1) == truth[known]).mean()) if known.any() else float("nan")
        return {"name": name, "kind": st.spec.kind, "events": st.done - before, "events_done": st.done,
                "events_total": len(st.encoded.events), "seconds": st.seconds,
                "ess_min": float(ess.min()) if len(ess) else float("nan"), "online_accuracy": acc,
                "condition": st.spec.meta.get("condition")}

    def _truth(self, st: StreamState) -> np.ndarray:
        truth = st.spec.truth or {}
        return np.asarray([VERDICTS.index(truth[c]) if c in truth else -1 for c in st.encoded.items], dtype=int)

    def replay(self, done: dict[str, int], grown: dict[str, tuple[list[Comparison], dict[str, str]]]) -> None:
        """Restore a checkpoint: the growing streams get their arrivals back, every stream is
        re-filtered up to the events it had applied (the same arrivals and seeds: the same state)."""
        for name, (comparisons, truth) in grown.items():
            st = self.streams[name]
            st.comparisons, st.spec.truth = list(comparisons), dict(truth)
            st.encoded = self._encode(st.spec, st.comparisons)
        for name, until in done.items():
            if name in self.streams:
                self._apply(self.streams[name], until)

    def check_exact(self, streams: list[tuple[SyntheticConfig, int]]) -> list[dict[str, Any]]:
        """§G.6: TV between SMC's and the exact verdict marginals on small synthetic streams (config, filter seed)."""
        out = []
        for syn_config, seed in streams:
            encoded = encode_stream(synthetic_stream(syn_config).comparisons, self.judge_model, self.require_groups)
            prior = prior_arrays(self.prior, encoded)
            out.append({**smc_vs_exact(encoded, prior, self.inference.model(seed)), "seed": syn_config.seed})
        return out

    def done(self) -> dict[str, int]:
        return {name: st.done for name, st in self.streams.items()}

    def results(self) -> list[dict[str, Any]]:
        """`score_stream` of every stream over the events applied so far."""
        out = []
        for name, st in self.streams.items():
            t0 = time.perf_counter()
            spec = st.spec
            truth = self._truth(st)[: len(st.smc.items)]
            true_theta = {r: np.asarray(v) for r, v in (spec.true_theta or {}).items()}
            row = score_stream(st.smc, _applied(st), truth if (truth >= 0).any() else None, true_theta or None,
                               spec.true_beta, spec.meta.get("true_groups"), self.inference.draws,
                               self.inference.ds_iterations, spec.seed)
            row.update(name=name, kind=spec.kind, condition=spec.meta.get("condition"), filter_s=st.seconds,
                       score_s=time.perf_counter() - t0, events_done=st.done, events_total=len(st.encoded.events),
                       meta={k: v for k, v in spec.meta.items() if k != "true_groups"})
            out.append(row)
        return out


def _applied(st: StreamState) -> EncodedStream:
    """The stream as far as the filter has read it (the baselines see the same arrivals)."""
    enc = st.encoded
    events = enc.events[: st.done]
    n = len(st.smc.items)
    return dataclasses.replace(enc, items=enc.items[:n], events=events)
