"""The text ICRM, its baselines and its reward role, on a tiny backbone: exact antisymmetry, a
static model that reads no demo, save/load, the generative judge's answer probability, and
the reward's three estimates; with the errors that name the input."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from troupe.actors.models import TinyLMSpec
from troupe.algorithms.icrm import posterior
from troupe.algorithms.icrm.judge_baseline import GenerativeJudge, judge_corpus, judge_prompt
from troupe.algorithms.icrm.model import ICRMConfig
from troupe.algorithms.icrm.reward import ICRMReward
from troupe.algorithms.icrm.text import (
    BackboneConfig,
    TextICRM,
    build_backbone_from,
    build_judge_lm,
    check_icrm_path,
    load_text_icrm,
    prepare_backbone,
    response_text,
)
from troupe.envs.preferences.personas import PersonaConfig, sample_personas
from troupe.envs.preferences.text_personas import TextPersonas, pool_episodes, response_pool
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError, DataError

BACKBONE = BackboneConfig(tiny=TinyLMSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                           intermediate_size=64), pretrain_steps=5, pretrain_batch_size=8)
PERSONAS = PersonaConfig(max_demos=4)


@pytest.fixture(scope="module")
def parts(troupe_cache):
    tp = TextPersonas(PERSONAS)
    rng = np.random.default_rng(0)
    pool = response_pool(tp, 300, rng)
    w = sample_personas(PERSONAS, 4, "train", rng)
    eps = pool_episodes(tp, pool, w, 40, rng, k=(0, 4))
    corpus = [response_text(p, t) for p, t in zip(pool.prompts, pool.texts, strict=True)] + judge_corpus(eps)
    path, facts = prepare_backbone(BACKBONE, corpus, {"test": 1})  # pretrained into the session's cache
    assert facts["cache"] == "fitted" and prepare_backbone(BACKBONE, corpus, {"test": 1})[1]["cache"] == "cached"
    return tp, pool, w, eps, path


def model(path, objective="elbo", context=True, seed=0):
    backbone, tok = build_backbone_from(BACKBONE, path)
    torch.manual_seed(seed)
    m = TextICRM(backbone, tok, ICRMConfig(max_demos=4, d_model=16, layers=1, heads=2), BACKBONE.max_tokens,
                 objective, context)
    m.fit_standardiser(["a note about this", "the oven and 17 cells", "yeah cool stuff okay"])
    return m.eval()


def swapped(eps):
    return [dataclasses.replace(e, query=e.query.swapped()) for e in eps]


@torch.no_grad()
def test_a_frozen_backbone_reads_each_text_once_and_gets_no_gradient(parts):
    _, _, _, eps, path = parts
    m = model(path)
    m.train()
    out, batch = m(eps[:8])
    assert m._states and all(not p.requires_grad for p in m.backbone.parameters())
    cached = m.encode(list(m._states)[:3], cache=True)
    torch.testing.assert_close(cached, m.encode(list(m._states)[:3]))  # the cache holds what encode computes


@torch.no_grad()
def test_swapping_the_query_pair_gives_one_minus_mu_and_the_same_tau_and_loss(parts):
    _, _, _, eps, tok = parts
    m = model(tok)
    out, batch = m(eps)
    out2, batch2 = m(swapped(eps))
    torch.testing.assert_close(out2["mu"], 1 - out["mu"], atol=1e-6, rtol=0)
    torch.testing.assert_close(out2["tau"], out["tau"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m.loss(out2, batch2), m.loss(out, batch), atol=1e-5, rtol=1e-5)


@torch.no_grad()
def test_the_context_moves_mu_and_a_static_model_reads_no_demo(parts):
    _, _, _, eps, tok = parts
    with_demos = [e for e in eps if e.k > 0]
    bare = [dataclasses.replace(e, demos=()) for e in with_demos]
    icrm, static = model(tok), model(tok, objective="bce", context=False)
    assert not torch.allclose(icrm(with_demos)[0]["mu"], icrm(bare)[0]["mu"])
    torch.testing.assert_close(static(with_demos)[0]["mu"], static(bare)[0]["mu"], atol=0, rtol=0)


def test_the_bce_objective_is_the_bt_cross_entropy_on_mu(parts):
    _, _, _, eps, tok = parts
    m = model(tok, objective="bce")
    out, batch = m(eps)
    mu, y = out["mu"], batch["label"]
    expected = -(y * torch.log(mu) + (1 - y) * torch.log(1 - mu)).mean()
    torch.testing.assert_close(m.loss(out, batch), expected, atol=1e-5, rtol=1e-5)


def test_too_many_demos_for_the_context_is_refused_naming_the_key(parts):
    tp, pool, w, _, tok = parts
    long = pool_episodes(TextPersonas(PersonaConfig(max_demos=6)), pool, w, 2, np.random.default_rng(1), k=6)
    with pytest.raises(ConfigError, match=r"icrm\.max_demos=4"):
        model(tok)(long)


@torch.no_grad()
def test_save_and_load_give_the_same_outputs(parts, tmp_path):
    _, _, _, eps, tok = parts
    m = model(tok)
    m.save(tmp_path / "rm")
    back = load_text_icrm(tmp_path / "rm")
    torch.testing.assert_close(back(eps)[0]["mu"], m(eps)[0]["mu"])
    torch.testing.assert_close(back.icrm.state_scale, m.icrm.state_scale)
    assert back.objective == "elbo" and back.context and not back.train_backbone


def test_a_directory_that_is_no_saved_icrm_is_refused_naming_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"reward\.path=.*icrm\.json"):
        check_icrm_path(tmp_path)


@torch.no_grad()
def test_the_generative_judge_reads_p_a_from_the_two_answer_letters(parts):
    _, _, _, eps, tok = parts
    cfg = type("Run", (), {"backbone": BACKBONE, "icrm": ICRMConfig(max_demos=4)})()
    lm, tokenizer, max_tokens = build_judge_lm(cfg, tok)
    assert max_tokens == 10 * BACKBONE.max_tokens and lm.config.max_position_embeddings >= max_tokens
    judge = GenerativeJudge(lm, tokenizer, max_tokens).eval()
    out = judge(eps[:6])
    pair = out["logits"][:, judge.answer_ids]
    torch.testing.assert_close(out["mu"], torch.softmax(pair, -1)[:, 0])
    target = judge.answer_ids[torch.tensor([1 - e.query.label for e in eps[:6]])]
    torch.testing.assert_close(judge.loss(out, eps[:6]), torch.nn.functional.cross_entropy(out["logits"], target))
    assert judge_prompt(eps[0]).endswith("answer: ")


@torch.no_grad()
def test_the_reward_role_scores_rows_with_each_estimate(parts, tmp_path):
    _, pool, _, eps, tok = parts
    m = model(tok)
    path = tmp_path / "rm"
    reward = ICRMReward(str(path))  # declared before the model exists: read at the first call
    m.save(path)
    rows = [{**e.as_row(), "reference": pool.texts[i]} for i, e in enumerate(eps[:5])]
    batch = _batch(rows)
    mu = reward.score(batch)["rewards"]
    out = m.pair([[dataclasses.replace(d) for d in e.demos] for e in eps[:5]], [r["prompt"] for r in rows],
                 [r["a"] for r in rows], [r["reference"] for r in rows])
    torch.testing.assert_close(mu, out["mu"])
    r = ICRMReward(str(path), estimate="r").score(batch)["rewards"]
    torch.testing.assert_close(r, out["r_a"])
    cons = ICRMReward(str(path), estimate="conservative").score(batch)["rewards"]
    torch.testing.assert_close(cons, posterior.conservative_reward(out["alpha"], out["beta"]))
    assert (cons <= 0).all()

    no_ref = _batch([{k: v for k, v in r.items() if k != "reference"} for r in rows])
    with pytest.raises(DataError, match=r"reward row 0: no reference response under 'reference'"):
        reward.score(no_ref)
    with pytest.raises(ConfigError, match=r"reward\.icrm_estimate='best'"):
        ICRMReward(str(path), estimate="best")
    bad_demo = _batch([{**rows[0], "demos": [{"prompt": "x", "a": "y", "label": 1}]}])
    with pytest.raises(DataError, match=r"reward row 0"):
        reward.score(bad_demo)


def _batch(rows):
    return Batch({"x": torch.zeros(len(rows), 1)}, {"prompt": [r["prompt"] for r in rows],
                                                   "completion": [r["a"] for r in rows], "row": list(rows)})


def test_grpo_with_reward_kind_icrm_declares_the_icrm_reward_role_and_checks_its_path(parts, tmp_path):
    from troupe.algorithms.grpo.config import GRPOConfig
    from troupe.algorithms.policy_graph import PolicyGraph
    from troupe.platform.config import check_registered, from_dict

    _, _, _, _, path = parts
    m = model(path)
    m.save(tmp_path / "rm")
    cfg = from_dict(GRPOConfig, {"task": {"name": "persona_prompts"},
                                 "reward": {"kind": "icrm", "path": str(tmp_path / "rm"), "icrm_estimate": "r"}})
    check_registered(cfg)
    roles = {r.name: r for r in PolicyGraph(cfg, "unused").roles()}
    assert roles["reward"].actor_class is ICRMReward and roles["reward"].kwargs["estimate"] == "r"
    assert roles["checker"].kwargs["fn"] == "persona_gold"  # eval/accuracy is the persona's gold reward
    bad = from_dict(GRPOConfig, {"reward": {"kind": "icrm", "path": str(tmp_path)}})
    with pytest.raises(ConfigError, match=r"reward\.path=.*not a saved in-context reward model"):
        check_registered(bad)
    with pytest.raises(ConfigError, match=r"reward\.path"):
        from_dict(GRPOConfig, {"reward": {"kind": "icrm"}})
