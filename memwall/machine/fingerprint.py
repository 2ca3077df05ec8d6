"""Which machine a number was measured on: CPU model, ISA flags, cores, caches, memory, GPU.

Every benchmark record carries `machine_fingerprint()`, so a figure recorded elsewhere can say so
when it is shown on a different machine (`same_machine`). `fingerprint_id()` is a short, stable
hash of the machine's identity, for cache keys (e.g. compiled kernels chosen by measuring here).

Pure standard library: it reads /proc/cpuinfo and sysfs on Linux and `sysctl` on macOS, never
imports torch unless torch is installed (and then only for its thread count), and degrades to
None/0 for anything it cannot find rather than raising.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

from memwall.machine.caches import last_level_cache_bytes
from memwall.machine.cores import usable_cores

# The ISA features that change which kernels are fast: vector width, fused multiply-add, native
# bf16/int8 dot products, matrix tiles (x86), and their ARM counterparts.
RELEVANT_FLAGS = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_vnni",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "fma",
    "neon",
    "asimd",
    "sve",
    "bf16",  # ARM's native bf16 dot products (FEAT_BF16)
    "i8mm",
)
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")

# What makes two machines "the same" for a recorded figure; threads and versions are settings.
IDENTITY_KEYS = ("cpu_model", "isa", "cores", "gpu")
# What a cache key must separate: the identity, plus cache and memory sizes and the OS.
HASHED_KEYS = (*IDENTITY_KEYS, "l3_bytes", "memory_bytes", "platform")

# macOS sysctl names for the same features.
_MAC_FLAGS = {
    "hw.optional.avx2_0": "avx2",
    "hw.optional.avx512f": "avx512f",
    "hw.optional.fma": "fma",
    "hw.optional.AdvSIMD": "asimd",
    "hw.optional.arm.FEAT_BF16": "bf16",
    "hw.optional.arm.FEAT_I8MM": "i8mm",
}


def _sysctl(name: str) -> str | None:
    try:
        out = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=2)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


@functools.cache
def _cpuinfo() -> list[dict[str, str]]:
    """/proc/cpuinfo as one dict per processor (empty where there is no such file)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    blocks = []
    for block in text.strip().split("\n\n"):
        fields = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
        blocks.append(fields)
    return blocks


def cpu_model() -> str:
    for fields in _cpuinfo():
        for key in ("model name", "Model", "Hardware"):
            if fields.get(key):
                return fields[key]
    if sys.platform == "darwin":
        brand = _sysctl("machdep.cpu.brand_string")
        if brand:
            return brand
    return platform.processor() or platform.machine() or "unknown"


def isa_flags() -> list[str]:
    """The RELEVANT_FLAGS this CPU has, sorted."""
    found: set[str] = set()
    for fields in _cpuinfo()[:1]:
        found |= set((fields.get("flags") or fields.get("Features") or "").split())
    if sys.platform == "darwin":
        found |= {flag for name, flag in _MAC_FLAGS.items() if _sysctl(name) == "1"}
    return sorted(found & set(RELEVANT_FLAGS))


def physical_cores() -> int:
    pairs = {
        (fields.get("physical id"), fields.get("core id"))
        for fields in _cpuinfo()
        if "core id" in fields
    }
    if pairs:
        return len(pairs)
    if sys.platform == "darwin":
        count = _sysctl("hw.physicalcpu")
        if count and count.isdigit():
            return int(count)
    return os.cpu_count() or 1


def memory_bytes() -> int:
    """Physical memory in bytes; 0 if unknown."""
    if sys.platform == "darwin":
        value = _sysctl("hw.memsize")
        return int(value) if value and value.isdigit() else 0
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def torch_version() -> str | None:
    """The installed torch's version, without importing it."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_name() -> str | None:
    """The first CUDA GPU's name, or None. Uses torch only if it is already imported."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            if torch.cuda.is_available():
                return torch.cuda.get_device_name(0)
        except Exception:  # a broken driver is "no GPU" for a fingerprint
            return None
        return None
    for info in sorted(Path("/proc/driver/nvidia/gpus").glob("*/information")):
        try:
            for line in info.read_text().splitlines():
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            continue
    return None


def threads() -> int:
    """torch's intra-op thread count when torch is installed (what the benchmarks use), else cores."""
    if "torch" in sys.modules or importlib.util.find_spec("torch") is not None:
        import torch

        return torch.get_num_threads()
    return os.cpu_count() or 1


def machine_fingerprint() -> dict:
    """A JSON-ready description of this machine, for every benchmark record."""
    return {
        "cpu_model": cpu_model(),
        "isa": isa_flags(),
        "cores": physical_cores(),
        "threads": threads(),
        "usable_cores": usable_cores(),
        "l3_bytes": last_level_cache_bytes(),
        "memory_bytes": memory_bytes(),
        "gpu": gpu_name(),
        "torch_version": torch_version(),
        "platform": f"{platform.system()}-{platform.machine()}",
    }


def fingerprint_id(fp: dict | None = None) -> str:
    """12 hex digits identifying the machine (not the thread count or the torch version)."""
    fp = machine_fingerprint() if fp is None else fp
    identity = {key: fp.get(key) for key in HASHED_KEYS}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]


def same_machine(a: dict | None, b: dict | None) -> bool:
    """Whether two fingerprints describe the same kind of machine (CPU model, ISA, cores, GPU)."""
    if not a or not b:
        return False
    return all(_normalise(a.get(key)) == _normalise(b.get(key)) for key in IDENTITY_KEYS)


def has_native_bf16(fp: dict | None = None) -> bool:
    """Whether the CPU has bf16 dot-product instructions (AVX-512 BF16, AMX, or ARM FEAT_BF16)."""
    isa = (machine_fingerprint() if fp is None else fp).get("isa") or []
    return any(flag in isa for flag in BF16_FLAGS)


def describe(fp: dict) -> str:
    """One short line: "<CPU model>, 2 cores, avx2 avx512f ..., 32 MiB LLC, no GPU"."""
    parts = [str(fp.get("cpu_model") or "unknown CPU"), f"{fp.get('cores')} cores"]
    if fp.get("isa"):
        parts.append(" ".join(fp["isa"]))
    if fp.get("l3_bytes"):
        parts.append(f"{fp['l3_bytes'] / 2**20:.0f} MiB LLC")
    parts.append(fp.get("gpu") or "no GPU")
    return ", ".join(parts)


def _normalise(value):
    return sorted(value) if isinstance(value, list) else value
