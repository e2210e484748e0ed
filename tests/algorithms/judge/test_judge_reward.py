"""BayesJudge as GRPO's reward: the posterior P(completion ≻ reference) from the judge's two verdict
distributions and the row's labels, its mean and lower credible bound checked against closed
forms and the fixed-parameter posterior, and GRPO trained on it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from troupe.actors.judge import JudgeCall, LLMJudge
from troupe.algorithms.judge.model import (
    A,
    JudgePrior,
    Params,
    cell,
    diag_rows,
    verdict_posterior_fixed,
)
from troupe.algorithms.judge.reward import (
    JudgeReward,
    answer_pairs,
    fixed_posteriors,
    human_labels,
    judge_pair,
    judge_prior,
    one_item_posterior,
    preference_posterior,
    weighted_quantile,
)
from troupe.platform.batch import Batch
from troupe.platform.errors import ConfigError, DataError

CALL = JudgeCall(np.array([0.6, 0.3, 0.1]), np.array([0.2, 0.5, 0.3]), "A", "B")


def _closed_form(call: JudgeCall, prior: JudgePrior, labels=()) -> float:
    """Σ_ab q_AB(a) q_BA(b) P(V=A | a, b, labels), with P(v | ·) ∝ E[π_v] E[Φ[v,(a,b)]] Π E[Θ_r[v,y_r]]:
    the one-item posterior of the conjugate model, each row hit once (§G.3a)."""
    pi = np.asarray(prior.alpha_pi) / sum(prior.alpha_pi)
    phi = diag_rows(9, prior.phi_diag, prior.phi_strength)
    phi = phi / phi.sum(-1, keepdims=True)
    theta = diag_rows(3, prior.group_diag, 1.0)
    lik_h = np.ones(3)
    for y in labels:
        lik_h = lik_h * theta[:, "ABT".index(y)]
    total = 0.0
    for a in range(3):
        for b in range(3):
            p = pi * phi[:, cell(a, b)] * lik_h
            total += call.ab[a] * call.ba[b] * p[A] / p.sum()
    return total


def test_the_mean_is_the_exact_one_item_posterior_averaged_over_the_judges_answers():
    prior = JudgePrior()
    post = preference_posterior(CALL, (), prior)
    assert post.mean == pytest.approx(_closed_form(CALL, prior), abs=1e-12)
    assert post.lower is None
    labels = human_labels([{"rater": "e1", "label": "A"}, {"rater": "e2", "label": "T"}], "row")
    with_labels = preference_posterior(CALL, labels, prior)
    assert with_labels.mean == pytest.approx(_closed_form(CALL, prior, ("A", "T")), abs=1e-12)


def test_human_labels_move_the_posterior_and_the_full_set_label_does_not():
    prior, base = JudgePrior(), preference_posterior(CALL, (), JudgePrior()).mean
    for_a = human_labels([{"rater": f"r{k}", "label": "A", "group": "expert"} for k in range(3)], "row")
    for_b = human_labels([{"rater": f"r{k}", "label": "B", "group": "expert"} for k in range(3)], "row")
    assert preference_posterior(CALL, for_a, prior).mean > base + 0.2
    assert preference_posterior(CALL, for_b, prior).mean < base - 0.2
    uninformative = human_labels([{"rater": "r0", "label": ["A", "B", "T"]}], "row")  # §G.7 test 8
    assert preference_posterior(CALL, uninformative, prior).mean == pytest.approx(base, abs=1e-12)


def test_an_unparsed_order_carries_no_information_and_two_leave_the_prior():
    prior = JudgePrior()
    half = JudgeCall(None, CALL.ba, "?", "B")
    # With order AB unparsed, the BA answer alone: Φ[v,·] summed over the AB answer.
    pi = np.asarray(prior.alpha_pi) / sum(prior.alpha_pi)
    phi = diag_rows(9, prior.phi_diag, prior.phi_strength)
    phi = phi / phi.sum(-1, keepdims=True)
    expected = sum(CALL.ba[b] * (pi * phi[:, [cell(a, b) for a in range(3)]].sum(-1))[A]
                   / (pi * phi[:, [cell(a, b) for a in range(3)]].sum(-1)).sum() for b in range(3))
    assert preference_posterior(half, (), prior).mean == pytest.approx(expected, abs=1e-12)
    none = JudgeCall(None, None, "?", "?")
    assert preference_posterior(none, (), prior).mean == pytest.approx(2 / 5)  # E[π_A] under Dir(2, 2, 1)
    assert judge_pair(half).ab is None and judge_pair(CALL).ab == "A" and judge_pair(CALL).ba == "B"


def test_fixed_parameter_posteriors_of_draws_are_the_models_own():
    rng = np.random.default_rng(0)
    labels = human_labels([{"rater": "r0", "label": "B"}, {"rater": "r1", "label": ["A", "T"]}], "row")
    rec, obs = one_item_posterior(judge_pair(CALL), labels, JudgePrior())
    draws = rec.sample(50, rng)
    vec = fixed_posteriors(draws, obs)
    for s in range(50):
        params = Params(draws["pi"][s], draws["theta"][s], draws["phi"][s])
        np.testing.assert_allclose(vec[s], verdict_posterior_fixed(params, [obs])[0], atol=1e-12)


def test_the_lower_bound_is_a_quantile_of_draws_whose_mean_is_the_posterior_mean():
    prior = JudgePrior()
    lows = [preference_posterior(CALL, (), prior, quantile=q, draws=4000, rng=np.random.default_rng(1)).lower
            for q in (0.05, 0.1, 0.5, 0.9)]
    assert lows == sorted(lows) and lows[0] < lows[-1]
    post = preference_posterior(CALL, (), prior, quantile=0.1, draws=4000, rng=np.random.default_rng(1))
    assert post.lower < post.mean
    # Tower rule: averaging P(V=A | obs, θ) over θ ~ p(θ | obs) gives P(V=A | obs).
    mc = 0.0
    rng = np.random.default_rng(2)
    for w, pair in answer_pairs(CALL):
        rec, obs = one_item_posterior(pair, (), prior)
        mc += w * fixed_posteriors(rec.sample(20000, rng), obs)[:, A].mean()
    assert mc == pytest.approx(post.mean, abs=0.005)
    assert weighted_quantile(np.array([3.0, 1.0, 2.0]), np.array([0.2, 0.5, 0.3]), 0.5) == 1.0
    assert weighted_quantile(np.array([3.0, 1.0, 2.0]), np.array([0.2, 0.5, 0.3]), 0.6) == 2.0


def test_with_a_concentrated_prior_the_posterior_is_the_fixed_parameter_posterior():
    big = 1e7
    prior = JudgePrior(alpha_pi=(2 * big, 2 * big, big), phi_strength=9 * big, group_strength=big)
    labels = human_labels([{"rater": "r0", "label": "B"}], "row")
    post = preference_posterior(CALL, labels, prior, quantile=0.1, draws=200, rng=np.random.default_rng(0))
    phi = diag_rows(9, prior.phi_diag, 1.0)[None]
    params = Params(np.array([0.4, 0.4, 0.2]), diag_rows(3, prior.group_diag, 1.0)[None], phi)
    weights, fixed = [], []
    for w, pair in answer_pairs(CALL):
        _, obs = one_item_posterior(pair, labels, prior)
        weights.append(w)
        fixed.append(verdict_posterior_fixed(params, [obs])[0, A])
    weights, fixed = np.array(weights), np.array(fixed)
    assert post.mean == pytest.approx(float(weights @ fixed), abs=1e-5)
    # Parameters known: only the judge's answer varies, so the bound is a quantile of the nine
    # fixed-parameter posteriors weighted by how likely the judge gives each answer pair.
    assert post.lower == pytest.approx(weighted_quantile(fixed, weights, 0.1), abs=1e-3)


def test_malformed_labels_are_errors_naming_the_row():
    with pytest.raises(DataError, match="row 3.*'rater' and 'label'"):
        human_labels([{"label": "A"}], "row 3")
    with pytest.raises(DataError, match="row 3.*not one of"):
        preference_posterior(CALL, human_labels([{"rater": "r", "label": "X"}], "row 3"), JudgePrior(), where="row 3")
    with pytest.raises(ConfigError, match="judge_prior: unknown keys"):
        judge_prior({"phi_dig": 0.5})
    assert judge_prior({"alpha_pi": [1, 1, 1]}).alpha_pi == (1.0, 1.0, 1.0)


def _batch(prompts, completions, rows):
    return Batch({"x": torch.zeros(len(prompts), 1)}, {"prompt": list(prompts), "completion": list(completions),
                                                      "row": list(rows)})


def test_judge_reward_scores_rows_with_the_posterior_of_the_judges_own_distributions(tiny_model_dir):
    prompts, completions = ["3+4=", "12+9=", "7+7="], ["7", "20", "14"]
    rows = [{"answer": "7"}, {"answer": "21", "labels": [{"rater": "e", "label": "B", "group": "expert"}]},
            {"answer": "14"}]
    reward = JudgeReward(tiny_model_dir, estimate="lower", quantile=0.2, draws=300, reference_key="answer",
                         min_mass=0.0, batch_size=2)
    out = reward.score(_batch(prompts, completions, rows))
    calls = LLMJudge(tiny_model_dir, min_mass=0.0).compare(prompts, completions, [r["answer"] for r in rows])
    for i, (call, row) in enumerate(zip(calls, rows, strict=True)):
        own = preference_posterior(call, human_labels(row.get("labels"), "r"), JudgePrior())
        assert out["extras"]["judge_mean"][i].item() == pytest.approx(own.mean, abs=1e-5)
        assert out["extras"]["judge_ab"][i].item() == pytest.approx(call.ab[A], abs=1e-5)
        assert out["extras"]["judge_ba"][i].item() == pytest.approx(call.ba[A], abs=1e-5)
    torch.testing.assert_close(out["rewards"], out["extras"]["judge_lower"])
    assert (out["rewards"] < out["extras"]["judge_mean"]).all()
    assert out["extras"]["judge_unparsed"].tolist() == [0.0, 0.0, 0.0]
    assert reward.stats()["calls"] == 4  # 3 rows in batches of 2, in each of two orders
    # Scored one row at a time, each row's draws are the same: the rewards do not depend on the batch.
    alone = torch.cat([reward.score(_batch([p], [c], [r]))["rewards"]
                       for p, c, r in zip(prompts, completions, rows, strict=True)])
    torch.testing.assert_close(alone, out["rewards"], atol=1e-5, rtol=0)
    with pytest.raises(DataError, match="row 0: no 'reference'"):
        JudgeReward(tiny_model_dir, min_mass=0.0).score(_batch(prompts[:1], completions[:1], [{}]))


def test_grpo_config_checks_the_judge_reward_before_any_actor_starts(tmp_path, tiny_model_dir):
    from troupe.platform.driver import resolve_config

    with pytest.raises(ConfigError, match="reward.path"):
        resolve_config("grpo", "smoke", ["reward.kind=judge"])
    with pytest.raises(ConfigError, match=r"reward.path=.*no config.json"):
        resolve_config("grpo", "smoke", ["reward.kind=judge", f"reward.path={tmp_path}"])
    judge = ["reward.kind=judge", f"reward.path={tiny_model_dir}"]
    with pytest.raises(ConfigError, match="judge_estimate"):
        resolve_config("grpo", "smoke", [*judge, "reward.judge_estimate=median"])
    with pytest.raises(ConfigError, match="judge_quantile"):
        resolve_config("grpo", "smoke", [*judge, "reward.judge_quantile=1.5"])
    with pytest.raises(ConfigError, match="judge_prior: unknown keys"):
        resolve_config("grpo", "smoke", [*judge, "reward.judge_prior.phi_dig=0.3"])
    with pytest.raises(ConfigError, match="group_means must be 'fixed'"):
        resolve_config("grpo", "smoke", [*judge, "reward.judge_prior.group_means=pooled"])
    with pytest.raises(ConfigError, match="judge_template lacks"):
        resolve_config("grpo", "smoke", [*judge, "reward.judge_template=which?"])
    cfg = resolve_config("grpo", "smoke", [*judge, "reward.judge_estimate=lower", "reward.judge_prior.phi_diag=0.6"])
    assert cfg.reward.kind == "judge" and cfg.reward.fn and cfg.reward.judge_prior == {"phi_diag": 0.6}


@pytest.mark.timeout(600)
def test_grpo_with_reward_kind_judge_trains_on_the_judges_posterior(ray_local, troupe_cache, tiny_model_dir, tmp_path,
        replay_first_rollout):
    from troupe import Run

    overrides = ["run.progress=false", "eval.num_prompts=8", "grpo.prompts_per_step=2", "grpo.group_size=4",
                 "run.steps=2", "run.eval_every=0", "run.checkpoint_every=0", "reward.kind=judge",
                 f"reward.path={tiny_model_dir}", "reward.judge_reference=answer", "reward.judge_min_mass=0.0",
                 "reward.judge_estimate=lower", "reward.judge_quantile=0.2", "reward.judge_draws=128"]
    with Run("grpo", preset="smoke", overrides=overrides, out=tmp_path / "run") as run:
        assert "checker" in run.graph.groups  # eval accuracy stays the task's exact checker
        replay, batch = replay_first_rollout(run)
        metrics = run.step()
        run.step()
        evaluated = run.evaluate()
    # The judge's own verdict distributions of each (completion, reference) pair, outside Ray.
    calls = LLMJudge(tiny_model_dir, min_mass=0.0).compare(batch["prompt"], batch["completion"],
                                                           [r["answer"] for r in batch["row"]])
    mean = torch.tensor([preference_posterior(call, (), JudgePrior()).mean for call in calls])
    torch.testing.assert_close(replay.extras["judge_mean"], mean.float(), atol=1e-5, rtol=0)
    own = JudgeReward(tiny_model_dir, estimate="lower", quantile=0.2, draws=128, reference_key="answer",
                      min_mass=0.0, seed=run.config.run.seed).score(batch)["rewards"]
    torch.testing.assert_close(replay.rewards, own, atol=1e-5, rtol=0)
    assert (replay.rewards < replay.extras["judge_mean"]).all()  # the lower bound, as configured
    assert metrics["reward/mean"] == pytest.approx(float(own.mean()), abs=1e-5)
    assert metrics["reward/judge_unparsed"] == 0.0
    assert not set(own.tolist()) <= {0.0, 1.0}  # the judge's posterior, not the 0/1 checker's
    assert 0.0 <= evaluated["eval/accuracy"] <= 1.0
