"""The CPU backend's twins of the readable linear layers: the same weights, several kernels.

A decode step's products have few activation rows, so they are memory-bound: what matters is how
fast a kernel streams the weights. CPUs disagree about which kernel does that best (the number of
rows, the weight format and the instruction set all change the winner), so each twin offers the
paths that can take an input and `path_choice.choose` picks one by measuring on this machine:

  fp32, bf16, fp16: "c" (memwall's C kernel, one slab of output rows per core), "packed" (fp32,
                    the C kernel on a copy of W packed in panels: batched decode in the fused
                    step only), "bmm" (W split into one slab per core, one batched matmul),
                    "linear" (F.linear, which wins for many rows: prefill)
  int8, int4:       "c" (C, a few rows at a time, codes turned into floats in registers),
                    "c_many" (C, chunks of weights dequantized in cache, for many rows),
                    int8 "c_row" (C, one row of codes at a time: a single stream of bytes),
                    int8 "w8a8" (C, activations rounded to int8 too: approximate, only when
                    pinned), "torch" (PyTorch's packed kernels, bf16 activations), "dequant"
                    (the readable layer's own math)

A twin shares its readable layer's tensors, except where a kernel wants another layout: an int4
twin repacks the codes into the blocked layout of PyTorch's CPU int4 kernel where that kernel
exists (memwall's kernels read that layout too, so both are timed on the same bytes).
`matmul_spec` describes a twin's path to the fused decode step in C.
"""

from __future__ import annotations

import copy
import functools

import torch
import torch.nn.functional as F
from torch import nn

from memwall.engine.cpu import kernels, path_choice
from memwall.engine.cpu.build import MatmulSpec
from memwall.engine.linear import Linear
from memwall.engine.quant import Int4Linear, Int8Linear, dequantize_int4
from memwall.machine import buffer_budget_bytes

FORMAT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# "packed" reads a second copy of the weights, so it is offered only to the fused step's batches:
# with 1-4 rows the row-major kernel streams as fast, and a second copy costs memory.
PACKED_ROWS = (5, 64)
INT4_KERNEL_GROUP_SIZES = (32, 64, 128, 256)  # what aten._weight_int4pack_mm_for_cpu accepts
KERNEL_ACTIVATION_DTYPE = torch.bfloat16  # what PyTorch's packed kernels take


def packed_copy_fits(nbytes: int) -> bool:
    """Whether a packed copy of `nbytes` of fp32 weights may be made. It is a second copy of a
    model's weights, so it must fit the budget of one measurement's buffers (an eighth of the
    available memory, at most 256 MiB: `buffer_budget_bytes`): a model beside its own copy would
    not fit a 1-2 GB container such as Binder's."""
    return nbytes <= buffer_budget_bytes()


class _Twin(nn.Module):
    """What every twin shares: forward through the chosen path, bias added after the kernel."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(path_choice.choose(self, x), x)

    def step_paths_for(self, x: torch.Tensor) -> tuple[str, ...]:
        return self.paths_for(x)

    def _with_bias(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.bias is None else y + self.bias

    def _spec(self, matmul_id: int) -> MatmulSpec:
        return MatmulSpec(
            kind=MatmulSpec.ELSEWHERE,
            id=matmul_id,
            in_features=self.in_features,
            out_features=self.out_features,
        )

    def _finish(self, spec: MatmulSpec) -> MatmulSpec:
        if self.bias is not None and spec.kind != MatmulSpec.ELSEWHERE:
            spec.bias = self.bias.data_ptr()
        return spec


class CpuLinear(_Twin):
    """A float `Linear` (fp32, bf16 or fp16) with the CPU's kernel paths."""

    def __init__(self, layer: Linear, splits: int | None = None):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.weight, self.bias = layer.weight, layer.bias
        splits = splits or torch.get_num_threads()
        self.splits = splits if splits > 1 and self.out_features % splits == 0 else 1
        # with_twins decides this for a whole model, whose copies would all be kept together
        self.packed_copy = packed_copy_fits(self.weight.numel() * self.weight.element_size())

    def run(self, path: str, x: torch.Tensor) -> torch.Tensor:
        """x W^T + b through one path: "c", "packed", "bmm" or "linear"."""
        if path == "c" and self.weight.dtype == torch.bfloat16:
            y = kernels.bf16_linear(x, self.weight)
        elif path == "c":
            y = kernels.fp32_linear(x, self.weight)
        elif path == "packed":
            y = kernels.fp32_packed_linear(x, self.weight)
        elif path == "bmm":
            rows = x.reshape(-1, self.in_features)
            slabs = self.weight.view(
                self.splits, self.out_features // self.splits, self.in_features
            )
            y = torch.bmm(slabs, rows.t().expand(self.splits, -1, -1))  # [splits, out/splits, rows]
            y = y.view(self.out_features, -1).t().reshape(*x.shape[:-1], self.out_features)
        else:
            return F.linear(x, self.weight, self.bias)
        return self._with_bias(y)

    def paths_for(self, x: torch.Tensor) -> tuple[str, ...]:
        if x.device.type != "cpu" or x.shape[-1] != self.in_features:
            return ("linear",)  # F.linear also raises the usual error for a wrong width
        fits = kernels.fp32_fits(x, self.weight) or kernels.bf16_fits(x, self.weight)
        c = ("c",) if fits else ()
        bmm = ("bmm",) if self.splits > 1 and x.dtype == self.weight.dtype else ()
        return (*c, *bmm, "linear")

    def step_paths_for(self, x: torch.Tensor) -> tuple[str, ...]:
        """paths_for's, and "packed" for batched decode's row counts (PACKED_ROWS) where the
        packed copy fits the memory budget (`packed_copy`)."""
        rows = x.numel() // max(x.shape[-1], 1)
        packed = (
            self.packed_copy
            and PACKED_ROWS[0] <= rows <= PACKED_ROWS[1]
            and kernels.packed_fits(x, self.weight)
        )
        options = self.paths_for(x)
        return (options[0], "packed", *options[1:]) if packed and "c" in options else options

    def kernel_key(self) -> tuple[str, str]:
        fmt = FORMAT_NAMES.get(self.weight.dtype, str(self.weight.dtype))
        return fmt, f"{self.out_features}x{self.in_features}"

    def matmul_spec(self, path: str, matmul_id: int = 0) -> MatmulSpec:
        spec = self._spec(matmul_id)
        if self.weight.dtype == torch.float32 and path == "c":
            spec.kind, spec.weight = MatmulSpec.FP32, self.weight.data_ptr()
        elif self.weight.dtype == torch.float32 and path == "packed":
            # the panels outlive the spec: panels_of keeps them while the weight lives
            spec.kind, spec.weight = (
                MatmulSpec.FP32_PACKED,
                kernels.panels_of(self.weight).data_ptr(),
            )
        return self._finish(spec)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, splits={self.splits}"


class CpuInt8Linear(_Twin):
    """An `Int8Linear` with the CPU's kernel paths, on the same codes and scales."""

    def __init__(self, layer: Int8Linear):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        for name in ("codes", "scales", "bias"):
            self.register_buffer(name, getattr(layer, name))
        self.readable = [layer]  # a list, so that it is not a submodule (its tensors are ours)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels.check_width(x, self.in_features, self.out_features)
        return super().forward(x)

    def run(self, path: str, x: torch.Tensor) -> torch.Tensor:
        """One path: "c", "c_row", "c_many", "w8a8", "torch" or "dequant" (the readable math)."""
        if path in kernels.INT8_KERNELS:
            y = kernels.int8_linear(x, self.codes, self.scales, path)
        elif path == "torch":
            y = _through_bf16(
                x,
                self.out_features,
                lambda rows: torch.ops.aten._weight_int8pack_mm(rows, self.codes, self.scales),
            )
        else:
            return self.readable[0](x)
        return self._with_bias(y)

    def paths_for(self, x: torch.Tensor) -> tuple[str, ...]:
        if x.device.type != "cpu":
            return ("dequant",)
        c = ("c", "c_row") if kernels.quant_fits(x, self.in_features) else ()
        many = ("c_many",) if c and self.out_features % 4 == 0 else ()
        library = ("torch",) if hasattr(torch.ops.aten, "_weight_int8pack_mm") else ()
        w8a8 = ("w8a8",) if c else ()
        return (*c, *many, *library, *w8a8, "dequant")

    def kernel_key(self) -> tuple[str, str]:
        return "int8", f"{self.out_features}x{self.in_features}"

    def matmul_spec(self, path: str, matmul_id: int = 0) -> MatmulSpec:
        spec = self._spec(matmul_id)
        kinds = {
            "c": spec.INT8,
            "c_row": spec.INT8_ROW,
            "c_many": spec.INT8_MANY,
            "w8a8": spec.W8A8,
        }
        if path in kinds:
            spec.kind = kinds[path]
            spec.weight, spec.scales = self.codes.data_ptr(), self.scales.data_ptr()
        return self._finish(spec)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, int8 per channel"


class CpuInt4Linear(_Twin):
    """An `Int4Linear` with the CPU's kernel paths; its codes are repacked into the layout of
    PyTorch's CPU int4 kernel where that kernel exists and takes the layer's shape."""

    def __init__(self, layer: Int4Linear):
        super().__init__()
        self.in_features, self.out_features = layer.in_features, layer.out_features
        self.group_size = layer.group_size
        self.register_buffer("scale_zero", layer.scale_zero)
        self.register_buffer("bias", layer.bias)
        self.readable = [layer]
        block = cpu_int4_block() if layer.packed.device.type == "cpu" else None
        self.kernel_layout = (
            block is not None
            and self.group_size in INT4_KERNEL_GROUP_SIZES
            and self.out_features % block == 0
        )
        self.block = block if self.kernel_layout else None
        if self.kernel_layout:
            codes = layer.codes().to(torch.int32)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
        else:
            packed = layer.packed
        self.register_buffer("packed", packed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels.check_width(x, self.in_features, self.out_features)
        return super().forward(x)

    def run(self, path: str, x: torch.Tensor) -> torch.Tensor:
        """One path: "c", "c_many", "torch" or "dequant" (the readable math)."""
        if path in ("c", "c_many"):
            many = path == "c_many"
            if self.kernel_layout:
                y = kernels.int4_blocked_linear(
                    x, self.packed, self.scale_zero, self.group_size, self.block, many
                )
            else:
                y = kernels.int4_linear(x, self.packed, self.scale_zero, self.group_size, many)
        elif path == "torch":
            y = _through_bf16(
                x,
                self.out_features,
                lambda rows: torch.ops.aten._weight_int4pack_mm_for_cpu(
                    rows, self.packed, self.group_size, self.scale_zero
                ),
            )
        else:
            return self.readable[0](x)
        return self._with_bias(y)

    def paths_for(self, x: torch.Tensor) -> tuple[str, ...]:
        if x.device.type != "cpu":
            return ("dequant",)
        fits = kernels.quant_fits(x, self.in_features) and (
            self.kernel_layout or self.group_size % 32 == 0
        )
        c = ("c",) if fits else ()
        many = ("c_many",) if fits and self.out_features % 4 == 0 else ()
        library = ("torch",) if self.kernel_layout else ()
        return (*c, *many, *library, "dequant")

    def kernel_key(self) -> tuple[str, str]:
        layout = "torch-layout" if self.kernel_layout else "plain"
        return "int4", f"{self.out_features}x{self.in_features}/g{self.group_size}/{layout}"

    def codes(self) -> torch.Tensor:
        """The 4-bit codes [out, in], unpacked from whichever layout they are stored in."""
        if self.kernel_layout:
            return from_cpu_kernel_layout(self.packed, self.block)
        return self.readable[0].codes()

    @property
    def weight(self) -> torch.Tensor:
        return dequantize_int4(self.codes(), self.scale_zero, self.group_size)

    def matmul_spec(self, path: str, matmul_id: int = 0) -> MatmulSpec:
        spec = self._spec(matmul_id)
        if path in ("c", "c_many"):
            many = path == "c_many"
            if self.kernel_layout:
                spec.kind = MatmulSpec.INT4_BLOCKED_MANY if many else MatmulSpec.INT4_BLOCKED
                spec.block = self.block
            else:
                spec.kind = MatmulSpec.INT4_MANY if many else MatmulSpec.INT4
            spec.weight, spec.scales = self.packed.data_ptr(), self.scale_zero.data_ptr()
            spec.group = self.group_size
        return self._finish(spec)

    def extra_repr(self) -> str:
        where = "PyTorch CPU kernel layout" if self.kernel_layout else "plain layout"
        return (
            f"in={self.in_features}, out={self.out_features}, int4 group {self.group_size}, {where}"
        )


TWINS = {Linear: CpuLinear, Int8Linear: CpuInt8Linear, Int4Linear: CpuInt4Linear}


def twin_of(layer: nn.Module) -> nn.Module:
    """The CPU twin of a readable linear layer (a twin is returned as it is)."""
    if isinstance(layer, _Twin):
        return layer
    try:
        return TWINS[type(layer)](layer)
    except KeyError:
        raise ValueError(
            f"no CPU twin for {type(layer).__name__}; twins exist for "
            f"{', '.join(kind.__name__ for kind in TWINS)}"
        ) from None


def _through_bf16(x: torch.Tensor, out_features: int, kernel) -> torch.Tensor:
    """Run one of PyTorch's packed kernels, which take bf16 rows (the scales' dtype) and accumulate
    in fp32, on x [..., in]: round x to bf16 on the way in and back to its dtype on the way out."""
    y = kernel(x.reshape(-1, x.shape[-1]).to(KERNEL_ACTIVATION_DTYPE))
    return y.to(x.dtype).view(*x.shape[:-1], out_features)


@functools.cache
def cpu_int4_block() -> int | None:
    """Rows per block in the layout `aten._convert_weight_to_int4pack_for_cpu` produces, or None.

    The kernel stores [N, K] codes as [N/B, K, B/2] bytes: for each block of B output rows and each
    input k, byte j holds row j in its low nibble and row j + B/2 in its high one (B depends on the
    instruction set PyTorch's kernel was built for). So find B by packing a probe and checking
    which layout reproduces it; None if none does (or the kernel is missing), in which case int4
    twins keep the plain layout.
    """
    probe = torch.randint(
        0, 16, (128, 64), generator=torch.Generator().manual_seed(0), dtype=torch.int32
    )
    try:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(probe, 1)
    except (AttributeError, RuntimeError):
        return None
    for block in (64, 32):
        if torch.equal(from_cpu_kernel_layout(packed, block), probe.to(torch.uint8)):
            return block
    return None


def from_cpu_kernel_layout(packed: torch.Tensor, block: int) -> torch.Tensor:
    """[N, K/2] bytes in the CPU kernel's blocked layout -> codes [N, K] (N a multiple of `block`)."""
    rows, half_k = packed.shape
    blocks = packed.reshape(rows // block, 2 * half_k, block // 2)  # [N/B, K, B/2]
    codes = torch.cat([blocks & 0xF, blocks >> 4], dim=-1)  # [N/B, K, B]: rows j, then j + B/2
    return codes.transpose(1, 2).reshape(rows, 2 * half_k)


def with_twins(model: nn.Module) -> nn.Module:
    """A new module tree over `model`'s tensors in which every readable linear layer is its CPU
    twin; `model` itself is left as it was (only an int4 twin's repacked codes are new bytes)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    fast = copy.deepcopy(model, memo=tensors)
    names = [name for name, module in fast.named_modules() if type(module) in TWINS]
    for name in names:
        parent_name, _, attr = name.rpartition(".")
        parent = fast.get_submodule(parent_name)
        setattr(parent, attr, twin_of(getattr(parent, attr)))
    # The fused step packs every layer that takes the "packed" path, and keeps the copies
    # together: allowed only where the whole model's copy fits the memory budget.
    floats = [m for m in fast.modules() if isinstance(m, CpuLinear)]
    weights = {m.weight.data_ptr(): m.weight.numel() * m.weight.element_size() for m in floats}
    fits = packed_copy_fits(sum(weights.values()))
    for twin in floats:
        twin.packed_copy = fits
    return fast
