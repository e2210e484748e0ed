"""``troupe run icrm`` end to end at smoke scale: every reward model fitted by learner actors, λ
chosen on validation ECE, the chosen ICRM saved and used as the reward of GRPO arms, a readable
run directory, and an exact resume from the fitting and from the RL phase."""

from __future__ import annotations

import json

import pytest

from troupe import Run

FAST = ["run.progress=false"]


def _files(run_dir):
    return {name: (run_dir / name).read_text() for name in ("predictions.json", "rl.jsonl")}


@pytest.mark.timeout(900)
def test_smoke_run_fits_every_model_trains_the_rl_arms_and_resumes_exactly(ray_local, troupe_cache, tmp_path,
                                                                         resume_from_checkpoint):
    full = tmp_path / "full"
    with Run("icrm", preset="smoke", overrides=FAST, out=full) as r:
        r.run()
    for name in ("report.md", "summary.json", "predictions.json", "truth.json", "selection.json", "rl.jsonl",
                 "models/icrm/icrm.json", "models/static/icrm.safetensors", "plots/accuracy_vs_k_seen.png",
                 "plots/reliability.png", "plots/ece_vs_lambda.png", "plots/rl_gold_a.png", "best_of_n.json",
                 "plots/best_of_n_gold_vs_kl.png", "plots/steering_front.png", "plots/rl_gold_vs_kl.png"):
        assert (full / name).is_file(), name
    predictions = json.loads((full / "predictions.json").read_text())
    assert set(predictions) == {"icrm_lam1", "icrm_lam0.1", "point", "static_0", "static_1", "judge"}
    for name, by_split in predictions.items():
        assert set(by_split) == {"valid", "seen", "unseen"}
        assert all(len(by_split[s][k]["mu"]) == 24 for s in by_split for k in ("0", "2")), name
    selection = json.loads((full / "selection.json").read_text())
    eces = selection["validation_ece"]
    assert selection["selected"] == min(eces, key=eces.get)
    assert json.loads((full / "models/icrm/icrm.json").read_text())["objective"] == "elbo"
    records = [json.loads(line) for line in (full / "rl.jsonl").read_text().splitlines()]
    assert [r["rl_step"] for r in records] == [0, 1, 2]
    assert set(records[0]) == {"rl_step"} | {f"{prefix}/{arm}/{who}" for prefix in ("gold", "gold_sampled")
                                            for arm in ("icrm", "static", "icrm_b") for who in ("a", "b")}
    # before any step every arm is the SFT policy, and the sampled evaluation draws the same samples
    assert len({records[0][f"gold_sampled/{arm}/a"] for arm in ("icrm", "static", "icrm_b")}) == 1
    picks = json.loads((full / "best_of_n.json").read_text())
    assert picks["n"] == [1, 2, 4, 8, 16, 32, 64] and picks["model"] == selection["selected"]
    assert set(picks["gold_a"]) == {"gold itself", "ICRM steered by a (r)", "ICRM steered by a (E_q log p)",
                                    "ICRM steered by b (r)", "static RM (r)"}
    gold = picks["gold_a"]["gold itself"]
    assert gold == sorted(gold) and all(c[0] == gold[0] for c in picks["gold_a"].values())  # N = 1: the same pick
    assert len(picks["mix"]) == len(picks["scalarised"]) == 11 and picks["hypervolume"]["mix"] >= 0
    summary = json.loads((full / "summary.json").read_text())
    claims = summary["claims"]
    assert len(claims) == 14 and all(isinstance(c["holds"], bool) and c["measured"] for c in claims)
    report = (full / "report.md").read_text()
    assert "## Reward models steered by demonstrations" in report and "## ICRM-RL" in report
    assert "## What the reward models pick" in report
    # every arm trained on its own reward model: the reward actors answered every step
    rows = [json.loads(line) for line in (full / "metrics.jsonl").read_text().splitlines()]
    rl_rows = [r for r in rows if "rl/reward/mean/icrm" in r]
    assert len(rl_rows) == 2 and all(0 < r["rl/reward/mean/icrm"] < 1 for r in rl_rows)
    # each model ends at its own step count: the static RMs at train.static_steps, the judge at judge_steps
    fitted = [r for r in rows if "steps/static_0" in r][-1]
    assert (fitted["steps/icrm_lam1"], fitted["steps/static_0"], fitted["steps/static_1"], fitted["steps/judge"]) \
        == (6, 4, 4, 4)

    # Interrupted in the RL phase (the last two checkpoints are kept): the same files at the end.
    part = resume_from_checkpoint("icrm", full, tmp_path / "part3", 3)
    assert _files(part) == _files(full)


@pytest.mark.timeout(600)
def test_a_run_interrupted_in_the_fitting_resumes_exactly(ray_local, troupe_cache, tmp_path, resume_from_checkpoint):
    full = tmp_path / "full"
    with Run("icrm", preset="smoke", overrides=[*FAST, "rl.steps=0"], out=full) as r:
        r.run()
    assert not (full / "rl.jsonl").exists()
    part = resume_from_checkpoint("icrm", full, tmp_path / "part1", 1)
    assert (part / "predictions.json").read_text() == (full / "predictions.json").read_text()
    a, b = (json.loads((d / "selection.json").read_text()) for d in (part, full))
    assert (a["selected"], a["validation_ece"]) == (b["selected"], b["validation_ece"])
