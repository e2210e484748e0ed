"""Agent episodes on LangGraph: token-in/token-out turns on the HF engine, the learner's
log-probs of whole multi-turn episodes, batched concurrent episodes, failures that end an
episode and never the step, the graph checks, and GRPO training an agent through episodes."""

from __future__ import annotations

import time
from typing import Any, TypedDict

import pytest
import torch
from langgraph.graph import END, START, StateGraph

from troupe.actors.learner import Learner
from troupe.actors.models import CHAT_TEMPLATE
from troupe.actors.rollout_hf import HFRolloutEngine
from troupe.actors.sampling import SamplingConfig, continuation_text
from troupe.algorithms.agents.episodes import AgentGraphError, EngineClient, agent_node, run_episodes
from troupe.algorithms.agents.transcript import Transcript, transcripts_to_batch

SAMPLING = SamplingConfig(temperature=0.7, top_k=20, max_new_tokens=5)


class State(TypedDict, total=False):
    question: str
    replies: list[str]
    turn: int


def _ask(state: State) -> list[dict[str, str]]:
    if not state.get("replies"):
        return [{"role": "system", "content": "answer"}, {"role": "user", "content": state["question"]}]
    return [{"role": "user", "content": f"again {state['turn']}"}]


def _record(state: State, text: str) -> dict[str, Any]:
    return {"replies": [*state.get("replies", []), text], "turn": state.get("turn", 0) + 1}


def _three_turns(agent: str = "executor", turns: int = 3) -> StateGraph:
    graph = StateGraph(State)
    graph.add_node("act", agent_node(agent, _ask, _record))
    graph.add_edge(START, "act")
    graph.add_conditional_edges("act", lambda s: "end" if s["turn"] >= turns else "again", {"end": END, "again": "act"})
    return graph


def _act_then(node: Any, route: Any) -> StateGraph:
    """The agent acts, then ``node`` (an environment or tool) runs, then ``route`` says act or end."""
    graph = StateGraph(State)
    graph.add_node("act", agent_node("executor", _ask, _record))
    graph.add_node("env", node)
    graph.add_edge(START, "act")
    graph.add_edge("act", "env")
    graph.add_conditional_edges("env", route, {"act": "act", "end": END})
    return graph


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return HFRolloutEngine(tiny_model_dir)


def test_a_continuation_closes_the_agents_turn_and_opens_its_next(engine):
    tok = engine.tokenizer
    assert tok.chat_template == CHAT_TEMPLATE
    turn = [{"role": "user", "content": "12+3="}]
    after_eos = "\n<|im_start|>user\n12+3=<|im_end|>\n<|im_start|>assistant\n"
    assert continuation_text(tok, turn, ended=True) == after_eos
    assert continuation_text(tok, turn, ended=False) == "<|im_end|>" + after_eos  # a truncated turn is closed
    with pytest.raises(ValueError, match="'role' and 'content'"):
        continuation_text(tok, [{"role": "user", "text": "x"}], ended=True)


def test_turns_extend_token_ids_and_the_learner_rescores_whole_episodes_exactly(engine, tiny_model_dir):
    client = EngineClient([engine], SAMPLING)
    out = run_episodes(_three_turns(), [{"question": q} for q in ("1+2=", "30+4=", "5+5=")], {"executor": client},
                       seed=3)
    assert [e.status for e in out.episodes] == ["done"] * 3
    assert out.engine_calls == 3  # three episodes, one batched call per turn
    first = engine.generate(["1+2="], SAMPLING, rows=[{"messages": _ask({"question": "1+2="})}])
    (t0,) = [t for i, t in out.transcripts("executor") if i == 0]
    assert t0.prompt_ids == first["prompt_ids"][0].tolist() and t0.turns == 3
    batch = transcripts_to_batch([t for _, t in out.transcripts("executor")])
    m = batch["completion_mask"].bool()
    assert (batch["completion_attention_mask"].sum(1) > batch["completion_mask"].sum(1)).all()  # env turns read
    learner = Learner(tiny_model_dir, {"lr": 1e-2}, sampling=SAMPLING)
    assert torch.allclose(learner.logprobs(batch)[m], batch["logprobs"][m], atol=1e-4)
    # Without the attention mask the appended turns would vanish and the log-probs move.
    hidden = batch.with_fields(completion_attention_mask=batch["completion_mask"])
    assert not torch.allclose(learner.logprobs(hidden)[m], batch["logprobs"][m], atol=1e-3)


@pytest.mark.timeout(240)
def test_episodes_share_engine_actors_with_one_batched_call_per_engine_and_turn(ray_local, tiny_model_dir):
    actors = [ray_local.remote(num_cpus=0.5)(HFRolloutEngine).remote(tiny_model_dir) for _ in range(2)]
    states = [{"question": q} for q in ("1+2=", "30+4=", "5+5=", "6+1=")]
    out = run_episodes(_three_turns(), states, {"executor": EngineClient(actors, SAMPLING, timeout_s=120)})
    assert [e.status for e in out.episodes] == ["done"] * 4 and out.engine_calls == 6  # 3 turns x 2 engines
    assert all(t.turns == 3 for _, t in out.transcripts("executor"))


def test_a_node_names_threads_to_hold_fresh_conversations_beside_the_agents_own(engine):
    """A probe in its own thread starts from nothing; the main thread continues as before."""

    def probe(state):
        return {"probe": state["turn"]}

    graph = StateGraph(State)
    graph.add_node("act", agent_node("executor", _ask, _record))
    graph.add_node("probe", agent_node("executor", lambda s: [{"role": "user", "content": "restate"}],
                                       lambda s, text: {}, thread=lambda s: f"probe/{s['turn']}"))
    graph.add_edge(START, "act")
    graph.add_edge("act", "probe")
    graph.add_conditional_edges("probe", lambda s: "end" if s["turn"] >= 2 else "act", {"end": END, "act": "act"})
    out = run_episodes(graph, [{"question": "1+2="}], {"executor": EngineClient([engine], SAMPLING)}, seed=0)
    ep = out.episodes[0]
    assert ep.ok and sorted(ep.transcripts) == ["executor", "probe/1", "probe/2"]
    assert ep.transcripts["executor"].turns == 2
    alone = engine.generate(["restate"], SAMPLING, rows=[{"messages": [{"role": "user", "content": "restate"}]}])
    for name in ("probe/1", "probe/2"):  # a first turn each: the probe prompt alone, not the episode so far
        assert ep.transcripts[name].prompt_ids == alone["prompt_ids"][0].tolist()
    assert len(out.transcripts("executor")) == 3  # every conversation of the agent


def test_a_transcript_marks_only_the_agents_tokens():
    t = Transcript("a")
    t.add_turn([1, 2, 3], [7, 8], [-0.5, -0.25], "x")
    t.add_turn([4, 5], [9], [-1.0], "y")
    assert t.context() == [1, 2, 3, 7, 8, 4, 5, 9]
    b = transcripts_to_batch([t, Transcript("a", [1], [6], [1], [-2.0], ["z"])], pad_id=0)
    assert b["completion_mask"].tolist() == [[1, 1, 0, 0, 1], [1, 0, 0, 0, 0]]
    assert b["completion_attention_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert b["prompt_ids"].tolist() == [[1, 2, 3], [0, 0, 1]] and b["prompt_mask"].tolist() == [[1, 1, 1], [0, 0, 1]]
    assert b["logprobs"].tolist() == [[-0.5, -0.25, 0.0, 0.0, -1.0], [-2.0, 0.0, 0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="hold no turn"):
        transcripts_to_batch([Transcript("a")])


class _Flaky:
    """The real engine, with its first ``hangs`` calls hanging past the timeout or failing."""

    def __init__(self, engine: HFRolloutEngine, hangs: int = 0, fails: int = 0) -> None:
        self.engine, self.hangs, self.fails = engine, hangs, fails

    def generate_turns(self, *args: Any) -> Any:
        if self.hangs:
            self.hangs -= 1
            time.sleep(3)
        elif self.fails:
            self.fails -= 1
            raise RuntimeError("engine lost")
        return self.engine.generate_turns(*args)


@pytest.mark.timeout(120)
def test_a_hung_call_is_reissued_and_a_failing_engine_fails_its_episodes_not_the_step(engine):
    states = [{"question": "1+1="}, {"question": "2+2="}]
    hung = EngineClient([_Flaky(engine, hangs=1)], SAMPLING, timeout_s=1.0, retries=1)
    out = run_episodes(_three_turns(turns=2), states, {"executor": hung})
    assert [e.status for e in out.episodes] == ["done", "done"] and out.retried == 1
    dead = EngineClient([_Flaky(engine, fails=10)], SAMPLING, retries=2)
    t = time.monotonic()
    out = run_episodes(_three_turns(turns=2), states, {"executor": dead})
    assert [e.status for e in out.episodes] == ["failed", "failed"] and time.monotonic() - t < 30
    assert "engine lost" in out.episodes[0].error and out.retried == 2


def test_a_node_error_or_a_runaway_loop_ends_only_that_episode(engine):
    def env(state: State) -> dict[str, Any]:
        if state["question"] == "bad":
            raise KeyError("no such tool")
        return {}

    # "loop" never ends by itself: the turn limit ends it
    graph = _act_then(env, lambda s: "act" if s["question"] == "loop" or s["turn"] < 2 else "end")
    out = run_episodes(graph, [{"question": q} for q in ("ok", "bad", "loop")],
                       {"executor": EngineClient([engine], SAMPLING)}, turn_limit=9)
    assert [e.status for e in out.episodes] == ["done", "failed", "turn_limit"]
    assert "no such tool" in out.episodes[1].error and "turn_limit=9" in out.episodes[2].error
    assert out.episodes[0].transcripts["executor"].turns == 2


def test_bad_graphs_are_refused_before_any_episode_runs(engine):
    clients = {"executor": EngineClient([engine], SAMPLING)}
    with pytest.raises(AgentGraphError, match=r"node 'act' calls agent 'planner', which has no engine"):
        run_episodes(_three_turns(agent="planner"), [{"question": "x"}], clients)
    with pytest.raises(AgentGraphError, match=r"turn_limit = 0"):
        run_episodes(_three_turns(), [{"question": "x"}], clients, turn_limit=0)
    endless = StateGraph(State)
    endless.add_node("act", agent_node("executor", _ask, _record))
    endless.add_edge(START, "act")
    endless.add_conditional_edges("act", lambda s: "again", {"again": "act"})
    with pytest.raises(AgentGraphError, match="no path from START reaches END"):
        run_episodes(endless, [{"question": "x"}], clients)


@pytest.mark.timeout(300)
def test_grpo_through_two_turn_episodes_raises_the_agents_reward(tiny_model_dir):
    """The executor is asked, then asked again; the episode's reward is the share of ASCII
    letters and digits in its second reply (an untrained model writes about a third). GRPO on
    whole episodes (both turns in one row, the turn between them read but masked out of the
    loss) raises it."""
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=4)
    engine = HFRolloutEngine(tiny_model_dir, seed=0)
    learner = Learner(tiny_model_dir, {"lr": 3e-2}, sampling=sampling)
    client = EngineClient([engine], sampling)

    graph = StateGraph(State)
    graph.add_node("act", agent_node("executor", _ask, _record))
    graph.add_edge(START, "act")
    graph.add_conditional_edges("act", lambda s: "end" if s["turn"] >= 2 else "again", {"end": END, "again": "act"})

    def reward(state: State) -> float:
        last = state["replies"][-1]
        return sum(ch.isascii() and ch.isalnum() for ch in last) / max(len(last), 1)

    G, rewards = 8, []
    for step in range(10):
        states = [{"question": f"{a}+{a}="} for a in range(2) for _ in range(G)]
        out = run_episodes(graph, states, {"executor": client}, seed=step)
        assert all(e.ok for e in out.episodes)
        r = torch.tensor([reward(e.state) for e in out.episodes]).view(-1, G)
        rewards.append(float(r.mean()))
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).flatten()
        batch = transcripts_to_batch([t for _, t in out.transcripts("executor")])
        learner.update(batch, {"advantages": adv})
        engine.install_state(learner.model.state_dict())
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.3, rewards


@pytest.mark.timeout(300)
def test_grpo_through_episodes_on_the_actor_graph_with_its_weight_sync(ray_local, tiny_model_dir):
    """The same training, on the policy graph a GRPO run builds: engine actors answer the
    agent's turns, the learner actor updates on the episode rows, and its weights reach the
    engines through the run's transport before the next episodes."""
    from troupe.algorithms.policy_graph import PolicyGraph
    from troupe.platform.driver import resolve_config
    from troupe.platform.placement import ActorGraph

    cfg = resolve_config("grpo", "smoke", ["learner.lr=0.03", "rollout.sampling.temperature=1.0",
                                           "rollout.sampling.max_new_tokens=4", "rollout.num_engines=2"])
    policy = PolicyGraph(cfg, tiny_model_dir)
    graph = ActorGraph(policy.roles(), 120, 120).start()
    try:
        policy.setup(graph)
        client = EngineClient(policy.role("rollout").handles, cfg.rollout.sampling, timeout_s=120)
        G, rewards, versions = 8, [], []
        for step in range(10):
            out = run_episodes(_three_turns(turns=2), [{"question": f"{a}+{a}="} for a in range(2) for _ in range(G)],
                               {"executor": client}, seed=step)
            assert all(e.ok for e in out.episodes)
            r = torch.tensor([sum(c.isascii() and c.isalnum() for c in e.state["replies"][-1])
                              / max(len(e.state["replies"][-1]), 1) for e in out.episodes]).view(-1, G)
            rewards.append(float(r.mean()))
            batch = transcripts_to_batch([t for _, t in out.transcripts("executor")])
            versions.append(batch.meta["version"])
            adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-6)).flatten()
            metrics = policy.update_and_sync([ray_local.put(batch)], {"advantages": adv}).result()
            assert metrics["ratio/mean"] == pytest.approx(1.0, abs=1e-3)  # the learner re-scores what was sampled
    finally:
        graph.shutdown()
    assert versions == list(range(10))  # each step's episodes ran on the weights of the update before
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.15, rewards


@pytest.mark.timeout(60)
def test_a_hung_tool_node_times_out_its_own_episode_and_the_others_finish(engine):
    def tool(state: State) -> dict[str, Any]:
        if state["question"] == "hang":
            time.sleep(8)  # a sync tool that never answers in time (LangGraph runs it in a thread)
        return {}

    graph = _act_then(tool, lambda s: "end" if s["turn"] >= 2 else "act")
    t = time.monotonic()
    out = run_episodes(graph, [{"question": q} for q in ("ok", "hang", "fine")],
                       {"executor": EngineClient([engine], SAMPLING)}, episode_timeout_s=2.0, flush_after_s=0.2)
    assert time.monotonic() - t < 7  # the others waited on the flush timer, not on the hung tool
    assert [e.status for e in out.episodes] == ["done", "timeout", "done"]
    assert out.timed_out[0].transcripts["executor"].turns == 1 and "episode_timeout_s=2.0" in out.timed_out[0].error
    with pytest.raises(AgentGraphError, match="episode_timeout_s = 0"):
        run_episodes(graph, [{"question": "x"}], {"executor": EngineClient([engine], SAMPLING)}, episode_timeout_s=0)
