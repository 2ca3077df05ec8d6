"""Accelerators as the roofline sees them: memory bandwidth, dense peak FLOP/s, memory size.

`CATALOG` holds datasheet numbers; `measure()` gets the same two numbers for the machine you
are on, with microbenchmarks (the roofline model: Williams, Waterman & Patterson, 2009).

Datasheets often quote tensor-core rates "with sparsity" (2:4 structured sparsity), twice the
dense rate: NVIDIA's 1,979 TFLOP/s bf16 for the H100 SXM is 989 dense. Inference on ordinary
weights gets the dense rate, so every number here is dense.
"""

from __future__ import annotations

import functools
import os
import platform
import time
from dataclasses import dataclass, field

# Names used for peak_flops keys and everywhere a compute dtype is named.
FLOP_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8")

GB = 1e9


@dataclass(frozen=True)
class Hardware:
    """One accelerator (or CPU): bytes/s from memory, dense FLOP/s per dtype, bytes of memory."""

    name: str
    memory_bandwidth: float  # bytes/s
    peak_flops: dict[str, float]  # dense FLOP/s by dtype name
    memory_bytes: float
    note: str = ""

    def __post_init__(self):
        if not self.memory_bandwidth > 0:
            raise ValueError(
                f"{self.name}: memory_bandwidth must be positive, got {self.memory_bandwidth!r}."
            )
        if not self.memory_bytes > 0:
            raise ValueError(
                f"{self.name}: memory_bytes must be positive, got {self.memory_bytes!r}."
            )
        if not self.peak_flops:
            raise ValueError(f"{self.name}: peak_flops needs at least one dtype.")
        for dtype, rate in self.peak_flops.items():
            if dtype not in FLOP_DTYPES:
                raise ValueError(
                    f"{self.name}: unknown dtype {dtype!r} in peak_flops; "
                    f"choose from {', '.join(FLOP_DTYPES)}."
                )
            if not rate > 0:
                raise ValueError(
                    f"{self.name}: peak_flops[{dtype!r}] must be positive, got {rate!r}."
                )

    def flops(self, dtype: str) -> float:
        """Dense peak FLOP/s for `dtype`."""
        if dtype not in self.peak_flops:
            raise ValueError(
                f"{self.name} has no peak FLOP/s for {dtype!r}; "
                f"choose from {', '.join(self.peak_flops)}."
            )
        return self.peak_flops[dtype]

    def compute_rate(self, dtype: str) -> float:
        """Dense peak FLOP/s when computing in `dtype`.

        A chip with no listed rate for a 16-bit float uses its other 16-bit float (T4 has fp16, not
        bf16), else fp32 (a CPU without native bf16 runs it no faster than fp32). Either way the
        rate is not an underestimate, so time bounds built on it stay lower bounds.
        """
        if dtype in self.peak_flops:
            return self.peak_flops[dtype]
        for fallback in {"bf16": ("fp16", "fp32"), "fp16": ("bf16", "fp32")}.get(dtype, ()):
            if fallback in self.peak_flops:
                return self.peak_flops[fallback]
        return self.flops(dtype)  # raises a ValueError naming the dtypes it has

    def ridge_point(self, dtype: str = "bf16") -> float:
        """FLOPs per byte where the roofline bends: below it a step is memory-bound, above it
        compute-bound. The one definition; `cost.ridge_point` also accepts a catalog name."""
        return self.compute_rate(dtype) / self.memory_bandwidth


def _nvidia(name, bandwidth, fp32, tensor_16bit, int8, memory, note, fp8=None) -> Hardware:
    flops = {"fp32": fp32, "fp16": tensor_16bit, "bf16": tensor_16bit, "int8": int8}
    if fp8:
        flops["fp8"] = fp8
    return Hardware(name, bandwidth, flops, memory, note)


# fp32 is the plain (non-tensor-core) rate: TF32 tensor cores are faster but round inputs to 10 bits,
# so they are a different dtype, not "fp32". Memory sizes are the decimal GB of the datasheet.
CATALOG: dict[str, Hardware] = {
    hw.name: hw
    for hw in (
        _nvidia(
            "h100-sxm",
            3.35e12,
            67e12,
            989e12,
            1979e12,
            80 * GB,
            fp8=1979e12,
            note="NVIDIA H100 SXM5 80GB datasheet; dense rates (the datasheet's 1,979 bf16 is with sparsity)",
        ),
        _nvidia(
            "h200",
            4.8e12,
            67e12,
            989e12,
            1979e12,
            141 * GB,
            fp8=1979e12,
            note="NVIDIA H200 SXM 141GB datasheet; same compute as H100 SXM, more and faster HBM3e",
        ),
        _nvidia(
            "a100-80gb",
            2.039e12,
            19.5e12,
            312e12,
            624e12,
            80 * GB,
            note="NVIDIA A100 80GB SXM datasheet; dense rates",
        ),
        _nvidia(
            "a100-40gb",
            1.555e12,
            19.5e12,
            312e12,
            624e12,
            40 * GB,
            note="NVIDIA A100 40GB datasheet; dense rates",
        ),
        _nvidia(
            "l4",
            300e9,
            30.3e12,
            121e12,
            242e12,
            24 * GB,
            fp8=242e12,
            note="NVIDIA L4 datasheet; dense rates are half the quoted sparse 242/485 TFLOP/s",
        ),
        Hardware(
            "t4",
            320e9,
            {"fp32": 8.1e12, "fp16": 65e12, "int8": 130e12},
            16 * GB,
            note="NVIDIA T4 datasheet (Turing: no bf16)",
        ),
        Hardware(
            "apple-m2-max",
            400e9,
            {"fp32": 13.6e12, "fp16": 13.6e12},
            96 * GB,
            note="Apple M2 Max, 38-core GPU, 96 GB unified memory; its GPU runs fp16 at the fp32 rate",
        ),
        Hardware(
            "laptop-100gbs",
            100e9,
            {"fp32": 1e12, "fp16": 2e12, "bf16": 2e12},
            16 * GB,
            note="a round-number laptop for the worked examples, not a real product",
        ),
    )
}

# A pseudo-name that get_hardware() answers by measuring the current machine.
MEASURED_NAME = "this"


def get_hardware(name_or_hardware: str | Hardware) -> Hardware:
    """A catalog entry by (case-insensitive) name, or "this" to measure the current device."""
    if isinstance(name_or_hardware, Hardware):
        return name_or_hardware
    key = str(name_or_hardware).strip().lower()
    if key == MEASURED_NAME:
        return measure().as_hardware()
    if key not in CATALOG:
        raise ValueError(
            f"Unknown hardware {name_or_hardware!r}; "
            f"choose from {', '.join((*CATALOG, MEASURED_NAME))}."
        )
    return CATALOG[key]


# ---- measuring the current machine -------------------------------------------------------------


@dataclass(frozen=True)
class Measurement:
    """What `measure()` found. Bandwidths are bytes/s, FLOP rates FLOP/s."""

    device: str  # e.g. "AMD EPYC" or "NVIDIA H100 80GB HBM3"
    device_type: str  # "cpu", "cuda", ...
    torch_version: str
    threads: int
    bandwidth: float  # the faster of read-only and copy streaming: the roofline's memory slope
    read_bandwidth: float  # torch.sum: bytes read / time
    copy_bandwidth: float  # tensor.copy_: (bytes read + bytes written) / time
    flops: dict[str, float] = field(default_factory=dict)
    # which matmul set each rate: "torch" (a square matmul) or "memwall C kernel" (CPU, fp32)
    flops_source: dict[str, str] = field(default_factory=dict)
    memory_bytes: float = 0.0
    working_set_bytes: int = 0
    machine: dict = field(default_factory=dict)  # memwall.fingerprint.machine_fingerprint()

    def as_hardware(self) -> Hardware:
        return Hardware(
            name=f"this-{self.device_type}",
            memory_bandwidth=self.bandwidth,
            peak_flops=dict(self.flops),
            memory_bytes=self.memory_bytes or 1.0,
            note=f"measured by memwall.measure() on {self.device}, torch {self.torch_version}, "
            f"{self.threads} threads",
        )


def _best_seconds(fn, synchronize, repeats: int, warmup: int = 1) -> float:
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


def _device_name(device) -> str:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or device.type


def _kernels_in_use() -> bool:
    """Whether memwall's C kernels run here (built, and not switched off)."""
    from memwall.engine import cpu_kernels

    return cpu_kernels.available()


def _memwall_kernel_flops(repeats: int) -> float | None:
    """fp32 FLOP/s of memwall's C kernel (None without a compiler or with MEMWALL_CPU_KERNELS=0)."""
    from memwall.engine import cpu_kernels

    return cpu_kernels.fp32_flops(repeats)


def _cpu_has_bf16() -> bool:
    from memwall.fingerprint import has_native_bf16

    return has_native_bf16()


def _memory_bytes(device) -> float:
    import torch

    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


MiB = 2**20


def working_set_bytes(quick: bool, cache_bytes: int, free_bytes: int) -> int:
    """Bytes per buffer for the bandwidth test: far above the last-level cache, or we would time
    the cache instead of DRAM/HBM (8x it, 4x when quick; at least 256/128 MiB), and small enough
    that the two buffers take at most a quarter of the free memory (Binder gives 1-2 GB)."""
    cache_bytes = cache_bytes or 32 * MiB  # unknown: a typical server L3
    size = max((4 if quick else 8) * cache_bytes, (128 if quick else 256) * MiB)
    if free_bytes:
        size = min(size, free_bytes // 8)
    return max(size // MiB, 1) * MiB


def _cache_and_free_memory(device) -> tuple[int, int]:
    """(last-level cache bytes, free memory bytes) of `device`; 0 where unknown."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0), free
    from memwall.fingerprint import last_level_cache_bytes
    from memwall.memory import available_memory_bytes

    return last_level_cache_bytes(), available_memory_bytes()


@functools.cache
def _measure(device_str: str, quick: bool, kernels: bool = False) -> Measurement:
    import torch

    from memwall.fingerprint import machine_fingerprint

    device = torch.device(device_str)
    on_cpu = device.type == "cpu"
    if device.type == "cuda":
        synchronize = functools.partial(torch.cuda.synchronize, device)
    elif hasattr(torch, device.type) and hasattr(getattr(torch, device.type), "synchronize"):
        synchronize = getattr(torch, device.type).synchronize  # e.g. torch.mps
    else:
        synchronize = lambda: None  # noqa: E731 - CPU ops are synchronous

    working_set = working_set_bytes(quick, *_cache_and_free_memory(device))
    source = torch.ones(working_set // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    # On a GPU one pass takes well under a millisecond, so time several passes per sample.
    passes = 1 if on_cpu else 10
    repeats = 3 if quick else 5

    def read_all():
        for _ in range(passes):
            source.sum()

    def copy_all():
        for _ in range(passes):
            target.copy_(source)

    read_bw = passes * working_set / _best_seconds(read_all, synchronize, repeats)
    copy_bw = passes * 2 * working_set / _best_seconds(copy_all, synchronize, repeats)
    source = target = None  # free the buffers before the matmuls

    # A square matmul of side n does 2 n^3 FLOPs on 3 n^2 elements: compute-bound for large n.
    n = (1024 if quick else 2048) if on_cpu else (4096 if quick else 8192)
    # A CPU gets a bf16 roof only when its flags say it has bf16 dot products (AVX-512 BF16, AMX,
    # ARM FEAT_BF16): elsewhere bf16 is emulated, slower than fp32, and its "roof" would mislead.
    dtypes = (
        {"fp32": torch.float32, **({"bf16": torch.bfloat16} if _cpu_has_bf16() else {})}
        if on_cpu
        else {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    )
    flops = {}
    for name, dtype in dtypes.items():
        try:
            a = torch.randn(n, n, device=device).to(dtype)
            b = torch.randn(n, n, device=device).to(dtype)
            flops[name] = (
                passes
                * 2
                * n**3
                / _best_seconds(
                    lambda a=a, b=b: [a @ b for _ in range(passes)],
                    synchronize,
                    repeats=2 if quick else 3,
                )
            )
        except (
            RuntimeError,
            TypeError,
        ):  # a dtype this device cannot multiply (e.g. bf16 on old MPS)
            if name == "fp32":
                raise
        finally:
            a = b = None  # free the operands before the next dtype

    sources = {name: "torch" for name in flops}
    if on_cpu:
        # PyTorch's fp32 matmul can leave the CPU's widest instructions unused (MKL runs its AVX2
        # code on AMD CPUs: about half of a Zen 5's FLOP/s). Where memwall's own kernel computes
        # faster, its rate is the roof: a ceiling below what the engine reaches is no ceiling.
        kernel = _memwall_kernel_flops(repeats=2 if quick else 3) if kernels else None
        if kernel and kernel > flops["fp32"]:
            flops["fp32"], sources["fp32"] = kernel, "memwall C kernel"

    return Measurement(
        device=_device_name(device),
        device_type=device.type,
        torch_version=torch.__version__,
        threads=torch.get_num_threads(),
        bandwidth=max(read_bw, copy_bw),
        read_bandwidth=read_bw,
        copy_bandwidth=copy_bw,
        flops=flops,
        flops_source=sources,
        memory_bytes=_memory_bytes(device),
        working_set_bytes=working_set,
        machine=machine_fingerprint(),
    )


def measure(device=None, quick: bool = False) -> Measurement:
    """Measure memory bandwidth and matmul FLOP/s on `device` (default: the device the models load
    on, `memwall.devices.default_device()`: the CPU unless MEMWALL_DEVICE says otherwise).

    Results are cached for the process, so chapters can call this freely. `quick` uses a smaller
    (still larger-than-cache) working set and matmul, for tests.
    """
    import torch

    if device is None:
        from memwall.devices import default_device

        device = default_device()
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    # The kernels' on/off state is part of the key: it decides which matmul sets the fp32 roof.
    kernels = device.type == "cpu" and _kernels_in_use()
    return _measure(str(device), bool(quick), kernels)
