"""The measuring harness every `memwall bench` subcommand shares.

What makes a timing trustworthy on a shared, noisy machine (Hoefler & Belli 2015, "Scientific
benchmarking of parallel computing systems"):
- warm-up runs first, thrown away (allocator, caches, lazy initialisation, CPU frequency);
- several repeats, reported as the median, with every repeat kept in the result;
- when two things are compared, their repeats are interleaved (A, B, A, B, ...), so that a burst
  of load from another process slows both, not just one, and the ratio stays honest;
- a device synchronisation before every clock read, so GPU work is not left running unseen.

`run_interleaved` does the first three, and with a `probe` (`memwall.machine.probe.RooflineProbe`)
measures the bandwidth right before every repeat, so the roofline is taken with the work, not once
before it; `synchronize` does the last. The rest resolves the options every subcommand shares
(device, dtype), records the machine (`memwall.machine.fingerprint`) and formats results.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping

import torch

from memwall.validate import count

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DEVICES = ("cpu", "cuda")
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "GOMP_SPINCOUNT")


# ---- options shared by every subcommand ------------------------------------------------------


def resolve_device(device: str | None) -> str:
    """ "cpu", "cuda" or "cuda:N" (default: cuda when available), or a ValueError naming the
    choices."""
    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = str(device).partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise ValueError(f"Unknown device {device!r}; choose from cpu, cuda or cuda:N.")
    if kind == "cuda" and not torch.cuda.is_available():
        raise ValueError("CUDA was requested but torch sees no CUDA GPU here; use --device cpu.")
    if index and int(index) >= torch.cuda.device_count():
        raise ValueError(f"{device} does not exist: torch sees {torch.cuda.device_count()} GPU(s).")
    return str(device)


def resolve_dtype(dtype: str | None, device: str) -> str:
    """A dtype name from DTYPES; default fp32 on CPU and, on a GPU, the 16-bit format it computes
    in natively (bf16, or fp16 on GPUs before compute capability 8.0, such as a T4).

    fp32 on a CPU because that is the engine's reference path there, not because every CPU lacks
    bf16: `memwall.machine.fingerprint.has_native_bf16()` says whether this one has it."""
    if dtype is None:
        if device == "cpu":
            return "fp32"
        from memwall.engine.cuda import native_half_dtype

        return dtype_name(native_half_dtype(device))
    if dtype not in DTYPES:
        raise ValueError(f"Unknown dtype {dtype!r}; choose from {', '.join(DTYPES)}.")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    for name, value in DTYPES.items():
        if value == dtype:
            return name
    return str(dtype).replace("torch.", "")


def synchronize(device) -> None:
    """Wait for queued device work, so the next clock read includes it (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def environment(device: str) -> dict:
    """What a reader needs to interpret the numbers: where, with what, and how busy the machine was."""
    from memwall.machine.fingerprint import fingerprint_id, machine_fingerprint
    from memwall.machine.microbench import device_name

    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {
        "device": torch.device(device).type,
        "device_name": device_name(torch.device(device)),
        "torch_version": torch.__version__,
        "threads": torch.get_num_threads(),
        "load_average_1min": load,
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_fingerprint(),
        "machine_id": fingerprint_id(),
        # Thread settings change CPU results a lot, above all on a busy machine: record them.
        **{name.lower(): os.environ[name] for name in THREAD_VARIABLES if name in os.environ},
    }


def warn_if_busy(result: dict) -> None:
    """On stderr: a CPU result taken while other work wanted the cores is not worth much alone."""
    load, threads = result.get("load_average_1min"), result.get("threads") or 1
    if result.get("device") == "cpu" and load is not None and load > threads:
        print(
            f"memwall bench: the 1-minute load average was {load:.1f} on {threads} threads: other programs "
            "competed for the cores, so absolute times are inflated (ratios from one run hold up better). "
            "On a shared machine, OMP_WAIT_POLICY=PASSIVE stops idle OpenMP threads from spinning.",
            file=sys.stderr,
        )


# ---- repeats and medians -----------------------------------------------------------------------


class _NoProgress:
    def update(self, n=1):
        pass

    def close(self):
        pass


def progress_bar(total: int, description: str, enabled: bool | None = None):
    """A tqdm bar on stderr, shown only when stderr is a terminal (never in logs, pipes or notebooks)."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    if not enabled:
        return _NoProgress()
    from tqdm import tqdm

    return tqdm(total=total, desc=description, file=sys.stderr, leave=False)


def run_interleaved(
    runs: Mapping[str, Callable[[], dict]],
    repeats: int,
    warmup: int = 1,
    description: str = "bench",
    progress: bool | None = None,
    probe: Callable[[], float] | None = None,
) -> dict[str, list[dict]]:
    """Call each function in `runs` warmup + repeats times, round-robin; keep the timed repeats.

    Each function does one complete measurement and returns a dict of numbers (e.g. seconds).
    Returns {name: [one dict per timed repeat]}. With a `probe` (a function returning bytes/s),
    every call is preceded by one probe, stored in its dict as "probe_bandwidth": the pair
    (probe, work) gives that repeat's roofline.
    """
    count("repeats", repeats, 1)
    count("warmup", warmup, 0)
    results: dict[str, list[dict]] = {name: [] for name in runs}
    bar = progress_bar((warmup + repeats) * len(runs), description, progress)
    try:
        for round_index in range(warmup + repeats):
            for name, run in runs.items():
                bandwidth = probe() if probe is not None else None
                measured = run()
                if bandwidth is not None:
                    measured = {**measured, "probe_bandwidth": bandwidth}
                if round_index >= warmup:
                    results[name].append(measured)
                bar.update()
    finally:
        bar.close()
    return results


def run_with_probe(runs, repeats, warmup, description, progress, probe):
    """run_interleaved; returns the samples and every bandwidth the probe read, in order."""
    samples = run_interleaved(runs, repeats, warmup, description, progress, probe=probe)
    probes = [
        s["probe_bandwidth"] for name in runs for s in samples[name] if "probe_bandwidth" in s
    ]
    return samples, probes


def medians(samples: list[dict]) -> dict:
    """The median of each key over repeats."""
    return {key: statistics.median(sample[key] for sample in samples) for key in samples[0]}


def roofline_fields(
    tok_per_s: float,
    bytes_per_step: float,
    bandwidth: float,
    compute_roof_tok_per_s: float | None = None,
    fraction: float | None = None,
) -> dict:
    """Where a measured decode speed sits under its ceiling, min(memory roof, compute roof):
    tokens/s <= bandwidth / bytes per token, and <= peak FLOP/s / FLOPs per token.

    compute_roof_tok_per_s: None when no compute peak is known (then the memory roof alone).
    fraction: the fraction from (probe, work) pairs, when the bandwidth was probed with the work;
    default tok_per_s / ceiling.
    """
    memory_roof = bandwidth / bytes_per_step
    roofline = min(memory_roof, compute_roof_tok_per_s or float("inf"))
    return {
        "measured_bandwidth_bytes_per_s": bandwidth,
        "achieved_bandwidth_bytes_per_s": tok_per_s * bytes_per_step,
        "memory_roof_tok_per_s": memory_roof,
        "compute_roof_tok_per_s": compute_roof_tok_per_s,
        "roofline_tok_per_s": roofline,
        "roofline_bound": "memory" if roofline == memory_roof else "compute",
        "fraction_of_roofline": tok_per_s / roofline if fraction is None else fraction,
    }


# ---- output ------------------------------------------------------------------------------------


def _format(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def print_result(result: dict, as_json: bool, columns: list[str] | None = None) -> None:
    """JSON for machines; otherwise a two-column table, or one column per entry of `columns`
    (e.g. ["memwall", "hf"]) when `result` holds a sub-dict for each."""
    if as_json:
        print(json.dumps(result, indent=2))
        return
    if not columns:
        rows = [
            (key, _format(value))
            for key, value in result.items()
            if not isinstance(value, (list, dict))
        ]
        width = max(len(key) for key, _ in rows)
        for key, value in rows:
            print(f"{key:<{width}}  {value}")
        return
    shared = [(key, _format(v)) for key, v in result.items() if not isinstance(v, (list, dict))]
    keys = [key for key, value in result[columns[0]].items() if not isinstance(value, (list, dict))]
    width = max(len(key) for key in keys + [key for key, _ in shared])
    for key, value in shared:
        print(f"{key:<{width}}  {value}")
    print(f"{'':<{width}}  " + "  ".join(f"{name:>14}" for name in columns))
    for key in keys:
        print(
            f"{key:<{width}}  "
            + "  ".join(f"{_format(result[name].get(key, '')):>14}" for name in columns)
        )
