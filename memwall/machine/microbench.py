"""The roofline of the machine you are on, measured: bandwidth of each memory level, FLOP/s.

`measure()` streams buffers sized by `working_set.for_device` (past the last-level cache where
the memory budget allows, else inside it, and then it says so) and times square matmuls; on a
CPU it also streams a buffer that sits in the last-level cache, because the cache is a roof too:
a working set that fits there is read at the cache's speed (the roofline model: Williams,
Waterman & Patterson, 2009). `get_hardware("this")` is the measured machine as a `Hardware`.
"""

from __future__ import annotations

import functools
import platform
import time

from memwall.hardware import CATALOG, Hardware
from memwall.hardware import get_hardware as catalog_hardware
from memwall.machine import working_set as sizing
from memwall.machine.caches import DRAM, found_usable_cache, last_level_cache_bytes
from memwall.machine.measurement import Measurement

# A pseudo-name that get_hardware() answers by measuring the current machine.
MEASURED_NAME = "this"


def get_hardware(name_or_hardware: str | Hardware) -> Hardware:
    """A catalog entry by (case-insensitive) name, or "this" to measure the current device."""
    if isinstance(name_or_hardware, str) and name_or_hardware.strip().lower() == MEASURED_NAME:
        return measure().as_hardware()
    try:
        return catalog_hardware(name_or_hardware)
    except ValueError:
        raise ValueError(
            f"Unknown hardware {name_or_hardware!r}; "
            f"choose from {', '.join((*CATALOG, MEASURED_NAME))}."
        ) from None


def best_seconds(fn, synchronize, repeats: int, warmup: int = 1) -> float:
    """Fastest of `repeats` timed calls.

    The best, not the median: the roofline is a ceiling, and on a shared machine noise only ever
    slows a run down, so the fastest repeat is the closest estimate of what the hardware can do.
    (bench reports medians, because there we want what a user typically gets.)
    """
    for _ in range(warmup):
        fn()
    synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        synchronize()
        times.append(time.perf_counter() - start)
    return min(times)


def device_name(device) -> str:
    """The GPU's name, or the CPU's model name."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from memwall.machine.fingerprint import cpu_model

    model = cpu_model()
    return model if model != "unknown" else (platform.processor() or device.type)


def _kernels_in_use() -> bool:
    """Whether memwall's C kernels run here (built, and not switched off)."""
    from memwall.engine.cpu import kernels as cpu_kernels

    return cpu_kernels.available()


def _memwall_kernel_flops(repeats: int) -> float | None:
    """fp32 FLOP/s of memwall's C kernel (None without a compiler or with MEMWALL_CPU_KERNELS=0)."""
    from memwall.engine.cpu import kernels as cpu_kernels

    return cpu_kernels.fp32_flops(repeats)


def _memory_bytes(device) -> float:
    import torch

    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    from memwall.machine.memory import memory_limit

    return float(memory_limit().total_bytes)  # the container's limit where it sets one


def _synchronizer(device):
    import torch

    if device.type == "cuda":
        return functools.partial(torch.cuda.synchronize, device)
    backend = getattr(torch, device.type, None)
    if backend is not None and hasattr(backend, "synchronize"):
        return backend.synchronize  # e.g. torch.mps
    return lambda: None  # CPU ops are synchronous


def stream_bandwidth(device, nbytes: int, repeats: int, copy: bool = False) -> float:
    """Bytes/s of streaming `nbytes` on `device`, best of `repeats`: reading one buffer
    (torch.sum), or copying one half-size buffer into another (bytes read + bytes written).
    Either way a pass touches `nbytes`, so both stream from the same memory level."""
    import torch

    synchronize = _synchronizer(device)
    passes = 1 if device.type == "cpu" else 10  # a GPU pass is too short to time alone
    elements = nbytes // 4 // (2 if copy else 1)
    source = torch.ones(elements, dtype=torch.float32, device=device)
    target = torch.empty_like(source) if copy else None

    def stream():
        for _ in range(passes):
            target.copy_(source) if copy else source.sum()

    return passes * 4 * elements * (2 if copy else 1) / best_seconds(stream, synchronize, repeats)


# A stream this many times slower than one over a quarter of its buffer reads a slower level.
SPILL_GAP = 1.3


@functools.cache
def _spill_rates(device_str: str, nbytes: int) -> tuple[float, float, float]:
    """Read bytes/s over `nbytes`, half of it and a quarter of it, best of 5 each (a shared
    core slows some reads: the best of several is the level's own rate)."""
    import torch

    device = torch.device(device_str)
    return tuple(stream_bandwidth(device, nbytes // part, 5) for part in (1, 2, 4))


def working_set_for(device, buffers: int = 1) -> sizing.WorkingSet:
    """`working_set.for_device`, with a CPU cache working set checked by timing it.

    The OS reports the whole last-level cache, but other cores (other tenants, on a shared host)
    fill it too, so a process can get much less of it. Where the budget kept the buffers inside
    the reported cache, one of them is streamed next to a half and a quarter of it: reading
    clearly slower than the quarter means it spilled out of the cache this process gets, so it
    measures DRAM, and says why. The half tells whether the cache ends above or below it; the
    middle of that interval is taken as the cache this process gets (`caches.level_of` uses it)."""
    import torch

    device = torch.device(device)
    chosen = sizing.for_device(device, buffers)
    if device.type != "cpu" or chosen.level == DRAM:
        return chosen
    whole, half, quarter = _spill_rates(str(device), chosen.bytes)
    if quarter <= SPILL_GAP * whole:
        return chosen
    # the cache ends between the half and the whole if the half still read fast, else below it
    found_usable_cache(chosen.bytes * 3 // (4 if half > SPILL_GAP * whole else 8))
    note = (
        f"the OS reports a {last_level_cache_bytes() / 2**20:.0f} MiB last-level cache, but a "
        f"{chosen.bytes / 2**20:.0f} MiB stream read {whole / 1e9:.1f} GB/s against "
        f"{quarter / 1e9:.1f} GB/s for a quarter of it: this process gets less of the cache "
        "(other cores share it), so this measures DRAM"
    )
    return sizing.WorkingSet(chosen.bytes, DRAM, note)


def _matmul_flops(device, quick: bool) -> dict[str, float]:
    import torch

    from memwall.machine.fingerprint import has_native_bf16

    synchronize = _synchronizer(device)
    on_cpu = device.type == "cpu"
    passes = 1 if on_cpu else 10
    # A square matmul of side n does 2 n^3 FLOPs on 3 n^2 elements: compute-bound for large n.
    n = (1024 if quick else 2048) if on_cpu else (4096 if quick else 8192)
    # A CPU gets a bf16 roof only when its flags say it has bf16 dot products (AVX-512 BF16, AMX,
    # ARM FEAT_BF16): elsewhere bf16 is emulated, slower than fp32, and its "roof" would mislead.
    dtypes = {"fp32": torch.float32}
    if not on_cpu:
        dtypes.update(bf16=torch.bfloat16, fp16=torch.float16)
    elif has_native_bf16():
        dtypes["bf16"] = torch.bfloat16
    flops = {}
    for name, dtype in dtypes.items():
        try:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            seconds = best_seconds(
                lambda a=a, b=b: [a @ b for _ in range(passes)], synchronize, 2 if quick else 3
            )
            flops[name] = passes * 2 * n**3 / seconds
        except (RuntimeError, TypeError):  # a dtype this device cannot multiply (bf16 on old MPS)
            if name == "fp32":
                raise
        finally:
            a = b = None  # free the operands before the next dtype
    return flops


@functools.cache
def _measure(device_str: str, quick: bool, kernels: bool = False) -> Measurement:
    import torch

    from memwall.machine.fingerprint import machine_fingerprint

    device = torch.device(device_str)
    repeats = 3 if quick else 5
    working_set = working_set_for(device)
    read_bw = stream_bandwidth(device, working_set.bytes, repeats)
    copy_bw = stream_bandwidth(device, working_set.bytes, repeats, copy=True)
    cache_set, cache_bw = None, None
    if device.type == "cpu" and working_set.level != DRAM:
        cache_set, cache_bw = working_set, read_bw  # the budget already made it the cache's
    elif device.type == "cpu" and last_level_cache_bytes():
        cache_set = sizing.cache_working_set()
        if cache_set.bytes >= working_set.bytes:  # it spilled: its quarter, timed, read the cache
            cache_set = sizing.WorkingSet(working_set.bytes // 4, cache_set.level)
            cache_bw = _spill_rates(device_str, working_set.bytes)[2]
        else:
            cache_bw = stream_bandwidth(device, cache_set.bytes, repeats)

    flops = _matmul_flops(device, quick)
    sources = {name: "torch" for name in flops}
    if device.type == "cpu":
        # A BLAS library can leave the CPU's widest vector instructions unused (a vendor library
        # on another vendor's CPU). Where memwall's own kernel computes faster, its rate is the
        # roof: a ceiling below what the engine reaches is no ceiling.
        kernel = _memwall_kernel_flops(repeats=2 if quick else 3) if kernels else None
        if kernel and kernel > flops["fp32"]:
            flops["fp32"], sources["fp32"] = kernel, "memwall C kernel"

    return Measurement(
        device=device_name(device),
        device_type=device.type,
        torch_version=torch.__version__,
        threads=torch.get_num_threads(),
        bandwidth=max(read_bw, copy_bw),
        read_bandwidth=read_bw,
        copy_bandwidth=copy_bw,
        flops=flops,
        flops_source=sources,
        memory_bytes=_memory_bytes(device),
        working_set_bytes=working_set.bytes,
        machine=machine_fingerprint(),
        memory_level=working_set.level,
        note=working_set.note,
        cache_bandwidth=cache_bw,
        cache_working_set_bytes=cache_set.bytes if cache_set else 0,
    )


def measure(device=None, quick: bool = False) -> Measurement:
    """Measure memory bandwidth and matmul FLOP/s on `device` (default: the device the models load
    on, `memwall.machine.devices.default_device()`: MEMWALL_DEVICE, else a CUDA GPU, else the CPU).

    Results are cached for the process, so chapters can call this freely. `quick` times fewer
    repeats and a smaller matmul, for tests; the buffers follow the same sizing rule.
    """
    import torch

    if device is None:
        from memwall.machine.devices import default_device

        device = default_device()
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    # The kernels' on/off state is part of the key: it decides which matmul sets the fp32 roof.
    kernels = device.type == "cpu" and _kernels_in_use()
    return _measure(str(device), bool(quick), kernels)
