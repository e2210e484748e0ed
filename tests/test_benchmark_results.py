"""Every committed benchmark result carries a top-level ``claims`` list, and each algorithm
benchmark's ``claims()`` turns its result's verdicts into that list."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
RESULTS = BENCHMARKS / "results"
RESULT_FILES = sorted(RESULTS.rglob("*.json"))


def load_benchmark(name: str) -> ModuleType:
    """A benchmark script as a module (benchmarks/ is not a package; its scripts import
    ``common`` from their own folder, so that folder goes on the path as when run)."""
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_there_are_results():
    assert len(RESULT_FILES) >= 10


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: str(p.relative_to(RESULTS)))
def test_result_has_top_level_claims(path: Path):
    result = json.loads(path.read_text())
    assert isinstance(result, dict)
    claims = result.get("claims")
    assert isinstance(claims, list) and claims, "no top-level claims list"
    for c in claims:
        assert set(c) == {"claim", "measured", "holds"}, c
        assert isinstance(c["claim"], str) and c["claim"]
        m = c["measured"]
        assert isinstance(m, (int, float, str)) and not isinstance(m, bool), c
        assert not (isinstance(m, float) and math.isnan(m)), c
        assert isinstance(c["holds"], bool), c


def test_bandit_claims():
    result = {"summary": {"claims": [
        {"claim": "bitpe within 3x of unquantised at B=16", "measured": 2.3, "reproduced": True},
        {"claim": "bitpe_safe beats bitpe at B=1024", "measured": 0.2, "reproduced": False},
    ]}}
    assert load_benchmark("bandit").claims(result) == [
        {"claim": "bitpe within 3x of unquantised at B=16", "measured": 2.3, "holds": True},
        {"claim": "bitpe_safe beats bitpe at B=1024", "measured": 0.2, "holds": False},
    ]


def _ci(value: float, lo: float, hi: float) -> dict[str, float]:
    return {"value": value, "lo": lo, "hi": hi}


def _arm(hard: tuple, f1: tuple, macro: tuple) -> dict:
    return {"pooled": {"temporal_hard_acc": _ci(*hard), "abstain_f1": _ci(*f1), "macro_acc": _ci(*macro)}}


def test_bpo_claims():
    arms = {"grpo": _arm((0.2, 0.1, 0.3), (0.0, 0.0, 0.0), (0.7, 0.6, 0.8)),
            "bpo": _arm((0.5, 0.4, 0.6), (0.5, 0.25, 0.75), (0.5, 0.4, 0.5)),
            "grpo_2x": _arm((0.3, 0.2, 0.35), (0.4, 0.3, 0.5), (0.7, 0.6, 0.8))}
    verdict = {"temporal_hard_separated": True, "abstain_f1_separated": True, "macro_not_lower": False,
               "grpo_2x_closes_gap": {"temporal_hard_acc": False, "abstain_f1": True}, "claim_holds": False}
    result = {"runs": {"main": {"seeds": 1}}, "main": {"arms": arms, "verdict": verdict},
              "linear": {"config": {}, "cue_sweep": {"0.6": {"arms": arms, "verdict": {
                  "temporal_hard_separated": True, "abstain_f1_separated": True, "macro_not_lower": True,
                  "claim_holds": True}}}}}
    claims = load_benchmark("bpo").claims(result)
    got = [(c["claim"].split(":")[0], c["measured"], c["holds"]) for c in claims]
    assert got == [
        ("main", pytest.approx(0.4 - 0.3), True),
        ("main", pytest.approx(0.25 - 0.0), True),
        ("main", pytest.approx(0.5 - 0.6), False),
        ("main", pytest.approx(0.4 - 0.35), True),
        ("main", pytest.approx(0.25 - 0.5), False),
        ("main", "2 of 3 hold", False),
        ("linear/cue_sweep/0.6", pytest.approx(0.1), True),
        ("linear/cue_sweep/0.6", pytest.approx(0.25), True),
        ("linear/cue_sweep/0.6", pytest.approx(-0.1), True),
        ("linear/cue_sweep/0.6", "3 of 3 hold", True),
    ]
    assert "temporal-hard" in claims[0]["claim"] and "temporal_hard_acc" in claims[3]["claim"]


def test_bpo_claims_say_whether_grpo_raised_macro_over_the_sft_start():
    grpo, bpo = _arm((0.2, 0.1, 0.3), (0.0, 0.0, 0.0), (0.7, 0.66, 0.74)), _arm((0.5, 0.4, 0.6), (0.5, 0.4, 0.6), (0.7, 0.66, 0.74))
    verdict = {"temporal_hard_separated": True, "abstain_f1_separated": True, "macro_not_lower": True, "claim_holds": True}
    below = {"main": {"arms": {"sft": _arm((0.3, 0.2, 0.4), (0.0, 0.0, 0.0), (0.71, 0.69, 0.73)), "grpo": grpo,
                               "bpo": bpo}, "verdict": verdict}}
    above = {"main": {"arms": {"sft": _arm((0.3, 0.2, 0.4), (0.0, 0.0, 0.0), (0.6, 0.58, 0.62)), "grpo": grpo,
                               "bpo": bpo}, "verdict": verdict}}
    bench = load_benchmark("bpo")
    last = bench.claims(below)[-1]
    assert "GRPO raises macro accuracy over the SFT start" in last["claim"]
    assert last["measured"] == pytest.approx(0.66 - 0.73) and not last["holds"]
    assert bench.claims(above)[-1]["measured"] == pytest.approx(0.66 - 0.62) and bench.claims(above)[-1]["holds"]
    # A verdict that carries the run report's flag decides it; the gap is still what is measured.
    above["main"]["verdict"] = {**verdict, "grpo_macro_over_sft": False}
    assert bench.claims(above)[-1]["measured"] == pytest.approx(0.66 - 0.62) and not bench.claims(above)[-1]["holds"]


def test_bpo_claims_check_the_order_of_the_advantage_modes_where_all_three_trained():
    bench = load_benchmark("bpo")
    arms = {name: _arm((0.3, 0.2, 0.4), (0.5, 0.4, 0.6), (macro, macro - 0.02, macro + 0.02))
            for name, macro in (("grpo", 0.7), ("bpo", 0.73), ("bpo_mixed_mean", 0.75), ("bpo_ar_literal", 0.70))}
    verdict = {"temporal_hard_separated": False, "abstain_f1_separated": False, "macro_not_lower": True, "claim_holds": False}
    order = [c for c in bench.claims({"main": {"arms": arms, "verdict": verdict}}) if "advantage mode" in c["claim"]]
    assert [c["holds"] for c in order] == [False, True]  # mixed-mean above AR-cf, above AR-literal
    assert "AR-cf >= mixed-mean" in order[0]["claim"] and "mixed-mean >= AR-literal" in order[1]["claim"]
    assert order[0]["measured"] == "AR-cf 0.730 / mixed-mean 0.750 / AR-literal 0.700"
    arms["bpo_mixed_mean"] = _arm((0.3, 0.2, 0.4), (0.5, 0.4, 0.6), (0.69, 0.67, 0.71))
    assert [c["holds"] for c in bench.claims({"main": {"arms": arms, "verdict": verdict}})
            if "advantage mode" in c["claim"]] == [True, False]
    del arms["bpo_ar_literal"]
    assert not [c for c in bench.claims({"main": {"arms": arms, "verdict": verdict}}) if "advantage mode" in c["claim"]]


def test_bpo_small_pack_claims_name_where_they_were_measured():
    def part(bpo: int, literal: int, mixed: int) -> dict:
        counts = {"bpo": bpo, "bpo_ar_literal": literal, "bpo_mixed_mean": mixed}
        return {"seeds": 3, "cells": {"batch2": {}, "batch8": {}}, "collapsed_total": counts,
                "collapsed_by_batch": {"2": counts, "8": {"bpo": 0, "bpo_ar_literal": 0, "bpo_mixed_mean": 0}}}

    claims = load_benchmark("bpo").claims({"small_packs": part(1, 2, 3), "small_packs_lm": part(2, 1, 3)})
    got = [(c["claim"].split(":")[0], c["holds"]) for c in claims]
    assert got == [("small packs, linear policy, all cells", True), ("small packs, linear policy, batch 2", True),
                   ("small packs, linear policy, batch 8", True), ("small packs, tiny LM, all cells", False),
                   ("small packs, tiny LM, batch 2", False), ("small packs, tiny LM, batch 8", True)]
    assert claims[3]["measured"] == "seeds at the shortcut of 6: AR-cf 2, AR-literal 1, mixed-mean 3"




def test_bpo_over_evaluation_claim_pairs_seeds_and_skips_step_0():
    def seed(*accs):  # step 0 is the SFT start's evaluation: left out of the mean
        return [{"step": 100 * i, "temporal_hard_acc": a} for i, a in enumerate(accs)]

    curves = {"bpo": [seed(0.9, 0.2, 0.4), seed(0.2, 0.5, 0.5)], "grpo": [seed(0.2, 0.2, 0.2), seed(0.2, 0.2, 0.2)],
              "grpo_2x": [seed(0.2, 0.3, 0.4), seed(0.2, 0.2, 0.2)]}
    bench = load_benchmark("bpo")
    assert bench.over_evals(curves)["bpo"] == pytest.approx([0.3, 0.5])
    against_grpo, against_2x = bench.over_eval_claims("main", curves)
    assert against_grpo["holds"] and against_grpo["measured"].startswith("per seed +0.100, +0.300")
    assert not against_2x["holds"] and against_2x["measured"].startswith("per seed -0.050, +0.300")
    assert bench.over_eval_claims("linear/main", {"bpo": {"reward_orig": [0.5]}}) == []


def test_bpo_eval_curves_read_a_run_directory(tmp_path):
    # Two evaluations of one arm: the first is the SFT start's, the last the arm's final record.
    def rec(qtype, hard, correct):
        return json.dumps({"qtype": qtype, "hard": hard, "correct": correct})

    steps = {0: [rec("temporal_order", True, False), rec("temporal_order", True, True), rec("counting", False, True)],
             100: [rec("temporal_order", True, True), rec("action_direction", True, False),
                   rec("counting", False, False)]}
    (tmp_path / "eval" / "bpo").mkdir(parents=True)
    for step, lines in steps.items():
        (tmp_path / "eval" / "bpo" / f"step_{step:06d}.jsonl").write_text("\n".join(lines) + "\n")
    records, curves = load_benchmark("bpo").eval_curves(tmp_path, ["bpo"])
    assert [r["correct"] for r in records["sft"]] == [False, True, True]
    assert [r["correct"] for r in records["bpo"]] == [True, False, False]
    assert [c["step"] for c in curves["bpo"]] == [0, 100]
    assert [c["temporal_hard_acc"] for c in curves["bpo"]] == [0.5, 0.5]
    assert curves["bpo"][1]["temporal_order"] == 1.0 and curves["bpo"][1]["action_direction"] == 0.0


def test_bpo_train_by_type_means_over_steps_and_skips_steps_without_an_update(tmp_path):
    rows = [{"step": 1, "adv_abs/bpo": 0.2, "adv_share_counting/bpo": 0.25, "train_acc_counting/bpo": 1.0,
             "adv_share_counting/grpo": 0.9},
            {"step": 2, "adv_abs/bpo": 0.0, "train_acc_counting/bpo": 0.5},  # a flat step: no shares
            {"step": 3, "adv_abs/bpo": 0.1, "adv_share_counting/bpo": 0.75, "train_acc_counting/bpo": 0.0,
             "adv_share_existence/bpo": 0.25}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = load_benchmark("bpo").train_by_type(tmp_path, ["bpo"])
    assert out == {"bpo": {"counting": {"train_acc": 0.5, "adv_share": 0.5}, "existence": {"adv_share": 0.25}}}


def test_bpo_refuses_an_unknown_part_naming_the_parts(monkeypatch, capsys, tmp_path):
    # A misspelt part would otherwise run nothing and rewrite the file's run record.
    monkeypatch.setattr(sys, "argv", ["bpo.py", "--parts", "main,pixel", "--out", str(tmp_path / "bpo.json")])
    with pytest.raises(SystemExit):
        load_benchmark("bpo").main()
    assert "--parts: unknown pixel; the parts are linear, small, main" in capsys.readouterr().err
    assert not (tmp_path / "bpo.json").exists()


def test_faults_claims():
    result = {"rows": [
        {"scenario": "reference", "survived": "continued", "error": None},
        {"scenario": "killed", "fault": "an engine killed", "survived": "continued", "error": None,
         "matches_uninterrupted_run": True},
        {"scenario": "hang", "fault": "a hang", "survived": "resumed", "error": "RemoteCallError: x (y)",
         "matches_uninterrupted_run": True},
        {"scenario": "driver", "fault": "driver killed", "survived": "resumed", "error": None,
         "matches_uninterrupted_run": True, "checkpoint_intact": False},
        {"scenario": "broken", "survived": "no", "lost": "the scenario failed", "error": "boom"},
    ]}
    claims = load_benchmark("faults").claims(result)
    assert [c["claim"].split(":")[0] for c in claims] == ["killed", "hang", "driver", "broken"]
    assert [(c["measured"], c["holds"]) for c in claims] == [
        ("continued; metrics identical", True),
        ("resumed after RemoteCallError; metrics identical", True),
        ("resumed; failed: checkpoint_intact", False),
        ("no after boom; failed: metrics not compared", False),
    ]


def test_ivdesign_claims():
    def pop(rmse: bool, auc: bool, m_rmse: float, m_auc: float) -> dict:
        return {"ivig_lowest_rmse_final": rmse, "ivig_lowest_auc": auc, "ivig_lowest_rmse_small_n": False,
                "margin_rmse_final_vs_best_baseline": m_rmse, "margin_auc_vs_best_baseline": m_auc}

    result = {"comparison": {"queries": 40, "claims": {"1d_strong": pop(True, True, 0.1, 0.2),
                                                       "1d_weak": pop(False, True, -0.05, 0.01)}}}
    claims = load_benchmark("ivdesign").claims(result)
    assert [(c["measured"], c["holds"]) for c in claims] == [
        (0.1, True), (0.2, True), (-0.05, False), (0.01, True), (pytest.approx(0.15), True)]
    assert claims[0]["claim"] == "1d_strong: IVIG has the lowest target-CATE RMSE@40 of all methods"


def test_opd_claims():
    hs = [2, 8, 12, 24]

    def cells(t1: dict, greedy: dict) -> dict:
        return {str(h): {"j_t1": {"mean": t1[h]}, "j_greedy": {"mean": greedy[h]}} for h in hs}

    ones = dict.fromkeys(hs, 1.0)
    zeros = dict.fromkeys(hs, 0.0)
    closed = {h: 0.8 ** h for h in hs}
    tc = {"eps": 0.3, "vocab": 3}
    tabular = {"config": {"tabular_config": tc},
               "summary": {"bc": cells({h: v + 0.01 for h, v in closed.items()}, {2: 1.0, 8: 1.0, 12: 1.0, 24: 0.3}),
                           "opd_kl": cells({h: v + 0.05 * (h == 8) for h, v in closed.items()},
                                           {2: 1.0, 8: 1.0, 12: 1.0, 24: 0.4}),
                           "ne_opd": cells(ones, {2: 1.0, 8: 1.0, 12: 1.0, 24: 0.9})}}
    nsweep = {"config": {"tabular_config": tc, "sweep_episodes": [50, 200, 1000], "fit_experts": 2000},
              "episodes_for_greedy_j_0.9": {"bc": {"2": 50, "8": 50, "12": 200, "24": None}},
              "fit": {"slope": 0.25, "expected_slope": 0.2231}}
    kernels = {"settings": {
        "step, eps=0.3": {"kernel": "step", "eps": 0.3, "margin": 0.55, "clean_step_prob": [0.7] * 3, "votes": 40,
                          "summary": {"bc": cells({h: 0.7 ** h + 0.03 * (h == 2) for h in hs}, ones),
                                      "ne_opd": cells(ones, ones), "ne_opd_vote": cells(ones, {**ones, 24: 0.95})}},
        "confusion, eps=0.6": {"kernel": "confusion", "eps": 0.6, "margin": -0.2, "clean_step_prob": [0.4] * 3,
                               "votes": 364, "summary": {"bc": cells({h: 0.4 ** h for h in hs}, {**zeros, 2: 0.02}),
                                                         "ne_opd": cells(zeros, zeros),
                                                         "ne_opd_vote": cells(zeros, zeros)}}}}
    approx = {"summary": {"context_2": {"bc": cells(zeros, ones), "ne_opd": cells(ones, ones)},
                          "context_0": {"bc": cells(zeros, {**ones, 24: 0.0}), "ne_opd": cells(ones, ones)}}}
    result = {"tabular": tabular, "kernels": kernels, "nsweep": nsweep, "approx": approx}
    claims = load_benchmark("opd").claims(result)
    assert [(c["measured"], c["holds"]) for c in claims] == [
        # tabular
        (pytest.approx(0.01), True), (pytest.approx(0.05), False), (1.0, True), (1.0, True), (0.3, True),
        (0.4, False), (0.9, False),
        # kernels: NE-OPD where the mode is kept, BC at T=1 against q^H, the lost mode
        (0.95, False), (pytest.approx(0.03), False), (0.02, False),
        # nsweep: growth on the sweep's grid, the fitted slope against -log q
        ("H=2: 50, H=8: 50, H=12: 200, H=24: >1000", True), (0.25, True),
        # approx: the greedy gap shrinks, the T=1 gap does not
        ("0.000 (last 2 tokens) vs 0.250 (whole prefix)", True), ("1.000 (last 2 tokens) vs 1.000 (whole prefix)", False)]
    assert claims[0]["claim"].startswith("BC J at T=1") and claims[10]["claim"].startswith("the N BC needs")
    assert "step at eps=0.3" in claims[7]["claim"] and "margin -0.20" in claims[9]["claim"]
    # a result of some parts only has the claims of those parts
    assert len(load_benchmark("opd").claims({"nsweep": nsweep})) == 2


def test_opd_lm_merge_keeps_the_horizons_not_run_now():
    lm = load_benchmark("opd_lm")

    def section(hs: list[int], value: float, seeds: tuple[int, ...] = (0, 1)) -> dict:
        cell = {"greedy": {"mean": value}}
        return {"seeds": list(seeds), "methods": ["bc"], "overrides": [], "horizons": hs, "missing": [],
                "runs": [{"seed": s, "horizon": h} for s in seeds for h in hs],
                "summary": {"bc": {str(h): cell for h in hs}, "teacher": {str(h): cell for h in hs}}}

    old, new = section([4, 8, 16], 0.5), section([32, 8], 0.9)
    merged = lm.merge(old, new)
    assert merged["horizons"] == [4, 8, 16, 32]
    # a horizon run now replaces the kept one; the cells read in increasing H, as the claims need
    assert list(merged["summary"]["bc"]) == ["4", "8", "16", "32"]
    assert [merged["summary"]["bc"][h]["greedy"]["mean"] for h in ("4", "8", "16", "32")] == [0.5, 0.9, 0.5, 0.9]
    kept = [r for r in merged["runs"] if r.get("kept_from_earlier_results")]
    assert sorted({r["horizon"] for r in kept}) == [4, 16] and len(merged["runs"]) == 2 * 4
    assert lm.merge({}, new) == new
    with pytest.raises(SystemExit, match="seeds"):
        lm.merge(section([4], 0.5, seeds=(0,)), new)
