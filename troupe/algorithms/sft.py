"""The starting checkpoint: build the embedded tiny model and fit it by supervised fine-tuning
on a task's training split, so RL starts from a real SFT model. A hub or local model starts
from its own weights unless ``model.sft.enabled=true`` asks for the same SFT first.

``model.path=tiny-vl`` builds the tiny vision-language model instead; its task rows carry
``"frames"`` (``uint8 [F, H, W, 3]``), shown to the model before the prompt. Rows may carry
``"group"`` (e.g. the question type): the fit then records its loss on the answer by group
(`GroupLoss`, in ``sft.json``).

The result is cached under ``$TROUPE_CACHE`` (default ``~/.cache/troupe``), keyed by
everything that shapes it, and written atomically: a second run, or an actor on the same
machine, loads the same directory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from troupe.actors.logprobs import positions_from_mask
from troupe.actors.models import (
    TinyLMSpec,
    build_tiny_lm,
    chat_template_text,
    load_causal_lm,
    save_model,
    train_tokenizer,
)
from troupe.actors.sampling import chat_format
from troupe.actors.vision import (
    VISION_TOKENS,
    TinyVLSpec,
    VideoLayout,
    build_tiny_vl,
    is_vision_model,
    video_inputs,
    video_prompts,
)
from troupe.platform.checkpoint import atomic_write_json, build_directory
from troupe.platform.config import check, to_dict
from troupe.platform.report import markdown_table

log = logging.getLogger("troupe")


class SFTTask(Protocol):
    def sample(self, n: int, split: str, rng: np.random.Generator) -> list[dict]: ...
    def corpus(self, n: int = ..., seed: int = ...) -> list[str]: ...


@dataclasses.dataclass
class SFTConfig:
    # Whether SFT on the task runs before RL. None: for an embedded model only (it starts from
    # random weights); a hub or local model starts from its own weights unless this is true.
    enabled: bool | None = None
    steps: int = 300  # when SFT runs; 0 skips it
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0
    schedule: str = "constant"  # after 20 warm-up steps: "constant", or "cosine" down to 10% of lr
    # Torch threads while fitting. One by default: the embedded models are too small to gain
    # from a second, and on a shared 2-core machine a second thread makes each step several
    # times slower. 0 keeps torch's default.
    threads: int = 1
    # Stop before `steps` once the mean loss of the last 20 steps is below this; None runs every
    # step. A task learnt all at once after a plateau need not pay for the steps after it.
    stop_loss: float | None = None

    def __post_init__(self) -> None:
        check(self.steps >= 0, "model.sft.steps", self.steps, "an integer >= 0")
        check(self.stop_loss is None or self.stop_loss > 0, "model.sft.stop_loss", self.stop_loss,
              "a loss > 0, or null to run every step")
        check(self.schedule in ("constant", "cosine"), "model.sft.schedule", self.schedule, "'constant' or 'cosine'")
        check(self.batch_size >= 1, "model.sft.batch_size", self.batch_size, "an integer >= 1")


@dataclasses.dataclass
class ModelConfig:
    """Which policy to start from."""

    path: str = "tiny"  # "tiny" or "tiny-vl" builds an embedded model; otherwise a hub id or a local directory
    dtype: str = "float32"
    device: str = "cpu"  # "cpu", "cuda" or "auto"
    tiny: TinyLMSpec = dataclasses.field(default_factory=TinyLMSpec)
    tiny_vl: TinyVLSpec = dataclasses.field(default_factory=TinyVLSpec)
    sft: SFTConfig = dataclasses.field(default_factory=SFTConfig)
    cache_dir: str | None = None
    # The chat template every engine, learner, scorer and SFT formats prompts with: a Jinja
    # string or the path of a .jinja file. None: the model's own (the embedded models have one).
    chat_template: str | None = None

    def validate(self) -> None:
        chat_template_text(self.chat_template)  # a missing file fails in the driver

    def sft_steps(self) -> int:
        """How many SFT steps run before RL: `SFTConfig.steps` where SFT is enabled, else 0."""
        enabled = self.path in EMBEDDED if self.sft.enabled is None else self.sft.enabled
        return self.sft.steps if enabled else 0


EMBEDDED = ("tiny", "tiny-vl")


def _key_fields(model_cfg: ModelConfig) -> dict[str, Any]:
    """What shapes the checkpoint: the spec of the model not built is left out (so adding
    ``tiny_vl`` kept every text checkpoint's key)."""
    unused = "tiny" if model_cfg.path == "tiny-vl" else "tiny_vl"
    out = {k: v for k, v in to_dict(model_cfg).items() if k != unused} | {"cache_dir": None}
    # The template's text shapes the checkpoint, not where it was read from; without one the
    # key is that of a checkpoint fitted before the option existed.
    template = out.pop("chat_template")
    if template is not None:
        out["chat_template"] = chat_template_text(template)
    # Threads do not shape the checkpoint, nor does `enabled` beside the steps that ran; the
    # constant schedule predates the choice: keys unchanged.
    drop = ({"threads", "enabled"} | ({"schedule"} if out["sft"].get("schedule") == "constant" else set())
            | ({"stop_loss"} if out["sft"].get("stop_loss") is None else set()))
    out["sft"] = {k: v for k, v in out["sft"].items() if k not in drop} | {"steps": model_cfg.sft_steps()}
    return out


def cache_root(model_cfg: ModelConfig) -> Path:
    root = model_cfg.cache_dir or os.environ.get("TROUPE_CACHE") or Path.home() / ".cache" / "troupe"
    return Path(root).expanduser()


def prepare_policy(model_cfg: ModelConfig, task: SFTTask, task_key: dict[str, Any],
                   info: dict[str, Any] | None = None) -> Path | str:
    """Path of the model RL starts from: the cached SFT checkpoint, built on first use.
    ``info``, when given, receives ``{"sft": "none" | "cached" | "fitted", "sft_steps": ...,
    "sft_reason": ..., "model_path": ...}``. By default only an embedded model is fitted (see
    `SFTConfig.enabled`); a hub or local model starts from its own weights."""
    info = {} if info is None else info
    steps = model_cfg.sft_steps()
    info["sft_steps"] = steps
    if model_cfg.path not in EMBEDDED and steps == 0:
        load_causal_lm(model_cfg.path)  # fail now, in the driver, with a clear error
        if model_cfg.sft.steps == 0:
            reason = "model.sft.steps=0"
        elif model_cfg.sft.enabled is False:
            reason = "model.sft.enabled=false"
        else:
            reason = "not an embedded model; model.sft.enabled=true fits SFT on the task first"
        info.update(sft="none", sft_reason=reason, model_path=str(model_cfg.path))
        log.info("policy: %s from its own weights, no SFT (%s)", model_cfg.path, reason)
        return model_cfg.path
    if steps == 0:  # an embedded model still has to be built
        info["sft_reason"] = "an embedded model, built without SFT (model.sft.steps=0 or model.sft.enabled=false)"
    elif model_cfg.sft.enabled:
        info["sft_reason"] = "model.sft.enabled=true"
    else:
        info["sft_reason"] = "an embedded model: SFT on the task by default"
    model_cfg = dataclasses.replace(model_cfg, sft=dataclasses.replace(model_cfg.sft, steps=steps))
    log.info("policy: %s with %d SFT steps on the task (%s)", model_cfg.path, steps, info["sft_reason"])
    key_src = {"model": _key_fields(model_cfg), "task": task_key, "v": 1}
    key = hashlib.sha256(json.dumps(key_src, sort_keys=True).encode()).hexdigest()[:16]
    final = cache_root(model_cfg) / "sft" / key
    info["model_path"] = str(final)
    if (final / "sft.json").is_file():
        info["sft"] = "cached"
        log.info("policy: SFT checkpoint from the cache, %s", final)
    else:
        info["sft"] = "fitted"

        def build(tmp: Path) -> None:
            fitted = fit_sft(model_cfg, task, tmp)
            atomic_write_json(tmp / "sft.json", {**fitted, "key": key_src})

        build_directory(final, build)
    # The steps that ran: model.sft.stop_loss may end the fit before the configured steps.
    fitted = json.loads((final / "sft.json").read_text())
    info["sft_steps"] = fitted.get("sft_steps", steps)
    if fitted.get("loss_by_group"):
        info["sft_loss_by_group"] = fitted["loss_by_group"]
    return final


def fit_sft(model_cfg: ModelConfig, task: SFTTask, out: Path) -> dict[str, Any]:
    """Train (or load) the model, run SFT on the task and save it to ``out``."""
    import torch

    t0 = time.perf_counter()
    threads = torch.get_num_threads()
    if model_cfg.sft.threads:
        torch.set_num_threads(model_cfg.sft.threads)
    try:
        return _fit(model_cfg, task, out, t0)
    finally:
        torch.set_num_threads(threads)


def _fit(model_cfg: ModelConfig, task: SFTTask, out: Path, t0: float) -> dict[str, Any]:
    import torch

    if model_cfg.path == "tiny":
        tokenizer = train_tokenizer(task.corpus(4000, seed=model_cfg.sft.seed), model_cfg.tiny.vocab_size)
        model = build_tiny_lm(model_cfg.tiny, tokenizer, seed=model_cfg.sft.seed)
    elif model_cfg.path == "tiny-vl":
        tokenizer = train_tokenizer(task.corpus(4000, seed=model_cfg.sft.seed), model_cfg.tiny_vl.vocab_size,
                                    special_tokens=VISION_TOKENS)
        model = build_tiny_vl(model_cfg.tiny_vl, tokenizer, seed=model_cfg.sft.seed)
    else:
        model, tokenizer = load_causal_lm(model_cfg.path, model_cfg.dtype)
    template = chat_template_text(model_cfg.chat_template)
    if template is not None:  # saved with the checkpoint, so every actor that loads it has it too
        tokenizer.chat_template = template
    layout = VideoLayout.of(model.config, model_cfg.path) if is_vision_model(model.config) else None
    # SFT runs where the model will (model.device): a hub model fitted first trains on its GPU
    device = model_cfg.device if model_cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    rng = np.random.default_rng(model_cfg.sft.seed)
    torch.manual_seed(model_cfg.sft.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=model_cfg.sft.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, model_cfg.sft))
    model.train()
    losses: list[float] = []
    by_group = GroupLoss()
    stop = model_cfg.sft.stop_loss
    for _ in range(model_cfg.sft.steps):
        if stop is not None and len(losses) >= 20 and np.mean(losses[-20:]) < stop:
            break
        rows = task.sample(model_cfg.sft.batch_size, "train", rng)
        inputs = sft_inputs(model, tokenizer, rows, layout)
        output = model(**{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()})
        loss = output.loss
        if any(r.get("group") is not None for r in rows):
            by_group.add([r.get("group") for r in rows], row_losses(output.logits, inputs["labels"].to(device)))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
        if len(losses) % GroupLoss.every == 0:
            by_group.close(len(losses))
            log.debug("SFT step %d: mean loss of the last 20 steps %.4f", len(losses), np.mean(losses[-20:]))
    by_group.close(len(losses))
    model.eval()
    save_model(model.to("cpu"), tokenizer, out)
    info = {"sft_steps": len(losses), "final_loss": float(np.mean(losses[-20:])) if losses else None,
            "parameters": sum(p.numel() for p in model.parameters()), "seconds": round(time.perf_counter() - t0, 1)}
    if by_group.steps:
        info["loss_by_group"] = by_group.as_dict()
    log.info("SFT checkpoint built in %.1fs: %s", info["seconds"], info)
    return info


class GroupLoss:
    """The SFT loss on the answer (`row_losses`) by row group (a task's rows may carry ``"group"``, e.g. the
    question type), averaged over each window of `every` steps: which kinds of row the fit
    learns, and when. A fit whose total loss falls can still leave one group at its prior."""

    every = 100

    def __init__(self) -> None:
        self.steps: list[int] = []
        self.means: dict[str, list[float | None]] = {}
        self._sum: dict[str, float] = {}
        self._n: dict[str, int] = {}

    def add(self, groups: list[str | None], losses: list[float]) -> None:
        for g, v in zip(groups, losses, strict=True):
            if g is not None:
                self._sum[g] = self._sum.get(g, 0.0) + v
                self._n[g] = self._n.get(g, 0) + 1

    def close(self, step: int) -> None:
        """End the window at ``step`` (nothing if no grouped row fell in it)."""
        if not self._n:  # also a second close at the same step: the first emptied the window
            return
        for g in self._n.keys() - self.means.keys():  # a group first seen now: no mean before
            self.means[g] = [None] * len(self.steps)
        for g, vals in self.means.items():
            vals.append(round(self._sum[g] / self._n[g], 4) if self._n.get(g) else None)
        self.steps.append(step)
        self._sum, self._n = {}, {}

    def as_dict(self) -> dict[str, Any]:
        return {"every": self.every, "steps": self.steps, "groups": dict(sorted(self.means.items()))}


def loss_table(curve: dict[str, Any], label: str = "group", columns: int = 6) -> list[str]:
    """A markdown table of a `GroupLoss` curve, one row per group, at up to ``columns`` window
    ends: the first and the last always, evenly between."""
    steps = curve["steps"]
    n = min(columns, len(steps))
    picks = sorted({round(i * (len(steps) - 1) / max(n - 1, 1)) for i in range(n)})
    return markdown_table([label, *(f"step {steps[i]}" for i in picks)],
                          ([group, *("–" if vals[i] is None else f"{vals[i]:.3f}" for i in picks)]
                           for group, vals in curve["groups"].items()))


def row_losses(logits: Any, labels: Any) -> list[float]:
    """Each row's negative log-likelihood of its answer: the next-token loss summed over its
    labelled tokens (the end-of-turn token included), shifted as the model's own loss is; no
    gradient. A sum, not a mean, so a uniform guess over k one-token options scores ln k."""
    import torch

    with torch.no_grad():
        ce = torch.nn.functional.cross_entropy(logits[:, :-1].float().transpose(1, 2), labels[:, 1:],
                                               ignore_index=-100, reduction="none")
        return ce.sum(1).tolist()  # ignored positions are 0


def sft_inputs(model: Any, tokenizer: Any, rows: list[dict], layout: VideoLayout | None = None) -> dict[str, Any]:
    """The model's arguments for an SFT step on ``rows`` (with their videos on a VL model)."""
    video = {}
    if layout is not None and any(r.get("frames") is not None for r in rows):
        texts, video = video_prompts([r["prompt"] for r in rows], [r.get("frames") for r in rows], layout)
        # The placeholders are in the text, which is the prompt (as in the engines), not the turns.
        rows = [{**r, "prompt": t, "messages": None} for r, t in zip(rows, texts, strict=True)]
    input_ids, attn, labels = sft_tensors(tokenizer, rows)
    extra = video_inputs(model.config, input_ids, **video) if video else {}
    # Without videos, positions skip the left padding; with them the model numbers its 3-D positions.
    return {"input_ids": input_ids, "attention_mask": attn, "labels": labels,
            **(extra or {"position_ids": positions_from_mask(attn)})}


def lr_factor(step: int, cfg: SFTConfig) -> float:
    """Linear warm-up over 20 steps, then constant or cosine decay to 10%."""
    warm = min(1.0, (step + 1) / 20)
    if cfg.schedule == "constant":
        return warm
    return warm * (0.1 + 0.45 * (1 + math.cos(math.pi * min(step, cfg.steps) / max(cfg.steps, 1))))


def sft_tensors(tokenizer: Any, rows: list[dict]) -> tuple[Any, Any, Any]:
    """Chat-formatted prompt (as the engines format it: a row's ``"messages"``, else one user
    turn, see `chat_format`) + answer + end-of-turn; labels only on the answer."""
    import torch

    seqs, label_seqs = [], []
    prompts = chat_format(tokenizer, [row["prompt"] for row in rows], True, rows)
    for row, prompt in zip(rows, prompts, strict=True):
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a_ids = tokenizer(str(row["answer"]), add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        seqs.append(p_ids + a_ids)
        label_seqs.append([-100] * len(p_ids) + a_ids)
    width = max(len(s) for s in seqs)
    pad = tokenizer.pad_token_id
    # Left padding, as at generation time, so positions match what the policy will see.
    input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs])
    attn = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs])
    labels = torch.tensor([[-100] * (width - len(s)) + s for s in label_seqs])
    return input_ids, attn, labels
