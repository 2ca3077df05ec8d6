"""`memwall bench decode`: batch-1 decode speed, beside transformers and the bandwidth roofline.

A decode step reads every weight once plus the KV cache so far, so on any machine

    tokens/s  <=  measured memory bandwidth / bytes per step          (the roofline ceiling)

with bytes per step = weight bytes + KV bytes at the step's context. This module times memwall's
engine and/or transformers' `generate` on the same model and prompt (greedy, exactly
`new_tokens` tokens, no early stop), probes the bandwidth right before every timed repeat
(`memwall.machine.probe`), and reports where each lands under the ceiling, in the manner of
gpt-fast's "bandwidth achieved" line. The ceiling is min(memory roof, compute roof); the compute
roof (FLOPs per token from `memwall.cost`, peak from `memwall.machine.measure`) only matters on
machines whose matmuls are slow for their bandwidth.

Both engines are timed the same way: TTFT from the call to the first generated token, and time
per output token as (time of the last token - time of the first) / (new_tokens - 1).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import time
import warnings

import torch

from memwall.bench import harness, workload
from memwall.machine import probe as roofline_probe
from memwall.validate import count

ENGINES = ("memwall", "hf")
FAST_CHOICES = ("off", "on", "both")


def bench_decode(
    model="smollm2-135m",
    engine: str = "memwall",
    *,
    tokenizer=None,
    device: str | None = None,
    dtype: str | None = None,
    prompt_tokens: int = 32,
    new_tokens: int = 128,
    repeats: int = 3,
    warmup: int = 1,
    bandwidth: float | None = None,
    progress: bool | None = None,
    quant: str | None = None,
    group_size: int = 32,
    peak_flops: float | None = None,
    probe=None,
    fast: str = "off",
    memwall_model=None,
) -> dict:
    """Time batch-1 greedy decode and return a dict of medians and roofline figures.

    model: a name ("smollm2-135m", "random:llama-3-8b"), or an already loaded transformers model
        (then `device`/`dtype` are taken from it and `tokenizer` is used for the prompt).
    engine: "memwall", "hf" (transformers' generate) or "compare" (both, interleaved, plus the
        ratio memwall tok/s / hf tok/s).
    bandwidth: bytes/s for a fixed roofline; default: probed before every timed repeat (`probe`,
        default a `RooflineProbe` on `device`), each repeat's fraction taken from its own pair.
    peak_flops: FLOP/s for the compute roof; default `memwall.machine.measure(device)` when the
        bandwidth is probed, none (memory roof alone) when a fixed `bandwidth` is given.
    quant: "int8" or "int4" (with `group_size`) quantizes memwall's engine weight-only
        (`memwall.engine.quant.quantize`, chapter 7); transformers stays in `dtype`. A list such as
        ["none", "int8", "int4"] times each format side by side, interleaved, in one process (engine
        "memwall" only): one sub-dict per format ("memwall", "memwall-int8", "memwall-int4-g32")
        and `tok_per_s_over_first`, each format's tokens/s over the first one's.
    memwall_model: an engine already built from `model` (e.g. `shared_engine(model)`), timed
        instead of a fresh copy, so a notebook does not hold the weights twice.
    fast: "on" times memwall's speed path for the device (`accelerate`: the fused C step on a
        CPU, the compiled step replayed as CUDA graphs on a GPU) instead of the readable engine;
        "both" times the two side by side ("...-fast" labels).
    """
    if fast not in FAST_CHOICES:
        raise ValueError(f"Unknown fast {fast!r}; choose from {', '.join(FAST_CHOICES)}.")
    if engine not in (*ENGINES, "compare"):
        raise ValueError(
            f"Unknown engine {engine!r}; choose from {', '.join((*ENGINES, 'compare'))}."
        )
    count("prompt_tokens", prompt_tokens, 1)
    count("new_tokens", new_tokens, 2)  # one decode step at least, after the first token
    engines = ENGINES if engine == "compare" else (engine,)
    quants = _parse_quants(quant)
    if quants != [None] and "memwall" not in engines:
        raise ValueError("quant applies to memwall's engine; use engine='memwall' or 'compare'.")
    if fast != "off" and "memwall" not in engines:
        raise ValueError("fast applies to memwall's engine; use engine='memwall' or 'compare'.")
    wrappers = {"off": [False], "on": [True], "both": [False, True]}[fast]
    side_by_side = len(quants) * len(wrappers) > 1
    if side_by_side and engine != "memwall":
        raise ValueError("several quant formats are timed side by side with engine='memwall' only.")

    if isinstance(model, str):
        device = harness.resolve_device(device)
        dtype = harness.resolve_dtype(dtype, device)
        name = model
        hf_model, tokenizer = workload.load_model(model, dtype, device)
    else:
        hf_model, name = model, getattr(model.config, "_name_or_path", type(model).__name__)
        parameter = next(hf_model.parameters())
        device, dtype = str(parameter.device), harness.dtype_name(parameter.dtype)
    config = hf_model.config
    if prompt_tokens + new_tokens > config.max_position_embeddings:
        raise ValueError(
            f"prompt_tokens + new_tokens = {prompt_tokens + new_tokens} exceeds the model's "
            f"context of {config.max_position_embeddings} tokens."
        )
    prompt = workload.make_prompt(prompt_tokens, config.vocab_size, tokenizer)

    runs, weight_bytes, kv_per_token = {}, {}, {}
    if "memwall" in engines:
        from memwall.engine import Transformer
        from memwall.engine.quant import quantize

        base = memwall_model if memwall_model is not None else Transformer.from_hf(hf_model)
        in_place = not side_by_side and memwall_model is None  # never change the caller's engine
        for q in quants:
            label = (
                "memwall"
                if q is None or not side_by_side
                else f"memwall-{_quant_dtype(q, group_size)}"
            )
            # One format: quantize in place, so a large model is never held twice.
            variant = (
                base if q is None else quantize(base, q, group_size=group_size, inplace=in_place)
            )
            for wrapped in wrappers:
                timed, tag = variant, label + ("-fast" if wrapped and fast == "both" else "")
                if wrapped:  # the device's speed path: the C step, or CUDA graphs
                    from memwall.engine.accelerate import accelerate

                    timed = accelerate(variant)
                runs[tag] = lambda m=timed: time_memwall(m, prompt, new_tokens)
                weight_bytes[tag] = variant.weight_bytes_per_step()
                kv_per_token[tag] = variant.new_cache(batch=1, max_tokens=1).nbytes  # real tensors
        if "hf" not in engines and isinstance(model, str):
            hf_model = None  # we loaded it: free it, so an 8B model is never held twice
    if "hf" in engines:
        runs["hf"] = lambda: time_hf(hf_model, prompt, new_tokens)
        weight_bytes["hf"] = workload.hf_weight_bytes_per_step(hf_model)
        kv_per_token["hf"] = workload.kv_bytes_per_token(
            config, torch.finfo(harness.DTYPES[dtype]).bits // 8
        )

    if bandwidth is None and probe is None:
        if peak_flops is None:
            peak_flops = measured_peak_flops(device, dtype)
        probe = roofline_probe.RooflineProbe(device)
    samples, probes = harness.run_with_probe(
        runs, repeats, warmup, f"decode {name}", progress, probe
    )
    flops_per_token = _flops_per_token(config, prompt_tokens + new_tokens / 2)
    compute_roof = peak_flops / flops_per_token if peak_flops else None

    shared = {
        "model": name,
        **harness.environment(device),
        "dtype": dtype,
        "prompt_tokens": prompt_tokens,
        "new_tokens": new_tokens,
        "repeats": repeats,
        "warmup": warmup,
        "flops_per_token": flops_per_token,
        "peak_flops": peak_flops,
        **roofline_probe.spread_fields(probes),
    }
    message = roofline_probe.warn_if_unstable(probes, f"bench decode {name}")
    if message:
        shared["roofline_warning"] = message
    per_engine = {
        e: summarize(
            e,
            samples[e],
            weight_bytes[e],
            kv_per_token[e],
            prompt_tokens,
            new_tokens,
            bandwidth,
            compute_roof,
        )
        for e in runs
    }
    if side_by_side:
        for label, q in zip(runs, quants):
            per_engine[label]["cost_model_weight_bytes"] = _cost_model_weight_bytes(
                config, _quant_dtype(q, group_size) or dtype
            )
        first = per_engine[next(iter(runs))]["tok_per_s"]
        return {
            "engine": "memwall",
            **shared,
            **per_engine,
            "tok_per_s_over_first": {
                label: v["tok_per_s"] / first for label, v in per_engine.items()
            },
        }
    quant = quants[0]
    shared["cost_model_weight_bytes"] = _cost_model_weight_bytes(
        config, _quant_dtype(quant, group_size) or dtype
    )
    if quant is not None:
        shared["quant"] = _quant_dtype(quant, group_size)
    if engine != "compare":
        return {"engine": engine, **shared, **per_engine[engine]}
    ratio = per_engine["memwall"]["tok_per_s"] / per_engine["hf"]["tok_per_s"]
    return {"engine": "compare", **shared, **per_engine, "memwall_over_hf_tok_per_s": ratio}


def summarize(
    engine: str,
    samples: list[dict],
    weight_bytes: int,
    kv_bytes_per_token: int,
    prompt_tokens: int,
    new_tokens: int,
    bandwidth: float | None,
    compute_roof_tok_per_s: float | None = None,
) -> dict:
    """Medians over repeats, and the bytes a step moves at the mean context of the decode steps.

    When the samples carry a "probe_bandwidth" (probed right before each), each repeat's fraction
    of the roofline comes from its own pair and the median of those is reported; `bandwidth` is
    then the median probe.
    """
    median = harness.medians(samples)
    # Decode step j (j = 1 .. new_tokens - 1) attends prompt_tokens + j positions: mean P + N/2.
    mean_context = prompt_tokens + new_tokens / 2
    kv_bytes = kv_bytes_per_token * mean_context
    bytes_per_step = weight_bytes + kv_bytes
    tok_per_s = 1 / median["tpot_s"]
    pairs = {}
    probes = [s["probe_bandwidth"] for s in samples if "probe_bandwidth" in s]
    if probes:
        fractions = roofline_probe.paired_fractions(
            [1 / s["tpot_s"] for s in samples], probes, bytes_per_step, compute_roof_tok_per_s
        )
        bandwidth = statistics.median(probes)
        pairs = {"fraction": statistics.median(fractions)}
    return {
        "engine": engine,
        "ttft_ms": median["ttft_s"] * 1e3,
        "ms_per_token": median["tpot_s"] * 1e3,
        "tok_per_s": tok_per_s,
        "weight_bytes": weight_bytes,
        "kv_bytes_per_token": kv_bytes_per_token,
        "mean_context": mean_context,
        "kv_bytes": kv_bytes,
        "bytes_per_step": bytes_per_step,
        **harness.roofline_fields(
            tok_per_s, bytes_per_step, bandwidth, compute_roof_tok_per_s, **pairs
        ),
        "ms_per_token_repeats": [s["tpot_s"] * 1e3 for s in samples],
        **({"fraction_of_roofline_repeats": fractions} if probes else {}),
    }


def measured_peak_flops(device: str, dtype: str) -> float | None:
    """This device's matmul FLOP/s for `dtype` from `memwall.machine.measure` (cached per process);
    fp32's rate for a dtype it did not measure (a CPU without native bf16 is no faster at it)."""
    from memwall.machine.microbench import measure

    flops = measure(device).flops
    return flops.get(dtype) or flops.get("fp32")


def _flops_per_token(config, context: float) -> float:
    """Cost-model FLOPs of one batch-1 decode step at `context` cached tokens."""
    from memwall import cost
    from memwall.specs import ModelSpec

    return cost.step(ModelSpec.from_hf_config(config), context=round(context)).flops


def _parse_quants(quant) -> list[str | None]:
    """None, "int8", "none,int8" or ["none", "int4"] -> formats, None meaning unquantized."""
    if quant is None:
        return [None]
    parts = [part.strip() for part in quant.split(",")] if isinstance(quant, str) else list(quant)
    quants = [None if part in (None, "none") else part for part in parts]
    bad = [part for part in quants if part not in (None, "int8", "int4")]
    if not quants or bad or len(set(quants)) < len(quants):
        raise ValueError(
            f"quant must be int8, int4, or a list of distinct formats among none, int8, int4 "
            f"(e.g. none,int8,int4); got {quant!r}"
        )
    return quants


def _quant_dtype(quant: str | None, group_size: int) -> str | None:
    """The cost model's name for a weight format: "int8" (per channel) or "int4-g<group size>"."""
    return None if quant is None else quant if quant == "int8" else f"{quant}-g{group_size}"


def _cost_model_weight_bytes(config, dtype: str) -> float:
    """What `memwall.cost` predicts for the same shape: the engines' byte counts are checked against it."""
    from memwall import cost
    from memwall.specs import ModelSpec

    return cost.weight_bytes(ModelSpec.from_hf_config(config), dtype, count_input_embedding=False)


# ---- one timed generation per engine -----------------------------------------------------------


def time_memwall(engine_model, prompt: list[int], new_tokens: int) -> dict:
    from memwall.engine import generate

    out = generate(engine_model, prompt, new_tokens)  # greedy, no stop tokens: exactly new_tokens
    return {"ttft_s": out.ttft_s, "tpot_s": sum(out.step_times_s) / len(out.step_times_s)}


class _TokenClock:
    """A transformers streamer that only records when each token arrives (after a device sync)."""

    def __init__(self, device):
        self.device, self.times = device, []

    def put(self, value):
        harness.synchronize(self.device)
        self.times.append(time.perf_counter())

    def end(self):
        pass


@contextlib.contextmanager
def without_end_of_text(hf_model):
    """No end-of-text token while it lasts, so that `generate` makes exactly the tokens asked
    for: it fills one left None in its config from the model's own generation config."""
    config = hf_model.generation_config
    saved, config.eos_token_id = config.eos_token_id, None
    try:
        yield
    finally:
        config.eos_token_id = saved


@torch.inference_mode()
def time_hf(hf_model, prompt: list[int], new_tokens: int) -> dict:
    from transformers import GenerationConfig

    device = next(hf_model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    # No end-of-text token, so it generates exactly new_tokens; an explicit mask, so no prompt
    # token is mistaken for padding.
    config = GenerationConfig(
        max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    clock = _TokenClock(device)
    start = time.perf_counter()
    with without_end_of_text(hf_model):
        hf_model.generate(
            ids, attention_mask=torch.ones_like(ids), generation_config=config, streamer=clock
        )
    times = clock.times[1:]  # the first put() is the prompt itself
    if len(times) != new_tokens:
        raise RuntimeError(f"transformers generated {len(times)} tokens, expected {new_tokens}")
    return {"ttft_s": times[0] - start, "tpot_s": (times[-1] - times[0]) / (new_tokens - 1)}


# ---- command line ------------------------------------------------------------------------------


def add_cli(bench_subparsers) -> None:
    parser = bench_subparsers.add_parser(
        "decode",
        help="time batch-1 decode against transformers and the bandwidth roofline",
        description="Time batch-1 greedy decode; report tok/s, bytes per step and the fraction of the "
        "measured-bandwidth roofline.",
    )
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="model name, or random:<catalog spec> for random weights (e.g. random:llama-3-8b)",
    )
    parser.add_argument("--engine", choices=ENGINES, default="memwall", help="which engine to time")
    parser.add_argument(
        "--compare", action="store_true", help="time memwall and hf in one process, add the ratio"
    )
    parser.add_argument(
        "--device", help=f"{' or '.join(harness.DEVICES)} (default: cuda if available)"
    )
    parser.add_argument(
        "--dtype", help=f"{', '.join(harness.DTYPES)} (default: fp32 on CPU, bf16 on CUDA)"
    )
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompt length (default 32)")
    parser.add_argument(
        "--new-tokens", type=int, default=128, help="tokens generated per run (default 128)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="timed runs per engine; medians reported (default 3)"
    )
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs first (default 1)")
    parser.add_argument(
        "--quant",
        help="quantize memwall's engine weight-only: int8 (per channel) or int4 (per group); "
        "a list such as none,int8,int4 times the formats side by side, interleaved",
    )
    parser.add_argument("--group-size", type=int, help="int4 group size (default 32)")
    parser.add_argument(
        "--fast",
        choices=FAST_CHOICES,
        default="off",
        help="memwall's speed path for the device (the fused C step on a CPU, the compiled step "
        "as CUDA graphs on a GPU): off, on, or both side by side",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(run=run_cli)


def run_cli(args) -> int:
    with warnings.catch_warnings():
        # The spread is printed as one plain line below, not as a Python warning with a source line.
        warnings.simplefilter("ignore", roofline_probe.RooflineSpreadWarning)
        result = _run(args)
    shown = result if args.json else {k: v for k, v in result.items() if k != "roofline_warning"}
    harness.print_result(shown, args.json, columns=_columns(args, result))
    if "tok_per_s_over_first" in result and not args.json:
        print(
            "tok/s over the first format: "
            + ", ".join(
                f"{label} {ratio:.2f}x" for label, ratio in result["tok_per_s_over_first"].items()
            )
        )
    if "roofline_warning" in result:
        print(f"memwall {result['roofline_warning']}", file=sys.stderr)
    harness.warn_if_busy(result)
    return 0


def _columns(args, result):
    if args.compare:
        return list(ENGINES)
    return [key for key in result if key.startswith("memwall")] or None


def _run(args) -> dict:
    if args.group_size is not None and "int4" not in _parse_quants(args.quant):
        raise ValueError("--group-size applies to int4 weights; add --quant int4.")
    group_size = {} if args.group_size is None else {"group_size": args.group_size}
    return bench_decode(
        args.model,
        "compare" if args.compare else args.engine,
        device=args.device,
        dtype=args.dtype,
        prompt_tokens=args.prompt_tokens,
        new_tokens=args.new_tokens,
        repeats=args.repeats,
        warmup=args.warmup,
        quant=args.quant,
        fast=args.fast,
        **group_size,
    )
