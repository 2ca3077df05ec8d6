"""What `measure()` found on this machine, and which of its roofs a working set answers to.

A stream's speed depends on the memory level its working set lives in: DRAM for one larger than
the last-level cache, the cache's bandwidth for one that fits there. `roof_for(nbytes)` picks the
measured roof for a working set from its size against the cache sizes, and says where that roof
is only a bound (a level that could not be measured within the memory budget).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from memwall.hardware import Hardware
from memwall.machine.caches import DRAM, level_of, usable_levels


class Roof(NamedTuple):
    """The bandwidth (bytes/s) a working set is judged against, its level, and a caveat."""

    level: str  # "DRAM", "L3", ...
    bandwidth: float
    note: str  # "" where the level itself was measured


@dataclass(frozen=True)
class Measurement:
    """What `measure()` found. Bandwidths are bytes/s, FLOP rates FLOP/s."""

    device: str  # the CPU's or GPU's model name
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
    machine: dict = field(default_factory=dict)  # machine.fingerprint.machine_fingerprint()
    memory_level: str = DRAM  # what `bandwidth` measured: "DRAM" or "last-level cache"
    note: str = ""  # "this measures the cache, not DRAM: ..." where the budget forced it
    cache_bandwidth: float | None = None  # read bandwidth of the last-level cache (CPU)
    cache_working_set_bytes: int = 0

    def as_hardware(self) -> Hardware:
        return Hardware(
            name=f"this-{self.device_type}",
            memory_bandwidth=self.bandwidth,
            peak_flops=dict(self.flops),
            memory_bytes=self.memory_bytes or 1.0,
            note=f"measured by memwall.machine.measure() on {self.device}, torch "
            f"{self.torch_version}, {self.threads} threads, {self.memory_level} bandwidth",
        )

    def roof_for(self, nbytes: int, levels=None) -> Roof:
        """The measured roof for a stream over `nbytes`: DRAM's bandwidth past the last-level
        cache, the cache's inside it. `levels` defaults to this CPU's cache levels, as far as this
        process gets them."""
        levels = usable_levels() if levels is None else levels
        level = level_of(nbytes, levels) if self.device_type == "cpu" else DRAM
        if level == DRAM:
            if self.memory_level == DRAM:
                return Roof(DRAM, self.bandwidth, "")
            return Roof(  # a roof above the truth still bounds the speed from above
                DRAM,
                self.bandwidth,
                "DRAM could not be measured within the memory budget: the cache's bandwidth "
                "stands in, an upper bound",
            )
        cache = self.cache_bandwidth or self.bandwidth
        if levels and level == levels[-1].name:
            return Roof(level, cache, "")
        return Roof(  # a smaller cache is faster still: this roof is low
            level, cache, f"the {level} cache is faster than the last-level cache measured here"
        )
