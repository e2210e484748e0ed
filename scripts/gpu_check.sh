#!/usr/bin/env bash
# troupe's GPU checks: the vLLM rollout engine and weight sync (pytest -m gpu), a short GRPO
# run with rollout.backend=vllm colocated with the learner on one GPU, BPO's vl-gpu preset
# on a tiny hub-format Qwen2.5-VL checkpoint, OPD's gpu preset on tiny Qwen2 models, and ICRM's
# gpu preset on a tiny Qwen2 backbone and a small HelpSteer2-format file.
#
#   scripts/gpu_check.sh OUT_DIR
#
# Installs the gpu extra into a fresh venv beside the CPU one (.venv-gpu, or $TROUPE_GPU_VENV;
# vLLM brings its own CUDA torch, so the CPU constraints file is not used), writes every log and
# a summary under OUT_DIR, runs every step even when one fails, and exits 1 if any failed.
# TROUPE_VLLM_TEST_DTYPE=bfloat16 runs the engine tests in bf16 if this vLLM lacks float32 kernels.
set -uo pipefail

out=${1:?usage: scripts/gpu_check.sh OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${TROUPE_GPU_VENV:-$root/.venv-gpu}
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary="$out/summary.txt"
: > "$summary"
failed=0

step() {  # step NAME COMMAND...: run, log to OUT_DIR/NAME.log, record the exit status
  local name=$1
  shift
  local t0=$SECONDS
  echo "== $name: $*" | tee -a "$summary"
  "$@" > "$out/$name.log" 2>&1
  local rc=$?
  echo "   rc=$rc in $((SECONDS - t0)) s (log: $name.log)" | tee -a "$summary"
  if [ "$rc" -ne 0 ]; then
    failed=1
    tail -n 30 "$out/$name.log"
  fi
  return "$rc"
}

nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || echo "nvidia-smi not found" >> "$out/nvidia-smi.txt"

cd "$root" || exit 1
if [ ! -x "$venv/bin/python" ]; then
  step venv python3 -m venv "$venv" || exit 1
fi
step install "$venv/bin/python" -m pip install -e ".[gpu]" pytest pytest-timeout || { echo "install failed"; exit 1; }
step versions "$venv/bin/python" -c '
import torch, vllm, transformers
print("vllm", vllm.__version__, "torch", torch.__version__, "transformers", transformers.__version__)
print("cuda", torch.version.cuda, "devices", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
'

export TROUPE_CACHE="$out/cache"  # the SFT checkpoint of the smoke run, kept apart from ~/.cache/troupe

step pytest-gpu "$venv/bin/python" -m pytest -q -m gpu tests/ -p no:cacheprovider -rs --junitxml "$out/pytest-gpu.xml"

step grpo-vllm "$venv/bin/troupe" run grpo --preset smoke --out "$out/grpo-vllm" \
  rollout.backend=vllm model.device=cuda \
  learner.num_gpus=0.5 rollout.num_gpus=0.4 rollout.colocate_with_learner=true \
  learner.recompute_old_logprobs=true
if [ -f "$out/grpo-vllm/summary.json" ]; then
  cp "$out/grpo-vllm/summary.json" "$out/grpo-vllm-summary.json"
fi

# The run exported as a Hugging Face model directory, then loaded and served by vLLM itself
# (what `vllm serve OUT` does first): the export's config, tokenizer and bf16 safetensors.
step export-vllm-load bash -c '
"$1/bin/troupe" export "$2/grpo-vllm" "$2/grpo-export" --force &&
"$1/bin/python" -c "
import sys
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype=\"bfloat16\", gpu_memory_utilization=0.3, enforce_eager=True)
out = llm.chat([{\"role\": \"user\", \"content\": \"12+34=\"}], SamplingParams(max_tokens=8, temperature=0))
print(\"vllm served the export:\", repr(out[0].outputs[0].text))
" "$2/grpo-export"' _ "$venv" "$out"

# The one-GPU BPO preset (bf16, LoRA, a hub-format Qwen2.5-VL checkpoint) on a tiny model of that
# architecture: the hub model cannot be downloaded here, the code path is the same.
step tiny-vl-hub "$venv/bin/python" -c '
import sys
from troupe.actors.models import train_tokenizer
from troupe.actors.vision import VISION_TOKENS, TinyVLSpec, build_tiny_vl, save_hub_format
from troupe.envs.video_qa import VideoQATask
tok = train_tokenizer(VideoQATask(pixel_size=56, grid=3).corpus(300), special_tokens=VISION_TOKENS)
print(save_hub_format(build_tiny_vl(TinyVLSpec(), tok), tok, sys.argv[1], TinyVLSpec().layout()))
' "$out/tiny-vl-hub" && \
step bpo-vl-gpu "$venv/bin/troupe" run bpo --preset vl-gpu --out "$out/bpo-vl-gpu" \
  model.path="$out/tiny-vl-hub" task.pixel_size=56 task.grid=3 bpo.prompts_per_step=4 \
  eval.num_prompts=20 run.steps=3 run.eval_every=3 run.checkpoint_every=3 run.progress=false
if [ -f "$out/bpo-vl-gpu/summary.json" ]; then
  cp "$out/bpo-vl-gpu/summary.json" "$out/bpo-vl-gpu-summary.json"
fi

# OPD's one-GPU preset (vLLM student engines, a larger teacher of the family on the GPU, top-k
# targets) on tiny Qwen2 models sharing one tokenizer, the teacher's embedding padded wider.
step tiny-opd-models "$venv/bin/python" -c '
import sys
from troupe.actors.models import TinyLMSpec, build_tiny_lm, save_model, train_tokenizer
from troupe.envs.chain import ChainTask
tok = train_tokenizer(ChainTask(ChainTask.Config(horizon=8)).corpus(500), 384)
save_model(build_tiny_lm(TinyLMSpec(), tok, seed=0), tok, sys.argv[1] + "/student")
teacher = build_tiny_lm(TinyLMSpec(hidden_size=128, intermediate_size=384), tok, seed=1)
teacher.resize_token_embeddings(len(tok) + 64)
save_model(teacher, tok, sys.argv[1] + "/teacher")
' "$out/tiny-opd" && \
step opd-gpu "$venv/bin/troupe" run opd --preset gpu --out "$out/opd-gpu" \
  model.path="$out/tiny-opd/student" teacher.path="$out/tiny-opd/teacher" opd.horizons=[8] \
  opd.prompts_per_step=8 eval.num_prompts=20 run.steps=3 run.eval_every=3 run.checkpoint_every=3 run.progress=false
if [ -f "$out/opd-gpu/summary.json" ]; then
  cp "$out/opd-gpu/summary.json" "$out/opd-gpu-summary.json"
fi

# ICRM's one-GPU preset (bf16 backbone and the heads on cuda, learners with half a GPU each,
# HelpSteer2 by hub id) on a tiny Qwen2 backbone and a HelpSteer2-format file written here: neither
# the hub model nor the hub dataset can be downloaded here, the code path is the same.
mkdir -p "$out/tiny-icrm"
step tiny-icrm-data "$venv/bin/python" -c '
import json, sys
import numpy as np
from troupe.actors.models import TinyLMSpec, build_tiny_lm, save_model, train_tokenizer
rng = np.random.default_rng(0)
words = "the answer is clear because we checked each step and found that it holds for all cases".split()
rows = []
for i in range(120):
    prompt = f"Question {i}: " + " ".join(rng.choice(words, 6))
    for _ in range(2):
        n = int(rng.integers(2, 30))
        rows.append({"prompt": prompt, "response": " ".join(rng.choice(words, n)), "helpfulness": min(4, n // 7),
                     "correctness": int(rng.integers(5)), "coherence": int(rng.integers(5)),
                     "complexity": int(rng.integers(5)), "verbosity": min(4, n // 7)})
with open(sys.argv[1] + "/helpsteer2.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
tok = train_tokenizer([r["prompt"] + "\n" + r["response"] for r in rows], 384)
save_model(build_tiny_lm(TinyLMSpec(), tok, seed=0), tok, sys.argv[1] + "/backbone")
' "$out/tiny-icrm" && \
step icrm-gpu "$venv/bin/troupe" run icrm --preset gpu --out "$out/icrm-gpu" \
  backbone.path="$out/tiny-icrm/backbone" data.path="$out/tiny-icrm/helpsteer2.jsonl" backbone.max_tokens=64 \
  data.eval_fraction=0.3 data.eval_episodes=100 train.steps=40 train.chunks=2 train.judge_steps=10 \
  run.progress=false
if [ -f "$out/icrm-gpu/summary.json" ]; then
  cp "$out/icrm-gpu/summary.json" "$out/icrm-gpu-summary.json"
fi

if [ "$failed" -ne 0 ]; then
  echo "GPU checks FAILED (see $summary)" | tee -a "$summary"
  exit 1
fi
echo "GPU checks passed" | tee -a "$summary"
