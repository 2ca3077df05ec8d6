"""Build and call the hand-written decode kernels in cpu_kernels.c (fp32, int8 and int4 weights).

Why they exist: on the course's AMD CPU, PyTorch's kernels handle decode's shapes (a few
activation rows against a large matrix) poorly. Its weight-only int8 and int4 kernels are
compute-bound (~5 GB/s of int8 weights), so fewer bytes do not make decode faster, and MKL's fp32
kernels with 2 to 128 rows leave much of the CPU's FLOP/s unused, which caps batched decode. The
C kernels turn packed weights into floats in registers, reading int8 weights about twice as fast
as PyTorch's kernel on the course machine (chapter 7), and keep a 4 x 3 tile of sums in registers
for batches (chapter 6).

The library is compiled with the system C compiler on first use (well under a second) and cached
under memwall's cache folder, keyed by a hash of the source. It is linked against OpenMP: the
loader resolves that to the libgomp that PyTorch has already loaded, so both share one thread
pool. `library()` returns None, with the reason in `unavailable_reason()`, where the CPU lacks
AVX2/FMA, no compiler is found, or the build fails; the layers then use PyTorch's kernels. Set MEMWALL_CPU_KERNELS=0 to turn them off, or use `switched_off()` for one block of code
(chapter 7 times both kernels side by side that way).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from memwall.paths import cache_dir

SOURCE = Path(__file__).with_name("cpu_kernels.c")
FLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]
MAX_ROWS = 8  # int8/int4: beyond a few rows, converting every weight again per row costs too much
# fp32: beyond this, F.linear (MKL, which blocks for cache). On the course CPU the kernel was
# still ahead at 512 rows (SmolLM2's shapes: 343 vs 386 ms over 40 matrices); 256 keeps margin.
MAX_FP32_ROWS = 256
_unavailable_reason: str | None = None  # set by library() when it returns None
_switched_off = False


def unavailable_reason() -> str | None:
    """Why the kernels cannot be used here, or None if they can."""
    return None if library() is not None else _unavailable_reason


def available() -> bool:
    return not _switched_off and library() is not None


@contextlib.contextmanager
def switched_off():
    """Inside this block the layers use PyTorch's kernels (int4 layers built inside it keep
    PyTorch's int4 layout afterwards)."""
    global _switched_off
    before, _switched_off = _switched_off, True
    try:
        yield
    finally:
        _switched_off = before


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be used (see the module docstring)."""
    global _unavailable_reason
    try:
        return _load()
    except (OSError, subprocess.SubprocessError, _Unavailable) as error:
        _unavailable_reason = str(error)
        return None


class _Unavailable(Exception):
    pass


def _load() -> ctypes.CDLL:
    if os.environ.get("MEMWALL_CPU_KERNELS", "1") == "0":
        raise _Unavailable("turned off by MEMWALL_CPU_KERNELS=0")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        raise _Unavailable(f"the CPU has no AVX2 ({torch.backends.cpu.get_cpu_capability()})")
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise _Unavailable("no C compiler (cc or gcc) found")
    source = SOURCE.read_bytes()
    digest = hashlib.sha256(source + " ".join(FLAGS).encode()).hexdigest()[:16]
    target = cache_dir() / "kernels" / f"cpu_kernels-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        # Build beside the target and rename: processes that build at the same time do not collide.
        fd, partial = tempfile.mkstemp(suffix=".so", dir=target.parent)
        os.close(fd)
        try:
            build = subprocess.run(
                [compiler, *FLAGS, str(SOURCE), "-o", partial],
                capture_output=True,
                text=True,
                timeout=120,
            )
            if build.returncode:
                raise _Unavailable(f"building {SOURCE.name} failed: {build.stderr.strip()[:500]}")
            os.replace(partial, target)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    lib = ctypes.CDLL(str(target))
    pointer, long, c_int = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
    lib.fp32_linear.argtypes = [pointer] * 3 + [long] * 3 + [c_int]
    lib.int8_linear.argtypes = [pointer] * 4 + [long] * 3 + [c_int]
    lib.int4_linear.argtypes = [pointer] * 4 + [long] * 4 + [c_int]
    lib.fp32_linear.restype = lib.int8_linear.restype = None
    lib.int4_linear.restype = c_int
    return lib


def usable(x: torch.Tensor, in_features: int) -> bool:
    """Whether the int8/int4 kernels can take x [..., in]: fp32 on the CPU, a few rows."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and in_features % 32 == 0
        and x.numel() <= MAX_ROWS * in_features
        and available()
    )


def fp32_usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `fp32_linear` can take x [..., in] against this weight [out, in]."""
    return (
        x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and weight.is_contiguous()
        and not (x.requires_grad or weight.requires_grad)
        and weight.shape[0] % 4 == 0
        and weight.shape[1] % 8 == 0
        and x.numel() <= MAX_FP32_ROWS * weight.shape[1]
        and available()
    )


# The wrappers take x [..., in] and return [..., out] without reshaping: in decode each is called
# ~120 times per step, and every avoided PyTorch call saves microseconds. They check what C cannot:
# a pointer to the wrong shape, dtype or device would read past a buffer and return garbage.


def check_width(x: torch.Tensor, in_features: int, out_features: int) -> None:
    """Raise the error F.linear raises when x [..., width] does not fit a [out, in] weight."""
    if x.shape[-1] != in_features:
        rows = x.numel() // max(x.shape[-1], 1)
        # The message F.linear gives for the same mistake.
        raise RuntimeError(
            f"mat1 and mat2 shapes cannot be multiplied "
            f"({rows}x{x.shape[-1]} and {in_features}x{out_features})"
        )


def _check(x: torch.Tensor, in_features: int, out_features: int, **buffers) -> torch.Tensor:
    """x made contiguous, after checking x and the weight buffers {name: (tensor, dtype, shape)}."""
    check_width(x, in_features, out_features)
    if x.device.type != "cpu" or x.dtype != torch.float32:
        raise TypeError(
            f"memwall's CPU kernels take fp32 CPU activations, got {x.dtype} on {x.device}"
        )
    for name, (tensor, dtype, shape) in buffers.items():
        if tensor.device.type != "cpu" or tensor.dtype != dtype or tuple(tensor.shape) != shape:
            raise TypeError(
                f"{name}: expected {dtype} {shape} on the CPU, "
                f"got {tensor.dtype} {tuple(tensor.shape)} on {tensor.device}"
            )
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous")
    return x.contiguous()


def _output(x: torch.Tensor, out_features: int) -> tuple[int, torch.Tensor]:
    return x.numel() // x.shape[-1], x.new_empty(x.shape[:-1] + (out_features,))


def fp32_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [..., in] @ weight [out, in]^T -> [..., out], all fp32."""
    out_features, in_features = weight.shape
    if out_features % 4 or in_features % 8:
        raise ValueError(
            f"fp32_linear needs out % 4 == 0 and in % 8 == 0, got {out_features}x{in_features}"
        )
    x = _check(x, in_features, out_features, weight=(weight, torch.float32, tuple(weight.shape)))
    rows, out = _output(x, out_features)
    library().fp32_linear(
        x.data_ptr(),
        weight.data_ptr(),
        out.data_ptr(),
        rows,
        in_features,
        out_features,
        torch.get_num_threads(),
    )
    return out


def int8_linear(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """x [..., in] fp32 @ (codes [out, in] int8 * bf16 scales [out, None])^T -> [..., out]."""
    out_features, in_features = codes.shape
    if in_features % 32:
        raise ValueError(f"int8_linear needs in % 32 == 0, got {in_features}")
    x = _check(
        x,
        in_features,
        out_features,
        codes=(codes, torch.int8, (out_features, in_features)),
        scales=(scales, torch.bfloat16, (out_features,)),
    )
    rows, out = _output(x, out_features)
    library().int8_linear(
        x.data_ptr(),
        codes.data_ptr(),
        scales.data_ptr(),
        out.data_ptr(),
        rows,
        in_features,
        out_features,
        torch.get_num_threads(),
    )
    return out


def int4_linear(
    x: torch.Tensor, packed: torch.Tensor, scale_zero: torch.Tensor, group_size: int
) -> torch.Tensor:
    """x [..., in] fp32 against pack_int4 codes [out, in / 2] and scale_zero [in / group, out, 2]."""
    out_features, in_features = packed.shape[0], 2 * packed.shape[1]
    if group_size <= 0 or group_size % 32 or in_features % group_size:
        raise ValueError(f"group_size {group_size} must be a multiple of 32 dividing {in_features}")
    x = _check(
        x,
        in_features,
        out_features,
        packed=(packed, torch.uint8, (out_features, in_features // 2)),
        scale_zero=(scale_zero, torch.bfloat16, (in_features // group_size, out_features, 2)),
    )
    rows, out = _output(x, out_features)
    status = library().int4_linear(
        x.data_ptr(),
        packed.data_ptr(),
        scale_zero.data_ptr(),
        out.data_ptr(),
        rows,
        in_features,
        out_features,
        group_size,
        torch.get_num_threads(),
    )
    if status:
        raise MemoryError("int4_linear could not allocate its scratch buffers")
    return out
