"""`troupe export` and the learner checkpoint format: weights in their own dtype, a Hugging Face
model (or PEFT adapter) directory with the learner's log-probs, one clear error per bad input."""

import json
import shutil

import pytest
import torch

from troupe.actors.learner import Learner
from troupe.actors.logprobs import score_completions
from troupe.actors.models import CHAT_TEMPLATE, TinyLMSpec, build_tiny_lm, save_model, train_tokenizer
from troupe.actors.rollout_hf import HFRolloutEngine
from troupe.actors.sampling import SamplingConfig
from troupe.actors.transport.base import pack_state_dict, unpack_state_dict
from troupe.algorithms.export import export
from troupe.algorithms.policy_graph import load_learner_state, save_learner_state
from troupe.cli import main
from troupe.envs.arithmetic import ArithmeticTask
from troupe.platform.checkpoint import CheckpointDir, atomic_write_json, load_state_dict, save_state_dict
from troupe.platform.config import save_yaml, to_dict

PROMPTS = ["12+34=", "5+7=", "99+1=", "40+2="]
SAMPLING = SamplingConfig(temperature=1.0, max_new_tokens=6)


def _learner(model_dir, **cfg):
    """A learner one optimizer step away from the start model (a random gradient), so its weights
    differ from it and Adam holds moments."""
    learner = Learner(str(model_dir), {"lr": 1e-2, **cfg})
    torch.manual_seed(0)
    for p in learner.model.parameters():
        if p.requires_grad:
            p.grad = torch.randn_like(p)
    learner.optimizer.step()
    return learner


def _write_run(run_dir, model_dir, learner, steps=(1, 3), arms=(), model=None):
    """A run directory as `troupe run` leaves it, as far as export reads it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    save_yaml({"learner": to_dict(learner.cfg), **({"model": model} if model else {})}, run_dir / "config.yaml")
    atomic_write_json(run_dir / "prepare.json", {"model_path": str(model_dir)})
    packed, meta = learner.get_state()

    for step in steps:
        def fill(tmp, step=step):
            for d in [tmp / a for a in arms] or [tmp]:
                d.mkdir(exist_ok=True)
                save_learner_state(d, packed, meta)
            atomic_write_json(tmp / "driver.json", {"step": step})  # the driver writes it last

        CheckpointDir(run_dir / "checkpoints").write(step, fill)
    return run_dir


@pytest.fixture(scope="module")
def batch(tiny_model_dir):
    return HFRolloutEngine(tiny_model_dir).generate(PROMPTS, SAMPLING, seed=0)


@pytest.fixture(scope="module")
def full_run(tiny_model_dir, tmp_path_factory):
    """A float32 full-weights run with checkpoints at steps 1 and 3."""
    return _write_run(tmp_path_factory.mktemp("full") / "run", tiny_model_dir, _learner(tiny_model_dir))


# -- checkpoints --------------------------------------------------------------------------------
def test_a_bf16_learners_checkpoint_holds_bf16_tensors_and_restores_exactly(tiny_model_dir, tmp_path):
    learner = _learner(tiny_model_dir, dtype="bfloat16")
    save_learner_state(tmp_path, *learner.get_state())
    stored = load_state_dict(tmp_path / "learner.safetensors")
    weights = {k: t for k, t in stored.items() if k.startswith("model/")}
    moments = {k: t for k, t in stored.items() if k.endswith(("/exp_avg", "/exp_avg_sq"))}
    assert weights and moments
    assert {t.dtype for t in weights.values()} == {t.dtype for t in moments.values()} == {torch.bfloat16}
    assert "views" not in json.loads((tmp_path / "learner.json").read_text())

    restored = Learner(tiny_model_dir, {"lr": 1e-2, "dtype": "bfloat16"})
    tensors, meta = load_learner_state(tmp_path)
    restored.set_state(pack_state_dict(tensors), meta)
    for k, v in learner.model.state_dict().items():
        assert torch.equal(restored.model.state_dict()[k], v), k
    want, got = learner.optimizer.state_dict()["state"], restored.optimizer.state_dict()["state"]
    assert want.keys() == got.keys()
    for pid in want:
        for name, v in want[pid].items():
            assert got[pid][name].dtype == v.dtype and torch.equal(got[pid][name], v), (pid, name)


def test_checkpoints_that_stored_bf16_as_int16_views_still_load(tiny_model_dir, tmp_path):
    packed, meta = _learner(tiny_model_dir, dtype="bfloat16").get_state()
    real = unpack_state_dict(packed)
    bf16 = [k for k, t in real.items() if t.dtype == torch.bfloat16]
    save_state_dict(tmp_path / "learner.safetensors",
                    {k: (t.view(torch.int16) if k in bf16 else t).clone() for k, t in real.items()})
    atomic_write_json(tmp_path / "learner.json", {**meta, "views": {k: "bfloat16" for k in bf16}})
    tensors, back = load_learner_state(tmp_path)
    assert back == json.loads(json.dumps(meta))  # "views" is read, not passed on
    for k, t in real.items():
        assert tensors[k].dtype == t.dtype and torch.equal(tensors[k], t), k


# -- export -------------------------------------------------------------------------------------
def test_export_of_a_bf16_run_is_a_bf16_model_with_the_learners_logprobs(tiny_model_dir, tmp_path, batch, capsys):
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

    learner = _learner(tiny_model_dir, dtype="bfloat16")
    run_dir = _write_run(tmp_path / "run", tiny_model_dir, learner)
    out = tmp_path / "model"
    assert main(["export", str(run_dir), str(out)]) == 0
    assert f"bfloat16 model of step 3 to {out}" in capsys.readouterr().out
    files = list(out.glob("*.safetensors"))
    assert files and (out / "config.json").is_file()
    for f in files:
        with safe_open(str(f), framework="pt") as st:
            assert {st.get_slice(k).get_dtype() for k in st.keys()} == {"BF16"}

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.dtype == torch.bfloat16
    got = score_completions(model, batch)["logprobs"]
    torch.testing.assert_close(got, learner.logprobs(batch))
    start = score_completions(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.bfloat16), batch)
    assert not torch.allclose(got, start["logprobs"], atol=1e-2)  # the checkpoint's weights, not the start's
    tok = PreTrainedTokenizerFast.from_pretrained(out)
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token == learner.tokenizer.eos_token
    assert json.loads((out / "troupe_export.json").read_text())["step"] == 3


def test_export_takes_the_step_asked_for(full_run, tmp_path):
    assert export(full_run, tmp_path / "model", step=1)["step"] == 1
    assert json.loads((tmp_path / "model" / "troupe_export.json").read_text())["step"] == 1


def test_export_reads_a_run_kept_at_a_storage_uri(full_run, tmp_path, capsys):
    from troupe.platform.storage import RemoteRunDir

    remote = RemoteRunDir(f"file://{tmp_path}/shared/run")
    remote.push(full_run)
    for name in CheckpointDir(full_run / "checkpoints").names():
        remote.push_checkpoint(full_run / "checkpoints" / name, keep=["step-00000001", "step-00000003"])
    assert main(["export", remote.uri, str(tmp_path / "latest")]) == 0
    assert main(["export", remote.uri, str(tmp_path / "first"), "--step", "1"]) == 0
    assert "of step 3" in capsys.readouterr().out.splitlines()[0]
    local = export(full_run, tmp_path / "local")
    assert json.loads((tmp_path / "first" / "troupe_export.json").read_text())["step"] == 1
    ours, theirs = (load_state_dict(d / "model.safetensors") for d in (tmp_path / "latest", tmp_path / "local"))
    assert local["step"] == 3 and ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_export_carries_the_chat_template_the_run_was_given(tiny_model_dir, tmp_path):
    from transformers import PreTrainedTokenizerFast

    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    run_dir = _write_run(tmp_path / "run", tiny_model_dir, _learner(tiny_model_dir), steps=(1,),
                         model={"chat_template": template})
    export(run_dir, tmp_path / "model")
    assert PreTrainedTokenizerFast.from_pretrained(tmp_path / "model").chat_template == template


def test_export_of_a_vision_language_model_loads_with_the_image_text_class(tmp_path):
    from transformers import AutoModelForImageTextToText

    from troupe.actors.vision import VISION_TOKENS, TinyVLSpec, build_tiny_vl

    tok = train_tokenizer(ArithmeticTask().corpus(500), special_tokens=VISION_TOKENS)
    start = tmp_path / "tiny-vl"
    save_model(build_tiny_vl(TinyVLSpec(), tok), tok, start)
    learner = _learner(start)
    out = tmp_path / "model"
    export(_write_run(tmp_path / "run", start, learner), out)
    model = AutoModelForImageTextToText.from_pretrained(out)
    assert type(model) is type(learner.model) and model.config.troupe_video == learner.model.config.troupe_video
    want = learner.model.state_dict()
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k]), k


def test_a_run_with_arms_exports_the_first_bpo_arm_unless_one_is_named(tiny_model_dir, tmp_path, capsys):
    learner = _learner(tiny_model_dir)
    run_dir = _write_run(tmp_path / "run", tiny_model_dir, learner, steps=(2,), arms=("grpo", "bpo"))
    assert export(run_dir, tmp_path / "bpo")["arm"] == "bpo"
    assert export(run_dir, tmp_path / "grpo", arm="grpo")["arm"] == "grpo"
    assert main(["export", str(run_dir), str(tmp_path / "x"), "--arm", "nope"]) == 2
    err = capsys.readouterr().err
    assert "--arm nope: no such arm" in err and "arms there: bpo, grpo" in err
    other = _write_run(tmp_path / "other", tiny_model_dir, learner, steps=(2,), arms=("a", "b"))
    assert main(["export", str(other), str(tmp_path / "y")]) == 2
    assert "one policy per arm (a, b); choose one with --arm NAME" in capsys.readouterr().err


@pytest.mark.parametrize("case, message", [
    ("not_a_run", "is not a run directory (no config.yaml)"),
    ("no_checkpoint", "no checkpoint in"),
    ("missing_step", "--step 2: no checkpoint of that step in"),
    ("merge_full_weights", "trained full weights (learner.lora.enabled=false), so there is no adapter to merge"),
    ("out_not_empty", "exists and is not empty; give a new directory, or pass --force to replace it"),
    ("arm_of_one_policy", "holds a single policy, not arms; drop --arm"),
])
def test_bad_input_is_one_error_that_names_the_file_and_the_fix(case, message, full_run, tmp_path, capsys):
    out = tmp_path / "out"
    run = str(full_run)
    if case == "not_a_run":
        (tmp_path / "empty").mkdir()
        run = str(tmp_path / "empty")
    elif case == "no_checkpoint":
        (tmp_path / "fresh").mkdir()
        shutil.copy(full_run / "config.yaml", tmp_path / "fresh")
        run = str(tmp_path / "fresh")
    elif case == "out_not_empty":
        out.mkdir()
        (out / "notes.txt").write_text("keep")
    extra = {"missing_step": ["--step", "2"], "merge_full_weights": ["--merge-lora"],
             "arm_of_one_policy": ["--arm", "bpo"]}.get(case, [])
    assert main(["export", run, str(out), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("troupe: error:") and message in err
    if case == "missing_step":
        assert "steps there: 1, 3 (or omit --step for the latest)" in err
    if case == "out_not_empty":
        assert (out / "notes.txt").read_text() == "keep"
    else:
        assert not out.exists()


def test_force_replaces_an_out_that_is_not_empty(full_run, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("old")
    export(full_run, out, force=True)
    assert (out / "config.json").is_file() and not (out / "notes.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no temporary folder left


def test_a_failed_export_leaves_no_out_and_no_temporary_folder(full_run, tmp_path, capsys):
    # A start model of another shape than the checkpoint's weights.
    tok = train_tokenizer(ArithmeticTask().corpus(500))
    other = tmp_path / "start"
    save_model(build_tiny_lm(TinyLMSpec(hidden_size=32), tok), tok, other)
    run_dir = tmp_path / "run"
    shutil.copytree(full_run, run_dir)
    atomic_write_json(run_dir / "prepare.json", {"model_path": str(other)})
    (tmp_path / "exports").mkdir()
    assert main(["export", str(run_dir), str(tmp_path / "exports" / "model")]) == 2
    assert f"do not fit the start model {other}" in capsys.readouterr().err
    assert list((tmp_path / "exports").iterdir()) == []


# -- real runs on Ray ---------------------------------------------------------------------------
FAST = ["run.progress=false", "run.steps=2", "run.eval_every=0", "run.checkpoint_every=2", "eval.num_prompts=8",
        "grpo.prompts_per_step=2", "grpo.group_size=4"]


def _trained(tmp_path, *overrides):
    """A 2-step GRPO smoke run; returns its directory, a batch of its engine's completions, the
    learner's log-probs on that batch and the temperature they were taken at."""
    from troupe import Run

    with Run("grpo", preset="smoke", overrides=[*FAST, *overrides], out=tmp_path / "run") as run:
        run.run()
        sampling = run.config.rollout.sampling
        batch = run.graph["rollout"].call("generate", PROMPTS, sampling)[0]
        want = run.graph["learner"].call("logprobs", batch)[0]
    return run.run_dir, batch, want, sampling.temperature or 1.0


@pytest.mark.timeout(600)
def test_a_grpo_run_exports_a_model_with_the_learners_logprobs_that_a_new_run_starts_from(
        ray_local, troupe_cache, tmp_path):
    from transformers import AutoModelForCausalLM

    from troupe import Run

    run_dir, batch, want, temperature = _trained(tmp_path)
    out = tmp_path / "model"
    assert main(["export", str(run_dir), str(out)]) == 0
    model = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(score_completions(model, batch, temperature)["logprobs"], want)

    again = [*FAST, f"model.path={out}", "model.sft.steps=0", "run.steps=1", "run.checkpoint_every=0"]
    with Run("grpo", preset="smoke", overrides=again, out=tmp_path / "again") as run:
        assert run.ctx.prepared()["model_path"] == str(out)
        torch.testing.assert_close(run.graph["learner"].call("logprobs", batch)[0], want)
        metrics = run.step()
    assert "reward/mean" in metrics


@pytest.mark.timeout(600)
# PeftModel (peft 0.21) reads `is_gradient_checkpointing`, which transformers 5 deprecates.
@pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")
def test_a_lora_run_exports_a_peft_adapter_or_with_merge_lora_the_merged_model(ray_local, troupe_cache, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    run_dir, batch, want, temperature = _trained(tmp_path, "learner.lora.enabled=true", "learner.lr=0.01")
    adapter = tmp_path / "adapter"
    assert main(["export", str(run_dir), str(adapter)]) == 0
    assert (adapter / "adapter_config.json").is_file() and not (adapter / "config.json").exists()
    start = json.loads((run_dir / "prepare.json").read_text())["model_path"]
    assert json.loads((adapter / "adapter_config.json").read_text())["base_model_name_or_path"] == start
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(start), adapter)
    torch.testing.assert_close(score_completions(model, batch, temperature)["logprobs"], want)

    merged = tmp_path / "merged"
    assert main(["export", str(run_dir), str(merged), "--merge-lora"]) == 0
    model = AutoModelForCausalLM.from_pretrained(merged)
    torch.testing.assert_close(score_completions(model, batch, temperature)["logprobs"], want, atol=1e-4, rtol=1e-4)
