"""The GPU check: memwall's compiled CUDA path, its correctness and its speed, in one run.

Run it through gpu_check.sh on a machine with an NVIDIA GPU and only torch and transformers (and
triton, which torch.compile uses) installed: every model here has random weights, since bytes are
bytes, so no model file or network is needed. Sections, in order of importance, each timed, each
allowed to fail on its own (its error is recorded), each skipped once the time budget is spent:

1. copy bandwidth (device-to-device, bytes read + written) and dense matmul FLOP/s in the dtype;
2. correctness on a small SmolLM2-wide model: readable engine against transformers (fp32 and
   bf16 logits), compiled against readable (fp32 logits and greedy tokens; bf16, int8 and int4
   logits), every comparison but the greedy one on the same tokens;
3. batch-1 decode of a Llama-3-8B shape (a smaller Llama where the GPU cannot hold its copies):
   readable eager, compiled bf16, int8, int4 (tinygemm, group 128), next to the copy bandwidth;
4. batch 1..256 with the compiled bf16 model, against the cost model's ceiling;
5. transformers' eager `generate` and its static-cache `generate` (compiled by transformers on a
   GPU) as peers, batch 1, same model and prompt;
6. every chapter executed on CUDA, only where a Jupyter stack (nbclient, jupytext, ipykernel)
   and the offline model are installed (benchmarks/gpu_kit.py carries them to a machine without
   them); otherwise `chapters_on_cuda_ok` is null. What each chapter printed is kept;
7. the server's engine: the continuous-batching scheduler's decode steps on its paged cache,
   compiled against readable (greedy tokens of a ragged stream, fp32) and timed at a few batch
   sizes on the speed model.

`--sections speed` runs 1-5, `--sections chapters` runs 6, `--sections server` runs 7; `--resume`
adds to the newest record of this machine (in `--results-dir`, or committed under
benchmarks/results by an earlier session), so they can run in calls, and sessions, of a device
tool that limits each one's time. What that record measured is kept (each section, decode
label, batch size, peer and chapter that finished), so a call cut short is finished by the next
one, not repeated.

Every section keeps the CUDA graph warnings it raised; `cudagraph_skips` in the summary counts
those of a graph skipped (0 expected): torch then runs that step launch by launch, correct and
slow, and says so only in a log line.

Writes benchmarks/results/gpu_check-<machine id>-<date>.json (after every section, so a run cut
short keeps what it measured; `--results-dir` to write elsewhere) and prints a markdown table.
`--allow-cpu` is a dry run with tiny shapes, to prove the script end to end without a GPU (with
`--sections chapters`, it runs the chapters on the CPU: a check of the kit, not of the chapters).
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import logging
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # memwall from this checkout, installed or not

from memwall.engine import Transformer, decode_step, generate, prefill  # noqa: E402
from memwall.engine.accelerate import accelerate  # noqa: E402
from memwall.engine.cuda import TinyGemmInt4Linear  # noqa: E402
from memwall.engine.quant import quantize  # noqa: E402
from memwall.specs import ModelSpec, get_spec  # noqa: E402

# (spec, parameters in billions): the first whose copies held at once fit in 85% of the GPU memory:
# transformers' and the engine's in 16 bits while the int8 copy is timed (a byte a weight).
BYTES_HELD_PER_PARAMETER = 2 + 2 + 1
SPEED_MODELS = (("llama-3-8b", 8.03), ("llama-3.2-3b", 3.21), ("llama-3.2-1b", 1.24))
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TINY = ModelSpec(  # the dry run's model for every section (widths that int4 group 128 divides)
    name="tiny", n_layers=2, d_model=128, n_heads=4, n_kv_heads=2, head_dim=32, d_ff=256,
    vocab_size=256, tied_embeddings=True, max_context=512,
)  # fmt: skip
SMALL = ModelSpec(  # SmolLM2-135M's widths and vocabulary, 4 layers: quick to compile
    name="smollm2-width-4-layers", n_layers=4, d_model=576, n_heads=9, n_kv_heads=3,
    head_dim=64, d_ff=1536, vocab_size=49152, tied_embeddings=True, max_context=2048,
    rope_theta=100000.0,
)  # fmt: skip
# Records committed from earlier sessions: `--resume` adds to this machine's newest one too, so
# that a session with little device time finishes what an earlier one on the same kind left.
COMMITTED = ROOT / "benchmarks" / "results"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def compiled(model):
    """The CUDA backend's compiled path: what `accelerate` picks for a model on a GPU, named
    explicitly so that the CPU dry run runs it too (the CPU's own backend is another thing)."""
    return accelerate(model, backend="compiled")


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def random_hf(spec, dtype, device, seed=0, sharpen=1.0):
    """A transformers Llama with `spec`'s shape and random weights on `device`; `sharpen` scales
    the matrices so that the logits are not nearly flat (where every greedy choice is a tie)."""
    from memwall import models

    hf = models.random_init(spec, dtype=dtype, device=device, seed=seed)
    if sharpen != 1.0:
        with torch.no_grad():
            for p in hf.parameters():
                if p.dim() == 2:
                    p.mul_(sharpen)
    return hf.eval()


# ---- 1. the device's roofs -----------------------------------------------------------------------


def roofs(device, dtype, quick: bool) -> dict:
    n = (64 << 20) if quick else (1 << 30)  # bytes per buffer: far past any cache
    src = torch.empty(n, dtype=torch.uint8, device=device).random_(0, 255)
    dst = torch.empty_like(src)
    copies = []
    for _ in range(6):
        sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        sync(device)
        copies.append(time.perf_counter() - start)
    del src, dst
    size = 1024 if quick else 8192
    a = torch.randn(size, size, dtype=DTYPES[dtype], device=device)
    b = torch.randn(size, size, dtype=DTYPES[dtype], device=device)
    matmuls = []
    for _ in range(6):
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        matmuls.append(time.perf_counter() - start)
    return {
        "copy_bandwidth_gbps": 2 * n / min(copies[1:]) / 1e9,  # read + written
        "copy_seconds": copies,
        "matmul_tflops": 2 * size**3 / min(matmuls[1:]) / 1e12,
        "matmul_dtype": dtype,
    }


# ---- 2. correctness ------------------------------------------------------------------------------


def stepwise(model, prompt, steps, forced=None):
    """Logits of a prefill and `steps` greedy decode steps [steps + 1, vocab], and the tokens.

    forced: tokens to feed instead of the model's own choices (another model's), so that logits
    compare on the same sequence: in 16 bits two correct models can break a near-tie apart, and
    their sequences would then part."""
    cache = model.new_cache(batch=1, max_tokens=prompt.shape[1] + steps + 1)
    with torch.inference_mode():
        logits = [model(prompt, cache, last_only=True)[:, -1]]
        for step in range(steps):
            token = logits[-1].argmax(-1) if forced is None else prompt.new_tensor([forced[step]])
            logits.append(model(token[:, None], cache)[:, -1])
    logits = torch.cat(logits).float()
    return logits, logits.argmax(-1).tolist()


def hf_stepwise(hf, prompt, tokens):
    """transformers' logits for the prompt then `tokens` fed one at a time (teacher forced)."""
    with torch.inference_mode():
        sequence = torch.cat([prompt, torch.tensor([tokens[:-1]], device=prompt.device)], 1)
        logits = hf(sequence).logits[0, prompt.shape[1] - 1 :].float()
    return logits


def compare(ours, ref) -> dict:
    return {
        "max_abs_diff": (ours - ref).abs().max().item(),
        "relative_max_diff": ((ours - ref).abs().max() / ref.abs().max()).item(),
        "top1_agreement": (ours.argmax(-1) == ref.argmax(-1)).float().mean().item(),
    }


def int4_group(model) -> int:
    """int4's group: 128, as tinygemm was first measured with, or the largest of its smaller
    groups that divides every layer's inputs (SmolLM2's width, 576, takes 64)."""
    widths = {m.in_features for m in model.modules() if hasattr(m, "in_features")}
    return next((g for g in (128, 64) if all(w % g == 0 for w in widths)), 32)


def check_correctness(spec, device, half, steps) -> dict:
    prompt = torch.tensor([list(range(11, 43))], device=device) % spec.vocab_size
    out = {"model": spec.name, "steps": steps}
    hf = random_hf(spec, torch.float32, device, seed=1, sharpen=4.0)
    readable = Transformer.from_hf(hf)
    ref_logits, ref_tokens = stepwise(readable, prompt, steps)
    out["fp32_readable_vs_hf"] = compare(ref_logits, hf_stepwise(hf, prompt, ref_tokens))
    fast_logits, fast_tokens = stepwise(compiled(readable), prompt, steps)
    out["fp32_compiled_vs_readable"] = compare(fast_logits, ref_logits)
    out["fp32_compiled_greedy_identical"] = fast_tokens == ref_tokens
    for fmt in ("int8", "int4"):
        quantized = quantize(readable, fmt, group_size=int4_group(readable), inplace=False)
        q_logits, q_tokens = stepwise(quantized, prompt, steps)
        fast_q = compiled(quantized)
        if fmt == "int4":  # layers on tinygemm (0 where torch has no kernel for this device)
            out["int4_tinygemm_layers"] = sum(
                isinstance(m, TinyGemmInt4Linear) for m in fast_q.modules()
            )
        q_compiled = stepwise(fast_q, prompt, steps, forced=q_tokens)[0]
        out[f"{fmt}_compiled_vs_readable"] = compare(q_compiled, q_logits)
        del quantized, fast_q
    hf16 = hf.to(DTYPES[half])
    readable16 = Transformer.from_hf(hf16)
    ref16, tokens16 = stepwise(readable16, prompt, steps)
    out[f"{half}_readable_vs_hf"] = compare(ref16, hf_stepwise(hf16, prompt, tokens16))
    out[f"{half}_compiled_vs_readable"] = compare(
        stepwise(compiled(readable16), prompt, steps, forced=tokens16)[0], ref16
    )
    out["prefill_attention_fused"] = prefill_attention_fused(spec, device, DTYPES[half])
    # Every comparison but the fp32 greedy one is on the same tokens. fp32 (int8's activations
    # too) differs by the order of sums; 16 bits (tinygemm's int4 rows too) by a few roundings of
    # 2^-8 each, a few percent of the largest logit; a wrong mask, slot or position by about
    # all of it. The top-1 agreements are recorded, not judged: in 16 bits a near-tie may go
    # either way.
    tolerances = {"fp32_readable_vs_hf": 1e-4, "fp32_compiled_vs_readable": 1e-4,
                  "int8_compiled_vs_readable": 1e-3, "int4_compiled_vs_readable": 0.15,
                  f"{half}_compiled_vs_readable": 0.15, f"{half}_readable_vs_hf": 0.15}  # fmt: skip
    out["ok"] = out["fp32_compiled_greedy_identical"] and all(
        out[name]["relative_max_diff"] < tolerance for name, tolerance in tolerances.items()
    )
    return out


def prefill_attention_fused(spec, device, dtype) -> bool | None:
    """Whether one of PyTorch's fused attention kernels takes the compiled path's prefill
    attention (a long prompt on the unfused one holds a [T, slots] score matrix per head). None
    off a GPU (a CPU's own fused kernel takes it either way)."""
    if torch.device(device).type != "cuda":
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from memwall.engine.cuda.step import attend_many

    tokens, slots = 64, 80  # a verify-like pass: 64 new tokens after 16 in the cache
    q = torch.randn(1, spec.n_heads, tokens, spec.head_dim, device=device, dtype=dtype)
    k, v = (torch.randn(1, spec.n_kv_heads, slots, spec.head_dim, device=device, dtype=dtype)
            for _ in range(2))  # fmt: skip
    visible = torch.arange(slots, device=device) <= torch.arange(16, slots, device=device)[:, None]
    fused = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION]
    try:
        with sdpa_kernel(fused):
            attend_many(q, k, v, visible[None, None])
        return True
    except RuntimeError:  # "No available kernel": only the unfused one would take it
        return False


# ---- 3. batch-1 decode speed ---------------------------------------------------------------------


def decode_timing(model, prompt, new_tokens, repeats) -> dict:
    """Median seconds per decode step of greedy `generate` (the first call, untimed, compiles and
    records the graphs); `generate` reads each token back, so every step's time is complete."""
    generate(model, prompt, new_tokens)
    runs = [
        statistics.median(generate(model, prompt, new_tokens).step_times_s) for _ in range(repeats)
    ]
    return {"step_s": statistics.median(runs), "step_s_repeats": runs}


def bytes_per_step(model, cache_tokens: int) -> int:
    """Weights plus the KV cache a step reads: the compiled path attends over the whole static
    cache (prompt + new tokens), the readable one over the tokens so far (counted the same here)."""
    kv_per_token = model.new_cache(batch=1, max_tokens=1).nbytes
    return model.weight_bytes_per_step() + cache_tokens * kv_per_token


def launches_per_step(run_steps, steps: int) -> dict | None:
    """CUDA runtime calls per decode step while `run_steps()` runs `steps` of them, from torch's
    profiler: a step replayed as a CUDA graph launches the graph and few kernels of its own, one
    that lost its graph launches hundreds (torch may drop a graph without a word: a positive
    check). None off a GPU."""
    if not torch.cuda.is_available():
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        run_steps()
        torch.cuda.synchronize()
    names = [event.name for event in profiler.events()]
    return {
        "graph_launches": sum(name == "cudaGraphLaunch" for name in names) / steps,
        "kernel_launches": sum("LaunchKernel" in name for name in names) / steps,
    }


def decode_launches(model, prompt, steps: int = 4) -> dict | None:
    """`launches_per_step` of batch-1 decode steps on a cache of the model's own, after two
    untimed steps (the graph is recorded on a new cache's first steps)."""
    device = next(model.parameters()).device
    cache = model.new_cache(batch=1, max_tokens=len(prompt) + steps + 3)
    with torch.inference_mode():
        token = prefill(model, torch.tensor([prompt], device=device), cache).argmax(-1)
        for _ in range(2):
            token = decode_step(model, token, cache).argmax(-1)

        def run_steps():
            nonlocal token
            for _ in range(steps):
                token = decode_step(model, token, cache).argmax(-1)

        return launches_per_step(run_steps, steps)


def check_decode(models, record, prompt, new_tokens, repeats, copy_gbps, budget) -> None:
    """Fills record["decode"]: the readable eager engine, its compiled wrapper, and int8 and int4
    compiled copies, at batch 1 (`models()` gives the engine and the wrapper). A label an earlier
    call measured (`--resume`) is kept."""
    results = record.setdefault("decode", {})
    cache_tokens = len(prompt) + new_tokens

    def run(label, make_model, tokens=new_tokens, runs=repeats):
        if measured(results.get(label)):
            return
        if budget.spent():
            results[label] = {"skipped": "time budget spent"}
            return
        model = make_model()
        started = time.perf_counter()
        timing = decode_timing(model, prompt, tokens, runs)
        step_bytes = bytes_per_step(model, cache_tokens)
        timing.update(
            compile_failure=getattr(model, "compile_failure", None),
            tok_per_s=1 / timing["step_s"],
            bytes_per_step=step_bytes,
            achieved_gbps=step_bytes / timing["step_s"] / 1e9,
            fraction_of_copy_bandwidth=step_bytes / timing["step_s"] / 1e9 / copy_gbps,
            wall_s=time.perf_counter() - started,  # compile and graph recording included
            launches_per_step=decode_launches(model, prompt),
        )
        results[label] = timing
        budget.save(record)
        budget.note(f"decode {label}: {timing['tok_per_s']:.1f} tok/s, {timing['wall_s']:.0f} s")

    # launch-bound: a few tokens are enough
    run("readable_eager", lambda: models()["engine"], tokens=min(new_tokens, 16), runs=1)
    run("compiled", lambda: models()["fast"])

    def quantized(fmt):
        engine = models()["engine"]
        return compiled(quantize(engine, fmt, group_size=int4_group(engine), inplace=False))

    for fmt in ("int8", "int4"):  # each copy let go once timed
        run(f"compiled_{fmt}", lambda fmt=fmt: quantized(fmt))


# ---- 4. batch 1..256 -----------------------------------------------------------------------------


def check_batches(models, spec, dtype, batches, context, new_tokens, roof, record, budget) -> None:
    """Fills record["batches"]: the compiled model (`models()["fast"]`) at each batch size, next
    to the cost model's ceiling. The batch sizes an earlier call measured (`--resume`) are kept."""
    from memwall import cost
    from memwall.bench.batch import time_decode_steps

    rows = record.setdefault("batches", {"context": context, "new_tokens": new_tokens, "rows": []})
    rows.pop("skipped_from_batch", None)
    if "out_of_memory_at_batch" in rows:  # an earlier call found the largest batch that fits
        return
    done = {row["batch"] for row in rows["rows"]}
    for batch in batches:
        if batch in done:
            continue
        if budget.spent():
            rows["skipped_from_batch"] = batch
            break
        fast = models()["fast"]
        try:
            time_decode_steps(fast, batch, context, new_tokens, seed=batch)  # records the graph
            step_s = statistics.median(
                time_decode_steps(fast, batch, context, new_tokens, seed=batch)["step_s"]
                for _ in range(3)
            )
        except torch.cuda.OutOfMemoryError:
            rows["out_of_memory_at_batch"] = batch
            break
        step = cost.step(spec, batch=batch, context=context + new_tokens // 2, new_tokens=1,
                         weight_dtype=dtype, count_input_embedding=False)  # fmt: skip
        ceiling_s = max(step.total_bytes / (roof["copy_bandwidth_gbps"] * 1e9),
                        step.flops / (roof["matmul_tflops"] * 1e12))  # fmt: skip
        rows["rows"].append(
            {
                "batch": batch,
                "step_s": step_s,
                "tok_per_s": batch / step_s,
                "ceiling_tok_per_s": batch / ceiling_s,
                "fraction_of_ceiling": ceiling_s / step_s,
                "bound": "memory" if step.total_bytes / (roof["copy_bandwidth_gbps"] * 1e9)
                >= step.flops / (roof["matmul_tflops"] * 1e12) else "compute",
            }
        )  # fmt: skip
        budget.save(record)
        budget.note(f"batch {batch}: {batch / step_s:.0f} tok/s")


# ---- 5. transformers as the peer -----------------------------------------------------------------


def hf_timing(hf, prompt, new_tokens, repeats, static: bool) -> dict:
    """transformers' greedy `generate`, eager (its dynamic cache) or with its static cache, which
    it compiles itself on a GPU (mode reduce-overhead); per-token times from a streamer that
    synchronises the device, as `memwall bench decode` times it."""
    from transformers import GenerationConfig

    from memwall.bench.decode import _TokenClock, without_end_of_text

    device = next(hf.parameters()).device
    ids = torch.tensor([prompt], device=device)
    options = {"cache_implementation": "static"} if static else {}
    config = GenerationConfig(
        max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0, **options
    )
    runs = []
    for attempt in range(repeats + 1):  # the first compiles (static) or warms up
        clock = _TokenClock(device)
        with torch.inference_mode(), without_end_of_text(hf):
            hf.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config,
                        streamer=clock)  # fmt: skip
        times = clock.times[1:]
        if len(times) != new_tokens:
            raise RuntimeError(f"transformers made {len(times)} of {new_tokens} tokens")
        if attempt:  # the median step, as memwall's are timed (a new cache's graph recorded once)
            runs.append(statistics.median(b - a for a, b in itertools.pairwise(times)))
    return {"step_s": statistics.median(runs), "step_s_repeats": runs,
            "tok_per_s": 1 / statistics.median(runs)}  # fmt: skip


# ---- 6. the chapters on CUDA ---------------------------------------------------------------------


def printed(notebook) -> list[str]:
    """What a notebook printed, cell by cell: its prose's verdicts, to read after the run."""
    texts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            text = output.get("text") or data.get("text/markdown") or data.get("text/plain")
            if text:
                texts.append(text if isinstance(text, str) else "".join(text))
    return texts


def check_chapters(device, budget, record, numbers=(), timeout_s=300) -> dict:
    """Execute every chapter with MEMWALL_DEVICE set to `device`: true only if all ran cleanly;
    null (None) where the Jupyter stack or the offline model is missing. Keeps what each chapter
    printed and how long it took; the record is saved after every chapter."""
    import importlib.util
    import os

    # A chapter run again (`--chapters`, `--resume`) replaces its earlier result only.
    earlier = record.get("chapters", {})
    kept = ("chapters", "seconds", "printed", "cudagraph_warnings_by_chapter")
    out = {key: dict(earlier.get(key, {})) for key in kept}
    out["chapters_on_cuda_ok"] = earlier.get("chapters_on_cuda_ok")
    missing = [
        m for m in ("nbclient", "jupytext", "ipykernel") if importlib.util.find_spec(m) is None
    ]
    if missing:
        return {**out, "reason": f"no {', '.join(missing)} here"}
    try:
        from memwall import models

        models.load("smollm2-135m")  # converted once here, not inside the first chapter
    except Exception as error:  # the chapters need the real model file
        return {**out, "reason": f"the offline model is missing: {error}"}
    import jupytext
    from nbclient import NotebookClient

    os.environ["MEMWALL_DEVICE"] = device
    # The kernels import memwall from this checkout, installed or not.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])
    )
    record["chapters"] = out
    paths = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.md"))
    for path in paths:
        # asked for by number; or, with none named, all but those that ran cleanly before
        asked = path.name[:2] in numbers if numbers else out["chapters"].get(path.name) != "ok"
        if not asked:
            continue
        if budget.spent():
            out["chapters"].setdefault(path.name, "skipped: time budget spent")
            continue
        budget.note(f"chapter {path.name}...")
        notebook = jupytext.read(path)
        client = NotebookClient(notebook, timeout=timeout_s, kernel_name="python3",
                                resources={"metadata": {"path": str(path.parent)}})  # fmt: skip
        started = time.perf_counter()
        try:
            client.execute()
            out["chapters"][path.name] = "ok"
        except Exception as error:
            out["chapters"][path.name] = f"{type(error).__name__}: {str(error)[-400:]}"
        out["seconds"][path.name] = time.perf_counter() - started
        out["printed"][path.name] = printed(notebook)
        # the kernel's CUDA graph warnings, which reach its stderr (see GraphWarnings)
        lines = [line for text in out["printed"][path.name] for line in text.splitlines()]
        warned = [line for line in lines if "[__cudagraphs]" in line]
        out["cudagraph_warnings_by_chapter"][path.name] = warned
        budget.save(record)
    # True only when every chapter ran cleanly; False when one failed; None while some have not run
    results = [out["chapters"].get(path.name, "not run") for path in paths]
    failed = any(v not in ("ok", "not run") and not v.startswith("skipped") for v in results)
    out["chapters_on_cuda_ok"] = False if failed else (all(v == "ok" for v in results) or None)
    return out


# ---- 7. the server's engine ----------------------------------------------------------------------


def ragged_stream(vocab_size: int, count: int = 12):
    """Requests of several prompt lengths arriving over time: joins, retirements, padded batches."""
    from memwall.engine.scheduler import Request

    g = torch.Generator().manual_seed(5)
    stream = []
    for i in range(count):
        length = int(torch.randint(1, 60, (1,), generator=g))
        prompt = torch.randint(0, vocab_size, (length,), generator=g).tolist()
        stream.append(Request(i, prompt, int(torch.randint(4, 40, (1,), generator=g)), 2 * i))
    return stream


def equal_requests(model, batch: int, prompt, new_tokens: int):
    """A scheduler with room for `batch` equal requests, and a function that runs them."""
    from memwall.engine.scheduler import Request, Scheduler

    blocks = batch * -(-(len(prompt) + new_tokens) // 16)
    scheduler = Scheduler(model, n_blocks=blocks, block_size=16, max_batch=batch)
    return scheduler, lambda: scheduler.run([Request(i, prompt, new_tokens) for i in range(batch)])


def scheduler_step_s(model, batch: int, prompt, new_tokens: int):
    """Median seconds of the scheduler's decode steps with `batch` equal requests running, and
    a function that runs them again. The first run, untimed, compiles and records the graphs its
    batch and table widths need on the scheduler's own paged pool, which later runs keep."""
    scheduler, run = equal_requests(model, batch, prompt, new_tokens)
    run()
    first = len(scheduler.step_times_s)
    run()
    # A run's first step admits and prefills; every later one decodes the whole batch (its
    # tokens read back).
    return statistics.median(scheduler.step_times_s[first + 1 :]), run


def check_server(device, dry, speed_spec, half, prompt, new_tokens, batches) -> dict:
    from memwall.engine.scheduler import Scheduler

    hf = random_hf(TINY if dry else SMALL, torch.float32, device, seed=2, sharpen=4.0)
    readable = Transformer.from_hf(hf)
    tokens = {}
    for name, model in (("readable", readable), ("compiled", compiled(readable))):
        scheduler = Scheduler(model, n_blocks=64, block_size=16, max_batch=6)
        tokens[name] = [r.tokens for r in scheduler.run(ragged_stream(hf.config.vocab_size))]
    out = {"greedy_identical": tokens["compiled"] == tokens["readable"], "rows": []}
    del hf, readable
    engine = Transformer.from_hf(random_hf(speed_spec, DTYPES[half], device))
    fast = compiled(engine)
    for batch in batches:
        readable_s, _ = scheduler_step_s(engine, batch, prompt, new_tokens)
        compiled_s, run = scheduler_step_s(fast, batch, prompt, new_tokens)
        out["rows"].append({"batch": batch, "readable_step_s": readable_s,
                            "compiled_step_s": compiled_s, "speedup": readable_s / compiled_s})  # fmt: skip
    # the last batch's steps once more, its graphs recorded before the profiler starts
    out["compiled_launches_per_step"] = launches_per_step(run, new_tokens - 1)
    return out


# ---- the record ----------------------------------------------------------------------------------


class Budget:
    """Wall-clock budget: sections not started once it is spent; the record saved as it grows."""

    def __init__(self, seconds: float, results_dir: Path | None, path: Path | None = None):
        self.start, self.seconds, self.results_dir = time.perf_counter(), seconds, results_dir
        self.path = path  # the record to rewrite; a new one is named on the first save

    def spent(self) -> bool:
        return time.perf_counter() - self.start > self.seconds

    def note(self, text: str) -> None:
        """A progress line with the seconds since the start: a call cut short by its time limit
        shows how far it got and what each step cost (to size the next call)."""
        print(f"gpu_check [{time.perf_counter() - self.start:.0f} s]: {text}", file=sys.stderr,
              flush=True)  # fmt: skip

    def save(self, record: dict) -> None:
        """The record's summary and table brought up to date, and written (a call stopped at any
        point leaves them current)."""
        record["wall_seconds"] = time.perf_counter() - self.start
        record["summary"] = summary(record)
        record["markdown"] = markdown(record)
        if self.results_dir is None:
            return
        from memwall.bench.records import save_record

        if self.path is None:
            self.path = save_record(record, "gpu_check", self.results_dir)
            saved = json.loads(self.path.read_text())  # the fingerprint and date it added
            record.update({k: saved[k] for k in ("machine", "machine_id", "date")})
        else:  # whole or not at all: `timeout` may stop the run mid-write
            partial = self.path.with_name(self.path.name + ".part")
            partial.write_text(json.dumps(record, indent=2, default=str) + "\n")
            partial.replace(self.path)


def summary(record: dict) -> dict:
    """The keys the issue asks for, from the raw timings (None where a section did not run)."""

    def tok_per_s(label):
        return record.get("decode", {}).get(label, {}).get("tok_per_s")

    def ratio(a, b):
        return a / b if a and b else None

    bf16 = tok_per_s("compiled")
    b64 = next((r for r in record.get("batches", {}).get("rows", []) if r["batch"] == 64), None)
    peers = record.get("peers", {})

    def replays_graph(launches):  # most steps (a new cache's first step records its graph)
        return None if not launches else launches["graph_launches"] >= 0.5

    # memwall's graphs only: the peers' warnings are transformers'
    parts = [v for k, v in record.items() if isinstance(v, dict) and k != "peers"]
    graph_warnings = [w for part in parts for w in part.get("cudagraph_warnings", [])]
    by_chapter = record.get("chapters", {}).get("cudagraph_warnings_by_chapter", {})
    graph_warnings += [w for warnings in by_chapter.values() for w in warnings]
    return {
        "device_name": record.get("device_name"),
        "copy_bandwidth_gbps": record.get("roofs", {}).get("copy_bandwidth_gbps"),
        "bf16_b1_fraction_of_bandwidth": record.get("decode", {})
        .get("compiled", {})
        .get("fraction_of_copy_bandwidth"),
        "int8_speedup_over_bf16": ratio(tok_per_s("compiled_int8"), bf16),
        "int4_speedup_over_bf16": ratio(tok_per_s("compiled_int4"), bf16),
        "compiled_speedup_over_readable": ratio(bf16, tok_per_s("readable_eager")),
        "b64_fraction_of_ceiling": b64["fraction_of_ceiling"] if b64 else None,
        "vs_hf_static_compiled": ratio(bf16, peers.get("hf_static", {}).get("tok_per_s")),
        "vs_hf_eager": ratio(bf16, peers.get("hf_eager", {}).get("tok_per_s")),
        "correctness_ok": record.get("correctness", {}).get("ok"),
        "prefill_attention_fused": record.get("correctness", {}).get("prefill_attention_fused"),
        "server_greedy_identical": record.get("server", {}).get("greedy_identical"),
        "server_compiled_speedup": {
            r["batch"]: r["speedup"] for r in record.get("server", {}).get("rows", [])
        }
        or None,
        "chapters_on_cuda_ok": record.get("chapters", {}).get("chapters_on_cuda_ok"),
        "cudagraph_skips": sum("skipping cudagraph" in w for w in graph_warnings),
        "compiled_step_replays_graph": replays_graph(
            record.get("decode", {}).get("compiled", {}).get("launches_per_step")
        ),
        "server_step_replays_graph": replays_graph(
            record.get("server", {}).get("compiled_launches_per_step")
        ),
    }


def markdown(record: dict) -> str:
    s = record["summary"]

    def show(value, fmt="{:.2f}"):
        return (
            "n/a"
            if value is None
            else fmt.format(value)
            if not isinstance(value, bool)
            else str(value)
        )

    lines = [
        f"GPU check on {s['device_name']} (torch {torch.__version__}), {record.get('speed_model')} "
        f"in {record.get('dtype')}, random weights",
        "",
        "| measure | value | target |",
        "|---|---|---|",
        f"| copy bandwidth (read + write) | {show(s['copy_bandwidth_gbps'], '{:.0f}')} GB/s | |",
        f"| batch-1 bf16 decode, fraction of copy bandwidth | {show(s['bf16_b1_fraction_of_bandwidth'], '{:.1%}')} | >= 85% |",
        f"| int8 speed-up over bf16 | {show(s['int8_speedup_over_bf16'])}x | >= 1.25x |",
        f"| int4 speed-up over bf16 | {show(s['int4_speedup_over_bf16'])}x | >= 1.6x |",
        f"| compiled over readable eager | {show(s['compiled_speedup_over_readable'])}x | |",
        f"| batch 64, fraction of the cost model's ceiling | {show(s['b64_fraction_of_ceiling'], '{:.1%}')} | >= 70% |",
        f"| memwall over transformers static+compiled | {show(s['vs_hf_static_compiled'])}x | >= 1x |",
        f"| memwall over transformers eager | {show(s['vs_hf_eager'])}x | >= 4x |",
        f"| correctness (compiled vs readable vs transformers) | {show(s['correctness_ok'])} | True |",
        f"| prefill attention on a fused kernel | {show(s['prefill_attention_fused'])} | True |",
        f"| chapters executed on {record.get('device')} | {show(s['chapters_on_cuda_ok'])} | True |",
        f"| server: compiled scheduler's tokens = readable | {show(s['server_greedy_identical'])} | True |",
        f"| CUDA graphs skipped (steps run launch by launch) | {s['cudagraph_skips']} | 0 |",
        f"| compiled decode step replays a CUDA graph | {show(s['compiled_step_replays_graph'])} | True |",
        f"| server's compiled step replays a CUDA graph | {show(s['server_step_replays_graph'])} | True |",
    ]
    lines += table(
        "| engine, batch 1 | ms/token | tok/s | GB/step | GB/s | wall s (compile included) |",
        [
            f"| {label} | {r['step_s'] * 1e3:.2f} | {r['tok_per_s']:.1f} | "
            f"{r['bytes_per_step'] / 1e9:.2f} | {r['achieved_gbps']:.0f} | {r['wall_s']:.0f} |"
            for label, r in record.get("decode", {}).items()
            if isinstance(r, dict) and "step_s" in r
        ],
    )
    lines += table(
        "| batch | ms/step | tok/s | ceiling tok/s | of ceiling | bound |",
        [
            f"| {r['batch']} | {r['step_s'] * 1e3:.2f} | {r['tok_per_s']:.0f} | "
            f"{r['ceiling_tok_per_s']:.0f} | {r['fraction_of_ceiling']:.1%} | {r['bound']} |"
            for r in record.get("batches", {}).get("rows", [])
        ],
    )
    lines += table(
        "| server's engine, batch | readable ms/step | compiled ms/step | speed-up |",
        [
            f"| {r['batch']} | {r['readable_step_s'] * 1e3:.2f} | "
            f"{r['compiled_step_s'] * 1e3:.2f} | {r['speedup']:.2f}x |"
            for r in record.get("server", {}).get("rows", [])
        ],
    )
    return "\n".join(lines)


def table(header: str, rows: list[str]) -> list[str]:
    """A markdown table's lines after a blank one; none without rows."""
    return ["", header, "|---" * (header.count("|") - 1) + "|", *rows] if rows else []


def speed_model(device: str) -> str:
    if not device.startswith("cuda"):
        return TINY.name
    memory = torch.cuda.get_device_properties(device).total_memory
    for spec, billions in SPEED_MODELS:
        if billions * 1e9 * BYTES_HELD_PER_PARAMETER < 0.85 * memory:
            return spec
    return SPEED_MODELS[-1][0]


class GraphWarnings(logging.Handler):
    """The warnings of torch's CUDA graph trees, as they arrive (on the loggers this torch has:
    older ones send them to the performance hints)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []
        from torch._inductor import cudagraph_utils

        for name in ("cudagraphs_log", "perf_hint_log"):
            if isinstance(log := getattr(cudagraph_utils, name, None), logging.Logger):
                log.addHandler(self)

    def emit(self, log_record) -> None:
        self.messages.append(log_record.getMessage().splitlines()[0])


GRAPH_WARNINGS = GraphWarnings()


def section(record: dict, name: str, budget: Budget, work) -> None:
    """Run one section: its result under `name`, or the error that stopped it, and the CUDA graph
    warnings raised while it ran (added to an earlier call's: the results they concern are
    kept)."""
    if budget.spent():
        record.setdefault(name, {"skipped": "time budget spent"})  # an earlier call's kept
        return
    budget.note(f"{name}...")
    earlier_warnings = record.get(name, {}).pop("cudagraph_warnings", [])
    for stale in ("error", "traceback", "skipped"):  # an earlier call's
        record.get(name, {}).pop(stale, None)
    if record.get(name) == {}:
        del record[name]
    started, warned = time.perf_counter(), len(GRAPH_WARNINGS.messages)
    try:
        result = work()
        if result is not None:
            record[name] = result
    except Exception as error:
        record.setdefault(name, {})
        record[name]["error"] = f"{type(error).__name__}: {error}"
        record[name]["traceback"] = traceback.format_exc()[-3000:]
        print(record[name]["traceback"], file=sys.stderr)
    gc.collect()  # a section's models (reference cycles among them) gone before the next's
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if warnings := earlier_warnings + GRAPH_WARNINGS.messages[warned:]:
        record.setdefault(name, {})["cudagraph_warnings"] = warnings
    seconds = record.setdefault("section_seconds", {})
    seconds[name] = seconds.get(name, 0) + time.perf_counter() - started  # all calls together
    budget.save(record)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=COMMITTED)
    parser.add_argument("--no-record", action="store_true", help="print only, write no record")
    parser.add_argument("--budget-s", type=float, default=420, help="sections start until then")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--model", help="catalog spec to time (default: the largest Llama that fits)"
    )
    parser.add_argument("--allow-cpu", action="store_true", help="dry run on the CPU, tiny shapes")
    parser.add_argument(
        "--sections", default="speed,chapters",
        help="comma-separated: speed (the roofs, correctness, decode, batches, peers), "
        "chapters, server",
    )  # fmt: skip
    parser.add_argument(
        "--chapters", default="", help="chapters to run, by number (e.g. 03,07; default all)"
    )
    parser.add_argument(
        "--resume", action="store_true",
        help="add to this machine's newest gpu_check record in --results-dir or "
        "benchmarks/results, if there is one",
    )  # fmt: skip
    args = parser.parse_args(argv)
    sections = set(args.sections.split(","))
    if not sections or not sections <= {"speed", "chapters", "server"}:
        parser.error(f"--sections takes speed, chapters, server, not {args.sections!r}")

    if torch.cuda.is_available():
        from memwall.engine.cuda import native_half_dtype

        device = "cuda"
        half = {torch.bfloat16: "bf16", torch.float16: "fp16"}[native_half_dtype(device)]
        device_name = torch.cuda.get_device_name()
    elif args.allow_cpu:
        device, half, device_name = "cpu", "bf16", "cpu (dry run)"
    else:
        print(
            f"gpu_check: no CUDA GPU visible to torch {torch.__version__} (CUDA build: "
            f"{torch.version.cuda or 'none'}); run it on a machine with an NVIDIA GPU, or pass "
            "--allow-cpu for a dry run with tiny shapes.",
            file=sys.stderr,
        )
        return 1
    dry = device == "cpu"
    if dry:
        torch.set_num_threads(1)  # tiny shapes; and a shared CPU's other tenants keep their core
    import transformers

    speed_spec = TINY if dry else get_spec(args.model or speed_model(device))
    new_tokens, repeats = (8, 1) if dry else (args.new_tokens, args.repeats)
    batches = (1, 2, 3) if dry else BATCHES
    prompt = [(100 + i) % speed_spec.vocab_size for i in range(32)]
    # this session's record first: its continuation of a committed one carries the same name
    earlier = (newest_record(args.results_dir) or newest_record(COMMITTED)) if args.resume else None
    setting = {
        "device": device,
        "device_name": device_name,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "dtype": half,
        "speed_model": speed_spec.name,
        "prompt_tokens": len(prompt),
        "new_tokens": new_tokens,
        "repeats": repeats,
    }  # fmt: skip
    record = json.loads(earlier.read_text()) if earlier else setting
    if differ := [f"{key} {record[key]} there, {value} here" for key, value in setting.items()
                  if key in record and record[key] != value]:  # fmt: skip
        # Its numbers and this run's would not compare (another torch on the image, say): it is
        # left as it is, and this run starts its own rather than losing the call.
        print(f"gpu_check: {earlier} was measured otherwise ({'; '.join(differ)}); a new record",
              file=sys.stderr)  # fmt: skip
        earlier, record = None, setting
    elif args.resume:  # a machine given back between calls takes its record with it
        print(f"gpu_check: adding to {earlier}" if earlier else "gpu_check: no earlier record "
              "of this machine; a new one", file=sys.stderr)  # fmt: skip
    # a record from elsewhere is saved anew in --results-dir, under its name
    rewrite = (
        earlier if earlier and earlier.parent.resolve() == args.results_dir.resolve() else None
    )
    budget = Budget(args.budget_s, None if args.no_record else args.results_dir, rewrite)
    if "speed" in sections:
        speed_sections(record, budget, device, half, dry, speed_spec, prompt, new_tokens,
                       repeats, batches)  # fmt: skip
    if "chapters" in sections:
        numbers = [n.strip().zfill(2) for n in args.chapters.split(",") if n.strip()]
        known = {p.name[:2] for p in (ROOT / "chapters").glob("[0-9][0-9]_*.md")}
        if set(numbers) - known:
            parser.error(f"--chapters: no chapter {', '.join(sorted(set(numbers) - known))}")
        section(record, "chapters", budget,
                lambda: check_chapters(device, budget, record, numbers))  # fmt: skip
    elif dry and "chapters" not in record:  # running the book on a CPU is `make book`'s work
        record["chapters"] = {"chapters_on_cuda_ok": None, "reason": "a CPU dry run"}
    if "server" in sections and not measured(record.get("server")):
        section(record, "server", budget, lambda: check_server(
            device, dry, speed_spec, half, prompt, 8 if dry else 32, (1, 2) if dry else (1, 8, 64)))  # fmt: skip
    budget.save(record)
    print(record["markdown"])
    where = f"record: {budget.path}" if budget.path else "no record written"
    print(f"\n{where} ({time.perf_counter() - budget.start:.0f} s)", file=sys.stderr)
    checks = {"speed": ("correctness", "correctness_ok"), "chapters": ("chapters",
              "chapters_on_cuda_ok"), "server": ("server", "server_greedy_identical")}  # fmt: skip
    failed = [  # a check that failed or broke; one the budget left for later is not a failure
        name for name, (part, key) in checks.items()
        if name in sections and (record["summary"][key] is False or "error" in record.get(part, {}))
    ]  # fmt: skip
    return 1 if failed else 0


def newest_record(folder: Path) -> Path | None:
    """This machine's latest gpu_check record in `folder`, if any."""
    from memwall.bench.records import parse_record_name
    from memwall.machine.fingerprint import fingerprint_id, machine_fingerprint

    here = fingerprint_id(machine_fingerprint())
    named = [(parsed.date, path) for path in folder.glob("gpu_check-*.json")
             if (parsed := parse_record_name(path.name)) and parsed.machine_id == here]  # fmt: skip
    return max(named)[1] if named else None


def speed_sections(record, budget, device, half, dry, speed_spec, prompt, new_tokens, repeats,
                   batches) -> None:  # fmt: skip
    """Sections 1-5: the roofs, correctness, batch-1 decode, the batch sweep, the peers. What an
    earlier call on this machine measured (`--resume`) is kept: a call cut short by its time
    limit is finished by the next, not started again."""
    state = {}

    def speed_hf():  # the speed model, made once, when a label needs it
        if "hf" not in state:
            state["hf"] = random_hf(speed_spec, DTYPES[half], device)
        return state["hf"]

    def models():
        if "engine" not in state:
            state["engine"] = Transformer.from_hf(speed_hf())
            state["fast"] = compiled(state["engine"])  # the batch sweep goes on with its graphs
        return state

    if not measured(record.get("roofs")):
        section(record, "roofs", budget, lambda: roofs(device, half, quick=dry))
    roof = record["roofs"]
    if not measured(record.get("correctness")):
        section(record, "correctness", budget,
                lambda: check_correctness(TINY if dry else SMALL, device, half, 6 if dry else 24))  # fmt: skip
    copy_gbps = roof.get("copy_bandwidth_gbps") or float("nan")
    section(record, "decode", budget, lambda: check_decode(
        models, record, prompt, new_tokens, repeats, copy_gbps, budget))  # fmt: skip
    if measured(roof):  # the ceiling needs the roofs
        section(record, "batches", budget, lambda: check_batches(
            models, speed_spec, half, batches, 32, 16 if not dry else 4, roof, record, budget))  # fmt: skip

    def peers():
        out = record.setdefault("peers", {})
        state.pop("engine", None)  # the peers' turn: the engine's copy is let go first
        state.pop("fast", None)
        for label, tokens, runs, static in (("hf_eager", min(new_tokens, 32), 1, False),
                                            ("hf_static", new_tokens, repeats, True)):  # fmt: skip
            if measured(out.get(label)):
                continue
            if budget.spent():
                out[label] = {"skipped": "time budget spent"}
                continue
            out[label] = hf_timing(speed_hf(), prompt, tokens, runs, static=static)
            budget.save(record)
            budget.note(f"peer {label}: {out[label]['tok_per_s']:.1f} tok/s")

    section(record, "peers", budget, peers)
    state.clear()


def measured(part) -> bool:
    """Whether a section's or a label's result is a measurement: there, not failed, not skipped."""
    return bool(part) and not {"error", "skipped"} & part.keys()


if __name__ == "__main__":
    sys.exit(main())
