"""Where a batch-1 fast decode step of SmolLM2-135M loses against the bandwidth probe.

    .venv/bin/python benchmarks/batch1_stream_profile.py [--format fp32|int8] [--rounds 12]

The fast step's weights stream at a fraction of what the probe (torch.sum over a buffer far
above the last-level cache) reads. This splits that gap into steps, each timed in every round,
interleaved, so that a shared machine's swings in bandwidth fall on all of them alike:

  probe            torch.sum over the probe's buffer (the roofline the book's fractions use)
  read 1 buffer    a bare C read (integer vector adds over the bytes) of a buffer as large as
                   the step's weight matrices, in one piece, split between the threads
  read pieces      the same read over that buffer cut into the matrices' sizes, one parallel
                   call each: what 121 starts, each after a barrier, cost
  read matrices    the same read over the step's own weight matrices (fp32 weights or int8
                   codes): what their placement in memory costs
  matmuls          the fast path's matmul kernels alone, one after another
  step             the whole fast step (norms, rotary, attention, the callbacks' Python)

Each line is reported as GB/s of the weight matrices' bytes and as a fraction of the probe of
its round. The bare read is compiled here with the machine's compiler (-O3 -march=native
-fopenmp; its loads are AVX-512 intrinsics, so it needs an x86 CPU with AVX-512); it is a
measuring tool, not part of memwall. The record goes to
benchmarks/results/batch1_stream_profile_FORMAT-<machine id>-<date>.json (`--out` to write
elsewhere). Not a test: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

from memwall.bench import workload
from memwall.bench.records import save_record
from memwall.engine import Transformer
from memwall.engine.cpu import fast_decode
from memwall.engine.quant import quantize
from memwall.machine.fingerprint import machine_fingerprint
from memwall.machine.probe import RooflineProbe

# Each thread reads one contiguous share of a span (as fp32_linear splits a matrix's rows),
# with four independent sums so that the adds never wait on each other.
BARE_READ = r"""
#include <immintrin.h>
static int read_share(const int *p, long n, int thread, int threads) {
    long lo = n * thread / threads / 64 * 64;
    long hi = thread + 1 == threads ? n : n * (thread + 1) / threads / 64 * 64;
    __m512i a = _mm512_setzero_si512(), b = a, c = a, d = a;
    long i = lo;
    for (; i + 64 <= hi; i += 64) {
        a = _mm512_add_epi32(a, _mm512_loadu_si512(p + i));
        b = _mm512_add_epi32(b, _mm512_loadu_si512(p + i + 16));
        c = _mm512_add_epi32(c, _mm512_loadu_si512(p + i + 32));
        d = _mm512_add_epi32(d, _mm512_loadu_si512(p + i + 48));
    }
    int rest = 0;
    for (; i < hi; i++) rest += p[i];
    return _mm512_reduce_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a, b), _mm512_add_epi32(c, d))) + rest;
}
/* spans of 4-byte words */
int read_spans(const int **spans, const long *lengths, int count, int threads) {
    int total = 0;
    for (int s = 0; s < count; s++) {
        #pragma omp parallel for num_threads(threads) reduction(+:total) schedule(static)
        for (int t = 0; t < threads; t++) total += read_share(spans[s], lengths[s], t, threads);
    }
    return total;
}
"""


def bare_reader():
    """read_spans(spans, lengths, count, threads), compiled for this CPU."""
    folder = Path(tempfile.mkdtemp(prefix="memwall-bare-read-"))
    source, library = folder / "read.c", folder / "read.so"
    source.write_text(BARE_READ)
    flags = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC"]
    subprocess.run(["cc", *flags, str(source), "-o", str(library)], check=True)
    read = ctypes.CDLL(str(library)).read_spans
    read.restype = ctypes.c_int
    read.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return read


def words(t: torch.Tensor) -> int:
    return t.numel() * t.element_size() // 4


def span_table(tensors):
    pointers = (ctypes.c_void_p * len(tensors))(*(t.data_ptr() for t in tensors))
    lengths = (ctypes.c_long * len(tensors))(*(words(t) for t in tensors))
    return pointers, lengths, len(tensors)


def seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--format", choices=("fp32", "int8"), default="fp32")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--out", type=Path, help="default: a record in benchmarks/results")
    args = parser.parse_args()

    hf_model, _ = workload.load_model("smollm2-135m", "fp32", "cpu")
    model = Transformer.from_hf(hf_model)
    del hf_model
    if args.format == "int8":
        model = quantize(model, "int8")
    fast = fast_decode.accelerate(model)
    cache = model.new_cache(1, 40 + 2 * args.rounds)
    tokens = torch.tensor([[1]])
    with torch.inference_mode():
        tokens = fast(tokens, cache)[:, -1:].argmax(-1)  # builds the batch-1 plan
    plan = fast._plans[1]
    if any(m.path != "c" for m in plan.matmuls):
        print("note: some matmuls are not on the C kernel:", sorted({m.path for m in plan.matmuls}))
    weights = [m.layer.weight if args.format == "fp32" else m.layer.codes for m in plan.matmuls]
    weight_bytes = sum(4 * words(w) for w in weights)
    one_buffer = torch.ones(weight_bytes // 4, dtype=torch.int32)
    read, threads = bare_reader(), torch.get_num_threads()
    matrices, single = span_table(weights), span_table([one_buffer])
    pieces = span_table(list(one_buffer.split([words(w) for w in weights])))
    probe = RooflineProbe("cpu")

    def step():
        nonlocal tokens
        tokens = fast(tokens, cache)[:, -1:].argmax(-1)

    timed = {
        "read 1 buffer": lambda: read(*single, threads),
        "read pieces": lambda: read(*pieces, threads),
        "read matrices": lambda: read(*matrices, threads),
        "matmuls": lambda: [plan.run(m) for m in plan.matmuls],
        "step": step,
    }
    samples = {name: [] for name in ("probe", *timed)}
    with torch.inference_mode():
        for fn in timed.values():
            fn()  # warm
        for _ in range(args.rounds):
            samples["probe"].append(weight_bytes / probe())
            for name, fn in timed.items():
                samples[name].append(seconds(fn))

    probe_s = statistics.median(samples["probe"])
    rows = []
    for name, times in samples.items():
        s = statistics.median(times)
        fractions = [p / t for p, t in zip(samples["probe"], times)]  # each against its round
        rows.append(
            {
                "what": name,
                "ms": 1e3 * s,
                "GBps": weight_bytes / s / 1e9,
                "fraction_of_probe": statistics.median(fractions),
            }
        )
        print(
            f"{name:14s} {1e3 * s:6.2f} ms  {weight_bytes / s / 1e9:5.1f} GB/s"
            f"  {rows[-1]['fraction_of_probe']:4.0%} of the probe (round by round)"
        )
    spread = [
        weight_bytes / max(samples["probe"]) / 1e9,
        weight_bytes / min(samples["probe"]) / 1e9,
    ]
    print(f"probe range {spread[0]:.0f}-{spread[1]:.0f} GB/s; {weight_bytes / 1e6:.0f} MB a step")
    record = {
        "machine": machine_fingerprint(),
        "format": args.format,
        "weight_bytes": weight_bytes,
        "threads": threads,
        "probe_ms": 1e3 * probe_s,
        "rows": rows,
    }
    if args.out is None:
        args.out = save_record(record, f"batch1_stream_profile_{args.format}")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
