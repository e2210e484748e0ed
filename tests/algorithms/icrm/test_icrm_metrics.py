"""§C.4's metrics with exact expectations, the report's choice of λ and claims on hand-made
predictions, the persona prompts task and its gold reward, and the icrm config's errors."""

from __future__ import annotations

import numpy as np
import pytest

from troupe.algorithms.icrm import analysis, metrics
from troupe.algorithms.icrm.config import ICRMRunConfig
from troupe.envs.persona_prompts import PersonaPromptsTask, persona_gold
from troupe.envs.preferences.personas import PersonaConfig, bt_probability
from troupe.envs.preferences.text_personas import TextPersonas, pool_episodes, response_pool
from troupe.platform.config import from_dict
from troupe.platform.errors import ConfigError


def test_ece_brier_nll_and_accuracy_by_hand():
    mu = np.array([0.1, 0.2, 0.8, 0.9])
    y = np.array([0.0, 1.0, 1.0, 1.0])
    # two equal-mass bins: {0.1, 0.2} mean 0.15 vs 0.5; {0.8, 0.9} mean 0.85 vs 1.0
    assert metrics.ece(mu, y, bins=2) == pytest.approx(0.5 * 0.35 + 0.5 * 0.15)
    assert metrics.brier(mu, y) == pytest.approx(np.mean([0.01, 0.64, 0.04, 0.01]))
    assert metrics.nll(mu, y) == pytest.approx(-np.mean(np.log([0.9, 0.2, 0.8, 0.9])))
    assert metrics.accuracy(mu, y) == 0.75
    # a soft target: Brier adds the label's own variance t(1 - t)
    assert metrics.brier(np.array([0.5]), np.array([0.3])) == pytest.approx(0.04 + 0.21)
    assert metrics.ece(np.array([0.3, 0.7]), np.array([0.3, 0.7]), bins=2) == 0.0


def test_hypervolume_of_a_two_point_front():
    pts = np.array([[3.0, 1.0], [1.0, 2.0], [0.5, 0.5]])  # the last is dominated
    # (3-0)(1-0) + (1-0)(2-1) = 4
    assert metrics.hypervolume_2d(pts, np.array([0.0, 0.0])) == pytest.approx(4.0)
    assert metrics.hypervolume_2d(pts, np.array([5.0, 5.0])) == 0.0


def _fake(mus: dict[str, dict[int, list[float]]], p: list[float]) -> tuple[dict, dict]:
    pred = {n: {s: {str(k): {"mu": v} for k, v in by_k.items()} for s in ("valid", "seen", "unseen")}
            for n, by_k in mus.items()}
    truth = {s: {str(k): {"label": [int(x > 0.5) for x in p], "p_true": p} for k in (0, 4)}
             for s in ("valid", "seen", "unseen")}
    return pred, truth


def test_lambda_is_chosen_by_validation_ece_and_the_claims_read_the_table():
    p = [0.9, 0.1, 0.8, 0.2]
    pred, truth = _fake({
        "icrm_lam1": {0: [0.55, 0.45, 0.45, 0.55], 4: [0.6, 0.4, 0.6, 0.4]},  # under-confident, rises with k
        "icrm_lam0.1": {0: [0.6, 0.4, 0.4, 0.6], 4: [0.9, 0.1, 0.8, 0.2]},  # calibrated at k = 4
        "static_0": {0: [0.7, 0.7, 0.3, 0.3], 4: [0.7, 0.7, 0.3, 0.3]},
        "static_1": {0: [0.6, 0.6, 0.4, 0.4], 4: [0.6, 0.6, 0.4, 0.4]},
        "judge": {0: [0.99, 0.99, 0.01, 0.01], 4: [0.99, 0.01, 0.99, 0.01]},
    }, p)
    pred = analysis.with_derived(pred)
    assert pred[analysis.ENSEMBLE]["seen"]["0"]["mu"] == pytest.approx([0.65, 0.65, 0.35, 0.35])
    tab = analysis.table(pred, truth)
    selected, eces = analysis.select_lambda(tab, {"icrm_lam1": 1.0, "icrm_lam0.1": 0.1})
    assert selected == "icrm_lam0.1" and eces["icrm_lam0.1"] < eces["icrm_lam1"]
    claims = analysis.claims(tab, pred, truth, selected, "icrm_lam1")

    def holds(start: str) -> bool:
        return next(c for c in claims if c["claim"].startswith(start))["holds"]

    assert holds("ICRM's pairwise accuracy rises")  # 0.5 -> 1.0
    assert holds("the static BT RM stays flat")
    assert holds("ICRM's ECE")
    assert holds("with λ = 1")
    assert all(isinstance(c["holds"], bool) for c in claims)


def test_rl_claims_compare_arms_on_the_gold_rewards():
    records = [{"rl_step": 0, "gold/icrm/a": 0.0, "gold/icrm/b": 0.0, "gold/static/a": 0.0, "gold/icrm_b/a": 0.0,
                "gold/icrm_b/b": 0.0},
               {"rl_step": 10, "gold/icrm/a": 1.0, "gold/icrm/b": -0.5, "gold/static/a": 0.2, "gold/icrm_b/a": -0.1,
                "gold/icrm_b/b": 0.7}]
    better, steer = analysis.rl_claims(records)
    assert better["holds"] and steer["holds"]
    records[-1]["gold/icrm_b/a"] = 2.0
    assert not analysis.rl_claims(records)[1]["holds"]


def test_rl_claims_are_read_again_on_the_sampled_completions_where_recorded():
    greedy = [{"rl_step": 0, "gold/icrm/a": 0.0, "gold/static/a": 0.0},
              {"rl_step": 10, "gold/icrm/a": -1.0, "gold/static/a": 0.5}]
    sampled = [{**r, "gold_sampled/icrm/a": 0.1, "gold_sampled/static/a": 0.1} for r in greedy]
    sampled[-1] |= {"gold_sampled/icrm/a": 0.9, "gold_sampled/static/a": 0.4}
    (only,) = analysis.rl_claims(greedy)
    on_greedy, on_sampled = analysis.rl_claims(sampled)
    assert not only["holds"] and on_greedy == only
    assert on_sampled["holds"] and on_sampled["claim"].endswith("(sampled completions)")
    assert on_sampled["measured"] == "0.900 vs 0.400 (start 0.100)"
    section = analysis.rl_section(sampled)[0]
    assert "on sampled completions" in section and "| 10 | 0.900 | 0.400 |" in section
    assert "on sampled completions" not in analysis.rl_section(greedy)[0]


def test_pool_episodes_label_by_bradley_terry_on_the_pool_features():
    cfg = PersonaConfig(max_demos=3)
    tp = TextPersonas(cfg)
    pool = response_pool(tp, 50, np.random.default_rng(0))
    np.testing.assert_allclose(pool.features, tp.features(list(pool.texts)))
    w = np.eye(8)[[1]]
    eps = pool_episodes(tp, pool, w, 400, np.random.default_rng(1), k=3)
    assert all(e.k == 3 and e.query.a != e.query.b for e in eps)
    feats = dict(zip(pool.texts, pool.features, strict=True))
    p = bt_probability(w[0], np.stack([feats[e.query.a] for e in eps]), np.stack([feats[e.query.b] for e in eps]), 3.0)
    labels = np.array([e.query.label for e in eps])
    assert abs(labels.mean() - p.mean()) < 0.06  # drawn from BT: mean label ≈ mean probability
    assert np.mean(labels == (p > 0.5)) > 0.75


def test_persona_prompts_rows_and_the_gold_reward():
    task = PersonaPromptsTask(weights=[0, 1, 1, 0, 0, 0, 0, 0], demos=3, pool=60)
    rows = task.train_rows(5, np.random.default_rng(0))
    w = np.array([0, 1, 1, 0, 0, 0, 0, 0]) / np.sqrt(2)
    for r in rows:
        assert len(r["demos"]) == 3 and r["reference"] and r["persona"] == pytest.approx(w.tolist())
    text = rows[0]["reference"]
    assert persona_gold(text, **rows[0]) == pytest.approx(float(w @ TextPersonas().features(text)))
    assert task.checker() == "persona_gold"
    assert task.eval_rows(4) == task.eval_rows(4)
    with pytest.raises(ConfigError, match=r"task\.weights"):
        PersonaPromptsTask(weights=[1.0, 2.0])


@pytest.mark.parametrize(("data", "key"), [
    ({"run": {"steps": 3}}, "run.steps"),
    ({"rl": {"arms": ["icrm", "gold"]}}, "rl.arms"),
    ({"train": {"ensemble": 0}}, "rl.arms"),
    ({"train": {"static_steps": 0}}, "train.static_steps"),
    ({"data": {"eval_ks": [0, 16]}}, "data.eval_ks"),
    ({"icrm": {"max_demos": 4}}, "icrm.max_demos"),
    ({"train": {"lambdas": [1.0, 1.0]}}, "train.lambdas"),
    ({"rl": {"persona_a": [1, 0]}}, "rl.persona_a"),
    ({"rl": {"eval_samples": -1}}, "rl.eval_samples"),
    ({"backbone": {"max_tokens": 2}}, "backbone.max_tokens"),
    ({"rl": {"policy": {"run": {"staleness": 1}}}}, "rl.policy.run.staleness"),
])
def test_bad_config_is_refused_naming_the_key(data, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        from_dict(ICRMRunConfig, data)


def test_the_run_length_is_the_fitting_then_the_rl_steps():
    c = from_dict(ICRMRunConfig, {"train": {"chunks": 3}, "rl": {"steps": 7}})
    assert c.run.steps == 10 and c.rl.policy.run.steps == 7


def test_the_static_rms_fit_their_own_step_count_never_more_than_train_steps():
    assert from_dict(ICRMRunConfig, {}).train.static_fit_steps == 1000
    assert from_dict(ICRMRunConfig, {"train": {"static_steps": None}}).train.static_fit_steps == 3000
    assert from_dict(ICRMRunConfig, {"train": {"steps": 600, "chunks": 2}}).train.static_fit_steps == 600


def test_models_are_dealt_to_learners_by_their_whole_fitting_cost():
    from troupe.algorithms.icrm.algorithm import deal
    from troupe.algorithms.icrm.learner import variants

    c = from_dict(ICRMRunConfig, {"train": {"lambdas": [1.0, 0.1], "point": False, "ensemble": 3, "judge": False}})
    shares = deal(variants(c), 2, c.train)
    # two in-context models of 3000 steps outweigh three static ones of 1000: one each, statics by load
    assert sorted(len(s) for s in shares) == [2, 3]
    assert all(sum(v.context for v in s) == 1 for s in shares)


def test_the_over_optimisation_curve_reads_the_sampled_gold_where_recorded():
    records = [{"rl_step": 0, "gold/icrm/a": 0.0, "gold_sampled/icrm/a": 0.1},
               {"rl_step": 10, "gold/icrm/a": -1.0, "gold_sampled/icrm/a": 0.5}]
    history = [{"step": 11, "rl/kl/ref/icrm": 0.2}]  # RL step 0 is driver step 2: the batch before step 10
    assert analysis.rl_kl_curves(records, history, 2) == {"icrm": [(0.0, 0.1), (0.2, 0.5)]}
    greedy = [{k: v for k, v in r.items() if not k.startswith("gold_sampled/")} for r in records]
    assert analysis.rl_kl_curves(greedy, history, 2) == {"icrm": [(0.0, 0.0), (0.2, -1.0)]}
