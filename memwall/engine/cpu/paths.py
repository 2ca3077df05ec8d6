"""Which kernel path a layer takes, chosen by measuring on this machine.

A linear layer can multiply in several ways, and which is fastest depends on the CPU, the number
of activation rows and the weight format (one 2-core EPYC with AVX2 and a Zen 5 with AVX-512
disagreed on every one of these). So the first time a layer of a given format and shape meets a
given bucket of rows, the candidates are timed on its real weights, read from memory as decode
reads them and called as the fast decode step calls them (memwall's C kernels from C, PyTorch's
paths through Python), a few seconds for the whole model, with a message on stderr; the fastest is
kept, on disk, under a key for this machine: CPU model, ISA flags, threads, torch version and the
kernels' source hash. A choice timed while other work kept the cores busy is used by this process
but not kept: on two shared cores, one stalled thread can make the best path look like the worst.

The candidates (a layer lists the ones that can take a given input):
  fp32, bf16, fp16: "c" (memwall's C kernel), "bmm" (the row split), "linear" (F.linear);
                    the fast decode step's batches also "packed" for fp32 (C, on a copy of the
                    weights packed in panels, made only for a layer that takes this path)
  int8, int4:       "c" (C, a few rows at a time), "c_many" (C, chunks of dequantized weights),
                    and for int8 "c_row" (C, one row of codes at a time),
                    "torch" (PyTorch's packed kernels, bf16 activations), "dequant" (reference)
  int8 also offers "w8a8" (C, activations rounded to int8: VNNI where the CPU has it). It changes
  the results beyond rounding, so it is never measured or chosen; only a pin takes it.

MEMWALL_KERNEL_PATH pins paths, for tests and for chapters that compare paths:
  "fp32:bmm,int8:c"  pins those formats (others are measured); "fixed" uses the fixed rules below
  for everything (no timing: the tests use it); "auto" or unset measures.
A pinned path that cannot take an input falls back to the fixed rule.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch

from memwall.engine import cpu_kernels
from memwall.fingerprint import last_level_cache_bytes

ENV = "MEMWALL_KERNEL_PATH"
PATHS = {
    "fp32": ("c", "packed", "bmm", "linear"),
    "bf16": ("bmm", "linear"),
    "fp16": ("bmm", "linear"),
    "int8": ("c", "c_row", "c_many", "torch", "w8a8", "dequant"),
    "int4": ("c", "c_many", "torch", "dequant"),
}
BUCKETS = (1, 4, 16, 64, 256, 512)  # rows are timed at the bucket's top; more than 512 -> 512
METHOD = 6  # how _measure times paths; a new way of timing must not reuse the old choices
CLEAR_WIN = 0.95  # another path replaces the fixed rule's when it takes under 0.95 of its time
# the fast decode step runs these without Python
C_PATHS = ("c", "packed", "c_row", "c_many", "w8a8")
APPROXIMATE = ("w8a8",)  # paths taken only when pinned
FEW_ROWS = {"fp32": 256, "bf16": 256, "fp16": 256, "int8": 8, "int4": 8}

_memo: dict[tuple, str] = {}
_announced = False


def bucket(rows: int) -> int:
    return next((top for top in BUCKETS if rows <= top), BUCKETS[-1])


@functools.cache
def parse_pins(spec: str | None) -> dict[str, str] | str:
    """MEMWALL_KERNEL_PATH -> {format: path}, or "fixed"/"auto"; a ValueError names the choices."""
    if not spec or spec.strip() == "auto":
        return "auto"
    if spec.strip() == "fixed":
        return "fixed"
    pins = {}
    for item in spec.split(","):
        fmt, _, path = item.strip().partition(":")
        if fmt not in PATHS or path not in PATHS[fmt]:
            choices = "; ".join(f"{f}: {', '.join(p)}" for f, p in PATHS.items())
            raise ValueError(
                f"{ENV}: {item.strip()!r} is not format:path ({choices}), 'fixed' or 'auto'"
            )
        pins[fmt] = path
    return pins


def fixed_path(fmt: str, rows: int, options: tuple[str, ...]) -> str:
    """The rule used when nothing is measured: C kernels for few rows, then the library."""
    if fmt in ("int8", "int4"):
        order = ("c", "torch") if rows <= FEW_ROWS[fmt] else ("c_many", "torch")
    else:
        order = ("c", "bmm") if rows <= FEW_ROWS.get(fmt, 256) else ("linear",)
    return next((path for path in order if path in options), options[-1])


def choose(layer, x: torch.Tensor, fast_step: bool = False) -> str:
    """The path `layer` should take for input x [..., in]; with `fast_step`, among the paths the
    fast decode step offers too (a layer's `step_paths_for`)."""
    rows = x.numel() // max(x.shape[-1], 1)
    spec = os.environ.get(ENV)
    switched_off = cpu_kernels._switched_off
    key = (layer.kernel_key(), rows, x.dtype, x.device.type, switched_off, spec, fast_step)
    path = _memo.get(key)
    if path is None:
        path = _memo[key] = _decide(layer, x, rows, parse_pins(spec), fast_step)
    return path


def _decide(layer, x, rows, pins, fast_step=False) -> str:
    step = fast_step and hasattr(layer, "step_paths_for")
    options = layer.step_paths_for(x) if step else layer.paths_for(x)
    fmt = layer.kernel_key()[0]
    if len(options) == 1 or x.device.type != "cpu" or pins == "fixed":
        return fixed_path(fmt, rows, options)
    if isinstance(pins, dict) and fmt in pins:
        return pins[fmt] if pins[fmt] in options else fixed_path(fmt, rows, options)
    name = _decision_name(layer, x, rows)
    if step and options != layer.paths_for(x):  # more candidates than the readable engine's
        name += ":step"
    decisions = _decisions()
    if decisions.get(name) not in options:
        decisions[name] = _measure(layer, x, bucket(rows), options)
        if not machine_busy():  # a choice timed against other work lasts this process only
            _save(decisions)
    return decisions[name]


def machine_busy() -> bool:
    """Whether other work competes for the cores: the 1-minute load average above the cores
    plus one (this process's own threads count in it too)."""
    try:
        return os.getloadavg()[0] > (os.cpu_count() or 1) + 1
    except OSError:
        return False


def _decision_name(layer, x, rows) -> str:
    fmt, shape = layer.kernel_key()
    return f"{fmt}:{shape}:{str(x.dtype).removeprefix('torch.')}:{bucket(rows)}"


def _measure(layer, x, rows: int, options: tuple[str, ...]) -> str:
    """Time each option on `rows` random rows through `layer`'s real weights, with the weights
    out of the caches, as decode meets them; the fastest."""
    global _announced
    if not _announced:
        print(
            # two lines, so the notice fits a notebook's output column
            f"memwall: timing kernel paths on this machine, once;\n  cached in {cache_file()}",
            file=sys.stderr,
        )
        _announced = True
    candidates = [p for p in options if p not in ("dequant", *APPROXIMATE)] or ["dequant"]
    sample = torch.randn(rows, x.shape[-1], dtype=x.dtype)
    # Decode reads each layer's weights from memory, right after other layers' weights. Timing
    # one layer over and over reads them from cache instead (a regime in which PyTorch's paths won
    # on small matrices), and one call after a cache flush is mostly its cold start, too noisy to
    # rank paths within 10%. So a sample runs the path through enough copies of the layer to
    # overflow the caches, one after the other, as decode runs layers.
    # Copies only, not the layer itself: a path that packs a copy of its weights on first use
    # ("packed") leaves the layer as it was unless it is chosen.
    copies = [_copy_of(layer)]
    times = {path: [] for path in candidates}
    with torch.inference_mode():
        for path in candidates:
            copies[0].run(path, sample)  # warm-up: lazy packing, first-call costs
        from_cache = min(_seconds(_calls(copies, path, sample)) for path in candidates)
        copies += [_copy_of(layer) for _ in range(_copies_for(layer, from_cache) - 1)]
        runs = {path: _calls(copies, path, sample) for path in candidates}
        for _ in range(5):
            for path in candidates:
                times[path].append(_seconds(runs[path]))
    # Each path against the fixed rule's path in the same round, as a ratio of times: the rounds
    # alternate the paths, so a change of the machine's bandwidth between rounds (this VM's jumps
    # by 1.7x) cancels out, where the fastest of each path's samples could come from different
    # phases. The median ratio ranks the paths.
    usual = fixed_path(layer.kernel_key()[0], rows, options)
    base = times[usual] if usual in times else [1.0] * len(times[candidates[0]])
    ratio = {
        path: statistics.median(t / b for t, b in zip(samples, base))
        for path, samples in times.items()
    }
    fastest = min(candidates, key=ratio.get)
    # The fixed rule's path unless another is clearly faster: two paths within a few percent swap
    # places from one calibration to the next.
    if usual in ratio and ratio[fastest] > CLEAR_WIN:
        return usual
    return fastest


def _seconds(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _calls(layers, path: str, sample: torch.Tensor):
    """A function that runs `path` on `sample` through each of `layers`, as the fast decode step
    would: a C path by one call into the library each, with no Python between them (the step
    runs them from its loop in C), any other path through the layer's `run` in Python (the step
    calls back into Python for it). Timed through `run`, a C path would carry Python's per-call
    cost, about what a small layer's kernel takes, and lose to paths that the step runs slower."""
    lib = cpu_kernels.library() if path in C_PATHS and hasattr(layers[0], "in_features") else None
    if lib is not None:
        from memwall.engine.cpu.build import MatmulElsewhere
        from memwall.engine.cpu.fast_decode import matmul_spec

        specs = [matmul_spec(each, path) for each in layers]
        if all(spec.kind != spec.ELSEWHERE for spec in specs):
            rows, threads = sample.shape[0], torch.get_num_threads()
            y = torch.empty(rows, layers[0].out_features)
            x_at, y_at = sample.data_ptr(), y.data_ptr()
            never = MatmulElsewhere(lambda matmul_id: None)  # C paths do not call back

            def run_in_c():
                for spec in specs:
                    if lib.run_matmul(spec, x_at, y_at, rows, threads, never):
                        raise MemoryError("a C kernel could not allocate its scratch buffers")
                return y

            return run_in_c
    return lambda: [each.run(path, sample) for each in layers]


def _copy_of(layer):
    """`layer` with clones of its tensors: a clone copies a view's elements, where deepcopy would
    copy the whole storage the view is cut from (a model can load as views into one buffer)."""
    from memwall.engine.sharing import copy_with

    return copy_with(layer, lambda t: t.detach().clone())


# A layer so small that it needs more copies than this (under 64 KiB with a 32 MiB cache) reads
# its weights in about a microsecond, less than a Python call costs, so where they come from
# hardly moves its samples. Without the cap such layers (tests' toy models) took 4-30 s each to
# calibrate on a 2-core Zen 3, mostly in Python calls: 21 minutes for the test suite's shapes.
MAX_COPIES = 1024


def _copies_to_overflow(layer) -> int:
    """How many copies of `layer` fill twice the last-level cache, and no less than 64 MiB (at
    most MAX_COPIES)."""
    size = _weight_bytes(layer)
    return min(MAX_COPIES, max(1, -(-max(2 * last_level_cache_bytes(), 64 << 20) // size)))


def _weight_bytes(layer) -> int:
    tensors = [*layer.parameters(), *layer.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) or 1


# A sample reads its weights from memory so that memory's time is in it. A call that runs slower
# from cache than its weights would stream from even a slow memory spends its time in arithmetic
# (many rows: prefill), and copies that overflow the caches barely move it; the copies that fill
# as long a sample as a memory-bound layer's are enough. (With every copy, SmolLM2's int4 layers
# at 256 rows took 13-16 s each to time on a 2-core Zen 3.)
SLOW_MEMORY = 2e9  # bytes/s, below any machine's memory bandwidth


def _copies_for(layer, seconds_from_cache: float) -> int:
    """The copies a sample runs through, one call taking `seconds_from_cache` from cache: all
    that overflow the caches when the layer streams faster than SLOW_MEMORY, else fewer."""
    copies, from_cache = (
        _copies_to_overflow(layer),
        _weight_bytes(layer) / max(seconds_from_cache, 1e-9),
    )
    if from_cache < SLOW_MEMORY:
        copies = math.ceil(copies * from_cache / SLOW_MEMORY)
    return copies


# ---- the decisions on disk, keyed by this machine -------------------------------------------------


@functools.cache
def machine_key() -> dict:
    """What the decisions depend on: the machine, threads, torch and the kernels' sources."""
    from memwall.engine.cpu import build
    from memwall.fingerprint import fingerprint_id, machine_fingerprint

    fingerprint = machine_fingerprint()
    key = {
        "machine": fingerprint_id(fingerprint),
        "cpu_model": fingerprint["cpu_model"],
        "isa": fingerprint["isa"],
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "kernel_variant": cpu_kernels.variant(),
        "kernel_source": build.source_hash(),
        "method": METHOD,
    }
    key["id"] = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return key


def cache_file():
    from memwall.paths import cache_dir

    return cache_dir() / "kernel_paths" / f"{machine_key()['id']}.json"


@functools.cache
def _decisions() -> dict[str, str]:
    try:
        return dict(json.loads(cache_file().read_text())["decisions"])
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def _save(decisions: dict[str, str]) -> None:
    target = cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(suffix=".json", dir=target.parent)
        with os.fdopen(fd, "w") as file:
            json.dump({"machine": machine_key(), "decisions": decisions}, file, indent=1)
        os.replace(partial, target)
    except OSError:
        pass  # a read-only cache folder: the decisions last for this process


def forget() -> None:
    """Drop every decision, in memory and on disk (the next use measures again)."""
    _memo.clear()
    _decisions.cache_clear()
    try:
        cache_file().unlink()
    except OSError:
        pass


def chosen_paths() -> dict:
    """For `memwall info`: the machine key, any pins, and the path per format, shape and rows."""
    per_format: dict[str, dict[str, str]] = {}
    for name, path in sorted(_decisions().items()):
        fmt, shape, dtype, rows, *step = name.split(":")
        where = " (fast step)" if step else ""
        per_format.setdefault(fmt, {})[f"{shape} {dtype} <= {rows} rows{where}"] = path
    return {
        "machine": machine_key(),
        "pinned": os.environ.get(ENV) or None,
        "cache_file": str(cache_file()),
        "paths": per_format,
    }
