"""How big a bandwidth test's buffers are: one rule, from the cache sizes and the memory budget.

To time DRAM, a stream must find nothing of itself in the last-level cache, so its buffer is
sized well past the cache (4x it, and at least 128 MiB). To fit beside a model in a 1-2 GB
session, a test's buffers together take no more than the memory budget
(`memory.buffer_budget_bytes`). When the budget cannot give a buffer twice the last-level cache,
DRAM is out of reach here: the test then measures the cache on purpose, with a buffer that sits
inside it, and its working set says so ("this measures the cache, not DRAM"). A stream over a
buffer between one and two caches' worth would time an unknown mix of the two.

`RooflineProbe` and `measure()` both size their buffers here (`for_device`).
"""

from __future__ import annotations

from dataclasses import dataclass

from memwall.machine.caches import DRAM, last_level_cache_bytes
from memwall.machine.memory import BUDGET_SHARE, MiB, buffer_budget_bytes

LAST_LEVEL_CACHE = "last-level cache"
CACHE_NOTE = "this measures the cache, not DRAM"
PAST_CACHE = 4  # a DRAM buffer is this many times the last-level cache, where the budget allows
CLEAR_OF_CACHE = 2  # a smaller multiple still finds part of itself in the cache
# A stream over this much takes milliseconds at any cache's bandwidth, and is far past the private
# caches: enough to time a last-level cache, however large (half of a 480 MiB one would sit
# beside a model in a 1-2 GB session).
CACHE_MAX_BYTES = 128 * MiB
MIN_DRAM_BYTES = 128 * MiB
# A GPU streams 512 MiB in about 0.1 ms; a smaller buffer would time the synchronisation.
GPU_MIN_BYTES = 512 * MiB
GPU_BUDGET_CAP = 2 * 2**30  # device memory, not the container's: larger buffers are fine
PAGE = 4096


@dataclass(frozen=True)
class WorkingSet:
    """Bytes per buffer, the level a stream over them reads from, and a note when that level is
    not the one asked for."""

    bytes: int
    level: str  # "DRAM" or "last-level cache"
    note: str = ""


def _pages(size: int) -> int:
    return max(size // PAGE, 1) * PAGE  # whole pages, so whole fp32 elements


def _check(buffers: int, budget: int) -> None:
    if not isinstance(buffers, int) or buffers < 1:
        raise ValueError(f"buffers must be a whole number of at least 1, got {buffers!r}.")
    if budget < 0:
        raise ValueError(f"budget_bytes must be at least 0, got {budget!r}.")


def cache_working_set(
    buffers: int = 1, cache_bytes: int | None = None, budget_bytes: int | None = None
) -> WorkingSet:
    """Buffers that together fill half of the last-level cache (the program keeps the other
    half), at most CACHE_MAX_BYTES, within the budget: a stream over them times the cache's
    bandwidth."""
    llc = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    budget = buffer_budget_bytes() if budget_bytes is None else budget_bytes
    _check(buffers, budget)
    if not llc > 0:
        raise ValueError("the last-level cache size is unknown here; pass cache_bytes.")
    size = min(llc // 2, CACHE_MAX_BYTES, budget) // buffers
    return WorkingSet(_pages(size), LAST_LEVEL_CACHE)


def dram_working_set(
    buffers: int = 1,
    cache_bytes: int | None = None,
    budget_bytes: int | None = None,
    minimum_bytes: int = MIN_DRAM_BYTES,
) -> WorkingSet:
    """Bytes per buffer for a test that streams `buffers` buffers from DRAM: 4x the last-level
    cache and at least `minimum_bytes`, within the budget. Where the budget cannot reach twice the
    cache, it is the cache's working set instead, with a note that says so.

    cache_bytes / budget_bytes default to this machine's (an unknown cache counts as none)."""
    llc = last_level_cache_bytes() if cache_bytes is None else cache_bytes
    budget = buffer_budget_bytes() if budget_bytes is None else budget_bytes
    _check(buffers, budget)
    size = min(max(PAST_CACHE * llc, minimum_bytes), budget // buffers)
    if llc > 0 and size < CLEAR_OF_CACHE * llc:
        inside = cache_working_set(buffers, llc, budget)
        note = (
            f"{CACHE_NOTE}: the memory budget ({budget / MiB:.0f} MiB) cannot hold "
            f"{'a buffer' if buffers == 1 else f'{buffers} buffers'} twice the last-level "
            f"cache ({llc / MiB:.0f} MiB)"
        )
        return WorkingSet(inside.bytes, inside.level, note)
    return WorkingSet(_pages(size), DRAM)


def for_device(device="cpu", buffers: int = 1) -> WorkingSet:
    """The DRAM (or HBM) working set for a bandwidth test on `device`: a CPU sizes it from its
    last-level cache and the container's memory budget, a CUDA GPU from its L2 and free memory."""
    import torch

    device = torch.device(device)
    if device.type != "cuda":
        return dram_working_set(buffers)
    free, _ = torch.cuda.mem_get_info(device)
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)
    budget = min(free // BUDGET_SHARE, GPU_BUDGET_CAP)
    return dram_working_set(buffers, l2, budget, minimum_bytes=GPU_MIN_BYTES)
