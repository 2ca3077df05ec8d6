"""Where a batched fast decode step of SmolLM2-135M (fp32) spends its time, at B = 1, 4, 8, 16.

    .venv/bin/python benchmarks/batch_step_profile.py [--batch 1,4,8,16] [--rounds 10]

Rounds alternate over the batch sizes; each takes a read-bandwidth probe, one whole fast step,
the step's matmuls alone one after another (the weights streaming from memory, as in the step),
and each distinct layer matmul again with its weights in cache (compute alone). It prints the
medians and two bounds for the matmuls: the stream alone (weight bytes / probe) and the
arithmetic alone (the hot times, times the layer count; the output head at the gate_up rate).
With perfect overlap the matmuls take the larger of the two; with none, their sum. The record
goes to benchmarks/results/batch_step_profile-<machine id>-<date>.json (`--out` to write elsewhere).
Not a test: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from memwall.bench import workload
from memwall.bench.batch import cache_with_context
from memwall.bench.records import save_record
from memwall.engine import Transformer
from memwall.engine.cpu import fast_decode
from memwall.machine.fingerprint import machine_fingerprint
from memwall.machine.probe import RooflineProbe

CONTEXT = 40


def seconds(fn, calls: int = 1) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,4,8,16")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, help="default: a record in benchmarks/results")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch.split(",")]

    hf_model, _ = workload.load_model("smollm2-135m", "fp32", "cpu")
    model = Transformer.from_hf(hf_model)
    del hf_model
    fast = fast_decode.accelerate(model)
    probe = RooflineProbe("cpu")
    state, samples = {}, {b: {k: [] for k in ("probe", "step", "matmuls", "hot")} for b in batches}
    for b in batches:
        generator = torch.Generator().manual_seed(b)
        cache = cache_with_context(model, b, CONTEXT, CONTEXT + args.rounds + 2, generator)
        tokens = torch.randint(0, model.embed.num_embeddings, (b, 1), generator=generator)
        with torch.inference_mode():
            tokens = fast(tokens, cache)[:, -1:].argmax(-1)  # builds the plan for b rows
        state[b] = [cache, tokens]
    weight_bytes = model.weight_bytes_per_step()
    layers = len(model.blocks)

    with torch.inference_mode():
        for _ in range(args.rounds):
            for b in batches:
                plan, s = fast._plans[b], samples[b]
                s["probe"].append(probe())
                cache, tokens = state[b]
                start = time.perf_counter()
                state[b][1] = fast(tokens, cache)[:, -1:].argmax(-1)
                s["step"].append(time.perf_counter() - start)
                s["matmuls"].append(seconds(lambda plan=plan: [plan.run(m) for m in plan.matmuls]))
                # one layer's matmuls (qkv, out, gate_up, down) with their weights in cache
                hot = []
                for m in plan.matmuls[:4]:
                    plan.run(m)
                    hot.append(seconds(lambda m=m, plan=plan: plan.run(m), calls=10))
                s["hot"].append(hot)

    rows = []
    head = model.lm_head
    for b in batches:
        s = samples[b]
        hot = [statistics.median(h[i] for h in s["hot"]) for i in range(4)]
        gate_up = fast._plans[b].matmuls[2].layer
        gate_up_flops = 2 * b * gate_up.in_features * gate_up.out_features / hot[2]
        compute = layers * sum(hot) + 2 * b * head.in_features * head.out_features / gate_up_flops
        bandwidth = statistics.median(s["probe"])
        row = {
            "batch": b,
            "probe_bytes_per_s": bandwidth,
            "step_ms": 1e3 * statistics.median(s["step"]),
            "matmuls_ms": 1e3 * statistics.median(s["matmuls"]),
            "stream_alone_ms": 1e3 * weight_bytes / bandwidth,
            "arithmetic_alone_ms": 1e3 * compute,
            "hot_gate_up_gflops": gate_up_flops / 1e9,
        }
        row["rest_ms"] = row["step_ms"] - row["matmuls_ms"]
        rows.append(row)
        print(
            f"B={b:2d}  step {row['step_ms']:5.1f} ms = matmuls {row['matmuls_ms']:5.1f}"
            f" + rest {row['rest_ms']:4.1f};  matmul bounds: stream alone"
            f" {row['stream_alone_ms']:5.1f} ({bandwidth / 1e9:.0f} GB/s), arithmetic alone"
            f" {row['arithmetic_alone_ms']:5.1f} (hot gate_up {row['hot_gate_up_gflops']:.0f}"
            f" GFLOP/s): overlapped {max(row['stream_alone_ms'], row['arithmetic_alone_ms']):5.1f},"
            f" one after the other {row['stream_alone_ms'] + row['arithmetic_alone_ms']:5.1f}"
        )
    record = {"machine": machine_fingerprint(), "context": CONTEXT, "rows": rows}
    if args.out is None:
        args.out = save_record(record, "batch_step_profile")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
