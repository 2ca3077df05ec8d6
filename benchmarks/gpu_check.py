"""The GPU check: memwall's engine against transformers on CUDA, then batch-1 decode of a
Llama-3-8B-shaped model against the measured bandwidth ceiling. Run it through gpu_check.sh.

1. Correctness on SmolLM2-135M: fp32 logits after prefill and 16 decode steps (max |difference|),
   and bf16 greedy decoding (identical prefix of 64 tokens, and top-1 agreement when both models
   read the same tokens, which does not let one early rounding flip spoil the rest).
2. Speed: `random:llama-3-8b` in bf16 (fp16 on GPUs without bf16; a smaller Llama if the GPU cannot
   hold two copies during the comparison), memwall and transformers interleaved, next to
   tokens/s <= measured bandwidth / bytes per step.

Prints a markdown table and writes everything to a record,
benchmarks/results/gpu_check-<machine id>-<date>.json (`--out` to write elsewhere; a CPU dry run
writes only where `--out` says).
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
from pathlib import Path

import torch

FP32_TOLERANCE = (
    1e-3  # GPU matmuls may sum in another order than transformers' separate projections
)
GREEDY_TOKENS = 64
# (spec, parameters in billions): the first whose two 16-bit copies fit in 85% of the GPU memory.
SPEED_MODELS = (("llama-3-8b", 8.03), ("llama-3.2-3b", 3.21), ("llama-3.2-1b", 1.24))


def hf_step(hf, tokens, cache):
    """One transformers forward that extends `cache` (the keyword was renamed in transformers 5)."""
    key = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    return hf(tokens, use_cache=True, **{key: cache}).logits[:, -1]


def logits_max_difference(hf, engine, prompt, steps=16) -> float:
    from transformers import DynamicCache

    from memwall.engine import decode_step, prefill

    ref_cache, cache = DynamicCache(), engine.new_cache(max_tokens=prompt.shape[1] + steps + 1)
    with torch.inference_mode():
        ours, ref = prefill(engine, prompt, cache), hf_step(hf, prompt, ref_cache)
        worst = (ours - ref).abs().max().item()
        for _ in range(steps):
            token = ref.argmax(-1)
            ours, ref = decode_step(engine, token, cache), hf_step(hf, token[:, None], ref_cache)
            worst = max(worst, (ours - ref).abs().max().item())
    return worst


def greedy_agreement(hf, engine, prompt, tokens=GREEDY_TOKENS) -> dict:
    from transformers import GenerationConfig

    from memwall.engine import generate

    config = GenerationConfig(
        max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    with torch.inference_mode():
        theirs = hf.generate(
            prompt, attention_mask=torch.ones_like(prompt), generation_config=config
        )
        ours = generate(engine, prompt[0], tokens).tokens
        reference = theirs[0, prompt.shape[1] :].tolist()
        prefix = next((i for i, (a, b) in enumerate(zip(ours, reference)) if a != b), tokens)
        # Teacher forcing: both read the reference sequence; compare their next-token choices.
        hf_top1 = hf(theirs[:, :-1]).logits.argmax(-1)
        our_top1 = engine(theirs[:, :-1]).argmax(-1)
        agreement = (hf_top1 == our_top1).float().mean().item()
    return {
        "identical_prefix": prefix,
        "tokens": tokens,
        "teacher_forced_top1_agreement": agreement,
    }


def check_correctness(device: str, greedy_tokens: int = GREEDY_TOKENS) -> dict:
    from memwall import models
    from memwall.engine import Transformer

    hf, tokenizer = models.load("smollm2-135m")
    hf = hf.to(device)
    prompt = tokenizer("The memory wall is", return_tensors="pt")["input_ids"].to(device)
    fp32_diff = logits_max_difference(hf, Transformer.from_hf(hf), prompt)
    hf16 = hf.to(torch.bfloat16)
    greedy = greedy_agreement(hf16, Transformer.from_hf(hf16), prompt, greedy_tokens)
    return {
        "fp32_logits_max_abs_diff": fp32_diff,
        "fp32_tolerance": FP32_TOLERANCE,
        "fp32_ok": fp32_diff < FP32_TOLERANCE,
        "bf16_greedy": greedy,
        "bf16_ok": greedy["teacher_forced_top1_agreement"] >= 0.95,
    }


def speed_model(device: str) -> str:
    free = (
        torch.cuda.get_device_properties(device).total_memory if device.startswith("cuda") else 8e9
    )
    for spec, billions in SPEED_MODELS:
        if 2 * billions * 1e9 * 2 < 0.85 * free:  # hf model + engine copy, 2 bytes per parameter
            return spec
    return SPEED_MODELS[-1][0]


def check_speed(device: str, dtype: str, model: str, new_tokens: int, repeats: int) -> dict:
    from memwall.bench import bench_decode

    return bench_decode(
        f"random:{model}",
        "compare",
        device=device,
        dtype=dtype,
        prompt_tokens=32,
        new_tokens=new_tokens,
        repeats=repeats,
        warmup=1,
        progress=False,
    )


def markdown(report: dict) -> str:
    c, s = report["correctness"], report["speed"]
    greedy = c["bf16_greedy"]
    lines = [
        f"GPU check on {s['device_name']} (torch {s['torch_version']})",
        "",
        "| check | result |",
        "|---|---|",
        f"| SmolLM2-135M fp32 logits, max abs diff vs transformers | {c['fp32_logits_max_abs_diff']:.2e} "
        f"({'ok' if c['fp32_ok'] else 'FAIL'}, tolerance {c['fp32_tolerance']:.0e}) |",
        f"| SmolLM2-135M bf16 greedy: identical prefix | {greedy['identical_prefix']}/{greedy['tokens']} tokens |",
        f"| SmolLM2-135M bf16 top-1 agreement (teacher forced) | {greedy['teacher_forced_top1_agreement']:.1%} "
        f"({'ok' if c['bf16_ok'] else 'FAIL'}) |",
        "",
        f"Batch-1 decode, {s['model']} (random weights), {s['dtype']}, {s['prompt_tokens']}-token prompt, "
        f"{s['new_tokens']} new tokens, median of {s['repeats']}:",
        "",
        "| engine | ms/token | tok/s | GB read/step | achieved GB/s | ceiling tok/s | fraction of ceiling |",
        "|---|---|---|---|---|---|---|",
    ]
    for engine in ("memwall", "hf"):
        r = s[engine]
        lines.append(
            f"| {engine} | {r['ms_per_token']:.2f} | {r['tok_per_s']:.1f} | {r['bytes_per_step'] / 1e9:.2f} | "
            f"{r['achieved_bandwidth_bytes_per_s'] / 1e9:.0f} | {r['roofline_tok_per_s']:.1f} | "
            f"{r['fraction_of_roofline']:.1%} |"
        )
    lines += [
        "",
        f"Measured device bandwidth: {s['memwall']['measured_bandwidth_bytes_per_s'] / 1e9:.0f} GB/s; "
        f"memwall / transformers tok/s: {s['memwall_over_hf_tok_per_s']:.2f}x",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="default: a record in benchmarks/results")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--greedy-tokens", type=int, default=GREEDY_TOKENS, help="bf16 greedy tokens compared"
    )
    parser.add_argument(
        "--model", help="catalog spec to time (default: the largest Llama the GPU holds twice)"
    )
    parser.add_argument(
        "--allow-cpu", action="store_true", help="dry run on CPU (only to test this script)"
    )
    args = parser.parse_args(argv)

    if torch.cuda.is_available():
        device = "cuda"
        dtype = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    elif args.allow_cpu:
        device, dtype = "cpu", "fp32"
    else:
        print(
            f"gpu_check: no CUDA GPU visible to torch {torch.__version__} (CUDA build: "
            f"{torch.version.cuda or 'none'}); nothing to check. Run it on a machine with an NVIDIA GPU "
            "and a CUDA build of torch.",
            file=sys.stderr,
        )
        return 1
    start = time.perf_counter()
    model = args.model or speed_model(device)
    print(f"gpu_check: correctness on {device}...", file=sys.stderr, flush=True)
    report = {"correctness": check_correctness(device, args.greedy_tokens)}
    print(f"gpu_check: decode speed of random:{model} in {dtype}...", file=sys.stderr, flush=True)
    report["speed"] = check_speed(device, dtype, model, args.new_tokens, args.repeats)
    report["wall_seconds"] = time.perf_counter() - start
    table = markdown(report)
    report["markdown"] = table
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
    elif device == "cuda":
        from memwall.bench.records import save_record

        args.out = save_record(report, "gpu_check")
    print(table)
    written = f"written to {args.out}" if args.out else "no record written (a CPU dry run)"
    print(f"\n{written} in {report['wall_seconds']:.0f} s", file=sys.stderr)
    return 0 if report["correctness"]["fp32_ok"] and report["correctness"]["bf16_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
