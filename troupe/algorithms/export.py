"""`troupe export`: a run's trained policy as a Hugging Face model directory.

Everything comes from the run directory, with no Ray and no actors: ``config.yaml`` (the
learner's dtype and LoRA settings), ``prepare.json`` (``model_path``: the model RL started
from, which holds the config, the tokenizer and its chat template) and the ``model/`` weights
of a checkpoint (``checkpoints/step-N/``, or ``step-N/<arm>/`` for a run with one policy per
arm). The start model is loaded in-process and given those weights.

A full-weights run gives a model directory (config, tokenizer, safetensors in the learner's
dtype) that ``AutoModelForCausalLM`` (a vision-language model: ``AutoModelForImageTextToText``)
and ``vllm serve`` load. A LoRA run gives a PEFT adapter directory for
``PeftModel.from_pretrained(base, OUT)``, or with ``merge_lora`` the merged model. The output
is written under a temporary name beside ``out`` and renamed into place.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from troupe.algorithms.policy_graph import load_learner_state
from troupe.platform.checkpoint import CheckpointDir, atomic_write_json
from troupe.platform.errors import ConfigError

# Files of the start model that its loaders read beside config.json: troupe's tokenizer marker
# (`load_tokenizer`) and a VL model's frame layout (`VideoLayout.of`).
SIDE_FILES = ("troupe_tokenizer.json", "preprocessor_config.json", "video_preprocessor_config.json")


def export(run_dir: str | Path, out: str | Path, step: int | None = None, arm: str | None = None,
           merge_lora: bool = False, force: bool = False) -> dict[str, Any]:
    """Write the policy of ``run_dir``'s checkpoint ``step`` (default: the latest) to ``out``;
    returns what was written (``kind``: ``"model"`` or ``"adapter"``, the step, the arm, the dtype)."""
    run_dir, out = Path(run_dir), Path(out)
    dtype, lora, template = _run_settings(run_dir)
    if merge_lora and not lora.enabled:
        raise ConfigError(f"--merge-lora: {run_dir / 'config.yaml'} trained full weights "
                          "(learner.lora.enabled=false), so there is no adapter to merge; drop --merge-lora")
    ckpt, step = _checkpoint(run_dir, step)
    policy_dir, arm = _policy_dir(ckpt, arm)
    _check_out(out, force)
    model_path = _start_model(run_dir)
    tensors, _ = load_learner_state(policy_dir, "model/")
    weights = {k[len("model/"):]: t for k, t in tensors.items()}
    kind = "adapter" if lora.enabled and not merge_lora else "model"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp"))
    try:
        _write(tmp, model_path, dtype, lora, weights, kind, policy_dir, template)
        info = {"kind": kind, "run_dir": str(run_dir), "step": step, "arm": arm, "dtype": dtype,
                "start_model": model_path, "lora_merged": lora.enabled and merge_lora}
        atomic_write_json(tmp / "troupe_export.json", info)
        _move_into_place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {**info, "out": str(out)}


# -- what the run directory holds -------------------------------------------------------------
def _run_settings(run_dir: Path) -> tuple[str, Any, str | None]:
    """The learner's dtype and `LoraSettings`, and ``model.chat_template`` (None: the start
    model's own), read from the run's config.yaml."""
    from troupe.actors.learner import LoraSettings
    from troupe.platform.config import from_dict, load_yaml

    path = run_dir / "config.yaml"
    if not path.is_file():
        raise ConfigError(f"{str(run_dir)!r} is not a run directory (no config.yaml); give the directory "
                          "`troupe run` printed at its end")
    data = load_yaml(path)
    learner = data.get("learner") or {}
    lora = from_dict(LoraSettings, learner.get("lora") or {}, prefix="learner.lora.")
    return str(learner.get("dtype", "float32")), lora, (data.get("model") or {}).get("chat_template")


def checkpoint_steps(root: Path) -> list[int]:
    """The steps of the complete checkpoints in a run's ``checkpoints/`` folder."""
    if not root.is_dir():
        return []
    names = (p.name[len("step-"):] for p in root.glob("step-*") if p.is_dir())
    return sorted(int(n) for n in names if n.isdigit())


def _checkpoint(run_dir: Path, step: int | None) -> tuple[Path, int]:
    root = run_dir / "checkpoints"
    steps = checkpoint_steps(root)
    if not steps:
        raise ConfigError(f"no checkpoint in {root}: the run stopped before its first one; "
                          "resume it (`troupe run ALGO --resume RUN_DIR`) or set run.checkpoint_every")
    if step is None:
        latest = CheckpointDir(root).latest()
        return latest, int(latest.name[len("step-"):])
    if step not in steps:
        raise ConfigError(f"--step {step}: no checkpoint of that step in {root}; steps there: "
                          f"{', '.join(map(str, steps))} (or omit --step for the latest)")
    return root / f"step-{step:08d}", step


def _policy_dir(ckpt: Path, arm: str | None) -> tuple[Path, str | None]:
    """The folder of the policy to export: the checkpoint itself, or one arm's folder in it."""
    if (ckpt / "learner.safetensors").is_file():
        if arm is not None:
            raise ConfigError(f"--arm {arm}: {ckpt} holds a single policy, not arms; drop --arm")
        return ckpt, None
    arms = sorted(p.name for p in ckpt.iterdir() if (p / "learner.safetensors").is_file())
    if not arms:
        raise ConfigError(f"{ckpt} holds no learner.safetensors, for one policy or per arm; "
                          "export another step (--step N)")
    if arm is None:
        arm = next((a for a in arms if "bpo" in a), None)
        if arm is None:
            raise ConfigError(f"{ckpt} holds one policy per arm ({', '.join(arms)}); choose one with --arm NAME")
    elif arm not in arms:
        raise ConfigError(f"--arm {arm}: no such arm in {ckpt}; arms there: {', '.join(arms)}")
    return ckpt / arm, arm


def _start_model(run_dir: Path) -> str:
    """``model_path`` from prepare.json: the model RL started from (a local folder or a hub id)."""
    import json

    path = run_dir / "prepare.json"
    if not path.is_file():
        raise ConfigError(f"{path} is missing: it names the model the run started from; "
                          "resume the run once (`troupe run ALGO --resume RUN_DIR`) to write it")
    model_path = json.loads(path.read_text()).get("model_path")
    if not model_path:
        raise ConfigError(f"{path} has no model_path: this run trained no language-model policy")
    local = Path(model_path).expanduser()
    if model_path.startswith(("/", ".", "~")) and not (local / "config.json").is_file():
        raise ConfigError(f"the start model {model_path} (model_path in {path}) is gone: it is an SFT checkpoint "
                          "in the cache; `troupe run ALGO --resume RUN_DIR` rebuilds it before any step, or "
                          "point TROUPE_CACHE at the cache the run used")
    return str(model_path)


def _check_out(out: Path, force: bool) -> None:
    if not out.exists() or force:
        return
    if out.is_dir() and not any(out.iterdir()):
        return
    raise ConfigError(f"{out} exists and is not empty; give a new directory, or pass --force to replace it")


# -- writing ----------------------------------------------------------------------------------
def _write(tmp: Path, model_path: str, dtype: str, lora: Any, weights: dict[str, Any], kind: str,
           policy_dir: Path, template: str | None) -> None:
    from troupe.actors.models import load_causal_lm

    # A run's model.chat_template replaces the start model's own: its prompts were formatted with it.
    extra = {}
    if template is not None:
        from troupe.actors.models import chat_template_text

        extra["chat_template"] = chat_template_text(template)
    model, tokenizer = load_causal_lm(model_path, dtype, **extra)
    misfit = (f"the weights in {policy_dir / 'learner.safetensors'} do not fit the start model {model_path}"
              " (was it rebuilt with another config?)")
    try:
        if lora.enabled:
            from peft import LoraConfig, get_peft_model, set_peft_model_state_dict

            with warnings.catch_warnings():
                # peft 0.21 reads `is_gradient_checkpointing`, which transformers 5 deprecates.
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
                model = get_peft_model(model, LoraConfig(**lora.peft_config()))
            result = set_peft_model_state_dict(model, weights)
            missing = []  # the base weights are not in an adapter's state
        else:
            result = model.load_state_dict(weights, strict=False)
            missing = list(result.missing_keys)
    except RuntimeError as e:  # a shape that differs
        raise ConfigError(f"{misfit}: {str(e).splitlines()[-1].strip()}") from None
    if missing or result.unexpected_keys:
        raise ConfigError(f"{misfit}: missing {missing[:3]}, unexpected {list(result.unexpected_keys)[:3]}")
    if lora.enabled and kind == "model":
        model = model.merge_and_unload()
    model.save_pretrained(tmp)  # an adapter: adapter_config.json naming the start model as its base
    tokenizer.save_pretrained(tmp)
    start = Path(model_path).expanduser()
    for name in SIDE_FILES:
        if (start / name).is_file():
            shutil.copy2(start / name, tmp / name)


def _move_into_place(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an existing ``out`` (empty, or replaced under --force) goes first."""
    if out.exists() or out.is_symlink():
        old = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}.", suffix=".old")) / out.name
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old.parent, ignore_errors=True)
    else:
        os.replace(tmp, out)
