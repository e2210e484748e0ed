"""§G.5's metrics as pure functions, checked against hand-computed values, and the claims they feed."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import make_toy

from troupe.algorithms.judge import model as M
from troupe.algorithms.judge.evaluation import (
    accuracy,
    ece,
    empirical_beta,
    entropy,
    label_disagreement,
    log_loss,
    reliability,
    score_stream,
    spearman,
    theta_mae,
    true_group_signatures,
)
from troupe.algorithms.judge.report import claims
from troupe.algorithms.judge.smc import SMCConfig, run_smc
from troupe.envs.judge_streams import SyntheticConfig, synthetic_stream

P = np.array([[0.7, 0.2, 0.1], [0.1, 0.6, 0.3], [0.4, 0.4, 0.2], [0.2, 0.2, 0.6]])
Y = np.array([0, 0, 1, 2])


def test_accuracy_and_log_loss_match_hand_values():
    assert accuracy(P, Y) == 0.5  # argmax of row 2 is A (the first of a tie), truth B
    floor = 0.01
    want = -np.mean(np.log((1 - floor) * P[np.arange(4), Y] + floor / 3))
    assert log_loss(P, Y) == pytest.approx(want)
    # a one-hot method that misses pays log(3 / floor), not infinity
    assert log_loss(np.array([[0.0, 1.0, 0.0]]), np.array([0])) == pytest.approx(np.log(3 / floor))


def test_ece_is_the_count_weighted_gap_between_confidence_and_accuracy():
    # two bins: confidences 0.9 (both right) and 0.5 (one of two right)
    p = np.array([[0.9, 0.05, 0.05], [0.05, 0.9, 0.05], [0.5, 0.3, 0.2], [0.5, 0.2, 0.3]])
    y = np.array([0, 1, 0, 1])
    assert ece(p, y) == pytest.approx((2 * 0.1 + 2 * 0.0) / 4)
    table = reliability(p, y)
    assert sum(table["count"]) == 4 and sum(table["correct"]) == 3
    perfect = np.eye(3)[[0, 1, 2, 0]]
    assert ece(perfect, np.array([0, 1, 2, 0])) == 0.0


def test_entropy_is_zero_for_certainty_and_log3_for_the_uniform():
    np.testing.assert_allclose(entropy(np.array([[1.0, 0, 0], [1 / 3] * 3])), [0.0, np.log(3)], atol=1e-12)


def test_spearman_is_rank_correlation_and_nan_on_constants():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 100]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))


def test_label_disagreement_counts_human_labels_only():
    comps = [M.Comparison("c0", (M.HumanLabel("r1", "A", "g"), M.HumanLabel("r2", "A", "g"),
                                 M.HumanLabel("r3", "B", "g")), M.JudgePair("B", "B")),
             M.Comparison("c1", (M.HumanLabel("r1", "T", "g"),)),
             M.Comparison("c2", (M.HumanLabel("r1", frozenset("AB"), "g"), M.HumanLabel("r2", "A", "g")))]
    s = M.encode_stream(comps)
    np.testing.assert_allclose(label_disagreement(s), [1 / 3, 0.0, 1 - 1.5 / 2])


def test_empirical_beta_is_first_both_times_minus_second_both_times():
    pairs = [("A", "B"), ("A", "B"), ("B", "A"), ("A", "A"), (None, "B")]
    comps = [M.Comparison(f"c{i}", (M.HumanLabel("r", "A", "g"),), M.JudgePair(*p)) for i, p in enumerate(pairs)]
    # of the 4 pairs with both orders parsed: 2 said "first" twice, 1 "second" twice
    assert empirical_beta(M.encode_stream(comps)) == pytest.approx((2 - 1) / 4)
    assert empirical_beta(M.encode_stream(comps, judge_model="factorised")) == pytest.approx((2 - 1) / 4)


def test_theta_mae_and_true_signatures_use_the_raters_known_rows():
    theta = np.stack([np.eye(3), np.full((3, 3), 1 / 3)])
    assert theta_mae(theta, ["x", "y"], {"x": np.eye(3)}) == 0.0
    assert theta_mae(theta, ["x", "y"], {"y": np.eye(3)}) == pytest.approx(np.abs(np.full((3, 3), 1 / 3) - np.eye(3)).mean())
    sig = true_group_signatures(np.array([0.5, 0.5, 0.0]), theta, ["expert", "crowd"])
    assert sig["expert"] == {"tie_propensity": 0.0, "accuracy": 1.0}
    assert sig["crowd"]["tie_propensity"] == pytest.approx(1 / 3)


def test_score_stream_recovers_section_g6_truth_on_a_short_stream():
    syn = synthetic_stream(SyntheticConfig(n=300, seed=3))
    s = M.encode_stream(syn.comparisons)
    smc = run_smc(s, M.prior_arrays(M.JudgePrior(), s), SMCConfig(n_particles=100, seed=0))
    truth = {r: syn.theta[k] for k, r in enumerate(syn.raters)}
    out = score_stream(smc, s, syn.verdicts, truth, 0.15, true_group_signatures(syn.pi, syn.theta, syn.rater_groups),
                       draws=500, ds_iterations=20)
    m = out["methods"]
    assert m["bayesjudge"]["accuracy"] > 0.9 and m["bayesjudge"]["accuracy"] > m["llm_single"]["accuracy"]
    assert m["bayesjudge"]["log_loss"] < m["majority_vote"]["log_loss"]
    assert out["order_bias"]["detected"] and out["order_bias"]["covered"]
    assert out["tie_difference"]["mean"] > 0 and out["tie_difference"]["true"] == pytest.approx(0.08)
    assert out["entropy_disagreement"]["spearman"] > 0
    assert out["theta_mae"] < 0.1 and 0 < out["ess"]["min"] <= 1


def test_score_stream_without_truth_reports_no_accuracy():
    s = M.encode_stream(make_toy(n=6, seed=2))
    smc = run_smc(s, M.prior_arrays(M.JudgePrior(), s), SMCConfig(n_particles=50))
    out = score_stream(smc, s, draws=200, ds_iterations=5)
    assert out["methods"] == {} and out["n_truth"] == 0 and "tie_difference" in out


def _cond(acc, detected, ties=1.0, rho=0.5, streams=10):
    return {"streams": streams, "methods": {m: {"accuracy": a} for m, a in acc.items()},
            "order_bias": {"detected_rate": detected, "mean": 0.1},
            "tie_difference": {"excludes_zero_rate": ties}, "entropy_spearman": {"mean": rho, "min": rho}}


def test_claims_follow_the_measured_figures():
    good = {"bayesjudge": 0.97, "dawid_skene": 0.96, "majority_vote": 0.94, "llm_single": 0.7}
    results = {"exact_check": [{"n": 10, "tv_max": 0.01}], "biased_condition": "beta_ord=0.15",
               "null_condition": "beta_ord=0",
               "conditions": {"beta_ord=0.15": _cond(good, 0.95), "beta_ord=0": _cond(good, 0.06)}}
    assert [c["holds"] for c in claims(results)] == [True] * 6
    results["conditions"]["beta_ord=0"] = _cond(good, 0.2, ties=0.5, rho=-0.1)
    results["conditions"]["beta_ord=0.15"] = _cond({**good, "dawid_skene": 0.98}, 0.8)
    results["exact_check"] = [{"n": 12, "tv_max": 0.03}]
    assert [c["holds"] for c in claims(results)] == [False] * 6


def test_the_benchmark_replaces_the_runs_exact_check_and_adds_the_pyro_claim():
    import importlib.util
    import sys
    from pathlib import Path

    bench = Path(__file__).resolve().parents[3] / "benchmarks"
    sys.path.insert(0, str(bench))
    spec = importlib.util.spec_from_file_location("benchmark_judge", bench / "judge.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    run_claims = [{"claim": "SMC matches the exact posterior: TV < 0.02 on 2 streams", "measured": 0.001, "holds": True},
                  {"claim": "order bias detected", "measured": 1.0, "holds": True}]
    result = {"exact": {"particles": 500, "streams": [{}] * 50, "n_range": [6, 12], "tv_max": 0.025},
              "synthetic": {"claims": run_claims},
              "pyro": {"n": 1500, "theta": 0.02, "beta_bar_mean": 0.001, "verdict_tv_mean": 0.002, "verdict_tv_max": 0.1}}
    out = module.claims(result)
    assert [c["holds"] for c in out] == [False, True, True]
    assert "50 streams of n = 6..12" in out[0]["claim"] and out[0]["measured"] == 0.025
    result["pyro"]["theta"] = 0.08
    assert module.claims(result)[-1]["holds"] is False
