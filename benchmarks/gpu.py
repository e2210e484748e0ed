"""In-process GPU check: troupe's hf rollout engine, scorer and learner on CUDA in bf16, with
nothing but torch (CUDA), transformers, peft and safetensors installed: no Ray, no vLLM, no
network, no install of troupe itself (it runs from a copy of the repository).

What it runs, each a claim of ``benchmarks/results/gpu.json`` (``{claim, measured, holds}``):

- the environment: the device, bf16 on it, and Ray never imported;
- the tiny LM in bf16: the engine samples (temperature, top-k, top-p), the learner's
  recomputed log-probs and the scorer's match the engine's, a GRPO update (PPO-clip) changes
  the policy, and a LoRA adapter published by the learner (packed as the object store carries
  it) and loaded by the engine makes the engine's log-probs the learner's;
- distillation: the distillation learner's reverse-KL step on a teacher's top-k log-probs and its
  hard-target step, their [B, C, V] targets built on the device;
- the tiny Qwen2.5-VL-style model on a few-frame video: generate, then the learner's log-probs;
- a 0.5B-parameter Qwen2-style model built from a config: generation tokens/s and the
  learner's step time.

``--device cpu`` runs all of it at tiny size (the "0.5B" model shrinks to a few million
parameters) so that CI keeps it working between GPU runs; its results go to ``--out``.

    python benchmarks/gpu.py --device cuda --out benchmarks/results
    python benchmarks/gpu.py --device cpu --out /tmp/gpu-check
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # troupe from this copy of the repository: it need not be installed
    sys.path.insert(0, str(ROOT))

# troupe's own entries by import path: without an install there are no entry points to name them by.
LOSS = {"loss": "troupe.actors.losses:ppo_clip", "aggregation": "troupe.actors.losses:grpo_weights"}
DISTILL = {"rkl": "troupe.algorithms.opd.losses:reverse_kl",
           "hard": "troupe.algorithms.opd.losses:hard_target_ce"}
PROMPTS = ["12+34=", "5+7=", "99+1=", "40+2=", "3+3=", "70+8=", "1+19=", "64+36="]
# Largest |engine - learner| log-prob gap allowed: same weights, same kernels, same processing,
# but the engine's KV-cached decode and the learner's full forward round differently in bf16.
TOL = {"bfloat16": 0.15, "float32": 1e-3}


# -- the sizes of each device -------------------------------------------------------------------
def scale_spec(device: str) -> Any:
    """The throughput model: 0.5B parameters on CUDA (a Qwen2.5-0.5B-like stack with troupe's
    small vocabulary, so the layers hold the parameters); a few million on CPU."""
    from troupe.actors.models import TinyLMSpec

    if device == "cuda":
        return TinyLMSpec(hidden_size=1024, num_layers=24, num_heads=16, num_kv_heads=2, intermediate_size=5632,
                          max_position_embeddings=1024)
    return TinyLMSpec(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384)


def floors(device: str) -> dict[str, float]:
    """What the throughput claims require: loose, so that they fail only when something is broken."""
    if device == "cuda":
        return {"tokens_per_s": 500.0, "step_s": 5.0, "new_tokens": 64}
    return {"tokens_per_s": 20.0, "step_s": 30.0, "new_tokens": 16}


# -- the check ------------------------------------------------------------------------------------
class Check:
    """Claims as they are made: each holds, fails, or names the exception that stopped it."""

    def __init__(self) -> None:
        self.claims: list[dict[str, Any]] = []
        self.figures: dict[str, Any] = {}

    def claim(self, text: str, measured: float | int | str, holds: bool) -> None:
        if isinstance(measured, float):
            measured = round(measured, 6)
        self.claims.append({"claim": text, "measured": measured, "holds": bool(holds)})
        print(f"{'ok  ' if holds else 'FAIL'} {text}: {measured}", flush=True)

    def section(self, name: str, fn: Callable[[], None]) -> None:
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:  # one broken section must not hide the others' results
            self.claim(f"{name} runs to the end", f"{type(e).__name__}: {e}"[:300], False)
            # Where it broke, in the log and in gpu.json: a GPU run is too scarce to repeat for a traceback.
            trace = traceback.format_exc()
            print(trace, file=sys.stderr, flush=True)
            self.figures.setdefault("tracebacks", {})[name] = trace.splitlines()[-12:]
        self.figures.setdefault("section_s", {})[name] = round(time.perf_counter() - t, 2)


def synchronize(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def max_gap(a: Any, b: Any, mask: Any) -> float:
    m = mask.bool()
    return float((a.float()[m] - b.float()[m]).abs().max()) if m.any() else 0.0


def build_lm(path: Path, spec: Any, dtype: str) -> tuple[str, int]:
    """A Qwen2-style LM built from ``spec``, saved in ``dtype``; its path and parameter count."""
    import torch

    from troupe.actors.models import build_tiny_lm, count_parameters, save_model, train_tokenizer
    from troupe.envs.arithmetic import ArithmeticTask

    tok = train_tokenizer(ArithmeticTask().corpus(500))
    model = build_tiny_lm(spec, tok, seed=0)
    with torch.no_grad():
        model.model.norm.weight.mul_(2.0)  # sharper than at random init, yet top-p keeps several tokens
    save_model(model.to(getattr(torch, dtype)), tok, path)
    return str(path), count_parameters(model)


def learner(path: str, device: str, dtype: str, sampling: Any, **cfg: Any) -> Any:
    from troupe.actors.learner import Learner

    config = {"lr": 1e-3, "dtype": dtype, "micro_batch_size": 64, **LOSS, **cfg}
    return Learner(path, config, sampling=sampling, max_len=sampling.max_new_tokens, device=device)


def lm_checks(check: Check, root: Path, device: str, dtype: str) -> None:
    """The tiny LM: engine, learner recompute, scorer, GRPO update, LoRA publish and load."""
    import torch
    from peft import get_peft_model_state_dict

    from troupe.actors.models import TinyLMSpec
    from troupe.actors.rollout_hf import HFRolloutEngine
    from troupe.actors.sampling import SamplingConfig
    from troupe.actors.scorer import Scorer
    from troupe.actors.transport.base import pack_state_dict, unpack_state_dict

    path, _ = build_lm(root / "tiny", TinyLMSpec(hidden_size=128, num_heads=2, num_kv_heads=1, intermediate_size=256),
                    dtype)
    sampling = SamplingConfig(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=8)
    engine = HFRolloutEngine(path, dtype=dtype, device=device)
    batch = engine.generate(PROMPTS, sampling, seed=1)
    mask = batch["completion_mask"]
    lp = batch["logprobs"]
    kept = lp[mask.bool()]
    # Finite, and not all 0: truncation kept more than one token somewhere, so the checks below see it.
    finite = bool(torch.isfinite(kept).all()) and bool((kept <= 0).all()) and bool((kept < -1e-3).any())
    check.claim(f"hf engine samples on {device} in {dtype} with finite log-probs", int(mask.sum()),
                finite and int(mask.sum()) > 0 and str(next(engine.model.parameters()).device).startswith(device))

    pol = learner(path, device, dtype, sampling)
    recomputed = pol.logprobs(batch)
    gap = max_gap(recomputed, lp, mask)
    check.claim(f"learner's recomputed log-probs match the engine's (top-k, top-p, T=0.8), max gap <= {TOL[dtype]}",
                gap, gap <= TOL[dtype])
    scored = Scorer(path, dtype=dtype, device=device).logprobs(batch, sampling)["logprobs"]
    gap = max_gap(scored, recomputed, mask)
    check.claim("scorer's log-probs equal the learner's (same model, same processing)", gap, gap <= 1e-5)

    advantages = torch.linspace(-1, 1, len(batch))
    before = {k: v.detach().float().clone() for k, v in pol.model.state_dict().items()}
    synchronize(device)
    t = time.perf_counter()
    metrics = pol.update(batch, {"advantages": advantages})
    synchronize(device)
    step_s = time.perf_counter() - t
    moved = max(float((v.detach().float() - before[k]).abs().max()) for k, v in pol.model.state_dict().items())
    finite = all(isinstance(v, float) and v == v for v in metrics.values())
    check.claim("a GRPO update (PPO-clip) changes the policy and reports finite metrics", moved, moved > 0 and finite)
    check.figures["tiny_update_s"] = round(step_s, 4)

    lora = learner(path, device, dtype, sampling, lr=5e-2,
                   lora={"enabled": True, "r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]})
    for _ in range(2):
        lora.update(batch, {"advantages": advantages})
    # What the lora transport sends: the adapter alone, packed as the object store carries it.
    packed = pack_state_dict(get_peft_model_state_dict(lora.model))
    adapter_bytes = sum(a.nbytes for a, _ in packed.values())
    engine.install_adapter(unpack_state_dict(packed), lora.cfg.lora.peft_config())
    fresh = engine.generate(PROMPTS, sampling, seed=2)
    gap = max_gap(lora.logprobs(fresh), fresh["logprobs"], fresh["completion_mask"])
    base_gap = max_gap(pol.logprobs(fresh), fresh["logprobs"], fresh["completion_mask"])
    check.claim(f"a published LoRA adapter ({adapter_bytes} bytes) loaded by the engine makes its log-probs the "
                f"learner's, max gap <= {TOL[dtype]}", gap, gap <= TOL[dtype] and base_gap > gap)


def distill_checks(check: Check, root: Path, device: str, dtype: str) -> None:
    """On-policy distillation's learner: a teacher's top-k log-probs (the scorer's, as the OPD
    graph sends them) and a teacher's tokens, each turned into [B, C, V] targets on the
    student's device, and a step of the reverse KL and of the hard-target loss."""
    import torch

    from troupe.actors.distill_learner import DistillLearner
    from troupe.actors.models import TinyLMSpec
    from troupe.actors.rollout_hf import HFRolloutEngine
    from troupe.actors.sampling import SamplingConfig
    from troupe.actors.scorer import Scorer

    path, _ = build_lm(root / "student", TinyLMSpec(hidden_size=64, num_heads=2, num_kv_heads=1,
                                                    intermediate_size=128), dtype)
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=6)
    batch = HFRolloutEngine(path, dtype=dtype, device=device).generate(PROMPTS, sampling, seed=3)
    teacher = Scorer(path, dtype=dtype, device=device).logprobs(batch, sampling, top_k=8)
    student = DistillLearner(path, {"lr": 1e-3, "dtype": dtype, "micro_batch_size": 64, **LOSS},
                             sampling=sampling, max_len=sampling.max_new_tokens, device=device)
    topk = batch.with_fields(targets_topk_ids=teacher["topk_ids"],
                             targets_topk_logprobs=teacher["topk_logprobs"])
    first = student.distill(topk, DISTILL["rkl"])
    second = student.distill(topk, DISTILL["rkl"])
    hard = student.distill(batch.with_fields(target_ids=batch["completion_ids"]), DISTILL["hard"])
    losses = [first["loss/distill"], second["loss/distill"], hard["loss/distill"]]
    ok = all(torch.isfinite(torch.tensor(losses))) and second["loss/distill"] < first["loss/distill"]
    check.claim("distillation steps (reverse KL to a teacher's top-8 log-probs, then hard targets) run on "
                f"{device}; the reverse KL falls", ", ".join(f"{v:.4f}" for v in losses), ok)


def vl_checks(check: Check, root: Path, device: str, dtype: str) -> None:
    """The tiny Qwen2.5-VL-style model on CUDA: a few-frame video in, a completion and log-probs out."""
    import numpy as np
    import torch

    from troupe.actors.models import save_model, train_tokenizer
    from troupe.actors.rollout_hf import HFRolloutEngine
    from troupe.actors.sampling import SamplingConfig
    from troupe.actors.vision import VISION_TOKENS, TinyVLSpec, build_tiny_vl

    corpus = [f"What colour is the square? {c}" for c in "ABC" for _ in range(50)]
    tok = train_tokenizer(corpus, special_tokens=VISION_TOKENS)
    path = root / "tiny-vl"
    save_model(build_tiny_vl(TinyVLSpec(), tok).to(getattr(torch, dtype)), tok, path)
    rng = np.random.default_rng(0)
    rows = [{"prompt": "What colour is the square?", "frames": rng.integers(0, 256, (4, 56, 56, 3), dtype=np.uint8)}
            for _ in range(4)]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=4)
    engine = HFRolloutEngine(str(path), dtype=dtype, device=device)
    batch = engine.generate([r["prompt"] for r in rows], sampling, rows, seed=0)
    recomputed = learner(str(path), device, dtype, sampling).logprobs(batch)
    gap = max_gap(recomputed, batch["logprobs"], batch["completion_mask"])
    check.claim(f"tiny VL model generates from video frames on {device} and the learner's log-probs match, "
                f"max gap <= {TOL[dtype]}", gap, engine.video_layout is not None and gap <= TOL[dtype])


def scale_checks(check: Check, root: Path, device: str, dtype: str) -> None:
    """Tokens/s of the engine and seconds per learner step at 0.5B parameters (a few million on CPU)."""
    import torch

    from troupe.actors.rollout_hf import HFRolloutEngine
    from troupe.actors.sampling import SamplingConfig

    floor = floors(device)
    path, params = build_lm(root / "scale", scale_spec(device), dtype)
    check.figures["scale_parameters"] = params
    # No EOS for the timed calls: every row generates exactly new_tokens.
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=int(floor["new_tokens"]))
    engine = HFRolloutEngine(path, dtype=dtype, device=device)
    eos = engine.tokenizer.eos_token_id
    engine.model.generation_config.suppress_tokens = [eos]
    prompts = PROMPTS * 2
    engine.generate(prompts, sampling, seed=0)  # warm-up: kernels, allocator
    synchronize(device)
    t = time.perf_counter()
    batch = engine.generate(prompts, sampling, seed=1)
    synchronize(device)
    rate = int(batch["completion_mask"].sum()) / (time.perf_counter() - t)
    check.figures["scale_tokens_per_s"] = round(rate, 1)
    check.claim(f"engine generates >= {floor['tokens_per_s']:g} tokens/s at {params / 1e6:.0f}M parameters "
                f"(batch {len(prompts)}, {sampling.max_new_tokens} new tokens)", rate, rate >= floor["tokens_per_s"])

    pol = learner(path, device, dtype, sampling, lr=1e-5, micro_batch_size=len(prompts))
    # How far the engine's log-probs (KV-cached decode) are from a learner's recompute at this
    # size, in the engine's dtype and in float32 from the same weights: what
    # learner.recompute_old_logprobs removes from the PPO ratio. Figures, not claims.
    mask = batch["completion_mask"]
    fp32 = learner(path, device, "float32", sampling, micro_batch_size=len(prompts))
    gaps = {"bf16_learner": pol.logprobs(batch), "fp32_learner": fp32.logprobs(batch)}
    del fp32
    check.figures["scale_logprob_gap"] = {
        k: {"max": round(max_gap(v, batch["logprobs"], mask), 5),
            "mean": round(float((v - batch["logprobs"]).abs()[mask.bool()].mean()), 5)}
        for k, v in gaps.items()}
    advantages = torch.linspace(-1, 1, len(batch))
    pol.update(batch, {"advantages": advantages})  # warm-up
    synchronize(device)
    t = time.perf_counter()
    pol.update(batch, {"advantages": advantages})
    synchronize(device)
    step_s = time.perf_counter() - t
    check.figures["scale_step_s"] = round(step_s, 3)
    if device == "cuda":
        check.figures["peak_memory_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    check.claim(f"learner step (GRPO, batch {len(prompts)}) <= {floor['step_s']:g} s at {params / 1e6:.0f}M "
                "parameters", step_s, step_s <= floor["step_s"])


def run(device: str, out: Path) -> dict[str, Any]:
    import torch
    import transformers

    t0 = time.perf_counter()
    check = Check()
    dtype = "bfloat16"
    torch.manual_seed(0)
    if device == "cuda":
        ok = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
        check.claim("a CUDA device with bf16", name, ok)
        if not ok:
            return finish(check, device, dtype, out, t0)
    with tempfile.TemporaryDirectory(prefix="troupe-gpu-check-") as tmp:
        root = Path(tmp)
        check.section("tiny LM", lambda: lm_checks(check, root, device, dtype))
        check.section("distillation", lambda: distill_checks(check, root, device, dtype))
        check.section("tiny VL", lambda: vl_checks(check, root, device, dtype))
        check.section("0.5B scale", lambda: scale_checks(check, root, device, dtype))
    check.claim("ran without importing Ray or vLLM", ",".join(sorted(
        m for m in ("ray", "vllm") if m in sys.modules)) or "neither", not {"ray", "vllm"} & set(sys.modules))
    check.figures["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                                 "cuda": torch.version.cuda}
    return finish(check, device, dtype, out, t0)


def finish(check: Check, device: str, dtype: str, out: Path, t0: float) -> dict[str, Any]:
    payload = {"benchmark": "gpu", "device": device, "dtype": dtype,
               "machine": {"python": platform.python_version(), "host": platform.node(), "cpus": os.cpu_count()},
               "wall_s": round(time.perf_counter() - t0, 1), **check.figures, "claims": check.claims}
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=1) + "\n")
    os.replace(tmp, path)  # atomic: a reader never sees half a file
    print(f"wrote {path} ({sum(c['holds'] for c in check.claims)}/{len(check.claims)} claims hold)")
    return payload


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results",
                    help="where gpu.json goes (default: benchmarks/results)")
    args = ap.parse_args(argv)
    payload = run(args.device, args.out)
    return 0 if all(c["holds"] for c in payload["claims"]) else 1


if __name__ == "__main__":
    sys.exit(main())
