"""Timing a twin's kernel paths on this machine: the measurement behind path_choice.choose."""

from __future__ import annotations

import math
import statistics
import time

import torch

from memwall.engine.cpu import kernels
from memwall.engine.cpu.build import MatmulElsewhere
from memwall.engine.sharing import copy_with
from memwall.machine.fingerprint import last_level_cache_bytes
from memwall.machine.memory import buffer_budget_bytes

CLEAR_WIN = 0.95  # another path replaces the fixed rule's when it takes under 0.95 of its time
# the fast decode step runs these without Python
C_PATHS = ("c", "packed", "c_row", "c_many", "w8a8")


def fastest(layer, width: int, dtype, rows: int, candidates: list[str], usual: str) -> str:
    """The fastest of `candidates` on `rows` random rows of `width` through `layer`'s weights,
    read from memory as decode meets them; `usual` (the fixed rule's path) unless another is
    clearly faster."""
    sample = torch.randn(rows, width, dtype=dtype)
    # Decode reads each layer's weights from memory, right after other layers' weights. Timing
    # one layer over and over reads them from cache instead (a regime in which PyTorch's paths won
    # on small matrices), and one call after a cache flush is mostly its cold start, too noisy to
    # rank paths within 10%. So a sample runs the path through enough copies of the layer to
    # overflow the caches, one after the other, as decode runs layers.
    # Copies only, not the layer itself: a path that packs a copy of its weights on first use
    # ("packed") leaves the layer as it was unless it is chosen.
    copies = [copy_of(layer)]
    times = {path: [] for path in candidates}
    with torch.inference_mode():
        for path in candidates:
            copies[0].run(path, sample)  # warm-up: lazy packing, first-call costs
        from_cache = min(_seconds(_calls(copies, path, sample)) for path in candidates)
        count = copies_for(layer, from_cache)
        copies += [copy_of(layer) for _ in range(count - 1)]
        runs = {path: _calls(copies, path, sample) for path in candidates}
        # A layer bound by arithmetic (timed over fewer copies) is long to time and barely moved
        # by the bandwidth's jumps, so three rounds rank its paths; a memory-bound one gets five.
        rounds = 5 if count == copies_to_overflow(layer) else 3
        ratio = _ratios(runs, usual, rounds, times)
        # A close call (another path at 0.90-1.00 of the fixed rule's time) gets twice as many
        # rounds again: a few rounds in one of the bandwidth's phases could decide it either way.
        close = [r for path, r in ratio.items() if path != usual and abs(r - CLEAR_WIN) < 0.05]
        if usual in ratio and close:
            ratio = _ratios(runs, usual, 2 * rounds, times)
    winner = min(candidates, key=ratio.get)
    # The fixed rule's path unless another is clearly faster: two paths within a few percent swap
    # places from one calibration to the next.
    if usual in ratio and ratio[winner] > CLEAR_WIN:
        return usual
    return winner


def _ratios(runs: dict, usual: str, rounds: int, times: dict) -> dict[str, float]:
    """Adds `rounds` rounds of samples of each path to `times`, then gives each path's median
    ratio of its time to the fixed rule's path `usual` (its median time if `usual` is not a
    candidate). Each ratio compares samples of one round: the rounds alternate the paths, so a
    change of the machine's bandwidth between rounds (a shared VM's can jump between phases)
    cancels out, where the fastest of each path's samples could come from different phases."""
    for _ in range(rounds):
        for path, run in runs.items():
            times[path].append(_seconds(run))
    base = times.get(usual) or [1.0] * len(next(iter(times.values())))
    return {
        path: statistics.median(t / b for t, b in zip(samples, base))
        for path, samples in times.items()
    }


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
    lib = kernels.library() if path in C_PATHS and hasattr(layers[0], "in_features") else None
    if lib is not None:
        specs = [each.matmul_spec(path) for each in layers]
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


def copy_of(layer):
    """`layer` with clones of its tensors: a clone copies a view's elements, where deepcopy would
    copy the whole storage the view is cut from (a model can load as views into one buffer)."""
    return copy_with(layer, lambda t: t.detach().clone())


# A layer so small that it needs more copies than this (under 64 KiB with a 32 MiB cache) reads
# its weights in about a microsecond, less than a Python call costs, so where they come from
# hardly moves its samples. Without the cap such layers (tests' toy models) needed thousands of
# copies, and calibration spent its time in Python calls rather than in the layer.
MAX_COPIES = 1024


def copies_to_overflow(layer) -> int:
    """How many copies of `layer` fill twice the last-level cache, and no less than 64 MiB (at
    most MAX_COPIES), within the memory budget: where the budget is smaller than the cache, the
    copies are timed from the cache (as a model that small would be read in decode)."""
    size = _weight_bytes(layer)
    target = min(max(2 * last_level_cache_bytes(), 64 << 20), max(buffer_budget_bytes(), 64 << 20))
    return min(MAX_COPIES, max(1, -(-target // size)))


def _weight_bytes(layer) -> int:
    tensors = [*layer.parameters(), *layer.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors) or 1


# A sample reads its weights from memory so that memory's time is in it. A call that runs slower
# from cache than its weights would stream from even a slow memory spends its time in arithmetic
# (many rows: prefill), and copies that overflow the caches barely move it; the copies that fill
# as long a sample as a memory-bound layer's are enough. (With every copy, arithmetic-bound layers
# took seconds each to time, and first-use calibration minutes.)
SLOW_MEMORY = 2e9  # bytes/s, below any machine's memory bandwidth


def copies_for(layer, seconds_from_cache: float) -> int:
    """The copies a sample runs through, one call taking `seconds_from_cache` from cache: all
    that overflow the caches when the layer streams faster than SLOW_MEMORY, else fewer."""
    copies = copies_to_overflow(layer)
    streams_from_cache = _weight_bytes(layer) / max(seconds_from_cache, 1e-9)  # bytes/s
    if streams_from_cache < SLOW_MEMORY:
        copies = math.ceil(copies * streams_from_cache / SLOW_MEMORY)
    return copies
