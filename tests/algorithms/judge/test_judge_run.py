"""``troupe run judge`` end to end at smoke scale (synthetic streams on aggregator actors, the tiny
LM judge's both-order verdicts joining a stream, the report rebuilt from the run directory), an
exact resume, and bad config and bad input refused by key, line or comparison."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from troupe import Run
from troupe.actors.judge import JudgeCall
from troupe.algorithms.judge.algorithm import lm_comparisons, lm_raters, lm_record, read_answer
from troupe.algorithms.judge.config import JudgeConfig
from troupe.algorithms.judge.model import A, encode_stream
from troupe.algorithms.judge.word_task import RIGHT, TextComparison, WordComparisons, WordTaskConfig
from troupe.cli import main
from troupe.envs.judge_streams import load_stream_jsonl
from troupe.platform.errors import ConfigError, DataError

FAST = ["run.progress=false"]
PLOTS = ("judge_accuracy", "judge_calibration", "judge_order_bias", "judge_tie_propensity",
         "judge_entropy_vs_disagreement", "judge_ess")


@pytest.fixture(scope="module")
def smoke_run(ray_local, troupe_cache, tmp_path_factory):
    out = tmp_path_factory.mktemp("judge") / "smoke"
    with Run("judge", preset="smoke", overrides=FAST, out=out) as run:
        summary = run.run()
    return out, summary


def _streams(run_dir):
    """Every stream's scores, less the wall-clock timings."""
    rows = json.loads((run_dir / "judge" / "results.json").read_text())["streams"]
    return [{k: v for k, v in r.items() if k not in ("filter_s", "score_s")} for r in rows]


@pytest.mark.timeout(240)
def test_smoke_run_scores_every_stream_and_writes_a_readable_report(smoke_run):
    out, summary = smoke_run
    results = json.loads((out / "judge" / "results.json").read_text())
    names = sorted(r["name"] for r in results["streams"])
    assert names == ["beta0.15/seed0", "beta0/seed0", "lm/words"]
    for r in results["streams"]:
        assert r["events_done"] == r["events_total"] > 0
        assert set(r["methods"]) >= {"bayesjudge", "dawid_skene", "majority_vote", "llm_single", "llm_both"}
        assert 0.3 < r["methods"]["bayesjudge"]["accuracy"] <= 1 and r["methods"]["bayesjudge"]["ece"] >= 0
        assert r["order_bias"]["lo"] <= r["order_bias"]["mean"] <= r["order_bias"]["hi"]
        assert 0 < r["ess"]["min"] <= 1
    lm = next(r for r in results["streams"] if r["kind"] == "lm")
    assert lm["n_items"] == 60 and results["lm_judge"]["judgments"] == 120  # both orders of every comparison
    assert results["lm_judge"]["unparsed"] == 0  # the smoke preset reads every answer (lm.min_mass=0)
    assert len(results["exact_check"]) == 2 and all(e["n"] == 6 for e in results["exact_check"])
    assert results["claims"] and all(isinstance(c["holds"], bool) for c in results["claims"])
    assert summary["claims"] == len(results["claims"])
    report = (out / "report.md").read_text()
    for heading in ("## BayesJudge result", "### Verdicts against the latent truth", "### Input checks", "### Claims"):
        assert heading in report
    for name in PLOTS:
        assert (out / "plots" / f"{name}.png").stat().st_size > 1000, name
        assert f"![{name}](plots/{name}.png)" in report
    logs = sorted((out / "judge" / "lm").glob("step-*.jsonl"))
    assert len(logs) == 2 and sum(len(p.read_text().splitlines()) for p in logs) == 60


@pytest.mark.timeout(240)
def test_troupe_report_rebuilds_the_report_from_the_run_directory_alone(smoke_run):
    out, summary = smoke_run
    (out / "report.md").unlink()
    for name in PLOTS:
        (out / "plots" / f"{name}.png").unlink()
    assert main(["report", str(out)]) == 0
    assert "### Claims" in (out / "report.md").read_text()
    assert all((out / "plots" / f"{name}.png").is_file() for name in PLOTS)
    rebuilt = json.loads((out / "summary.json").read_text())
    for key, value in json.loads(json.dumps(summary)).items():
        if key not in ("wall_s", "run_dir"):
            assert rebuilt[key] == value, key


@pytest.mark.timeout(240)
def test_resume_from_the_first_checkpoint_reproduces_the_uninterrupted_run(smoke_run, tmp_path):
    full, _ = smoke_run
    part = tmp_path / "part"
    shutil.copytree(full, part)
    shutil.rmtree(part / "checkpoints" / "step-00000002")
    (part / "checkpoints" / "latest").write_text("step-00000001\n")
    with Run("judge", resume=part) as run:
        assert run.step_index == 1
        run.run()
    assert _streams(part) == _streams(full)
    for name in ("step-00000.jsonl", "step-00001.jsonl"):
        assert (part / "judge" / "lm" / name).read_text() == (full / "judge" / "lm" / name).read_text()


@pytest.mark.timeout(240)
def test_a_judge_that_answers_with_no_verdict_is_counted_never_dropped(ray_local, troupe_cache, tmp_path):
    overrides = [*FAST, "lm.min_mass=1.0", "streams.seeds=0", "check.exact_streams=0", "run.steps=1"]
    with Run("judge", preset="smoke", overrides=overrides, out=tmp_path / "unparsed") as run:
        run.run()
    results = json.loads((tmp_path / "unparsed" / "judge" / "results.json").read_text())
    assert results["lm_judge"]["unparsed"] == 120
    (lm,) = results["streams"]
    assert lm["counts"]["judge_unparsed_skipped"] == 60 and lm["n_items"] == 60  # every comparison kept
    assert "120 of 120 LM answers" in (tmp_path / "unparsed" / "report.md").read_text()


def test_bad_config_is_refused_by_key(tmp_path):
    cases = [
        (["streams.beta_ord=[0.15, 1.5]"], "streams.beta_ord"),
        (["streams.pi=[0.5, 0.5, 0.5]"], "streams.pi"),
        (["raters.crowd_tie=0.5"], "raters.crowd_tie"),
        (["raters.crowd_per_item=40"], "raters.crowd_per_item"),
        (["prior.group_means=shared"], "prior.group_means"),
        (["prior.judge_model=pairwise"], "prior.judge_model"),
        (["smc.draws=10"], "smc.draws"),
        (["lm.answer=mode"], "lm.answer"),
        (["lm.template=which one?"], "lm.template"),
        (["lm.task.first_bias=0.95"], "lm.task.first_bias"),
        (["check.exact_n=20"], "check.exact_n"),
        (["prior.group_means=pooled"], "check.exact_streams"),
        (["streams.seeds=0", "lm.enabled=false"], "streams.seeds"),
        ([f"streams.files=[{tmp_path / 'none.jsonl'}]"], r"streams.files\[0\]"),
    ]
    for overrides, key in cases:
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            Run("judge", preset="smoke", overrides=[*FAST, *overrides], out=tmp_path / "bad").start()


def _write(path, lines):
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


LINE = {"id": "c1", "labels": [{"rater": "e1", "label": "A", "group": "expert"}], "responses": ["x", "y"]}


@pytest.mark.parametrize(("lines", "message"), [
    ([{**LINE, "labels": [{"rater": "e1", "label": "X", "group": "expert"}]}], r"label \['X'\] is not one of"),
    ([{**LINE, "labels": [{"rater": "e1", "label": [], "group": "expert"}]}], "empty label set"),
    ([{**LINE, "labels": [{"rater": "e1", "label": "A"}]}], "rater has no group and groups are required"),
    ([LINE, {**LINE, "responses": ["x", "z"]}], "repeats an id with different responses"),
])
def test_a_stream_file_with_bad_labels_is_refused_before_any_actor_starts(tmp_path, lines, message):
    path = _write(tmp_path / "mine.jsonl", lines)
    with pytest.raises(DataError, match=message) as err:
        Run("judge", preset="smoke", overrides=[*FAST, f"streams.files=[{path}]"], out=tmp_path / "r").start()
    assert r"streams.files[0]" in str(err.value) and "'c1'" in str(err.value)


def test_a_stream_file_is_read_with_late_labels_sets_and_unparsed_judge_answers(tmp_path):
    lines = [{**LINE, "judge": {"ab": "A", "ba": None}, "truth": "A"},
             {"id": "c1", "labels": [{"rater": "w1", "label": ["A", "T"], "group": "crowd"}]},
             {"id": "c2", "labels": [{"rater": "w1", "label": "B", "group": "crowd"}], "judge": {"ab": None, "ba": None}}]
    data = load_stream_jsonl(_write(tmp_path / "mine.jsonl", lines))
    s = encode_stream(data.comparisons)
    assert data.truth == {"c1": "A"} and s.n_items == 2
    assert s.counts == {"late_events": 1, "set_labels": 1, "judge_half_unparsed": 1, "judge_unparsed_skipped": 1}
    (tmp_path / "broken.jsonl").write_text('{"id": "c1"}\nnot json\n')
    with pytest.raises(DataError, match="broken.jsonl: line 2: not JSON"):
        load_stream_jsonl(tmp_path / "broken.jsonl")
    with pytest.raises(DataError, match="line 1: 'judge' must be"):
        load_stream_jsonl(_write(tmp_path / "j.jsonl", [{**LINE, "judge": ["A", "B"]}]))


def test_the_word_task_draws_verdicts_that_match_its_responses():
    task = WordComparisons(WordTaskConfig())
    comps = task.comparisons(400, seed=0)
    for c in comps:
        right = (c.a in RIGHT, c.b in RIGHT)
        assert c.verdict == (0 if right == (True, False) else 1 if right == (False, True) else 2)
    shares = np.bincount([c.verdict for c in comps], minlength=3) / len(comps)
    np.testing.assert_allclose(shares, [0.4, 0.4, 0.2], atol=0.06)
    assert [c.id for c in comps[:2]] == ["lm0", "lm1"] and task.comparisons(5, 0) == comps[:5]


def test_sft_answers_lean_to_the_first_position_by_first_bias():
    task = WordComparisons(WordTaskConfig(first_bias=0.3, label_noise=0.0))
    rng = np.random.default_rng(0)
    # verdict B shown in order AB: the right letter is B, the biased one A
    answers = [task.sft_answer(1, True, rng) for _ in range(4000)]
    assert answers.count("A") / 4000 == pytest.approx(0.3, abs=0.03) and set(answers) == {"A", "B"}
    rows = task.sample(50, "train", rng)
    assert all(r["answer"] in "ABT" and "name a fruit" in r["prompt"] for r in rows)


def test_lm_records_read_the_judges_answers_and_simulate_every_raters_label():
    cfg = JudgeConfig()
    roster, theta = lm_raters(cfg, np.random.default_rng(0))
    assert len(roster) == 33 and dict(roster)["expert0"] == "expert" and dict(roster)["crowd29"] == "crowd"
    item = TextComparison("lm7", "name a fruit", "plum", "rope", A)
    rec = lm_record(item, JudgeCall(np.array([1.0, 0, 0]), None, "A", "?"), cfg, roster, theta)
    assert rec["pair"] == ["A", None] and rec["truth"] == "A"
    groups = [g for _, _, g in rec["labels"]]
    assert groups.count("expert") == 3 and groups.count("crowd") == 3
    assert rec == lm_record(item, JudgeCall(np.array([1.0, 0, 0]), None, "A", "?"), cfg, roster, theta)  # seeded
    (comp,), truth = lm_comparisons([rec])
    assert comp.judge.ab == "A" and comp.judge.ba is None and truth == {"lm7": "A"}
    assert encode_stream([comp]).counts["judge_half_unparsed"] == 1
    rng = np.random.default_rng(0)
    q = np.array([0.2, 0.5, 0.3])
    assert read_answer(q, "argmax", rng) == "B" and read_answer(None, "sample", rng) is None
    draws = [read_answer(q, "sample", rng) for _ in range(3000)]
    assert draws.count("B") / 3000 == pytest.approx(0.5, abs=0.04)
