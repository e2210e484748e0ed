"""§D on language models: the split-context task played by a main-agent LM and an executor LM
on the agent layer, logged counterfactually, with the selector's features measured from them.

An episode is a LangGraph graph over two agents (`troupe.algorithms.agents`), one pass per step:

    START → [assess → draft → choose] → main? → deliver → probe → act → score → next step or END

* ``assess``: E answers the absorption probe with nothing received, its self-assessed
  sufficiency (does it hold a value for the key from its local view alone?);
* ``draft``: M writes the plain message of its belief; its mean token probability is M's
  confidence, the message's token overlap with E's view its novelty;
* ``choose``: the selector picks the action from those features (only under ``policy="select"``;
  a fixed policy goes straight on, and the bracketed nodes are skipped);
* ``main``: M writes the content the action needs that the draft does not give (the cryptic code,
  or the plain message when nothing was drafted);
* ``deliver`` (an environment node): the content of the action (nothing, M's message, M's code
  or the raw slice of M's document), what E reads of it (its context budget), and the protocol tax;
* ``probe``, then ``act``: E restates the key (a fresh conversation beside its action), then acts;
* ``score``: the step's success, its first failing stage (§D.1), its record.

The task's state does not depend on past actions (every step draws fresh values), so running
each episode once under every fixed action is §D.2's counterfactual logging: every step forked
and run under every action, from the same state. The forks' own calls give the features: the
``none`` fork's probe is E's assessment, the ``plain`` fork's message is M's draft, the same
prompts the live selector sends.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypedDict

import numpy as np
from langgraph.types import RunnableConfig

from troupe.algorithms.agents.episodes import AgentGraphError, EngineClient, agent_turn, run_episodes
from troupe.algorithms.comm.simulator import TaxModel, protocol_tax
from troupe.envs.split_context import (
    KINDS,
    UNKNOWN,
    Episode,
    SplitContext,
    Step,
    externalised,
    facts_text,
    first_failing_stage,
    misleading,
    parse_action,
    parse_restated_key,
    truncate,
)

ACTIONS = KINDS  # none, plain, cryptic, raw: the selector's columns, in this order
POLICIES = (*ACTIONS, "select")
FEATURES = ("self_sufficiency", "m_confidence", "novelty", "raw_tokens", "msg_tokens", "step_next", "budget")
AGENTS = ("main", "executor")
_WORDS = re.compile(r"[a-z]+|\d")

# (features [len(FEATURES)], each action's tax [len(ACTIONS)]) -> the index of the action to take
Selector = Callable[[np.ndarray, np.ndarray], int]


class CommState(TypedDict, total=False):
    episode: Episode
    policy: str  # a fixed action, or "select"
    t: int  # the step under way
    action: str
    assess: dict[str, Any]
    draft: dict[str, Any]
    message: dict[str, Any]  # M's turn that wrote this step's content (a message or the code)
    content: str
    received: str
    written: int
    read: int
    probe: dict[str, Any]
    act_text: str
    features: list[float]
    records: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class Protocol:
    """What the graph's nodes need besides the state: the prompts, the token counters and the tax."""

    task: SplitContext
    count_main: Callable[[str], int]  # tokens of a text in M's tokenizer (what M writes)
    count_executor: Callable[[str], int]  # in E's (what E reads)
    tax: TaxModel = TaxModel()
    selector: Selector | None = None


# -- nodes ------------------------------------------------------------------------------------------
def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _step(state: CommState) -> Step:
    return state["episode"].steps[state["t"]]


def _turn_summary(out: dict[str, Any]) -> dict[str, Any]:
    lps = out["logprobs"]
    return {"text": out["text"], "tokens": len(out["completion"]),
            "mean_p": float(math.exp(sum(lps) / len(lps))) if lps else 0.0}


def build_graph(protocol: Protocol) -> Any:
    """The episode graph of the module docstring (a `StateGraph`, compiled by `run_episodes`)."""
    from langgraph.graph import END, START, StateGraph

    task = protocol.task

    async def assess(state: CommState, config: RunnableConfig) -> dict:
        step = _step(state)
        out = await agent_turn(config, "executor", _user(task.probe_prompt(step, "")), f"executor/{step.index}/assess")
        return {"assess": _turn_summary(out)}

    async def draft(state: CommState, config: RunnableConfig) -> dict:
        step = _step(state)
        out = await agent_turn(config, "main", _user(task.main_prompt(step, "plain")), f"main/{step.index}/plain")
        return {"draft": _turn_summary(out)}

    def choose(state: CommState) -> dict:
        if protocol.selector is None:
            raise AgentGraphError("policy 'select' needs a selector: Protocol(selector=...)")
        step = _step(state)
        z = features(state["assess"], state["draft"], facts_text(step.local), raw_tokens(step, protocol),
                     step.step_type, step.budget)
        taxes = action_taxes(step, state["draft"], protocol)
        return {"action": ACTIONS[int(protocol.selector(np.asarray(z), np.asarray(taxes)))], "features": z}

    def fixed(state: CommState) -> dict:
        return {"action": state["policy"], "features": None, "assess": None, "draft": None}

    async def main(state: CommState, config: RunnableConfig) -> dict:
        step, kind = _step(state), state["action"]
        out = await agent_turn(config, "main", _user(task.main_prompt(step, kind)), f"main/{step.index}/{kind}")
        return {"message": _turn_summary(out)}

    def deliver(state: CommState) -> dict:
        step, kind = _step(state), state["action"]
        if kind in ("plain", "cryptic"):
            content = state["message"]["text"].strip()
            written = protocol.count_main(content)
        else:
            content = step.content(kind)  # "" or the verbatim raw slice: nothing generated
            written = 0
        received = truncate(content, step.budget)
        return {"content": content, "received": received, "written": written,
                "read": protocol.count_executor(received) if received else 0}

    async def probe(state: CommState, config: RunnableConfig) -> dict:
        step = _step(state)
        prompt = task.probe_prompt(step, state["received"])
        out = await agent_turn(config, "executor", _user(prompt), f"executor/{step.index}/probe")
        return {"probe": _turn_summary(out)}

    async def act(state: CommState, config: RunnableConfig) -> dict:
        step = _step(state)
        prompt = task.executor_prompt(step, state["received"])
        out = await agent_turn(config, "executor", _user(prompt), f"executor/{step.index}/act")
        return {"act_text": out["text"]}

    def score(state: CommState) -> dict:
        step = _step(state)
        record = step_record(step, state, protocol)
        return {"records": [*state.get("records", []), record], "t": state["t"] + 1, "message": None}

    for fn, agents in ((assess, "executor"), (draft, "main"), (main, "main"), (probe, "executor"), (act, "executor")):
        fn.troupe_agent = agents

    def start_route(state: CommState) -> str:
        if state["policy"] not in POLICIES:
            raise AgentGraphError(f"episode policy {state['policy']!r} is unknown: expected one of {POLICIES}")
        return "assess" if state["policy"] == "select" else "fixed"

    def after_choice(state: CommState) -> str:
        kind = state["action"]
        if kind == "plain" and state.get("draft"):
            return "deliver_draft"
        return "main" if kind in ("plain", "cryptic") else "deliver"

    def next_step(state: CommState) -> str:
        return "end" if state["t"] >= len(state["episode"].steps) else start_route(state)

    g = StateGraph(CommState)
    for name, fn in (("assess", assess), ("draft", draft), ("choose", choose), ("fixed", fixed), ("main", main),
                     ("deliver", deliver), ("probe", probe), ("act", act), ("score", score)):
        g.add_node(name, fn)
    g.add_node("reuse_draft", lambda s: {"message": s["draft"]})  # the plain message is the draft itself
    g.add_conditional_edges(START, start_route, {"assess": "assess", "fixed": "fixed"})
    g.add_edge("assess", "draft")
    g.add_edge("draft", "choose")
    paths = {"main": "main", "deliver": "deliver", "deliver_draft": "reuse_draft"}
    g.add_conditional_edges("choose", after_choice, paths)
    g.add_conditional_edges("fixed", after_choice, paths)
    g.add_edge("reuse_draft", "deliver")
    g.add_edge("main", "deliver")
    g.add_edge("deliver", "probe")
    g.add_edge("probe", "act")
    g.add_edge("act", "score")
    g.add_conditional_edges("score", next_step, {"assess": "assess", "fixed": "fixed", "end": END})
    return g


# -- records, features ----------------------------------------------------------------------------------
def step_record(step: Step, state: CommState, protocol: Protocol) -> dict[str, Any]:
    """One step's outcome under its action: success, the §D.1 stage, the tokens and the tax,
    and what the features are computed from (E's probe, M's message, E's view, the raw slice)."""
    content, act_text = state["content"], state["act_text"]
    restated = state["probe"]["text"]
    stage = first_failing_stage(step, content, restated, act_text)
    if stage == "externalisation" and misleading(content, step):
        stage = "misleading"  # content stating a wrong value: the weak-M share of externalisation
    written, read = state["written"], state["read"]
    return {
        "t": step.index, "action": state["action"], "step_type": step.step_type, "key": step.key,
        "value": step.value, "correct_action": step.action, "acted": parse_action(act_text),
        "success": stage is None, "stage": stage, "content": content, "received": state["received"],
        "probe": state["probe"], "message": state.get("message"), "act": act_text.strip(),
        "belief_right": parse_restated_key(restated) == step.key_fact, "externalised": externalised(content, step),
        "written": written, "read": read, "tax": float(protocol_tax(written, read, protocol.tax)),
        "local": facts_text(step.local), "raw_tokens": raw_tokens(step, protocol), "budget": step.budget,
        # the latent facts of the step (for the latent oracle and the analysis; no policy sees them)
        "local_has_key": step.local_has_key, "m_right": step.m_right, "m_belief": step.m_belief,
        "raw_key_visible": step.raw_key_pos < step.budget, "raw_length": step.raw_length,
        "features": state.get("features"),
    }


def raw_tokens(step: Step, protocol: Protocol) -> int:
    """Tokens of the whole raw slice in E's tokenizer (the slice's length, known before sending)."""
    return protocol.count_executor(facts_text(step.raw_slice))


def action_taxes(step: Step, draft: Mapping[str, Any], protocol: Protocol) -> list[float]:
    """Each action's tax at this step, known before it is taken: the draft is the plain message,
    the code is its reference form (two characters), the raw slice is M's document."""
    counts = {"none": (0, ""), "plain": (protocol.count_main(draft["text"].strip()), draft["text"].strip()),
              "cryptic": (protocol.count_main(step.content("cryptic")), step.content("cryptic")),
              "raw": (0, step.content("raw"))}
    out = []
    for a in ACTIONS:
        written, content = counts[a]
        received = truncate(content, step.budget)
        read = protocol.count_executor(received) if received else 0
        out.append(float(protocol_tax(written, read, protocol.tax)))
    return out


def _words(text: str) -> set[str]:
    return set(_WORDS.findall(text.lower()))


def novelty(message: str, local: str) -> float:
    """1 − token-set Jaccard of M's message against E's local view (§D.2)."""
    a, b = _words(message), _words(local)
    return 1.0 - (len(a & b) / len(a | b) if a | b else 1.0)


def self_sufficiency(assess: Mapping[str, Any]) -> float:
    """E's self-assessed sufficiency: the probability it gave its no-content answer, turned
    toward "I hold a value" (a restated value) or away from it (``key=?``)."""
    holds = parse_restated_key(assess["text"]) is not None and UNKNOWN not in assess["text"]
    return assess["mean_p"] if holds else 1.0 - assess["mean_p"]


def features(assess: Mapping[str, Any], draft: Mapping[str, Any], local: str, raw_tokens: int, step_type: str,
             budget: int) -> list[float]:
    """The selector's features (`FEATURES`), all observable before the content is chosen: from
    E's answer to the probe with nothing received (``assess``) and M's plain message (``draft``)."""
    return [self_sufficiency(assess), float(draft["mean_p"]), novelty(draft["text"], local), float(raw_tokens),
            float(draft["tokens"]), float(step_type == "next"), float(budget)]


def logged_features(records: Mapping[str, Mapping[str, Any]]) -> list[float]:
    """A logged step's features from its forks: the ``none`` fork's probe is E's assessment (the
    same prompt), the ``plain`` fork's message is M's draft."""
    r = records["none"]
    return features(r["probe"], records["plain"]["message"], r["local"], r["raw_tokens"], r["step_type"], r["budget"])


# -- running ---------------------------------------------------------------------------------------------
@dataclasses.dataclass
class EpisodeLog:
    """Episodes run under each policy: records[policy][i] is episode i's list of step records."""

    episodes: list[Episode]
    records: dict[str, list[list[dict[str, Any]] | None]]
    meta: list[dict[str, Any]]  # per episode: its split, regime, q_L, q_M, raw length
    failed: dict[str, int]
    engine_calls: int
    wall_s: float


def run_policies(task: SplitContext, episodes: Sequence[Episode], policies: Sequence[str],
                 clients: Mapping[str, EngineClient], protocol: Protocol, seed: int,
                 meta: Sequence[dict[str, Any]] | None = None, episode_timeout_s: float | None = None) -> EpisodeLog:
    """Every episode once under every policy, all in one `run_episodes` call (so every engine
    call carries every fork waiting on it). An episode that fails keeps None."""
    for p in policies:
        if p not in POLICIES:
            raise AgentGraphError(f"policy {p!r} is unknown: expected one of {POLICIES}")
    states = [{"episode": ep, "policy": p, "t": 0, "records": []} for p in policies for ep in episodes]
    steps = max((len(ep.steps) for ep in episodes), default=1)
    # nodes per step: at most assess, draft, choose, main, deliver, probe, act, score, and one
    # routing node; the limit counts graph steps, with room to spare
    out = run_episodes(build_graph(protocol), states, clients, seed=seed, turn_limit=10 * steps + 5,
                       episode_timeout_s=episode_timeout_s)
    records: dict[str, list] = {p: [None] * len(episodes) for p in policies}
    failed = dict.fromkeys(policies, 0)
    for e in out.episodes:
        p, i = policies[e.index // len(episodes)], e.index % len(episodes)
        if e.ok:
            records[p][i] = e.state["records"]
        else:
            failed[p] += 1
    return EpisodeLog(list(episodes), records, list(meta or [{} for _ in episodes]), failed, out.engine_calls,
                      out.wall_s)


def check_policy_names(policies: Sequence[str], key: str) -> None:
    for p in policies:
        if p not in POLICIES:
            raise ValueError(f"{key}: policy {p!r} is unknown: expected one of {POLICIES}")


