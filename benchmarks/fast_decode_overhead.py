"""Batch-1 decode of SmolLM2-135M, readable engine vs the fast path, interleaved in one process.

    .venv/bin/python benchmarks/fast_decode_overhead.py [--formats fp32,int8,int4] [--rounds 8]

For each weight format, rounds alternate: a read-bandwidth probe (sum over 1 GiB), 12 readable
decode steps, a probe, 12 fast steps (`accelerate(model)`). It prints the median step time,
tok/s, the fraction of the probe's bandwidth that the step's weight bytes reach, and the per-step
overhead of the fast path (its step time minus the same matmuls called on their own). The record
goes to benchmarks/results/fast_decode_overhead-<machine id>-<date>.json (`--out` to write
elsewhere).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from memwall import models
from memwall.bench.records import save_record
from memwall.engine import Transformer
from memwall.engine.accelerate import accelerate
from memwall.engine.cpu import chosen_paths
from memwall.engine.quant import quantize
from memwall.machine.fingerprint import machine_fingerprint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--formats", default="fp32,int8,int4")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, help="default: a record in benchmarks/results")
    args = parser.parse_args()
    hf_model, tokenizer = models.load("smollm2-135m")
    base = Transformer.from_hf(hf_model)
    del hf_model
    prompt = torch.tensor([tokenizer("The capital of France is").input_ids])
    big = torch.ones(2**28)  # 1 GiB, far beyond the last-level cache

    def probe() -> float:
        start = time.perf_counter()
        big.sum()
        return big.numel() * 4 / (time.perf_counter() - start)

    record = {"machine": machine_fingerprint(), "load_before": os.getloadavg()[0], "formats": {}}
    for fmt in args.formats.split(","):
        extra = {"head": "int8"} if fmt == "int4" else {}
        model = base if fmt == "fp32" else quantize(base, fmt, inplace=False, **extra)
        weight_bytes = model.weight_bytes_per_step()
        engines = {"readable": model, "fast": accelerate(model)}
        steps = {name: [] for name in engines}
        fractions = {name: [] for name in engines}
        matmuls, probes = [], []
        with torch.inference_mode():
            caches = {name: model.new_cache(1, 16 + 12 * args.rounds) for name in engines}
            tokens = {
                name: m(prompt, caches[name], last_only=True)[:, -1].argmax(-1)
                for name, m in engines.items()
            }
            for _ in range(args.rounds):
                for name, m in engines.items():
                    bandwidth = probe()
                    probes.append(bandwidth)
                    times = []
                    for _ in range(12):
                        start = time.perf_counter()
                        tokens[name] = m(tokens[name][:, None], caches[name])[:, -1].argmax(-1)
                        times.append(time.perf_counter() - start)
                    steps[name].append(statistics.median(times))
                    fractions[name].append(weight_bytes / steps[name][-1] / bandwidth)
                plan = engines["fast"]._plans[1]  # the batch-1 plan
                start = time.perf_counter()
                for matmul in plan.matmuls:
                    plan.run(matmul)
                matmuls.append(time.perf_counter() - start)
        result = {
            name: {
                "step_ms": statistics.median(steps[name]) * 1e3,
                "tok_per_s": 1 / statistics.median(steps[name]),
                "fraction_of_probe_bandwidth": statistics.median(fractions[name]),
            }
            for name in engines
        }
        result["matmuls_only_ms"] = statistics.median(matmuls) * 1e3
        result["fast_overhead_ms"] = result["fast"]["step_ms"] - result["matmuls_only_ms"]
        result["probe_GBps"] = [
            min(probes) / 1e9,
            statistics.median(probes) / 1e9,
            max(probes) / 1e9,
        ]
        result["weight_bytes"] = weight_bytes
        record["formats"][fmt] = result
        print(fmt, json.dumps(result), flush=True)
    record["load_after"] = os.getloadavg()[0]
    record["kernels"] = chosen_paths()
    if args.out is None:
        args.out = save_record(record, "fast_decode_overhead")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"recorded in {args.out}")


if __name__ == "__main__":
    main()
