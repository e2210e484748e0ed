"""`troupe run icrm` on the attribute datasets (``data.source`` helpsteer2, ultrafeedback,
pku_saferlhf) read from small files written here in each dataset's own format, and the GPU preset
on CPU with a tiny Qwen2 backbone in place of Qwen2.5-1.5B: the reports, predictions and claims
are well-formed, evaluation prompts are never training ones, and bad input is a clear error
naming its key."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.special import expit

from troupe import Run
from troupe.algorithms.icrm.algorithm import ICRMAlgorithm
from troupe.algorithms.icrm.config import DEFAULT_OBJECTIVES, PERSONA_RL_STEPS, SPLITS, ICRMRunConfig
from troupe.algorithms.icrm.learner import DatasetData, eval_sets, task_data
from troupe.platform.config import from_dict, resolve
from troupe.platform.errors import ConfigError, DataError

FAST = ["run.progress=false"]
NO_RL = ["rl.steps=0"]  # the smoke preset's RL arms need the personas' gold reward
WORDS = ("the", "answer", "is", "clear", "because", "we", "checked", "each", "step", "carefully", "and", "found",
         "that", "it", "holds", "for", "all", "cases", "here", "so")


def sentence(rng: np.random.Generator, n: int) -> str:
    return " ".join(rng.choice(WORDS, size=n)).capitalize() + "."


def helpsteer2_rows(prompts: int, seed: int = 0) -> list[dict]:
    """nvidia/HelpSteer2's format: a row per response, two responses per prompt, five 0-4 scores;
    helpfulness and verbosity follow a response's length, so an objective is learnable."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(prompts):
        prompt = f"Question {i}: {sentence(rng, 6)}"
        for _ in range(2):
            n = int(rng.integers(2, 14))
            rows.append({"prompt": prompt, "response": sentence(rng, n), "helpfulness": min(4, n // 3),
                         "correctness": int(rng.integers(5)), "coherence": int(rng.integers(5)),
                         "complexity": int(rng.integers(5)), "verbosity": min(4, n // 3)})
    return rows


def saferlhf_rows(pairs: int, seed: int = 1) -> list[dict]:
    """PKU-Alignment/PKU-SafeRLHF's format: a row per pair with its better and safer ids."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(pairs):
        better, safer = int(rng.integers(2)), int(rng.integers(2))
        rows.append({"prompt": f"Request {i}: {sentence(rng, 5)}", "response_0": sentence(rng, int(rng.integers(2, 12))),
                     "response_1": sentence(rng, int(rng.integers(2, 12))), "better_response_id": better,
                     "safer_response_id": safer, "is_response_0_safe": safer == 0 or bool(rng.integers(2)),
                     "is_response_1_safe": safer == 1 or bool(rng.integers(2))})
    return rows


def ultrafeedback_rows(prompts: int, seed: int = 2) -> list[dict]:
    """openbmb/UltraFeedback's format: a row per instruction, four completions rated per aspect."""
    rng = np.random.default_rng(seed)
    aspects = ("instruction_following", "honesty", "truthfulness", "helpfulness")
    return [{"instruction": f"Task {i}: {sentence(rng, 5)}",
             "completions": [{"response": sentence(rng, int(rng.integers(2, 12))),
                              "annotations": {a: {"Rating": str(int(rng.integers(1, 6)))} for a in aspects}}
                             for _ in range(4)]} for i in range(prompts)]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture(autouse=True)
def _private_datasets_cache(tmp_path, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets-cache"))


def config(**data) -> ICRMRunConfig:
    return from_dict(ICRMRunConfig, {"data": data})


def check_run_directory(out, source: str) -> dict:
    """What every dataset run writes, and what it does not (the persona-only parts)."""
    for name in ("report.md", "summary.json", "predictions.json", "truth.json", "selection.json", "data.json",
                 "models/icrm/icrm.json", "models/static/icrm.safetensors", "plots/accuracy_vs_k_seen.png",
                 "plots/reliability.png"):
        assert (out / name).is_file(), name
    assert not (out / "rl.jsonl").exists() and not (out / "best_of_n.json").exists()
    predictions = json.loads((out / "predictions.json").read_text())
    truth = json.loads((out / "truth.json").read_text())
    for name, by_split in predictions.items():
        assert set(by_split) == set(SPLITS), name
        assert all(len(by_split[s][k]["mu"]) == 24 for s in SPLITS for k in ("0", "2")), name
        assert all(0 < mu < 1 for s in SPLITS for k in ("0", "2") for mu in by_split[s][k]["mu"]), name
    summary = json.loads((out / "summary.json").read_text())
    claims = summary["claims"]
    assert claims and all(set(c) == {"claim", "measured", "holds"} and isinstance(c["holds"], bool) and c["measured"]
                          for c in claims)
    assert summary["data"]["source"] == source and summary["data"]["prompts"]["valid"] >= 2
    report = (out / "report.md").read_text()
    assert "## Data" in report and "## Reward models steered by demonstrations" in report
    assert f"Not run with data.source={source}: ICRM-RL (rl.steps) and best-of-N" in report
    assert "## ICRM-RL" not in report
    return truth


# -- runs ---------------------------------------------------------------------------------------------
@pytest.mark.timeout(300)
def test_a_smoke_run_on_a_helpsteer2_file_fits_and_evaluates_on_held_out_prompts(ray_local, troupe_cache,
                                                                                 tmp_path):
    path = write_jsonl(tmp_path / "helpsteer2.jsonl", helpsteer2_rows(80))
    out = tmp_path / "run"
    with Run("icrm", preset="smoke", overrides=[*FAST, *NO_RL, "data.source=helpsteer2", f"data.path={path}"],
             out=out) as r:
        assert r.config.rl.steps == 0 and r.config.run.steps == r.config.train.chunks
        assert r.config.data.objectives == DEFAULT_OBJECTIVES["helpsteer2"][0]
        r.run()
    truth = check_run_directory(out, "helpsteer2")
    for split in SPLITS:  # threshold labels: the objective's preference is exact, p_true is the label
        for by_k in truth[split].values():
            assert by_k["p_true"] == [float(v) for v in by_k["label"]]
    assert json.loads((out / "prepare.json").read_text())["backbone"]["backbone"] == "tiny"


@pytest.mark.timeout(300)
def test_a_smoke_run_on_a_saferlhf_file_with_bt_labels_reports_their_probabilities(ray_local, troupe_cache,
                                                                                   tmp_path):
    path = write_jsonl(tmp_path / "saferlhf.jsonl", saferlhf_rows(50))
    out = tmp_path / "run"
    over = [*FAST, *NO_RL, "data.source=pku_saferlhf", f"data.path={path}", "data.labels=bt", "data.beta=2.0",
            "train.judge=false", "train.ensemble=1"]
    with Run("icrm", preset="smoke", overrides=over, out=out) as r:
        r.run()
    truth = check_run_directory(out, "pku_saferlhf")
    # every margin of a {helpful: 1} or {harmless: 1} objective is ±1: p_true is σ(±2)
    assert {round(p, 6) for p in truth["seen"]["0"]["p_true"]} <= {round(float(expit(2.0)), 6),
                                                                   round(float(expit(-2.0)), 6)}
    predictions = json.loads((out / "predictions.json").read_text())
    assert set(predictions) == {"icrm_lam1", "icrm_lam0.1", "point", "static_0"}


@pytest.mark.timeout(300)
def test_the_gpu_preset_runs_on_cpu_with_a_tiny_qwen2_backbone_and_a_helpsteer2_file(ray_local, troupe_cache,
                                                                                     tmp_path):
    """The GPU preset as a GPU user runs it (a hub-format Qwen2 backbone in bf16, the heads on top,
    HelpSteer2), with a tiny model of that architecture, a small file and CPU in place of the GPU."""
    from troupe.actors.models import TinyLMSpec, build_tiny_lm, save_model, train_tokenizer
    from troupe.algorithms.icrm.text import response_text

    rows = helpsteer2_rows(80)
    tok = train_tokenizer([response_text(r["prompt"], r["response"]) for r in rows], 384)
    spec = TinyLMSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)
    save_model(build_tiny_lm(spec, tok, seed=0), tok, tmp_path / "backbone")
    assert json.loads((tmp_path / "backbone" / "config.json").read_text())["model_type"] == "qwen2"
    path = write_jsonl(tmp_path / "helpsteer2.jsonl", rows)

    preset = resolve(ICRMRunConfig, ICRMAlgorithm.presets_dir(), "gpu", [])
    assert preset.backbone.path.startswith("Qwen/Qwen2.5-1.5B") and preset.backbone.dtype == "bfloat16"
    assert preset.backbone.device == "cuda" and preset.workers.num_gpus > 0 and not preset.backbone.train
    assert preset.data.source == "helpsteer2" and preset.data.path is None and preset.rl.steps == 0

    cpu = [f"backbone.path={tmp_path / 'backbone'}", f"data.path={path}", "backbone.device=cpu", "workers.num_gpus=0",
           "workers.num_cpus=0.5", "run.num_cpus=4", "backbone.max_tokens=48", "backbone.features=16",
           "backbone.encode_batch=16", "data.personas.max_demos=2", "icrm.max_demos=2", "icrm.d_model=16",
           "icrm.layers=1", "icrm.heads=2", "data.eval_ks=[0,2]", "data.eval_episodes=24", "data.eval_fraction=0.2",
           "train.steps=6", "train.chunks=2", "train.batch_size=16", "train.lambdas=[1.0,0.1]", "train.ensemble=2",
           "train.judge_steps=4", *FAST]
    out = tmp_path / "run"
    with Run("icrm", preset="gpu", overrides=cpu, out=out) as r:
        assert r.config.backbone.dtype == "bfloat16" and r.config.workers.count == 2
        r.run()
    check_run_directory(out, "helpsteer2")
    prepared = json.loads((out / "prepare.json").read_text())
    assert prepared["backbone_path"] == str(tmp_path / "backbone")
    assert json.loads((out / "models/icrm/icrm.json").read_text())["features"] == 16


# -- the data itself, without Ray ------------------------------------------------------------------------
def test_evaluation_prompts_are_held_out_of_training_and_split_by_their_text(tmp_path):
    rows = helpsteer2_rows(60)
    cfg = config(source="helpsteer2", path=write_jsonl(tmp_path / "a.jsonl", rows), eval_episodes=40)
    data = task_data(cfg)
    assert isinstance(data, DatasetData)
    parts = [set(p.prompts) for p in (data.train, data.valid, data.test)]
    assert all(parts) and not (parts[0] & parts[1] or parts[0] & parts[2] or parts[1] & parts[2])
    assert sum(map(len, parts)) == 60
    # the split follows each prompt's text, not the file's order
    shuffled = [rows[i] for i in np.random.default_rng(0).permutation(len(rows))]
    again = task_data(config(source="helpsteer2", path=write_jsonl(tmp_path / "b.jsonl", shuffled)))
    assert set(again.valid.prompts) == parts[1] and set(again.test.prompts) == parts[2]
    sets = eval_sets(cfg, data)
    train_prompts = parts[0]
    for split in SPLITS:
        eps, _ = sets[split][2]
        assert all(c.prompt not in train_prompts for e in eps for c in (*e.demos, e.query))
        assert {e.objective for e in eps} <= set(cfg.data.unseen_objectives if split == "unseen"
                                                 else cfg.data.objectives)
    assert [e.query for e in sets["seen"][0][0]] == [e.query for e in sets["seen"][2][0]]  # k nested


def test_bt_p_true_is_the_logistic_of_the_margin_in_the_order_shown(tmp_path):
    rows = helpsteer2_rows(30)
    scores = {(r["prompt"], r["response"]): r["helpfulness"] for r in rows}
    cfg = config(source="helpsteer2", path=write_jsonl(tmp_path / "a.jsonl", rows), labels="bt", beta=0.7,
                 objectives={"helpful": {"helpfulness": 1.0}}, unseen_objectives={"terse": {"verbosity": -1.0}},
                 eval_fraction=0.5)
    eps, p_true = eval_sets(cfg, task_data(cfg))["seen"][0]
    margins = [scores[(e.query.prompt, e.query.a)] - scores[(e.query.prompt, e.query.b)] for e in eps]
    assert p_true == pytest.approx(expit(0.7 * np.array(margins)))


def test_an_ultrafeedback_file_gives_its_default_objectives_episodes_on_held_out_prompts(tmp_path):
    cfg = config(source="ultrafeedback", path=write_jsonl(tmp_path / "uf.jsonl", ultrafeedback_rows(40)),
                 eval_episodes=30)
    assert set(cfg.data.unseen_objectives) == set(DEFAULT_OBJECTIVES["ultrafeedback"][1])
    data = task_data(cfg)
    sets = eval_sets(cfg, data)
    assert {e.objective for e in sets["unseen"][2][0]} <= {"honest", "truthful"}
    assert all(e.query.prompt in set(data.test.prompts) for e in sets["unseen"][2][0])


def test_max_prompts_keeps_that_many_prompts(tmp_path):
    cfg = config(source="helpsteer2", path=write_jsonl(tmp_path / "a.jsonl", helpsteer2_rows(200)), max_prompts=80)
    data = task_data(cfg)
    assert sum(len(p.prompts) for p in (data.train, data.valid, data.test)) == 80


def test_the_personas_stay_the_default_source_with_their_rl_arms():
    c = from_dict(ICRMRunConfig, {})
    assert c.data.source == "personas" and c.rl.steps == PERSONA_RL_STEPS and c.data.objectives == {}
    assert c.backbone.device == "cpu" and c.workers.num_gpus == 0


# -- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("data", "key"), [
    ({"source": "hh-rlhf"}, r"data\.source"),
    ({"source": "helpsteer2", "objectives": {"safe": {"harmless": 1.0}}},
     r"data\.objectives\.safe'?: objective names attribute\(s\) \['harmless'\] the dataset helpsteer2 does not have"),
    ({"source": "pku_saferlhf", "unseen_objectives": {"x": {"helpfulness": 1.0}}},
     r"data\.unseen_objectives\.x'?: objective names attribute\(s\) \['helpfulness'\]"),
    ({"source": "helpsteer2", "objectives": {"helpful": 1.0}}, r"data\.objectives\.helpful' = 1\.0: expected a mapping"),
    ({"source": "helpsteer2", "objectives": {"helpful": {}}}, r"data\.objectives\.helpful' = \{\}: expected a non-empty"),
    ({"source": "helpsteer2", "objectives": {"none": {"helpfulness": 0.0}}}, r"data\.objectives\.none"),
    ({"source": "helpsteer2", "objectives": {"terse": {"verbosity": -1.0}}}, r"data\.unseen_objectives"),
    ({"objectives": {"helpful": {"helpfulness": 1.0}}}, r"data\.objectives.*data\.source=personas"),
    ({"source": "helpsteer2", "labels": "soft"}, r"data\.labels"),
    ({"source": "helpsteer2", "beta": 0.0}, r"data\.beta"),
    ({"source": "helpsteer2", "eval_fraction": 1.0}, r"data\.eval_fraction"),
])
def test_bad_data_config_is_refused_naming_the_key(data, key):
    with pytest.raises(ConfigError, match=key):
        from_dict(ICRMRunConfig, {"data": data})


def test_rl_steps_with_a_dataset_source_are_refused_naming_rl_steps():
    with pytest.raises(ConfigError, match=r"rl\.steps.*0 \(or unset\) with data\.source=helpsteer2"):
        from_dict(ICRMRunConfig, {"data": {"source": "helpsteer2"}, "rl": {"steps": 2}})


@pytest.mark.parametrize(("over", "key"), [
    ({"backbone": {"device": "cuda"}}, r"workers\.num_gpus"),
    ({"backbone": {"device": "tpu"}}, r"backbone\.device"),
    ({"workers": {"num_gpus": -1}}, r"workers\.num_gpus"),
    ({"backbone": {"encode_batch": 0}}, r"backbone\.encode_batch"),
])
def test_bad_device_config_is_refused_naming_the_key(over, key):
    with pytest.raises(ConfigError, match=key):
        from_dict(ICRMRunConfig, over)


def test_a_dataset_with_too_few_prompts_for_the_evaluation_split_names_data_eval_fraction(tmp_path):
    cfg = config(source="helpsteer2", path=write_jsonl(tmp_path / "small.jsonl", helpsteer2_rows(3)))
    with pytest.raises(ConfigError, match=r"data\.eval_fraction=0\.2: data\.source=helpsteer2 .* has 3 prompts "
                                          r"with a pair.* it needs at least 2"):
        task_data(cfg)


def test_an_objective_that_labels_no_held_out_pair_names_the_split_and_key(tmp_path):
    rows = helpsteer2_rows(80)
    for r in rows:
        r["complexity"] = 2  # every pair tied on complexity
    cfg = config(source="helpsteer2", path=write_jsonl(tmp_path / "a.jsonl", rows), eval_fraction=0.5,
                 unseen_objectives={"complex": {"complexity": 1.0}})
    with pytest.raises(DataError, match=r"the unseen split \(data\.unseen_objectives, \d+ held-out prompts\):.*"
                                        r"objective 'complex' labels no pair"):
        eval_sets(cfg, task_data(cfg))


def test_a_missing_dataset_file_is_a_clear_error_naming_the_path(tmp_path):
    cfg = config(source="ultrafeedback", path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(DataError, match=r"nope\.jsonl' does not exist"):
        task_data(cfg)
