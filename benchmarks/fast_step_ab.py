"""The whole fast decode step with two builds of the C kernels, timed step by step in one
process (A, B, B, A, ...), so that both see the same phase of a shared machine's bandwidth.

Build each library first, e.g. for the committed AVX-512 kernels against an older commit:

    mkdir -p /tmp/base /tmp/new
    for f in kernels_avx512.c common.h decode_ops.h decode_step.h; do
      git show OLD:memwall/engine/cpu/$f > /tmp/base/$f; cp memwall/engine/cpu/$f /tmp/new/$f
    done
    for d in base new; do gcc -O3 -fno-trapping-math -shared -fPIC -mavx512f -mavx512bw \
      -mavx512vl -mavx512dq -mavx2 -mfma -fopenmp /tmp/$d/kernels_avx512.c -o /tmp/$d/k.so -lm; done
    .venv/bin/python benchmarks/fast_step_ab.py

or name the two folders that hold k.so (e.g. builds of the AVX2 variant, kernels_avx2.c) and
the weight format:

    .venv/bin/python benchmarks/fast_step_ab.py /tmp/a2base /tmp/a2new --format int8

or compare two kernel paths of one build (the installed one unless folders are named):

    .venv/bin/python benchmarks/fast_step_ab.py --format int8 --pins int8:c int8:c_row

Prints the median step of each build and their ratio at B = 1, 4, 8 and 16 (or --batch), with
40 cached tokens (or --context). Every matmul is pinned to memwall's C kernels
(MEMWALL_KERNEL_PATH): the builds are what is compared, and a swapped-in library shares its
calibration key with MEMWALL_CPU_KERNELS=0, whose choices are PyTorch's paths."""

import argparse
import ctypes
import os
import statistics
import time

import torch

from memwall.bench import workload
from memwall.bench.batch import cache_with_context
from memwall.engine import Transformer
from memwall.engine.cpu import build, fast_decode
from memwall.engine.cpu import kernels as cpu_kernels
from memwall.engine.quant import quantize

parser = argparse.ArgumentParser()
parser.add_argument("folders", nargs="*")
parser.add_argument("--format", choices=("fp32", "int8", "int4"), default="fp32")
parser.add_argument("--context", type=int, default=40, help="cached tokens per sequence")
parser.add_argument("--batch", default="1,4,8,16")
parser.add_argument("--pins", nargs=2, metavar=("BASE", "NEW"), help="MEMWALL_KERNEL_PATH pins")
args = parser.parse_args()
pins = dict(zip(("base", "new"), args.pins or ["fp32:c,int8:c,int4:c"] * 2))
if args.pins and not args.folders:
    libs = {d: cpu_kernels.library() for d in pins}
else:
    folders = dict(zip(("base", "new"), args.folders or ["/tmp/base", "/tmp/new"]))
    libs = {d: build.declare(ctypes.CDLL(f"{folder}/k.so")) for d, folder in folders.items()}
hf, _ = workload.load_model("smollm2-135m", "fp32", "cpu")
model = Transformer.from_hf(hf)
if args.format != "fp32":
    model = quantize(model, args.format)
wrappers = {d: fast_decode.accelerate(model) for d in libs}
context, steps = args.context, 24
Bs = [int(b) for b in args.batch.split(",")]
state = {}
for d, wrapper in wrappers.items():
    cpu_kernels.library = lambda d=d: libs[d]
    os.environ["MEMWALL_KERNEL_PATH"] = pins[d]  # the paths are bound at the first step
    for b in Bs:
        g = torch.Generator().manual_seed(b)
        cache = cache_with_context(model, b, context, context + steps + 1, g)
        tokens = torch.randint(0, 49152, (b, 1), generator=g)
        wrapper(tokens, cache)
        state[d, b] = [cache, tokens, []]
for step in range(steps):
    for b in Bs:
        # A, B then B, A: on a machine whose bandwidth swings, the second of a fixed pair can
        # run slower whichever build it is (the log's "slot bias")
        for d, wrapper in list(wrappers.items())[:: 1 if step % 2 else -1]:
            cache, tokens, times = state[d, b]
            t = time.perf_counter()
            state[d, b][1] = wrapper(tokens, cache)[:, -1:].argmax(-1)
            times.append(time.perf_counter() - t)
for b in Bs:
    base, new = (statistics.median(state[d, b][2]) * 1e3 for d in ("base", "new"))
    print(f"B={b:2d}  base {base:.2f} ms  new {new:.2f} ms  new/base {new / base:.3f}")
