"""`memwall bench batch`: decode throughput and latency against batch size, beside the cost model.

One decode step for B sequences reads every weight once, plus each sequence's KV cache, and does
2 x parameters FLOPs per sequence (Pope et al. 2022). The roofline therefore predicts

    step time >= max(bytes per step / bandwidth, FLOPs per step / peak FLOP/s)

so total tokens/s = B / step time grows almost B-fold while the weights dominate the bytes, and
stops growing once the FLOPs (past the ridge point) or the KV cache (long contexts) take over.
This module times memwall's batched decode for each B and prints that prediction next to it,
using FLOP/s measured in the same process (`memwall.machine.measure`) and the bandwidth probed
right before each timed repeat (`memwall.machine.probe`): each row's fraction of the prediction is
the median over its (probe, work) pairs.

The cache is filled with `context` random keys/values per sequence instead of a real prefill: a
step's time depends on how many bytes and FLOPs it has, not on their values, and a prefill of
32 x 2048 tokens would take minutes on a CPU.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
import warnings

import torch

from memwall.bench import harness, workload
from memwall.machine import probe as roofline_probe
from memwall.machine.memory import check_fits
from memwall.validate import count

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32)


def parse_batches(text: str) -> list[int]:
    """ "1,2,4" -> [1, 2, 4]; a ValueError for anything that is not a list of positive integers."""
    try:
        batches = [int(part) for part in str(text).split(",") if part.strip()]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        raise ValueError(
            f"--batch must be a comma-separated list of positive integers, e.g. 1,2,4,8; got {text!r}"
        )
    return batches


def cache_with_context(engine_model, batch: int, context: int, max_tokens: int, generator):
    """A KV cache for `batch` sequences that already holds `context` random tokens each, made on
    the model's device (`generator` must live there too)."""
    needed = engine_model.new_cache(batch=1, max_tokens=1).nbytes * batch * max_tokens
    device = next(engine_model.parameters()).device
    check_fits(needed, device, f"a KV cache of {batch} x {max_tokens} tokens",
                       "lower --batch or the context")  # fmt: skip
    cache = engine_model.new_cache(batch=batch, max_tokens=max_tokens)
    if context:
        # A static cache (the compiled path's) keeps one tensor per layer; the readable one, one
        # for all layers. Either way the token axis is the second to last.
        if hasattr(cache, "layer_keys"):
            buffers = (*cache.layer_keys, *cache.layer_values)
        else:
            buffers = (cache.keys, cache.values)
        for buffer in buffers:
            buffer[..., :context, :].normal_(generator=generator)
        cache.length = context
    return cache


def model_device(engine_model) -> torch.device:
    return next(engine_model.parameters()).device


@torch.inference_mode()
def time_decode_steps(
    engine_model, batch: int, context: int, new_tokens: int, seed: int = 0
) -> dict:
    """Median seconds of one decode step for `batch` sequences that each hold `context` cached tokens."""
    device = model_device(engine_model)
    generator = torch.Generator(device=device).manual_seed(seed)  # random numbers made in place
    cache = cache_with_context(engine_model, batch, context, context + new_tokens, generator)
    vocab = engine_model.lm_head.out_features
    tokens = torch.randint(0, vocab, (batch, 1), generator=generator, device=device)
    times = []
    for _ in range(new_tokens):
        harness.synchronize(device)
        start = time.perf_counter()
        tokens = engine_model(tokens, cache)[:, -1:].argmax(-1)
        harness.synchronize(device)
        times.append(time.perf_counter() - start)
    times.sort()
    return {"step_s": times[len(times) // 2]}


def predicted(spec, hardware, dtype: str, batch: int, context: int) -> dict:
    """The cost model's ledger and roofline bound for one decode step at this batch and context."""
    from memwall import cost

    step = cost.step(
        spec,
        batch=batch,
        context=context,
        new_tokens=1,
        weight_dtype=dtype,
        count_input_embedding=False,
    )
    seconds = cost.step_time_lower_bound(step, hardware)
    return {
        "predicted_weight_bytes": step.weight_bytes,
        "predicted_kv_bytes": step.kv_bytes,
        "predicted_bytes_per_step": step.total_bytes,
        "predicted_flops_per_step": step.flops,
        "predicted_step_ms": seconds * 1e3,
        "predicted_tok_per_s": batch / seconds,
        "predicted_bound": "memory"
        if cost.memory_time(step, hardware) >= cost.compute_time(step, hardware)
        else "compute",
    }


def bench_batch(
    model="smollm2-135m",
    batches=DEFAULT_BATCHES,
    *,
    context: int = 32,
    new_tokens: int = 16,
    device: str | None = None,
    dtype: str | None = None,
    repeats: int = 3,
    warmup: int = 1,
    hardware=None,
    progress: bool | None = None,
    probe=None,
    fast: bool = False,
) -> dict:
    """Time batched decode for each batch size; return a dict with one row per B.

    model: a name ("smollm2-135m", "random:llama-3-8b") or a loaded transformers model.
    hardware: a `memwall.hardware.Hardware` for a fixed prediction; default: FLOP/s measured here,
        and the bandwidth probed before every repeat (`probe`, default a `RooflineProbe`).
    fast: time memwall's speed path for the device (`accelerate`: the fused C step on a CPU, the
        compiled step replayed as CUDA graphs on a GPU) instead of the readable engine.
    """
    batches = [count("batch", b, 1) for b in batches]
    count("context", context, 0)
    count("new_tokens", new_tokens, 1)
    from memwall.engine import Transformer
    from memwall.specs import ModelSpec

    if isinstance(model, str):
        device = harness.resolve_device(device)
        dtype = harness.resolve_dtype(dtype, device)
        name, (hf_model, _) = model, workload.load_model(model, dtype, device)
    else:
        hf_model, name = model, getattr(model.config, "_name_or_path", type(model).__name__)
        parameter = next(hf_model.parameters())
        device, dtype = str(parameter.device), harness.dtype_name(parameter.dtype)
    config = hf_model.config
    if context + new_tokens > config.max_position_embeddings:
        raise ValueError(
            f"context + new_tokens = {context + new_tokens} exceeds the model's "
            f"context of {config.max_position_embeddings} tokens."
        )
    spec = ModelSpec.from_hf_config(config, name=name)
    engine_model = Transformer.from_hf(hf_model)
    del hf_model
    if fast:  # the device's speed path: the C step on a CPU, CUDA graphs on a GPU
        from memwall.engine.accelerate import accelerate

        engine_model = accelerate(engine_model)
    if hardware is None:
        from memwall.machine.microbench import measure

        hardware = measure(device).as_hardware()
        probe = probe or roofline_probe.RooflineProbe(device)

    runs = {
        b: (lambda b=b: time_decode_steps(engine_model, b, context, new_tokens, seed=b))
        for b in batches
    }
    samples, probes = harness.run_with_probe(
        runs, repeats, warmup, f"batch {name}", progress, probe
    )
    if probes:  # predict with the bandwidth of this run, not of an earlier one
        hardware = dataclasses.replace(hardware, memory_bandwidth=statistics.median(probes))
    weight_bytes = engine_model.weight_bytes_per_step()
    kv_per_token = engine_model.new_cache(batch=1, max_tokens=1).nbytes
    mean_context = context + (new_tokens + 1) / 2  # step j attends context + j positions
    rows = []
    for b in batches:
        step_s = harness.medians(samples[b])["step_s"]
        bytes_per_step = weight_bytes + b * mean_context * kv_per_token
        rows.append(
            {
                "batch": b,
                "tok_per_s": b / step_s,
                "ms_per_token": step_s * 1e3,
                "weight_bytes": weight_bytes,
                "kv_bytes": b * mean_context * kv_per_token,
                "bytes_per_step": bytes_per_step,
                "achieved_bandwidth_bytes_per_s": bytes_per_step / step_s,
                **predicted(spec, hardware, dtype, b, round(mean_context)),
                "ms_per_token_repeats": [s["step_s"] * 1e3 for s in samples[b]],
            }
        )
    for row in rows:
        row["fraction_of_prediction"] = _fraction(row, samples[row["batch"]], hardware, dtype)
        row["fraction_of_roofline"] = row["fraction_of_prediction"]
        row["speedup_over_first"] = row["tok_per_s"] / rows[0]["tok_per_s"]
    spread = roofline_probe.spread_fields(probes)
    message = roofline_probe.warn_if_unstable(probes, f"bench batch {name}")
    if message:
        spread["roofline_warning"] = message
    return {
        "model": name,
        **harness.environment(device),
        "dtype": dtype,
        "engine": "memwall-fast" if fast else "memwall",
        "context": context,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "bandwidth_bytes_per_s": hardware.memory_bandwidth,
        "peak_flops": hardware.peak_flops.get(dtype, max(hardware.peak_flops.values())),
        **spread,
        "rows": rows,
    }


def _fraction(row: dict, samples: list[dict], hardware, dtype: str) -> float:
    """tok/s over the predicted ceiling min(memory roof, compute roof): the median over the row's
    (probe, work) pairs when the bandwidth was probed, else against the fixed `hardware`."""
    from memwall import cost

    probes = [s["probe_bandwidth"] for s in samples if "probe_bandwidth" in s]
    if not probes:
        return row["tok_per_s"] / row["predicted_tok_per_s"]
    batch = row["batch"]
    peak = cost.peak_flops(hardware, cost.compute_dtype_for(dtype))
    fractions = roofline_probe.paired_fractions(
        [batch / (s["step_s"]) for s in samples],
        probes,
        row["predicted_bytes_per_step"] / batch,
        batch * peak / row["predicted_flops_per_step"],
    )
    return statistics.median(fractions)


# ---- command line ------------------------------------------------------------------------------


def add_cli(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "batch",
        help="decode tok/s and latency against batch size, next to the cost model",
        description="Time batched greedy decode for each batch size; report total tok/s, per-request "
        "ms per token, bytes per step and the roofline prediction from measured bandwidth/FLOP/s.",
    )
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="model name, or random:<catalog spec> for random weights (e.g. random:llama-3-8b)",
    )
    parser.add_argument(
        "--batch",
        default=",".join(map(str, DEFAULT_BATCHES)),
        help="comma-separated batch sizes (default 1,2,4,8,16,32)",
    )
    parser.add_argument(
        "--context",
        type=int,
        default=32,
        help="cached tokens per sequence before the timed steps (default 32); "
        "raise it to see the KV cache take over from the weights",
    )
    parser.add_argument(
        "--new-tokens", type=int, default=16, help="decode steps timed per run (default 16)"
    )
    parser.add_argument(
        "--device", help=f"{' or '.join(harness.DEVICES)} (default: cuda if available)"
    )
    parser.add_argument(
        "--dtype", help=f"{', '.join(harness.DTYPES)} (default: fp32 on CPU, bf16 on CUDA)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per batch size; medians (default 3)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument(
        "--fast",
        action="store_true",
        help="time memwall's speed path for the device (the layers looped in C on a CPU, the "
        "compiled step as CUDA graphs on a GPU) instead of the readable engine",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run_cli)


def run_cli(args) -> int:
    with warnings.catch_warnings():  # the spread is printed as one plain line, at the end
        warnings.simplefilter("ignore", roofline_probe.RooflineSpreadWarning)
        result = _run(args)
    _print(result, args.json)
    if "roofline_warning" in result:
        print(f"memwall {result['roofline_warning']}", file=sys.stderr)
    return 0


def _run(args) -> dict:
    return bench_batch(
        args.model,
        parse_batches(args.batch),
        context=args.context,
        new_tokens=args.new_tokens,
        device=args.device,
        dtype=args.dtype,
        repeats=args.repeats,
        warmup=args.warmup,
        fast=args.fast,
    )


def _print(result: dict, as_json: bool) -> None:
    if as_json:
        harness.print_result(result, as_json=True)
        return
    shown = {k: v for k, v in result.items() if k not in ("rows", "roofline_warning")}
    harness.print_result(shown, as_json=False)  # the warning is printed last, on stderr
    print(
        f"{'B':>4} {'tok/s':>9} {'ms/token':>9} {'MB/step':>9} {'GB/s':>7} {'predicted tok/s':>16} "
        f"{'bound':>8} {'of pred.':>9} {'x B=' + str(result['rows'][0]['batch']):>7}"
    )
    for r in result["rows"]:
        print(
            f"{r['batch']:>4} {r['tok_per_s']:>9.1f} {r['ms_per_token']:>9.1f} {r['bytes_per_step'] / 1e6:>9.1f} "
            f"{r['achieved_bandwidth_bytes_per_s'] / 1e9:>7.1f} {r['predicted_tok_per_s']:>16.1f} "
            f"{r['predicted_bound']:>8} {r['fraction_of_prediction']:>9.0%} {r['speedup_over_first']:>7.2f}"
        )
