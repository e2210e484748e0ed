"""§D on language models: the split-context episode graph over two real engines, its
counterfactual forks, the live selector against the logged forks, the records' accounting,
and the analysis of logged episodes."""

from __future__ import annotations

import numpy as np
import pytest

from troupe.actors.models import TinyLMSpec
from troupe.actors.rollout_hf import HFRolloutEngine
from troupe.actors.sampling import SamplingConfig
from troupe.algorithms.agents.episodes import AgentGraphError, EngineClient
from troupe.algorithms.comm import analysis
from troupe.algorithms.comm.algorithm import MixedSFT
from troupe.algorithms.comm.lm import (
    ACTIONS,
    FEATURES,
    Protocol,
    action_taxes,
    logged_features,
    novelty,
    run_policies,
    self_sufficiency,
)
from troupe.algorithms.sft import ModelConfig, SFTConfig, fit_sft
from troupe.envs.split_context import SplitContext, SplitContextConfig

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=8)
TINY = TinyLMSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64)


@pytest.fixture(scope="module")
def task():
    return SplitContext(SplitContextConfig(steps=2, step_types=("copy", "next"), q_L=0.6, q_M=0.7))


@pytest.fixture(scope="module")
def agents(task, tmp_path_factory):
    """Two barely fitted agents (a few SFT steps: they write the task's formats, often wrongly)."""
    out = {}
    for role, kinds in (("main", {"plain": 1, "cryptic": 1}), ("executor", dict.fromkeys(ACTIONS, 1))):
        path = tmp_path_factory.mktemp(role)
        fit_sft(ModelConfig(tiny=TINY, sft=SFTConfig(steps=60, batch_size=32)), MixedSFT([task], role, kinds), path)
        out[role] = HFRolloutEngine(str(path))
    return out


@pytest.fixture(scope="module")
def protocol(task, agents):
    def counter(role):
        tok = agents[role].tokenizer
        return lambda s: len(tok(s, add_special_tokens=False)["input_ids"])

    return Protocol(task, counter("main"), counter("executor"))


def _clients(agents):
    return {role: EngineClient([engine], GREEDY) for role, engine in agents.items()}


@pytest.fixture(scope="module")
def logged(task, agents, protocol):
    episodes = task.episodes(6, np.random.default_rng(3))
    return episodes, run_policies(task, episodes, ACTIONS, _clients(agents), protocol, seed=0)


# -- pure pieces ------------------------------------------------------------------------------------
def test_novelty_is_one_minus_the_token_set_jaccard():
    assert novelty("key door is 3", "door=3 lamp=5") == pytest.approx(1 - 2 / 6)
    assert novelty("door=3", "door=3") == 0.0
    assert novelty("", "") == 0.0  # nothing against nothing: no news
    assert novelty("key gate is 1", "door=3") == 1.0


def test_self_sufficiency_leans_toward_holding_a_value_by_the_answers_probability():
    assert self_sufficiency({"text": "door=3", "mean_p": 0.9}) == pytest.approx(0.9)
    assert self_sufficiency({"text": "door=?", "mean_p": 0.9}) == pytest.approx(0.1)
    assert self_sufficiency({"text": "", "mean_p": 0.3}) == pytest.approx(0.7)  # no value stated


def test_taxes_are_zero_for_nothing_and_grow_with_what_is_read(task, protocol):
    step = task.steps(1, np.random.default_rng(0))[0]
    draft = {"text": "key door is 3", "tokens": 6, "mean_p": 0.9}
    taxes = dict(zip(ACTIONS, action_taxes(step, draft, protocol), strict=True))
    assert taxes["none"] == 0.0 and min(taxes["plain"], taxes["cryptic"], taxes["raw"]) > 0
    assert taxes["cryptic"] < taxes["plain"]  # two characters against a sentence
    wide = SplitContext(task.config, budget=8)  # E reads the whole raw slice: more tokens, more tax
    long_step = wide.steps(1, np.random.default_rng(0))[0]
    assert dict(zip(ACTIONS, action_taxes(long_step, draft, protocol), strict=True))["raw"] > taxes["raw"]


# -- the graph over two engines ------------------------------------------------------------------------
@pytest.mark.timeout(180)
def test_every_fork_logs_every_step_with_exclusive_stages_and_consistent_tokens(logged):
    episodes, log = logged
    assert log.failed == dict.fromkeys(ACTIONS, 0)
    for a in ACTIONS:
        for ep, recs in zip(episodes, log.records[a], strict=True):
            assert [r["t"] for r in recs] == list(range(len(ep.steps)))
            for r, step in zip(recs, ep.steps, strict=True):
                assert r["action"] == a and r["key"] == step.key
                assert r["success"] == (r["acted"] == step.action)
                assert (r["stage"] is None) == r["success"]  # exactly one stage per failure, none on success
                assert r["stage"] in (None, *analysis.STAGES)
                if a == "none":
                    assert r["content"] == "" and r["tax"] == 0.0 and r["read"] == 0
                if a == "raw":
                    assert r["written"] == 0 and r["content"] == step.content("raw")
                if a in ("plain", "cryptic"):
                    assert r["message"]["text"].strip() == r["content"] and r["written"] > 0
                assert r["received"] == r["content"][: len(r["received"])]  # E reads a prefix
    # one call per engine whenever every fork waits: far fewer calls than turns
    turns = sum(len(ep.steps) for ep in episodes) * (2 * len(ACTIONS) + 2)
    assert log.engine_calls < turns / 4


@pytest.mark.timeout(180)
@pytest.mark.parametrize("pick", ["plain", "cryptic", "raw"])
def test_the_live_selector_sees_the_logged_features_and_repeats_the_fork_it_picks(task, agents, protocol, logged, pick):
    """The selector node's features come from the same calls the forks made (E's probe with
    nothing received, M's plain draft), and the action it picks runs as that fork ran."""
    episodes, log = logged
    seen = []

    def selector(z, taxes):
        seen.append((np.asarray(z).copy(), np.asarray(taxes).copy()))
        return ACTIONS.index(pick)

    live = run_policies(task, episodes, ["select"], _clients(agents), Protocol(
        task, protocol.count_main, protocol.count_executor, selector=selector), seed=1)
    for i in range(len(episodes)):
        for t, rec in enumerate(live.records["select"][i]):
            forks = {a: log.records[a][i][t] for a in ACTIONS}
            assert rec["features"] == pytest.approx(logged_features(forks))
            logged_rec = forks[pick]
            for k in ("content", "received", "act", "success", "stage", "tax"):
                assert rec[k] == logged_rec[k], k
    assert len(seen) == sum(len(ep.steps) for ep in episodes)
    z, taxes = seen[0]
    assert z.shape == (len(FEATURES),) and taxes.shape == (len(ACTIONS),) and taxes[0] == 0.0


def test_an_unknown_policy_is_refused_by_name(task, agents, protocol):
    with pytest.raises(AgentGraphError, match="'often'"):
        run_policies(task, task.episodes(1, np.random.default_rng(0)), ["often"], _clients(agents), protocol, seed=0)


# -- the analysis of logged episodes --------------------------------------------------------------------
def _rec(t, action, success, tax, *, local=True, m_right=True, visible=True, raw_length=8, step_type="copy"):
    probe = {"text": "door=3" if local else "door=?", "mean_p": 0.9, "tokens": 3}
    message = {"text": "key door is 3", "mean_p": 0.8, "tokens": 6} if action == "plain" else None
    return {"t": t, "action": action, "success": success, "stage": None if success else "absorption", "tax": tax,
            "probe": probe, "message": message, "local": "door=3 lamp=1", "raw_tokens": 24, "budget": 2,
            "step_type": step_type, "local_has_key": local, "m_right": m_right, "raw_key_visible": visible,
            "raw_length": raw_length}


def _row(split, outcomes, **latent):
    """An episode whose step t succeeds under action a iff outcomes[a][t]."""
    taxes = {"none": 0.0, "plain": 10.0, "cryptic": 4.0, "raw": 20.0}
    recs = {a: [_rec(t, a, ok, taxes[a], **latent) for t, ok in enumerate(outcomes[a])] for a in ACTIONS}
    return {"step": 0, "split": split, "regime": "weak_local", "records": recs}


def test_step_tables_joint_accuracy_and_the_latent_oracle_from_logged_episodes():
    good = {"none": [True, False], "plain": [True, True], "cryptic": [False, False], "raw": [False, True]}
    bad = {"none": [False, False], "plain": [False, True], "cryptic": [False, False], "raw": [False, False]}
    rows = [_row("test", good), _row("test", bad, local=False)]
    tab = analysis.step_table(rows)
    assert tab.n == 4 and tab.z.shape == (4, len(FEATURES)) and tab.skipped == 0
    plain = ACTIONS.index("plain")
    assert analysis.joint_accuracy(tab.success[:, plain], tab.episode) == 0.5
    assert analysis.joint_accuracy(tab.success[:, ACTIONS.index("none")], tab.episode) == 0.0
    oracle = analysis.latent_oracle(tab, np.array([0.0, 1.0]))
    # λ = 0: plain is best in both cells (local view with and without the key): 3 of 4 steps
    assert oracle.accuracy[0] == pytest.approx(0.75) and oracle.cost[0] == pytest.approx(10.0)
    # λ = 1: a point of accuracy is worth one token, so nothing is sent in either cell
    assert oracle.cost[1] == 0.0 and oracle.accuracy[1] == pytest.approx(0.25)
    c = analysis.contrast(tab, "plain", "none", np.random.default_rng(0), n=200)
    assert c["diff"] == pytest.approx(0.5) and c["ci95"][0] <= 0.5 <= c["ci95"][1]
    # an episode with a failed fork is left out, and counted
    broken = _row("test", good)
    broken["records"]["raw"] = None
    assert analysis.step_table([broken, rows[0]]).skipped == 1


def test_an_executor_whose_prompts_outrun_its_context_is_refused_naming_the_task_keys(task, tmp_path):
    from transformers import AutoTokenizer

    from troupe.algorithms.comm.algorithm import check_context
    from troupe.platform.errors import ConfigError

    short = TinyLMSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                       max_position_embeddings=64)
    fit_sft(ModelConfig(tiny=short, sft=SFTConfig(steps=0)), MixedSFT([task], "executor", {"raw": 1}), tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    check_context([task], tok, str(tmp_path))  # two facts read: the prompts fit 64 positions
    wide = SplitContext(SplitContextConfig(doc_facts=12, raw_length=12, budget=12, local_facts=6))
    with pytest.raises(ConfigError, match="task.budget"):
        check_context([wide], tok, str(tmp_path))
