#!/usr/bin/env bash
# GPU check, under 5 minutes on a datacenter GPU: memwall's engine against transformers on CUDA,
# then batch-1 decode of a Llama-3-8B-shaped random-weight model in bf16 next to the measured
# bandwidth ceiling. Prints a markdown table; writes a record (default
# benchmarks/results/gpu_check-<machine id>-<date>.json).
#   benchmarks/gpu_check.sh [--out FILE] [--new-tokens N] [--repeats N] [--model SPEC]
# Exits 1 at once, saying why, when torch sees no CUDA GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
# Fail at once where there is plainly no NVIDIA GPU (no driver tool, no device node).
if [[ " $* " != *" --allow-cpu "* ]] && ! command -v nvidia-smi >/dev/null && ! ls /dev/nvidia0 >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (no nvidia-smi, no /dev/nvidia0); run it on a CUDA machine." >&2
    exit 1
fi
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
exec "$PYTHON" benchmarks/gpu_check.py "$@"
