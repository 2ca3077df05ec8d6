"""Weight-only quantized linears whose storage is really packed: int8 per output channel, int4 per group.

Weight-only quantization shrinks the bytes a decode step reads; the activations stay in floating
point and each weight is turned back into a float ("dequantized") inside the matmul.

- int8, per output channel, symmetric: w ~ q * s with q in [-127, 127] and one bf16 scale per row
  (the absmax scheme LLM.int8() builds on, Dettmers et al. 2022, without its outlier split).
  1 byte per weight plus 2 bytes per row.
- int4, per group of `group_size` weights along the input dimension, asymmetric:
  w ~ (q - 8) * s + z with q in [0, 15], and a bf16 scale s and bf16 offset z per group (the
  layout of PyTorch's int4 kernels; GPTQ and AWQ store group-wise int4 the same way, Frantar et
  al. 2022, Lin et al. 2023, but choose the codes more cleverly than the round-to-nearest used here).
  Half a byte per weight plus 4 bytes per group: exactly `memwall.cost`'s "int4-g<group_size>".

Each layer's forward is the reference math, written so that a compiler can fuse the
dequantization into the product (int8: the codes cast to the activations' dtype, multiplied, then
each output scaled by its row's scale). Faster kernels that read the packed bytes directly are
the backends' business (`accelerate(model)`); they are tested against these layers.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from memwall.engine.linear import Linear

SCHEMES = ("int8", "int4")
HEAD_CHOICES = ("same", "int8", "int4", "float")
INT4_SCALE_DTYPE = torch.bfloat16  # 2 bytes for s and 2 for z: 4 bytes per group
INT8_SCALE_DTYPE = torch.bfloat16  # 2 bytes per output row
# The readable layers convert their codes to floats at every call, a slab of this many output rows
# at a time: the output head (49152 rows) would otherwise exist whole in fp32, 113 MB for a 135M
# model, beside everything else a 1-2 GB notebook session holds.
SLAB_ROWS = 8192


# ---- the formats, as plain tensor functions ---------------------------------------------------


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (int8 codes [out, in], bf16 scales [out]), symmetric per output row.

    The scale is nudged up before rounding to bf16 so that the row's largest weight still fits in
    127 steps; the codes are then rounded against the stored scale.
    """
    weight = weight.float().contiguous()
    largest = torch.maximum(weight.amax(dim=1), -weight.amin(dim=1))  # no |weight| copy
    scales = (largest / 127 * (1 + 2**-7)).clamp(min=1e-30).to(INT8_SCALE_DTYPE)
    codes = torch.empty(weight.shape, dtype=torch.int8, device=weight.device)
    for start in range(0, weight.shape[0], SLAB_ROWS):  # no float copy of a whole output head
        rows = slice(start, start + SLAB_ROWS)
        codes[rows] = weight[rows].div(scales[rows].float()[:, None]).round_().clamp_(-127, 127)
    return codes, scales


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    # in place on the fresh fp32 copy: a large matrix (the output head) is then held once, not twice
    return codes.to(torch.float32, copy=True).mul_(scales[:, None].float())


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[out, in] float -> (codes [out, in] as uint8 in 0..15, scale_zero [in/group, out, 2] bf16).

    Each group of `group_size` consecutive inputs of a row maps its [min, max] onto codes 0..15.
    Codes are rounded against the stored (bf16) scale and offset, so w - dequantized is at most
    about half a step.
    """
    out_features, in_features = weight.shape
    _check_group_size(group_size, in_features)
    groups = (
        weight.float().contiguous().reshape(out_features, in_features // group_size, group_size)
    )
    low, high = groups.amin(-1), groups.amax(-1)
    scale = ((high - low) / 15).clamp(min=1e-8).to(INT4_SCALE_DTYPE).float()
    zero = (low + 8 * scale).to(INT4_SCALE_DTYPE).float()  # the value of the middle code, 8
    codes = torch.empty(out_features, in_features, dtype=torch.uint8, device=weight.device)
    for start in range(0, out_features, SLAB_ROWS):  # no float copy of a whole output head
        rows = slice(start, start + SLAB_ROWS)
        steps = groups[rows].sub(zero[rows, :, None]).div_(scale[rows, :, None])
        codes[rows] = steps.add_(8).round_().clamp_(0, 15).reshape(-1, in_features)
    scale_zero = (
        torch.stack([scale, zero], dim=-1).transpose(0, 1).to(INT4_SCALE_DTYPE).contiguous()
    )
    return codes, scale_zero


def dequantize_int4(codes: torch.Tensor, scale_zero: torch.Tensor, group_size: int) -> torch.Tensor:
    """Inverse of `quantize_int4`: (q - 8) * s + z, as fp32 [out, in]."""
    out_features, in_features = codes.shape
    scale, zero = scale_zero.float().transpose(0, 1).unbind(-1)  # each [out, groups]
    groups = codes.to(torch.float32, copy=True).reshape(out_features, -1, group_size)
    # in place on the fresh fp32 copy (the same operations): one copy of the matrix, not three
    return (
        groups.sub_(8)
        .mul_(scale[..., None])
        .add_(zero[..., None])
        .reshape(out_features, in_features)
    )


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last dim: even index in the low nibble, odd in the high."""
    if codes.shape[-1] % 2:
        raise ValueError(f"the last dimension must be even to pack pairs, got {codes.shape[-1]}")
    codes = codes.to(torch.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4`: [..., n] bytes -> [..., 2n] codes in 0..15."""
    return torch.stack([packed & 0xF, packed >> 4], dim=-1).flatten(-2)


def _check_group_size(group_size: int, in_features: int) -> None:
    if (
        isinstance(group_size, bool)
        or not isinstance(group_size, int)
        or group_size < 2
        or group_size % 2
    ):
        raise ValueError(
            f"group_size must be an even integer >= 2 (e.g. 32, 64, 128), got {group_size!r}"
        )
    if in_features % group_size:
        divisors = [g for g in range(2, in_features + 1, 2) if in_features % g == 0 and g >= 16]
        raise ValueError(
            f"group_size {group_size} does not divide in_features {in_features}; "
            f"group sizes that do: {', '.join(map(str, divisors[:8]))}"
        )


# ---- the layers --------------------------------------------------------------------------------------


def linear_by_slabs(x: torch.Tensor, rows, out_features: int) -> torch.Tensor:
    """x W^T, where rows(start, stop) gives W[start:stop] as floats of x's dtype: every row is
    converted, but no more than SLAB_ROWS of them exist as floats at once."""
    if out_features <= SLAB_ROWS:
        return F.linear(x, rows(0, out_features))
    y = x.new_empty(*x.shape[:-1], out_features)
    for start in range(0, out_features, SLAB_ROWS):
        stop = min(start + SLAB_ROWS, out_features)
        y[..., start:stop] = F.linear(x, rows(start, stop))
    return y


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 codes [out, in] and one bf16 scale per output row."""

    def __init__(self, codes: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        self.register_buffer("codes", codes.to(torch.int8).contiguous())
        self.register_buffer("scales", scales.to(INT8_SCALE_DTYPE).contiguous())
        self.register_buffer("bias", None if bias is None else bias.float().clone())

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int8Linear:
        return cls(*quantize_int8(weight), bias)

    @property
    def weight(self) -> torch.Tensor:
        """The dequantized W [out, in] (a new fp32 tensor, for inspection)."""
        return dequantize_int8(self.codes, self.scales)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x (q s)^T = (x q^T) * s: multiply by the codes, then scale each output once.
        def code_rows(start, stop):
            return self.codes[start:stop].to(x.dtype)

        y = linear_by_slabs(x, code_rows, self.out_features) * self.scales.to(x.dtype)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8 per channel"


class Int4Linear(nn.Module):
    """y = x W^T + b with W as packed 4-bit codes and a bf16 (scale, offset) pair per group."""

    def __init__(
        self,
        codes: torch.Tensor,
        scale_zero: torch.Tensor,
        group_size: int,
        bias: torch.Tensor | None = None,
    ):
        super().__init__()
        self.out_features, self.in_features = codes.shape
        _check_group_size(group_size, self.in_features)
        self.group_size = group_size
        self.register_buffer("packed", pack_int4(codes).contiguous())  # [out, in/2]: 2 codes a byte
        self.register_buffer("scale_zero", scale_zero.to(INT4_SCALE_DTYPE).contiguous())
        self.register_buffer("bias", None if bias is None else bias.float().clone())

    @classmethod
    def from_weight(
        cls, weight: torch.Tensor, bias: torch.Tensor | None = None, group_size: int = 32
    ) -> Int4Linear:
        return cls(*quantize_int4(weight, group_size), group_size, bias)

    def codes(self) -> torch.Tensor:
        """The 4-bit codes [out, in], unpacked."""
        return unpack_int4(self.packed)

    def weight_rows(self, start: int = 0, stop: int | None = None) -> torch.Tensor:
        """Rows start:stop of the dequantized W, as a new fp32 tensor."""
        codes = unpack_int4(self.packed[start:stop])
        return dequantize_int4(codes, self.scale_zero[:, start:stop], self.group_size)

    @property
    def weight(self) -> torch.Tensor:
        return self.weight_rows()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def rows(start, stop):
            return self.weight_rows(start, stop).to(x.dtype)

        y = linear_by_slabs(x, rows, self.out_features)
        return y if self.bias is None else y + self.bias.to(x.dtype)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int4 group {self.group_size}"


# ---- one call for a whole model ----------------------------------------------------------------------


def quantize(
    model: nn.Module, scheme: str, group_size: int = 32, inplace: bool = True, head: str = "same"
) -> nn.Module:
    """Swap every engine `Linear` in `model` for an Int8Linear or Int4Linear (in place, or a copy).

    `head` chooses the output head's format: "same" as the rest, "int8", "int4", or "float" to
    keep it as it is. The output head is the most sensitive layer, and GGUF files often keep it at
    8 bits while the rest is 4-bit (the shipped SmolLM2 file does: Q8_0 head, Q4_1 layers). The
    token embedding always stays in floating point: a step reads one row of it.
    """
    if scheme not in SCHEMES:
        raise ValueError(
            f"Unknown quantization scheme {scheme!r}; choose from {', '.join(SCHEMES)}"
        )
    if head not in HEAD_CHOICES:
        raise ValueError(f"Unknown head format {head!r}; choose from {', '.join(HEAD_CHOICES)}")
    plan = {}  # module name -> scheme
    for name, module in model.named_modules():
        if isinstance(module, Linear):
            chosen = scheme if name != "lm_head" or head == "same" else head
            if chosen != "float":
                plan[name] = (module, chosen)
    for name, (module, chosen) in plan.items():  # check every layer before changing any
        if chosen == "int4":
            try:
                _check_group_size(group_size, module.in_features)
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None
    target = model
    if not inplace:
        # A new module tree over the same tensors: the float weights about to be replaced are not
        # copied (they would be thrown away), and the ones kept (embedding, norms, a head tied to
        # the embedding) are shared with `model`, as memwall never writes weights in place. A
        # notebook can then hold several formats of one model without a copy of its embedding each.
        replaced = {id(module) for module, _ in plan.values()}
        kept = {
            id(t): t
            for m in model.modules()
            if id(m) not in replaced
            for t in (*m.parameters(recurse=False), *m.buffers(recurse=False))
        }
        skip = {
            id(module.weight): torch.empty(0)
            for module, _ in plan.values()
            if id(module.weight) not in kept
        }
        target = copy.deepcopy(model, memo={**skip, **kept})
    for name, (old, chosen) in plan.items():
        bias = None if old.bias is None else old.bias.detach()
        with torch.no_grad():
            if chosen == "int8":
                new = Int8Linear.from_weight(old.weight.detach(), bias)
            else:
                new = Int4Linear.from_weight(old.weight.detach(), bias, group_size)
        parent_name, _, attr = name.rpartition(".")
        setattr(target.get_submodule(parent_name), attr, new)
    return target
