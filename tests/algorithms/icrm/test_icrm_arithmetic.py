"""`troupe run icrm` with ``data.source=arithmetic`` (verifiable math, §C.2 and §C.3 5): episodes of
(correct, incorrect) solution pairs whose demos are other problems', evaluation on held-out
problems, the RL arms on the arithmetic task (ICRM, the static RM on the same pairs, the rule
verifier), and bad input refused naming its key."""

from __future__ import annotations

import json

import numpy as np
import pytest

from troupe import Run
from troupe.algorithms.icrm.algorithm import ICRMAlgorithm, backbone_key
from troupe.algorithms.icrm.analysis import arithmetic_rl_claims
from troupe.algorithms.icrm.config import ARITHMETIC_RL_STEPS, SPLITS, ICRMRunConfig
from troupe.algorithms.icrm.learner import (
    ArithmeticData,
    arithmetic_task,
    eval_sets,
    task_data,
    train_episodes,
)
from troupe.envs.arithmetic import ArithmeticTask
from troupe.envs.preferences.solutions import parse_problem
from troupe.platform.config import from_dict, resolve
from troupe.platform.errors import ConfigError

SMALL = {"source": "arithmetic", "problems": 200, "eval_problems": 40, "eval_episodes": 30}


def config(**data) -> ICRMRunConfig:
    return from_dict(ICRMRunConfig, {"data": {**SMALL, **data}})


def test_the_arithmetic_source_trains_its_rl_arms_on_its_own_problems_with_the_exact_checker():
    c = config(digits=3, ops=["+", "-"])
    assert c.rl.arms == ["icrm", "static", "rule"] and c.rl.steps == ARITHMETIC_RL_STEPS
    task = c.rl.policy.task
    assert isinstance(task, ArithmeticTask.Config) and (task.digits, task.ops) == (3, ["+", "-"])
    assert c.rl.policy.reward.fn == "arithmetic_exact"
    assert c.run.steps == c.train.chunks + c.rl.steps


def test_evaluation_problems_are_held_out_and_never_training_ones():
    c = config()
    data = task_data(c)
    assert isinstance(data, ArithmeticData)
    task = arithmetic_task(c)
    train, valid, test = (set(p.prompts) for p in (data.train, data.valid, data.test))
    assert len(train) == 200 and len(valid) == len(test) == 20
    assert not train & valid and not train & test and not valid & test
    for prompt in valid | test:
        p = parse_problem(prompt)
        assert task.is_test(p.a, p.b, p.op)
    # training episodes show the trained kinds only; the unseen split the held-out kind only
    for e in train_episodes(c, data, 50, np.random.default_rng(0)):
        for pair in (e.query, *e.demos):
            wrong = data.train.wrong[data.train.prompts.index(pair.prompt)]
            assert pair.rejected in {wrong.get(k) for k in c.data.mistakes}
    sets = eval_sets(c, data)
    assert set(sets) == set(SPLITS)
    for split, by_k in sets.items():
        pool, kinds = data.split(split)
        eps, p_true = by_k[max(c.data.eval_ks)]
        assert list(p_true) == [float(e.query.label) for e in eps]  # the correct solution always wins
        for e in eps:
            assert e.query.prompt in set(pool.prompts)
            assert all(d.prompt != e.query.prompt for d in e.demos)
            wrong = pool.wrong[pool.prompts.index(e.query.prompt)]
            assert e.query.rejected in {wrong[k] for k in kinds if k in wrong}
            assert e.query.chosen == str(parse_problem(e.query.prompt).answer)
        # nested in k: the same queries, the first k demos
        assert [e.query for e in by_k[0][0]] == [e.query for e in eps]


@pytest.mark.parametrize(("data", "key"), [
    ({"digits": 1, "mistakes": ["carry"], "unseen_mistakes": ["digit"], "problems": 20}, r"data\.mistakes.*'carry' needs"),
    ({"ops": ["*"], "mistakes": ["carry"]}, r"data\.mistakes"),
    ({"digits": 1}, r"data\.problems' = 200.*at most 77.*raise data\.digits"),
    ({"mistakes": ["typo"]}, r"data\.mistakes"),
    ({"mistakes": ["digit"]}, r"data\.unseen_mistakes"),
    ({"eval_problems": 2}, r"data\.eval_problems"),
    ({"pool": 300}, r"data\.pool.*do not apply with data\.source=arithmetic"),
    ({"train_personas": 8}, r"data\.train_personas"),
    ({"personas": {"beta0": 0.7}}, r"data\.personas'?\].*do not apply"),
    ({"objectives": {"x": {"helpfulness": 1.0}}}, r"data\.objectives"),
])
def test_bad_arithmetic_config_is_refused_naming_the_key(data, key):
    with pytest.raises(ConfigError, match=key):
        config(**data)


def test_arithmetic_keys_with_another_source_and_other_problems_for_the_arms_are_refused():
    with pytest.raises(ConfigError, match=r"data\.digits.*data\.source=arithmetic only"):
        from_dict(ICRMRunConfig, {"data": {"digits": 3}})
    with pytest.raises(ConfigError, match=r"rl\.policy\.task.*data\.digits=2"):
        from_dict(ICRMRunConfig, {"data": SMALL, "rl": {"policy": {"task": {"name": "arithmetic", "digits": 3}}}})
    with pytest.raises(ConfigError, match=r"rl\.arms.*\['icrm', 'static', 'rule'\]"):
        from_dict(ICRMRunConfig, {"data": SMALL, "rl": {"arms": ["icrm_b"]}})
    with pytest.raises(ConfigError, match=r"rl\.arms.*\['icrm', 'static', 'icrm_b'\]"):
        from_dict(ICRMRunConfig, {"rl": {"arms": ["rule"]}})


def test_the_rl_claims_compare_the_icrm_arm_with_the_static_rm_and_the_rule_verifier():
    records = [{"rl_step": 0, "gold/icrm/exact": 0.2, "gold/static/exact": 0.2, "gold/rule/exact": 0.2},
               {"rl_step": 10, "gold/icrm/exact": 0.4, "gold/static/exact": 0.3, "gold/rule/exact": 0.5}]
    beats, close = arithmetic_rl_claims(records)
    assert beats["holds"] and "0.400 vs 0.300" in beats["measured"]
    assert not close["holds"] and "gap +0.100" in close["measured"] and "0.67 of its gain" in close["measured"]
    records[-1]["gold/rule/exact"] = 0.42
    assert arithmetic_rl_claims(records)[1]["holds"]
    flat = [{k: (0.0 if k != "rl_step" else v) for k, v in r.items()} for r in records]
    assert not arithmetic_rl_claims(flat)[1]["holds"]  # no gain of the rule arm: nothing to come close to


@pytest.mark.timeout(120)
def test_a_smoke_run_fits_on_solution_pairs_and_trains_every_rl_arm(ray_local, troupe_cache, tmp_path):
    out = tmp_path / "run"
    assert resolve(ICRMRunConfig, ICRMAlgorithm.presets_dir(), "smoke_arithmetic").data.source == "arithmetic"
    with Run("icrm", preset="smoke_arithmetic", overrides=["run.progress=false"], out=out) as r:
        r.run()
    for name in ("report.md", "summary.json", "predictions.json", "truth.json", "data.json", "rl.jsonl",
                 "models/icrm/icrm.json", "models/static/icrm.safetensors", "plots/accuracy_vs_k_seen.png",
                 "plots/rl_gold_exact.png"):
        assert (out / name).is_file(), name
    assert not (out / "best_of_n.json").exists()
    truth = json.loads((out / "truth.json").read_text())
    assert all(by_k["p_true"] == [float(v) for v in by_k["label"]] for s in SPLITS for by_k in truth[s].values())
    records = [json.loads(line) for line in (out / "rl.jsonl").read_text().splitlines()]
    assert [r["rl_step"] for r in records] == [0, 1, 2]
    assert set(records[0]) == {"rl_step"} | {f"{prefix}/{arm}/exact" for prefix in ("gold", "gold_sampled")
                                            for arm in ("icrm", "static", "rule")}
    assert all(0 <= v <= 1 for r in records for k, v in r.items() if k != "rl_step")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    rl_rows = [r for r in rows if "rl/reward/mean/icrm" in r]
    assert len(rl_rows) == 2 and all(0 < r["rl/reward/mean/icrm"] < 1 for r in rl_rows)
    assert all(r["rl/reward/mean/rule"] in (0.0, 0.25, 0.5, 0.75, 1.0) for r in rl_rows)  # 4 rows of 0/1
    summary = json.loads((out / "summary.json").read_text())
    assert summary["data"]["source"] == "arithmetic"
    rl_claims = [c for c in summary["claims"] if c["claim"].startswith("arithmetic RL")]
    assert len(rl_claims) == 2 and all(isinstance(c["holds"], bool) for c in rl_claims)
    report = (out / "report.md").read_text()
    assert "Verifiable arithmetic" in report and "## ICRM-RL" in report and "rule verifier" in report


def test_the_arithmetic_backbone_is_cached_apart_from_the_personas_one_at_the_same_seed():
    # Both sources at one seed once had one cache key, so a personas run loaded the backbone
    # pretrained on arithmetic solutions (or the reverse), whichever ran first.
    personas = from_dict(ICRMRunConfig, {})
    arithmetic = from_dict(ICRMRunConfig, {"data": {"source": "arithmetic"}})
    keys = {c.data.source: backbone_key(c, task_data(c), []) for c in (personas, arithmetic)}
    assert keys["arithmetic"] != keys["personas"] and keys["arithmetic"]["source"] == "arithmetic"
    # the personas' key is what it was, so their cached backbones still serve
    assert "source" not in keys["personas"] and "corpus_sha256" not in keys["personas"]
