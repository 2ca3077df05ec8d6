"""Accelerators as the roofline sees them: memory bandwidth, dense peak FLOP/s, memory size.

`CATALOG` holds datasheet numbers; `memwall.machine.measure()` gets the same numbers for the
machine you are on, with microbenchmarks (the roofline model: Williams, Waterman & Patterson, 2009).

Datasheets often quote tensor-core rates "with sparsity" (2:4 structured sparsity), twice the
dense rate: NVIDIA's 1,979 TFLOP/s bf16 for the H100 SXM is 989 dense. Inference on ordinary
weights gets the dense rate, so every number here is dense.
"""

from __future__ import annotations

from dataclasses import dataclass

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


def get_hardware(name_or_hardware: str | Hardware) -> Hardware:
    """A catalog entry by (case-insensitive) name; a `Hardware` passes through.
    (`memwall.machine.get_hardware` also answers "this", by measuring the current machine.)"""
    if isinstance(name_or_hardware, Hardware):
        return name_or_hardware
    key = str(name_or_hardware).strip().lower()
    if key not in CATALOG:
        raise ValueError(
            f"Unknown hardware {name_or_hardware!r}; choose from {', '.join(CATALOG)}."
        )
    return CATALOG[key]
