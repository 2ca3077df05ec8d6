"""int4 through PyTorch's tinygemm kernel: the packed bytes read directly, never dequantized whole.

The readable `Int4Linear` turns its whole matrix back into floats on every call: correct, and on a
GPU slower than not quantizing at all, since it writes and reads a full-size copy. A GPU gains
from 4-bit weights only when the kernel that multiplies reads the 4-bit bytes and dequantizes
each tile in registers on its way to the tensor cores; tinygemm
(`torch.ops.aten._weight_int4pack_mm`) is such a kernel, and PyTorch ships it.

memwall's int4 format is already tinygemm's arithmetic: w = (q - 8) * s + z per group along the
input dimension, with (s, z) stored as [in / group, out, 2] in bf16. What differs is where the
codes sit: memwall packs two codes a byte with the even index in the low nibble, tinygemm's CUDA
converter wants the even index in the high nibble ([out, in / 2] uint8, torch >= 2.5) and
rearranges them into its tiled layout. On a CPU, PyTorch has the same kernel family under other
names (`..._for_cpu`), taking the codes one per int32; the twin below uses it there, which is how
CI tests the conversion without a GPU.
"""

from __future__ import annotations

import torch
from torch import nn

from memwall.engine.quant import Int4Linear, unpack_int4

TINYGEMM_GROUP_SIZES = (32, 64, 128, 256)


def tinygemm_uint8(packed: torch.Tensor) -> torch.Tensor:
    """memwall's packed codes (even index in the low nibble) -> tinygemm's CUDA input (even index
    in the high nibble), both [out, in / 2] uint8."""
    return (packed << 4) | (packed >> 4)


def inner_k_tiles(in_features: int) -> int | None:
    """The largest tile depth tinygemm accepts for this many inputs, or None if none fits."""
    return next((tiles for tiles in (8, 4, 2) if in_features % (tiles * 16) == 0), None)


def _ops(device_type: str):
    """(convert, matmul, wants unpacked int32 codes) for this device, or None without a kernel."""
    aten = torch.ops.aten
    if device_type == "cuda" and hasattr(aten, "_weight_int4pack_mm"):
        return aten._convert_weight_to_int4pack, aten._weight_int4pack_mm, False
    if device_type == "cpu" and hasattr(aten, "_weight_int4pack_mm_for_cpu"):
        return aten._convert_weight_to_int4pack_for_cpu, aten._weight_int4pack_mm_for_cpu, True
    return None


def unsupported_reason(layer: Int4Linear) -> str | None:
    """Why tinygemm cannot take this layer (then the readable layer is kept), or None."""
    device = layer.packed.device
    if _ops(device.type) is None:
        return f"torch {torch.__version__} has no int4 tinygemm kernel for {device.type}"
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 0):
        return "tinygemm needs a GPU with bf16 tensor cores (compute capability 8.0 or newer)"
    if device.type == "cuda" and (reason := cuda_build_reason(torch.version.cuda)):
        return reason
    return layout_reason(layer)


def cuda_build_reason(cuda_version: str | None) -> str | None:
    """Why this torch build has no tinygemm for NVIDIA GPUs: PyTorch compiles it only with CUDA
    12 or newer (its cu118 wheels raise "not available for build"). None on ROCm's builds."""
    if cuda_version and int(cuda_version.split(".")[0]) < 12:
        return f"torch's tinygemm needs a build with CUDA 12 or newer, not {cuda_version}"
    return None


def layout_reason(layer: Int4Linear) -> str | None:
    """Why tinygemm cannot take this layer's group or widths on any device, or None."""
    if layer.group_size not in TINYGEMM_GROUP_SIZES:
        return f"tinygemm takes int4 groups of {TINYGEMM_GROUP_SIZES}, not {layer.group_size}"
    if inner_k_tiles(layer.in_features) is None or layer.out_features % 8:
        return "tinygemm needs in_features a multiple of 32 and out_features a multiple of 8"
    return None


class TinyGemmInt4Linear(nn.Module):
    """The twin of an `Int4Linear`: the same codes, scales and offsets, in tinygemm's layout."""

    def __init__(self, layer: Int4Linear):
        super().__init__()
        reason = unsupported_reason(layer)
        if reason:
            raise ValueError(reason)
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.group_size = layer.group_size
        convert, self._matmul, wants_int32 = _ops(layer.packed.device.type)
        codes = (
            unpack_int4(layer.packed).to(torch.int32)
            if wants_int32
            else tinygemm_uint8(layer.packed)
        )
        self.register_buffer("tiles", convert(codes.contiguous(), inner_k_tiles(self.in_features)))
        self.register_buffer("scale_zero", layer.scale_zero)  # shared: already tinygemm's layout
        self.register_buffer("bias", layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The kernel takes bf16 rows; a decode step has few, so the casts cost next to nothing.
        rows = x.reshape(-1, self.in_features).to(torch.bfloat16)
        y = self._matmul(rows, self.tiles, self.group_size, self.scale_zero)
        y = y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int4 group {self.group_size}, tinygemm"
