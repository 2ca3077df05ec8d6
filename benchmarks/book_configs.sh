#!/usr/bin/env bash
# Execute the whole book in the configurations its prose must hold in, one after the other:
#   default      the kernels memwall chooses on this machine
#   kernels-off  MEMWALL_CPU_KERNELS=0 (PyTorch's kernels only: the path ARM and Apple laptops take)
#   one-thread   OMP_NUM_THREADS=1
#   compiled     MEMWALL_ACCELERATE=compiled (the GPU's compiled step, run on the CPU: slow, a check)
# Usage: benchmarks/book_configs.sh [OUT_DIR] [CONFIG ...]   (default OUT_DIR: /tmp/memwall-configs)
# Each build goes to OUT_DIR/CONFIG; OUT_DIR/CONFIG.txt holds every chapter's printed output, so
# the verdicts of two configurations can be read side by side (diff them).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-/tmp/memwall-configs}
shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(default kernels-off one-thread)
mkdir -p "$out"
status=0
for config in "${configs[@]}"; do
    case $config in
        default) settings=() ;;
        kernels-off) settings=(MEMWALL_CPU_KERNELS=0) ;;
        one-thread) settings=(OMP_NUM_THREADS=1) ;;
        compiled) settings=(MEMWALL_ACCELERATE=compiled) ;;
        *) echo "unknown configuration $config (default, kernels-off, one-thread, compiled)" >&2; exit 2 ;;
    esac
    echo "== $config ${settings[*]:-}"
    # A fresh folder: the execution cache of an earlier build would reuse the outputs of every
    # chapter whose source has not changed, and that configuration would never run them.
    rm -rf "${out:?}/$config"
    started=$(date +%s)
    env "${settings[@]}" .venv/bin/jupyter-book build . --path-output "$out/$config" --all -W \
        --keep-going > "$out/$config.log" 2>&1
    code=$?
    echo "   exit $code after $(( $(date +%s) - started )) s (log: $out/$config.log)"
    [ $code -eq 0 ] || status=1
    .venv/bin/python benchmarks/printed_outputs.py "$out/$config/_build/html" > "$out/$config.txt"
done
exit $status
