"""The roofline measured with the workload: bandwidth probes interleaved with the timed repeats.

On a shared machine the memory bandwidth is not a constant: other tenants' traffic and the
host's power states can move it by a factor of two from one moment to the next, so a ceiling
measured once, before the work, can make the same engine look like 39% or 89% of its roofline.
Instead, each timed repeat is preceded by a short read-bandwidth probe, and each fraction of
the roofline is taken from an adjacent (probe, work) pair; the fractions' median is reported,
with the probes' spread. When the probes disagree by more than 20%, `warn_if_unstable` says so.

The probe's buffer follows the machine room's one sizing rule (`working_set.for_device`): past
the last-level cache where the memory budget allows, else inside the cache, and then its
`level` and `note` say that it measures the cache, not DRAM; unless timing it shows that this
process gets less of the cache than the OS reports (`microbench.working_set_for`).
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch

from memwall.machine import working_set as sizing
from memwall.machine.caches import DRAM, level_of
from memwall.machine.microbench import working_set_for

UNSTABLE_SPREAD = 1.2  # max/min of the probes above which a result gets a warning


class RooflineSpreadWarning(UserWarning):
    """The bandwidth probes of one benchmark disagreed by more than UNSTABLE_SPREAD."""


class RooflineProbe:
    """Call it to measure read bandwidth now (bytes/s); it keeps every sample in `.samples`.

    Each call times `reads` full reads of its buffer (torch.sum) and keeps the fastest: noise only
    ever slows a read down, and the probe is the ceiling. The buffer exists only during a call:
    between calls the memory belongs to the work being measured, whose own temporaries (a
    dequantized matrix, a cache) would otherwise sit beside it. About 50 ms on a CPU, most of it
    touching the fresh buffer's pages.
    """

    def __init__(self, device="cpu", working_set_bytes: int | None = None, reads: int = 3):
        self.device = torch.device(device)
        on_gpu = self.device.type == "cuda"
        if working_set_bytes is None:
            chosen = working_set_for(self.device)
        else:  # a size the caller chose: say which level it reads from all the same
            chosen = sizing.WorkingSet(int(working_set_bytes), DRAM)
            if not on_gpu and level_of(chosen.bytes) != DRAM:
                chosen = sizing.WorkingSet(
                    chosen.bytes,
                    sizing.LAST_LEVEL_CACHE,
                    f"{sizing.CACHE_NOTE}: {chosen.bytes / 2**20:.0f} MiB fits in the "
                    f"{level_of(chosen.bytes)} cache",
                )
        self.working_set_bytes = chosen.bytes
        self.level = chosen.level  # "DRAM" or "last-level cache": the roof this probe measures
        self.note = chosen.note  # why it is not DRAM, where it is not
        self.reads = reads
        # A GPU reads 512 MiB in ~0.1 ms, close to the cost of a sync: time 10 passes per sample.
        self.passes = 10 if on_gpu else 1
        self.samples: list[float] = []

    def stand_in_note(self, nbytes: int) -> str:
        """Why this probe's bandwidth only bounds a stream over `nbytes` from above ("" when it
        is that stream's own roof): the probe measured the cache, and the stream comes from
        DRAM (as `Measurement.roof_for` says of its roof)."""
        if self.level != DRAM and self.device.type != "cuda" and level_of(int(nbytes)) == DRAM:
            return self.note
        return ""

    def _sync(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def __call__(self) -> float:
        buffer = torch.ones(self.working_set_bytes // 4, dtype=torch.float32, device=self.device)
        buffer.sum()  # warm the reduction
        self._sync()
        best = float("inf")
        for _ in range(self.reads):
            start = time.perf_counter()
            for _ in range(self.passes):
                buffer.sum()
            self._sync()
            best = min(best, time.perf_counter() - start)
        bandwidth = self.passes * self.working_set_bytes / best
        self.samples.append(bandwidth)
        return bandwidth


def spread_fields(probes: list[float]) -> dict:
    """min/median/max of the probes (bytes/s) and their spread max/min, as JSON-ready fields."""
    if not probes:
        return {}
    low, high = min(probes), max(probes)
    return {
        "bandwidth_probe_min_bytes_per_s": low,
        "bandwidth_probe_median_bytes_per_s": statistics.median(probes),
        "bandwidth_probe_max_bytes_per_s": high,
        "bandwidth_probe_spread": high / low,
        "bandwidth_probes_bytes_per_s": list(probes),
    }


def warn_if_unstable(probes: list[float], what: str = "benchmark") -> str | None:
    """Warn (RooflineSpreadWarning) when probes disagree by more than 20%; return the message."""
    if len(probes) < 2:
        return None
    spread = max(probes) / min(probes)
    if spread <= UNSTABLE_SPREAD:
        return None
    message = (
        f"{what}: the bandwidth probes disagreed by {spread:.2f}x "
        f"({min(probes) / 1e9:.1f} to {max(probes) / 1e9:.1f} GB/s): the machine's memory "
        "bandwidth changed during the run. Each fraction of the roofline uses the probe next to "
        "it, but treat absolute speeds with care."
    )
    warnings.warn(message, RooflineSpreadWarning, stacklevel=2)
    return message


def paired_fractions(
    achieved: list[float], probes: list[float], bytes_per_unit: float, compute_roof=None
) -> list[float]:
    """Fraction of the roofline for each adjacent (probe, work) pair.

    achieved: units/s of each timed repeat (tokens/s); probes: the bandwidth measured just before
    it; bytes_per_unit: bytes moved per unit; compute_roof: units/s the compute peak allows
    (None: no compute ceiling known), so each pair's roof is min(memory roof, compute roof).
    """
    if len(achieved) != len(probes):
        raise ValueError(f"{len(achieved)} timings but {len(probes)} probes; they come in pairs.")
    return [
        rate / min(probe / bytes_per_unit, compute_roof or float("inf"))
        for rate, probe in zip(achieved, probes)
    ]


def timed_against_roofline(
    fn,
    bytes_per_call: float,
    repeats: int = 5,
    warmup: int = 1,
    flops_per_call: float = 0.0,
    peak_flops: float | None = None,
    device="cpu",
    probe=None,
) -> dict:
    """Time `fn()` with a bandwidth probe before each call, for chapters that measure a kernel or a
    step against the roofline: the fraction is the median over (probe, call) pairs.

    bytes_per_call / flops_per_call: what one call must move and compute (its ceiling is
    min(bandwidth / bytes, peak / FLOPs) calls per second; no peak: the memory roof alone).
    Returns seconds (median), the fraction and its repeats, and the probes' min/median/max/spread;
    warns (RooflineSpreadWarning) when the probes disagree by more than 20%.
    """
    from memwall.validate import count

    count("repeats", repeats, 1)
    count("warmup", warmup, 0)
    if not bytes_per_call > 0:
        raise ValueError(f"bytes_per_call must be positive, got {bytes_per_call!r}.")
    probe = RooflineProbe(device) if probe is None else probe
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    seconds, probes = [], []
    for index in range(warmup + repeats):
        bandwidth = probe()
        sync()
        start = time.perf_counter()
        fn()
        sync()
        if index >= warmup:
            seconds.append(time.perf_counter() - start)
            probes.append(bandwidth)
    compute_roof = peak_flops / flops_per_call if peak_flops and flops_per_call else None
    fractions = paired_fractions([1 / s for s in seconds], probes, bytes_per_call, compute_roof)
    result = {
        "seconds": statistics.median(seconds),
        "seconds_repeats": seconds,
        "fraction_of_roofline": statistics.median(fractions),
        "fraction_of_roofline_repeats": fractions,
        **spread_fields(probes),
    }
    message = warn_if_unstable(probes, "timed_against_roofline")
    if message:
        result["roofline_warning"] = message
    return result
