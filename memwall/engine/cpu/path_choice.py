"""Which kernel path a layer takes, chosen by measuring on this machine.

A linear layer's CPU twin can multiply in several ways, and which is fastest depends on the CPU,
the number of activation rows and the weight format (CPUs with different instruction sets and
caches disagree on every one of these). So the first time a layer of a given format and shape meets a
given bucket of rows, the candidates are timed (calibrate.py) on its real weights, read from
memory as decode reads them and called as the fast decode step calls them (memwall's C kernels
from C, PyTorch's paths through Python), a few seconds for the whole model (logged once, to
the "memwall.kernels" logger); the fastest is kept, on disk, under a key for this machine: CPU model, ISA flags,
threads, torch version and the kernels' source hash. A choice timed while other work kept the
cores busy is used by this process but not kept: on shared cores, one stalled thread can make
the best path look like the worst.

The candidates (a twin lists the ones that can take a given input; linears.py describes them):
  fp32, bf16, fp16: "c" (memwall's C kernel), "bmm" (the row split), "linear" (F.linear);
                    the fast decode step's batches also "packed" for fp32 (C, on a copy of the
                    weights packed in panels, made only for a layer that takes this path, and
                    offered only where a copy of the model fits the memory budget)
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
import logging
import os
import tempfile

import torch

from memwall.engine.cpu import calibrate, kernels

ENV = "MEMWALL_KERNEL_PATH"
PATHS = {
    "fp32": ("c", "packed", "bmm", "linear"),
    "bf16": ("c", "bmm", "linear"),
    "fp16": ("bmm", "linear"),
    "int8": ("c", "c_row", "c_many", "torch", "w8a8", "dequant"),
    "int4": ("c", "c_many", "torch", "dequant"),
}
BUCKETS = (1, 4, 16, 64, 256, 512)  # rows are timed at the bucket's top; more than 512 -> 512
METHOD = 7  # how calibrate.py times paths; a new way of timing must not reuse the old choices
APPROXIMATE = ("w8a8",)  # paths taken only when pinned
FEW_ROWS = {"fp32": 256, "bf16": 256, "fp16": 256, "int8": 8, "int4": 8}

log = logging.getLogger("memwall.kernels")
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
    switched_off = kernels._switched_off
    # twins of one shape may differ in whether they may make a packed copy (linears.py)
    packed_copy = fast_step and getattr(layer, "packed_copy", False)
    key = (
        layer.kernel_key(),
        rows,
        x.dtype,
        x.device.type,
        switched_off,
        spec,
        fast_step,
        packed_copy,
    )
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
    """The fastest of `options` at `rows` rows (calibrate.fastest), with a notice the first time
    this process measures."""
    global _announced
    if not _announced:
        # a log record, not a print: a notebook's page must not depend on who built it
        # (`memwall build-kernels` calibrates ahead of time and shows these lines)
        log.info("timing kernel paths on this machine, once; cached in %s", cache_file())
        _announced = True
    candidates = [p for p in options if p not in ("dequant", *APPROXIMATE)] or ["dequant"]
    usual = fixed_path(layer.kernel_key()[0], rows, options)
    return calibrate.fastest(layer, x.shape[-1], x.dtype, rows, candidates, usual)


# ---- the decisions on disk, keyed by this machine -------------------------------------------------


@functools.cache
def machine_key() -> dict:
    """What the decisions depend on: the machine, threads, torch and the kernels' sources."""
    from memwall.engine.cpu import build
    from memwall.machine.fingerprint import fingerprint_id, machine_fingerprint

    fingerprint = machine_fingerprint()
    key = {
        "machine": fingerprint_id(fingerprint),
        "cpu_model": fingerprint["cpu_model"],
        "isa": fingerprint["isa"],
        "threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "kernel_variant": kernels.variant(),
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
