"""``troupe run opd`` end to end at smoke scale: every arm trained through its actors, a readable
run directory, an exact resume, and bad input refused before any actor starts."""

from __future__ import annotations

import json

import pytest

from troupe import Run
from troupe.platform.errors import ConfigError

FAST = ["run.progress=false"]


def _evals(run_dir):
    return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.timeout(900)
def test_smoke_run_trains_every_arm_and_resumes_exactly(ray_local, troupe_cache, tmp_path, resume_from_checkpoint):
    full = tmp_path / "full"
    # the NE-OPD arm rolls in ε-greedy: exploring, seeded, and resumed exactly like the rest
    with Run("opd", preset="smoke", overrides=[*FAST, "opd.explore=0.1", "opd.offline_updates_per_step=3"],
             out=full) as r:
        lr, warmup = r.config.learner.lr, r.config.learner.warmup_steps
        r.run()
    for name in ("report.md", "summary.json", "eval.json", "config.yaml", "metrics.jsonl",
                 "plots/success_vs_h_greedy.png", "plots/success_vs_h_t1.png"):
        assert (full / name).is_file(), name
    rows = _evals(full)
    # The offline arm takes opd.offline_updates_per_step (3) updates a step, the others
    # opd.updates_per_step (2): in the warm-up, step 0's last update is its third against their second.
    first = next(r for r in rows if "bc_h4/lr" in r)
    assert first["bc_h4/lr"] == pytest.approx(lr * 2 / warmup)
    assert first["ne_opd_vote_h4/lr"] == pytest.approx(lr * 1 / warmup)
    last = [r for r in rows if "bc_h4/loss/distill" in r][-1]
    # the budget: 3 steps × 4 roll-ins × (4 digits + the end token) for the online arms, as many
    # tokens of trajectories for BC; the vote arm pays its m = 5 draws at every position it scores
    assert last["bc_h4/teacher_tokens"] <= 60 and last["bc_h4/teacher_tokens"] >= 12 * 4
    assert 0 < last["tm_opd_h4/teacher_tokens"] <= 60
    assert last["ne_opd_vote_h4/teacher_tokens"] % 5 == 0
    record = json.loads((full / "eval.json").read_text())
    assert set(record["arms"]) == {"bc_h4", "tm_opd_h4", "ne_opd_vote_h4"}
    assert all(len(record["arms"][a][m]["success"]) == 8 for a in record["arms"] for m in ("greedy", "t1"))
    summary = json.loads((full / "summary.json").read_text())
    assert all(isinstance(c["holds"], bool) and c["measured"] for c in summary["claims"])
    report = (full / "report.md").read_text()
    assert "## OPD under a noisy teacher" in report and "the noisy teacher itself" in report

    part = resume_from_checkpoint("opd", full, tmp_path / "part", 2)
    assert _evals(part) == rows
    assert (part / "eval.json").read_text() == (full / "eval.json").read_text()


@pytest.mark.parametrize("override, match", [
    ("teacher.noise.eps=1.0", "teacher.noise.eps"),
    ("teacher.noise.kernel=confusion", "teacher.noise.confusion"),
    ("teacher.noise.kernel=topk teacher.noise.top_k=5000", "teacher.noise.top_k=5000 is larger than the vocabulary"),
    ("opd.methods=[bc,dagger]", "opd.methods"),
    ("opd.horizons=[2]", "opd.horizons"),
    ("opd.explore=1.0", "opd.explore"),
    ("opd.teacher_tokens=3", "opd.teacher_tokens=3 is less than one episode"),
    ("teacher.path=/nonexistent/teacher", "teacher.path"),
    ("teacher.path=tiny teacher.model.sft.steps=1 teacher.model.tiny.vocab_size=259",
     "distillation needs a shared tokenizer"),
])
@pytest.mark.timeout(120)
def test_bad_input_is_refused_naming_the_key(override, match, troupe_cache, tmp_path):
    with pytest.raises(ConfigError, match=match):
        with Run("opd", preset="smoke", overrides=[*FAST, *override.split()], out=tmp_path) as r:
            r.run()


@pytest.mark.timeout(600)
def test_an_embedded_lm_teacher_is_fitted_with_the_students_tokenizer_and_scored_through_the_graph(
        ray_local, troupe_cache, tmp_path):
    """``teacher.path=tiny`` is SFT-fitted with the student's tokenizer and scores through the
    graph; with ``run.staleness=1`` the DAgger arm rolls in its next chains while it updates."""
    over = [*FAST, "teacher.path=tiny", "teacher.model.sft.steps=30", "teacher.model.sft.batch_size=16",
            "teacher.model.tiny.hidden_size=32", "teacher.model.tiny.intermediate_size=64", "opd.methods=[bc,ne_opd_hard]",
            "run.steps=2", "run.eval_every=2", "run.staleness=1"]
    out = tmp_path / "run"
    with Run("opd", preset="smoke", overrides=over, out=out) as r:
        r.run()
    prepared = json.loads((out / "prepare.json").read_text())
    assert prepared["teacher"]["sft"] == "fitted" and prepared["teacher"]["sft_steps"] == 30
    record = json.loads((out / "eval.json").read_text())
    assert set(record["teacher_clean_greedy"]) == {"4"} and len(record["teacher_clean_greedy"]["4"]) == 8
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row["ne_opd_hard_h4/teacher_tokens"] for row in rows if "ne_opd_hard_h4/teacher_tokens" in row][-1] > 0
    # Step 0 rolls in before any update, step 1 during update 0; the offline arm rolls in nothing.
    assert [row["ne_opd_hard_h4/staleness"] for row in rows if "ne_opd_hard_h4/staleness" in row] == [0.0, 1.0]
    assert not any("bc_h4/staleness" in row for row in rows)
    assert "embedded LM SFT-fitted on clean chains" in (out / "report.md").read_text()


@pytest.mark.timeout(900)
def test_gpu_preset_runs_on_cpu_with_tiny_models_of_its_family(ray_local, troupe_cache, tmp_path):
    """The GPU preset as a GPU user runs it (a hub-format Qwen2 student and a larger teacher of its
    family with a padded vocabulary, top-k noise, top-k targets), with tiny models of that
    architecture, the HF engine and the devices turned down for CPU."""
    from troupe.actors.models import TinyLMSpec, build_tiny_lm, save_model, train_tokenizer
    from troupe.envs.chain import ChainTask

    tok = train_tokenizer(ChainTask(ChainTask.Config(horizon=8)).corpus(500), 384)
    save_model(build_tiny_lm(TinyLMSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                        intermediate_size=64), tok, seed=0), tok, tmp_path / "student")
    teacher = build_tiny_lm(TinyLMSpec(hidden_size=64, num_layers=2), tok, seed=1)
    teacher.resize_token_embeddings(len(tok) + 64)  # a larger model of the family pads its embedding further
    save_model(teacher, tok, tmp_path / "teacher")
    cpu = [f"model.path={tmp_path / 'student'}", f"teacher.path={tmp_path / 'teacher'}", "model.device=cpu",
           "model.dtype=float32", "teacher.device=cpu", "teacher.dtype=float32", "teacher.num_gpus=0",
           "rollout.backend=hf", "rollout.num_gpus=0", "learner.num_gpus=0", "learner.autocast=none",
           "learner.recompute_old_logprobs=false", "rollout.num_cpus=0.1", "learner.num_cpus=0.1",
           "opd.prompts_per_step=4", "opd.updates_per_step=1", "opd.offline_updates_per_step=1", "opd.batch_size=8", "opd.horizons=[8]",
           "eval.num_prompts=4", "eval.bootstrap=20", "run.steps=2", "run.eval_every=2", "run.checkpoint_every=2",
           "run.num_cpus=4", *FAST]
    out = tmp_path / "run"
    with Run("opd", preset="gpu", overrides=cpu, out=out) as r:
        c = r.config
        assert c.teacher.top_k == 20 and c.teacher.noise.kernel == "topk" and c.task.kind == "running_sum"
        assert c.model.chat_template is None and c.model.sft_steps() == 0
        r.run()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [row for row in rows if "ne_opd_hard_h8/loss/distill" in row]
    assert len(trained) == 2 and all(row["tm_opd_h8/teacher_tokens"] > 0 for row in trained)
    assert (out / "report.md").is_file()


def test_every_preset_resolves_and_the_default_compares_three_families(tmp_path):
    from troupe.algorithms.opd.algorithm import OPD
    from troupe.algorithms.opd.config import METHODS, OPDConfig
    from troupe.platform.config import resolve

    names = sorted(p.stem for p in OPD.presets_dir().glob("*.yaml"))
    assert {"smoke", "baselines", "lm-teacher", "gpu"} <= set(names)
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')  # stands in for the hub teacher: no network
    for name in names:
        cfg = resolve(OPDConfig, OPD.presets_dir(), name, [f"teacher.path={tmp_path}"] if name == "gpu" else [])
        assert cfg.arm_learner("ne_opd_hard").total_steps == cfg.run.steps * cfg.opd.updates_per_step
        assert cfg.arm_learner("bc").total_steps == cfg.run.steps * cfg.opd.offline_updates_per_step
    assert set(resolve(OPDConfig, OPD.presets_dir(), "baselines", []).opd.methods) == set(METHODS)
    default = resolve(OPDConfig, OPD.presets_dir(), None, [])
    kinds = {METHODS[m].data for m in default.opd.methods}
    assert kinds == {"offline", "online", "dagger"} and default.opd.horizons == [4, 8]
