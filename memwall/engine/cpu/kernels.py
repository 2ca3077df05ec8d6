"""Call memwall's hand-written C kernels (fp32, bf16, int8 and int4 weights) from PyTorch.

Why they exist: decode multiplies a few activation rows by each weight matrix, a memory-bound
product whose speed is how fast the weights stream. General-purpose kernels are tuned for big
products: weight-only int8/int4 kernels that are bound by their arithmetic stream their bytes
slowly, and an fp32 product with 2 to 128 rows may leave much of the CPU's FLOP/s unused, which
caps batched decode. These kernels turn packed weights into floats in registers and keep a tile of
sums in registers for batches (chapters 6, 7). For many rows with int8/int4 weights (`*_many`),
each core converts a chunk of weight rows to floats in its cache once and runs the fp32 tile over
every row: prefill without a dequantized copy. For batched fp32 decode, `fp32_packed_linear` reads
a copy of the weights packed in panels (`panels_of`), which keeps memory streaming while the cores
compute (common.h says how).

`build.py` compiles the variant for this CPU (AVX-512, AVX2, or portable C) on first use, or
ahead of time with `memwall build-kernels`. The libraries use OpenMP; the loader resolves that to
the libgomp PyTorch has already loaded, so both share one thread pool. `library()` returns None,
with the reason in `unavailable_reason()`, where nothing builds; the twins (`linears.py`) then use
PyTorch's paths. Set MEMWALL_CPU_KERNELS=0 to turn them off, or use `switched_off()` for one block
of code. Which path a twin takes for a given number of rows is decided in `path_choice.py`.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import weakref

import torch

from memwall.engine.cpu import build

_unavailable_reason: str | None = None  # set by library() when it returns None
_switched_off = False
_variant: str | None = None


def unavailable_reason() -> str | None:
    """Why the kernels cannot be used here, or None if they can."""
    return None if library() is not None else _unavailable_reason


def available() -> bool:
    return not _switched_off and library() is not None


def variant() -> str | None:
    """Which build is in use: "avx512", "avx2", "portable", or None."""
    return _variant if library() is not None else None


@contextlib.contextmanager
def switched_off():
    """Inside this block the twins use PyTorch's paths."""
    global _switched_off
    before, _switched_off = _switched_off, True
    try:
        yield
    finally:
        _switched_off = before


@functools.cache
def library() -> ctypes.CDLL | None:
    """The compiled kernels, or None where they cannot be used (see the module docstring)."""
    global _unavailable_reason, _variant
    if os.environ.get("MEMWALL_CPU_KERNELS", "1") == "0":
        _unavailable_reason = "turned off by MEMWALL_CPU_KERNELS=0"
        return None
    try:
        _variant, lib = build.best_variant()
        return lib
    except (OSError, build.BuildError) as error:
        _unavailable_reason = str(error)
        return None


def has_vnni() -> bool:
    """Whether the int8 "w8a8" path multiplies with AVX-512 VNNI here (else plain C vectors)."""
    return variant() == "avx512" and bool(library().memwall_cpu_features() & 4)


@functools.cache
def variant_library(name: str) -> ctypes.CDLL:
    """One variant's library, whichever is in use (the tests check each against the reference)."""
    return build.load(name)


def quant_fits(x: torch.Tensor, in_features: int) -> bool:
    """Whether the int8/int4 kernels can take x [..., in]: fp32 on the CPU, in a multiple of 32."""
    return (
        x.device.type == "cpu"
        and x.dtype == torch.float32
        and in_features % 32 == 0
        and not x.requires_grad
        and available()
    )


def packed_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `fp32_packed_linear` can take x [..., in] against this weight [out, in] (any
    shape: it reads its own packed copy)."""
    return (
        x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.float32
        and not (x.requires_grad or weight.requires_grad)
        and available()
    )


def fp32_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `fp32_linear` can take x [..., in] against this weight [out, in]: packed_fits, on
    the weight itself, so contiguous and of a shape its tiles cover."""
    return (
        weight.is_contiguous()
        and weight.shape[0] % 4 == 0
        and weight.shape[1] % 8 == 0
        and packed_fits(x, weight)
    )


def bf16_fits(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `bf16_linear` can take x [..., in] against this weight [out, in]."""
    return (
        x.device.type == "cpu"
        and x.dtype == weight.dtype == torch.bfloat16
        and weight.is_contiguous()
        and not (x.requires_grad or weight.requires_grad)
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


def fp32_linear(x: torch.Tensor, weight: torch.Tensor, lib=None) -> torch.Tensor:
    """x [..., in] @ weight [out, in]^T -> [..., out], all fp32."""
    out_features, in_features = weight.shape
    if out_features % 4 or in_features % 8:
        raise ValueError(
            f"fp32_linear needs out % 4 == 0 and in % 8 == 0, got {out_features}x{in_features}"
        )
    x = _check(x, in_features, out_features, weight=(weight, torch.float32, tuple(weight.shape)))
    return _run_float((lib or library()).fp32_linear, x, weight, in_features, out_features)


def bf16_linear(x: torch.Tensor, weight: torch.Tensor, lib=None) -> torch.Tensor:
    """x [..., in] @ weight [out, in]^T -> [..., out], all bf16 (sums in fp32)."""
    out_features, in_features = weight.shape
    check_width(x, in_features, out_features)
    if not bf16_fits(x, weight):
        raise TypeError(
            "bf16_linear takes bf16 CPU activations and a contiguous bf16 CPU weight, got "
            f"{x.dtype} on {x.device} and {weight.dtype} on {weight.device}"
        )
    return _run_float(
        (lib or library()).bf16_linear, x.contiguous(), weight, in_features, out_features
    )


def _run_float(kernel, x, weights, in_features: int, out_features: int) -> torch.Tensor:
    """kernel(x, weights, y, rows, in, out, threads) into a new y [..., out] of x's dtype."""
    rows, out = _output(x, out_features)
    threads = torch.get_num_threads()
    # the fp32 kernels return nothing; bf16_linear -1 if it could not allocate its scratch
    if kernel(
        x.data_ptr(), weights.data_ptr(), out.data_ptr(), rows, in_features, out_features, threads
    ):
        raise MemoryError(f"{kernel.__name__} could not allocate its scratch buffer")
    return out


PANEL = 32  # output rows per panel, as common.h's PANEL
_panels: dict[int, tuple] = {}  # id(weight) -> (weak ref, version, address, panels)


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [out, in] as panels [ceil(out / PANEL), in, PANEL] for the "packed" path: panel p
    holds output rows p * PANEL to p * PANEL + PANEL - 1, input by input; the last panel is padded
    with zero rows."""
    out_features, in_features = weight.shape
    padded = torch.nn.functional.pad(weight.detach(), (0, 0, 0, -out_features % PANEL))
    return padded.view(-1, PANEL, in_features).transpose(1, 2).contiguous()


def version_of(tensor: torch.Tensor) -> int | None:
    """The count of in-place changes to `tensor`; None for one made in inference mode, which
    does not keep it."""
    return None if tensor.is_inference() else tensor._version


def panels_of(weight: torch.Tensor) -> torch.Tensor:
    """pack_panels(weight), made once and kept while the weight lives and stays unchanged (an
    in-place change bumps its version): a second copy of the weights, which only layers that take
    the "packed" path pay for."""
    kept = _panels.get(id(weight))
    now = (version_of(weight), weight.data_ptr())
    if kept is not None and kept[0]() is weight and kept[1:3] == now:
        return kept[3]
    panels = pack_panels(weight)
    if kept is None:
        weakref.finalize(weight, _panels.pop, id(weight), None)
    _panels[id(weight)] = (weakref.ref(weight), *now, panels)
    return panels


def fp32_packed_linear(x: torch.Tensor, weight: torch.Tensor, lib=None) -> torch.Tensor:
    """x [..., in] @ weight [out, in]^T -> [..., out], all fp32, on the weight's panels."""
    out_features, in_features = weight.shape
    check_width(x, in_features, out_features)  # before packing: a wrong input costs no copy
    panels = panels_of(weight)
    shape = (-(-out_features // PANEL), in_features, PANEL)
    x = _check(x, in_features, out_features, panels=(panels, torch.float32, shape))
    return _run_float((lib or library()).fp32_packed_linear, x, panels, in_features, out_features)


def fp32_flops(repeats: int = 3) -> float | None:
    """FLOP/s of the faster fp32 kernel (row-major or packed) on a compute-bound product whose
    operands stay in each core's L2 (128 rows x 512 x 512: 1 MiB of weights), the fastest of
    `repeats` samples; None when the kernels are not in use. The roofline's compute roof takes it
    where it beats PyTorch's matmul (`memwall.machine.measure`): a roof below what a kernel
    reaches would flatter every fraction of it."""
    if not available():
        return None
    import time

    rows, out_features, in_features, calls = 128, 512, 512, 20
    x, weight = torch.randn(rows, in_features), torch.randn(out_features, in_features)
    kernels = (fp32_linear, fp32_packed_linear)
    for kernel in kernels:  # warm-up: the library, the thread pool, the caches, the panels
        kernel(x, weight)
    best = float("inf")
    for _ in range(repeats):
        for kernel in kernels:
            start = time.perf_counter()
            for _ in range(calls):
                kernel(x, weight)
            best = min(best, (time.perf_counter() - start) / calls)
    return 2 * rows * out_features * in_features / best


INT8_KERNELS = {
    "c": "int8_linear",
    "c_row": "int8_row_linear",
    "c_many": "int8_linear_many",
    "w8a8": "w8a8_linear",
}


def int8_linear(
    x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, path="c", lib=None
) -> torch.Tensor:
    """x [..., in] fp32 @ (codes [out, in] int8 * bf16 scales [out, None])^T -> [..., out].

    path: "c" (4 code rows at a time), "c_row" (one code row at a time: a single stream of codes),
    "c_many" (chunks of dequantized rows, for many activation rows; `out` a multiple of 4) or
    "w8a8" (each row of x rounded to int8 with its own scale, integer dot products: approximate)."""
    out_features, in_features = codes.shape
    many = path == "c_many"
    if path not in INT8_KERNELS:
        raise ValueError(
            f"int8_linear: path must be one of {', '.join(INT8_KERNELS)}, got {path!r}"
        )
    if in_features % 32 or (many and out_features % 4):
        raise ValueError(
            f"int8_linear needs in % 32 == 0 (and out % 4 == 0 for many rows), got {out_features}x{in_features}"
        )
    x = _check(
        x,
        in_features,
        out_features,
        codes=(codes, torch.int8, (out_features, in_features)),
        scales=(scales, torch.bfloat16, (out_features,)),
    )
    rows, out = _output(x, out_features)
    lib = lib or library()
    kernel = getattr(lib, INT8_KERNELS[path])
    status = kernel(
        x.data_ptr(),
        codes.data_ptr(),
        scales.data_ptr(),
        out.data_ptr(),
        rows,
        in_features,
        out_features,
        torch.get_num_threads(),
    )
    if status:
        raise MemoryError("int8_linear could not allocate its scratch buffers")
    return out


def int4_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale_zero: torch.Tensor,
    group_size: int,
    many=False,
    lib=None,
) -> torch.Tensor:
    """x [..., in] fp32 against pack_int4 codes [out, in / 2] and scale_zero [in / group, out, 2].

    many=True: the chunked kernel for many rows (`out` a multiple of 4)."""
    out_features, in_features = packed.shape[0], 2 * packed.shape[1]
    if many and out_features % 4:
        raise ValueError(f"int4_linear for many rows needs out % 4 == 0, got {out_features}")
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
    kernel = (lib or library()).int4_linear_many if many else (lib or library()).int4_linear
    status = kernel(
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


def int4_blocked_linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    scale_zero: torch.Tensor,
    group_size: int,
    block: int,
    many=False,
    lib=None,
) -> torch.Tensor:
    """Like int4_linear, for codes [out, in / 2] in PyTorch's CPU kernel layout with `block` rows
    per block (quant.cpu_int4_block()), so that PyTorch's int4 kernel can read the same bytes."""
    out_features, in_features = packed.shape[0], 2 * packed.shape[1]
    if block not in (32, 64) or out_features % block:
        raise ValueError(f"block must be 32 or 64 and divide out ({out_features}), got {block}")
    if group_size <= 0 or in_features % group_size:
        raise ValueError(f"group_size {group_size} must divide in ({in_features})")
    x = _check(
        x,
        in_features,
        out_features,
        packed=(packed, torch.uint8, (out_features, in_features // 2)),
        scale_zero=(scale_zero, torch.bfloat16, (in_features // group_size, out_features, 2)),
    )
    rows, out = _output(x, out_features)
    lib = lib or library()
    kernel = lib.int4_blocked_linear_many if many else lib.int4_blocked_linear
    status = kernel(
        x.data_ptr(),
        packed.data_ptr(),
        scale_zero.data_ptr(),
        out.data_ptr(),
        rows,
        in_features,
        out_features,
        group_size,
        block,
        torch.get_num_threads(),
    )
    if status:
        raise MemoryError("int4_blocked_linear could not allocate its scratch buffers")
    return out
