#!/usr/bin/env bash
# troupe's GPU checks: the vLLM rollout engine and weight sync (pytest -m gpu), then a short
# GRPO run with rollout.backend=vllm colocated with the learner on one GPU.
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

if [ "$failed" -ne 0 ]; then
  echo "GPU checks FAILED (see $summary)" | tee -a "$summary"
  exit 1
fi
echo "GPU checks passed" | tee -a "$summary"
