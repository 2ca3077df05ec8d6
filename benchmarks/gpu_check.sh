#!/usr/bin/env bash
# GPU check in one call of a few minutes (benchmarks/gpu_check.py says what it measures): the
# compiled CUDA path against the readable engine and transformers, batch-1 decode of a
# Llama-3-8B shape in bf16/int8/int4 next to the measured copy bandwidth, batch 1..256 against
# the cost model, transformers' eager and static-cache compiled generate as peers, the chapters
# on CUDA where a Jupyter stack is installed, and the server's scheduler compiled. Needs only
# torch and transformers (and triton, for torch.compile); every model has random weights.
# Prints a markdown table and writes benchmarks/results/gpu_check-<machine id>-<date>.json as
# it goes.
#   benchmarks/gpu_check.sh [--results-dir DIR] [--budget-s S] [--new-tokens N] [--repeats N]
#                           [--model SPEC] [--no-record] [--allow-cpu]
#                           [--sections speed,chapters,server] [--chapters NN,NN] [--resume]
# Exits 1 at once, saying why, when there is no NVIDIA GPU (unless --allow-cpu: a dry run with
# tiny shapes); exits 1 at the end when a correctness check or a chapter failed.
# benchmarks/gpu_kit.py carries the chapters' packages and model to a GPU machine without them.
set -euo pipefail
cd "$(dirname "$0")/.."
# Fail at once where there is plainly no NVIDIA GPU (no driver tool, no device node).
if [[ " $* " != *" --allow-cpu "* ]] && ! command -v nvidia-smi >/dev/null && ! ls /dev/nvidia0 >/dev/null 2>&1; then
    echo "gpu_check: no NVIDIA GPU here (no nvidia-smi, no /dev/nvidia0); run it on a CUDA machine." >&2
    exit 1
fi
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
# Output as it happens, so a run cut short still shows how far it got.
PYTHONUNBUFFERED=1 exec "$PYTHON" benchmarks/gpu_check.py "$@"
