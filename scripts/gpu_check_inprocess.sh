#!/usr/bin/env bash
# troupe's in-process GPU check, for a GPU node with no network: the hf rollout engine, scorer and
# learner on CUDA in bf16, LoRA publish and load, the tiny VL model, and throughput at 0.5B
# parameters. Needs only a python with torch (CUDA), transformers, peft and safetensors: no Ray,
# no vLLM, no install of troupe (it runs from this copy of the repository). A few minutes.
#
#   scripts/gpu_check_inprocess.sh [OUT_DIR]     # writes OUT_DIR/gpu.json (default benchmarks/results)
#   PYTHON=/opt/venv/bin/python scripts/gpu_check_inprocess.sh
#
# Exits 1 if any claim in gpu.json does not hold. With network access, scripts/gpu_check.sh
# installs the gpu extra and also runs the vLLM and nccl checks.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
exec "${PYTHON:-python3}" "$root/benchmarks/gpu.py" --device cuda --out "${1:-$root/benchmarks/results}"
