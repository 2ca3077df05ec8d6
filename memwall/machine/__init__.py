"""The machine memwall runs on: what it is, what this process may use of it, how fast it is.

- `fingerprint`: CPU model, ISA flags, cores, caches, GPU (which machine a number came from).
- `devices`: the one device a notebook runs and measures on (``MEMWALL_DEVICE``).
- `memory`: how much memory this process may use (the container's cgroup limit, else the host).
- `cores`: how many cores it may use (affinity and the container's CPU quota).
- `cpu_wait`: how long its threads waited for a CPU (another process held a core).
- `step_threads`: how many threads a decode step uses, chosen from the steps' own times, so that
  no step waits on a core another process holds (the fast path's and the readable engine's; needs
  torch).
- `caches`: the cache levels, and which level a working set of N bytes lives in.
- `working_set`: the one rule that sizes a bandwidth test's buffers (caches and memory budget).
- `microbench`: bandwidth of each memory level and matmul FLOP/s, measured (`measure()`).
- `measurement`: what it found, and the roof a working set of N bytes answers to (`roof_for`).
- `probe`: the roofline probed between a benchmark's timed repeats (`RooflineProbe`; needs torch).
- `notebook_peak`: a notebook's peak memory, run in a fresh kernel.

Importing this package needs only the standard library; torch is imported when measuring.
"""

from memwall.machine.caches import cache_levels, last_level_cache_bytes, level_of, usable_levels
from memwall.machine.cores import core_limit, usable_cores
from memwall.machine.devices import default_device
from memwall.machine.fingerprint import machine_fingerprint
from memwall.machine.measurement import Measurement, Roof
from memwall.machine.memory import (
    available_memory_bytes,
    buffer_budget_bytes,
    memory_limit,
)
from memwall.machine.microbench import MEASURED_NAME, get_hardware, measure
from memwall.machine.working_set import cache_working_set, dram_working_set

__all__ = [
    "MEASURED_NAME",
    "Measurement",
    "Roof",
    "available_memory_bytes",
    "buffer_budget_bytes",
    "cache_levels",
    "cache_working_set",
    "core_limit",
    "default_device",
    "dram_working_set",
    "get_hardware",
    "last_level_cache_bytes",
    "level_of",
    "machine_fingerprint",
    "measure",
    "memory_limit",
    "usable_cores",
    "usable_levels",
]
