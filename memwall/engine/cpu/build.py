"""Compile memwall's C kernels for the CPU at hand, once, and cache the shared library.

Three variants of the same functions, from the most to the least specialised:

- "avx512": cpu/kernels_avx512.c, for x86 CPUs with AVX-512 (F, BW, VL, DQ);
- "avx2": cpu/kernels_avx2.c, for x86 CPUs with AVX2 and FMA (the one chapter 7 reads);
- "portable": cpu/kernels_portable.c, plain C for any CPU (ARM, Apple Silicon).

The portable library is built first: its `memwall_cpu_features()` asks cpuid which of the others
this CPU can run, and the most specialised one that builds is used. MEMWALL_CPU_VARIANT pins one.
Each library is cached under memwall's cache folder, keyed by its sources, its flags and the
compiler's own version line, so a new compiler or an edited kernel builds afresh. If the compiler
rejects -fopenmp (Apple's clang), the build retries without it: single-threaded kernels.
`memwall build-kernels` builds ahead of time, so a reader's first forward pass does not compile.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

CPU_DIR = Path(__file__).resolve().parent
HEADERS = (
    CPU_DIR / "common.h",
    CPU_DIR / "decode_ops.h",
    CPU_DIR / "decode_attention.h",
    CPU_DIR / "decode_step.h",
)  # included by every variant
# -fno-trapping-math: nothing here reads floating-point exception flags, and without it GCC
# leaves loops with a clamp or a rounding (the exp in decode_ops.h) unvectorized.
BASE_FLAGS = ["-O3", "-fno-trapping-math", "-shared", "-fPIC", "-lm"]
OPENMP_FLAGS = ["-fopenmp"]
AVX2, AVX512 = 1, 2  # bits of memwall_cpu_features()

# name -> (source, instruction-set flags, feature bits the CPU needs)
VARIANTS = {
    "avx512": (
        CPU_DIR / "kernels_avx512.c",
        ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"],
        AVX512 | AVX2,
    ),
    "avx2": (CPU_DIR / "kernels_avx2.c", ["-mavx2", "-mfma"], AVX2),
    "portable": (CPU_DIR / "kernels_portable.c", [], 0),
}


class BuildError(Exception):
    """The kernels cannot be built or used here; the message says why."""


def compiler() -> str:
    found = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if found is None:
        raise BuildError("no C compiler (cc or gcc) found")
    return found


@functools.cache
def compiler_version(path: str) -> str:
    """The compiler's first --version line (part of the cache key)."""
    try:
        run = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as error:
        raise BuildError(f"the C compiler {path} does not run: {error}") from None
    return (run.stdout or run.stderr).strip().splitlines()[0] if run.returncode == 0 else path


def source_hash() -> str:
    """One hash over every kernel source (part of the machine fingerprint for calibration)."""
    digest = hashlib.sha256()
    for source, _, _ in VARIANTS.values():
        digest.update(source.read_bytes())
    for header in HEADERS:
        digest.update(header.read_bytes())
    return digest.hexdigest()[:16]


def _target(name: str, cc: str, flags: list[str]) -> Path:
    from memwall.paths import cache_dir

    source = VARIANTS[name][0]
    key = source.read_bytes() + b"".join(header.read_bytes() for header in HEADERS)
    key += " ".join([compiler_version(cc), platform.machine(), *flags]).encode()
    return cache_dir() / "kernels" / f"{name}-{hashlib.sha256(key).hexdigest()[:16]}.so"


def _compile(cc: str, source: Path, flags: list[str], target: Path) -> subprocess.CompletedProcess:
    # Build beside the target and rename: processes that build at the same time do not collide.
    fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        build = subprocess.run(
            [cc, *flags, str(source), "-o", partial], capture_output=True, text=True, timeout=180
        )
        if build.returncode == 0:
            os.replace(partial, target)
        return build
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def build(name: str) -> Path:
    """The path of the compiled variant `name`, building it if needed (with OpenMP if possible)."""
    if name not in VARIANTS:
        raise BuildError(f"unknown kernel variant {name!r}; choose from {', '.join(VARIANTS)}")
    cc = compiler()
    source, isa_flags, _ = VARIANTS[name]
    errors = []
    for threads in (OPENMP_FLAGS, []):  # retry without OpenMP where the compiler rejects it
        flags = [*BASE_FLAGS, *isa_flags, *threads]
        target = _target(name, cc, flags)
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        result = _compile(cc, source, flags, target)
        if result.returncode == 0:
            return target
        errors.append(result.stderr.strip()[:400])
    raise BuildError(f"building {source.name} failed: {errors[0]}")


class MatmulSpec(ctypes.Structure):
    """decode_step.h's struct matmul_spec: how one matmul of a decode step runs."""

    # the kinds, numbered in the order of decode_step.h's enum
    (
        FP32,
        FP32_PACKED,
        INT8,
        INT8_ROW,
        INT8_MANY,
        W8A8,
        INT4,
        INT4_MANY,
        INT4_BLOCKED,
        INT4_BLOCKED_MANY,
        ELSEWHERE,
    ) = range(11)
    _fields_ = [
        ("kind", ctypes.c_int),
        ("id", ctypes.c_int),
        ("weight", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("in_features", ctypes.c_long),
        ("out_features", ctypes.c_long),
        ("group", ctypes.c_long),
        ("block", ctypes.c_long),
    ]


class LayerSpec(ctypes.Structure):
    """decode_step.h's struct layer_spec: one transformer block's weights for decode_layers."""

    _fields_ = [
        ("norm1", ctypes.c_void_p),
        ("norm2", ctypes.c_void_p),
        ("eps1", ctypes.c_float),
        ("eps2", ctypes.c_float),
        ("qkv", MatmulSpec),
        ("out", MatmulSpec),
        ("gate_up", MatmulSpec),
        ("down", MatmulSpec),
    ]


# The callback decode_layers makes for a matmul on another path: it gets the matmul's id.
MatmulElsewhere = ctypes.CFUNCTYPE(None, ctypes.c_int)


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set the argument and result types of every exported kernel."""
    pointer, long, c_int = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    signatures = {
        "fp32_linear": ([pointer] * 3 + [long] * 3 + [c_int], None),
        "fp32_packed_linear": ([pointer] * 3 + [long] * 3 + [c_int], None),
        "bf16_linear": ([pointer] * 3 + [long] * 3 + [c_int], c_int),
        "int8_linear": ([pointer] * 4 + [long] * 3 + [c_int], None),
        "int8_row_linear": ([pointer] * 4 + [long] * 3 + [c_int], None),
        "w8a8_linear": ([pointer] * 4 + [long] * 3 + [c_int], c_int),
        "int4_linear": ([pointer] * 4 + [long] * 4 + [c_int], c_int),
        "int8_linear_many": ([pointer] * 4 + [long] * 3 + [c_int], c_int),
        "int4_linear_many": ([pointer] * 4 + [long] * 4 + [c_int], c_int),
        "int4_blocked_linear": ([pointer] * 4 + [long] * 5 + [c_int], c_int),
        "int4_blocked_linear_many": ([pointer] * 4 + [long] * 5 + [c_int], c_int),
        "memwall_cpu_features": ([], c_int),
        "add_rmsnorm": ([pointer] * 4 + [long, long, ctypes.c_float, c_int], None),
        "rope_and_store": ([pointer] * 3 + [long] * 3 + [pointer] * 4 + [long] * 3 + [c_int], None),
        "attend_one": (
            [pointer] * 4 + [long] * 3 + [pointer] * 2 + [long] * 2 + [pointer, c_int, long],
            None,
        ),
        "attend_scratch_floats": ([long] * 4, long),
        "silu_mul": ([pointer] * 2 + [long, long, c_int], None),
        "add_into": ([pointer] * 2 + [long, long], None),
        "run_matmul": (
            [ctypes.POINTER(MatmulSpec), pointer, pointer, long, c_int, MatmulElsewhere],
            c_int,
        ),
        "decode_layers": (
            [ctypes.POINTER(LayerSpec), long, pointer, ctypes.c_float]
            + [pointer] * 11
            + [long]
            + [pointer] * 2
            + [long] * 7
            + [pointer, long, c_int, MatmulElsewhere],
            c_int,
        ),
    }
    for name, (args, result) in signatures.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = args, result
    return lib


def load(name: str) -> ctypes.CDLL:
    return declare(ctypes.CDLL(str(build(name))))


@functools.cache
def cpu_features() -> int:
    """memwall_cpu_features() of this CPU (cpuid, through the portable library)."""
    return load("portable").memwall_cpu_features()


def runnable(name: str) -> bool:
    """Whether this CPU can run variant `name` (it may still fail to build)."""
    needed = VARIANTS[name][2]
    return needed == 0 or (
        platform.machine().lower() in ("x86_64", "amd64") and cpu_features() & needed == needed
    )


def best_variant() -> tuple[str, ctypes.CDLL]:
    """The most specialised variant this CPU runs and the compiler builds (or the pinned one)."""
    pinned = os.environ.get("MEMWALL_CPU_VARIANT")
    if pinned:
        if pinned not in VARIANTS:
            raise BuildError(
                f"MEMWALL_CPU_VARIANT={pinned!r} is not a variant; choose from {', '.join(VARIANTS)}"
            )
        if not runnable(pinned):
            raise BuildError(f"MEMWALL_CPU_VARIANT={pinned}: this CPU cannot run it")
        return pinned, load(pinned)
    errors = []
    for name in VARIANTS:
        if runnable(name):
            try:
                return name, load(name)
            except (BuildError, OSError) as error:
                errors.append(str(error))
    raise BuildError("; ".join(errors))


def build_all() -> dict[str, str]:
    """Build every variant this CPU can run: {variant: library path, or why it did not build}."""
    report = {}
    for name in VARIANTS:
        try:
            report[name] = str(build(name)) if runnable(name) else "this CPU cannot run it"
        except BuildError as error:
            report[name] = f"failed: {error}"
    return report
