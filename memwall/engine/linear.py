"""The engine's linear layer, written so a memory-bound matrix product uses every core.

Decode multiplies a few activation rows by each weight matrix, so it streams the weights at
whatever rate the hardware can read them. On this course's 2-core AMD CPU, MKL's fp32 kernels
handle that shape poorly: `F.linear` on one row runs on a single core (chapters 3 and 6 time it
against the engine's kernels), and with 2 to 128 rows it leaves much of the CPU's
FLOP/s unused (chapter 6). Two fixes, both splitting W into one slab of output rows per core:

- memwall's own kernel (`cpu_kernels.c`, where it builds): each core streams its slab once and
  keeps a tile of sums in registers (path "c"), or, for batched decode, reads a copy of W packed
  in panels of 32 output rows and multiplies each input into 32 sums at once (path "packed");
  a bf16 layer's "c" is its own kernel, with bf16 weights and activations and sums in fp32;
- otherwise, one batched matmul over the slabs, `bmm(W_slabs, x^T)`: each core streams its own
  share of the weights, and the slabs' outputs are simply stacked.

W keeps the usual [out, in] layout (the slabs are a view; the panels a copy made only if the
layer runs on them). For many rows (prefill) `F.linear` is the usual winner, and on a GPU it is
always used. Which of "c", "packed", "bmm" and "linear" a layer takes
for a given number of rows is measured once per machine (`engine/cpu/paths.py`): machines
disagree about it. `run(path, x)` computes through one named path.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from memwall.engine import cpu_kernels
from memwall.engine.cpu import paths as kernel_paths

# The fixed rule (kernel_paths.fixed_path): above this many activation rows F.linear, which beat
# the row split on the course CPU (SmolLM2-135M's shapes: the split was ahead up to 128 rows).
MAX_SPLIT_ROWS = 256
FORMAT_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
# The "packed" path reads a second copy of the weights, packed in panels, so it is offered where
# it pays: batched decode, and only to the fast decode step, so that the readable engine keeps one
# copy of its weights (chapter 6's batches on the readable engine peaked at 1.94 GB with it, 1.40
# without, against Binder's 1.5 GB target). With 1-4 rows the row-major kernel already streams as
# fast (0.96-1.0x the time on a 2-core Zen 5).
PACKED_ROWS = (5, 64)


def default_splits(device) -> int:
    return torch.get_num_threads() if torch.device(device).type == "cpu" else 1


class Linear(nn.Module):
    """y = x W^T + b for W of shape [out_features, in_features]."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        splits: int | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        device = device or torch.empty(0).device  # honours a surrounding `with torch.device(...)`
        splits = splits or default_splits(device)
        self.splits = splits if splits > 1 and out_features % splits == 0 else 1
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, device=device, dtype=dtype), requires_grad=False
        )
        self.bias = (
            nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype), requires_grad=False)
            if bias
            else None
        )

    @torch.no_grad()
    def set_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> Linear:
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"expected a weight of shape {(self.out_features, self.in_features)}, "
                f"got {tuple(weight.shape)}"
            )
        self.weight.copy_(weight)
        if bias is not None:
            self.bias.copy_(bias)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.run(kernel_paths.choose(self, x), x)

    def run(self, path: str, x: torch.Tensor) -> torch.Tensor:
        """x W^T + b through one path: "c" (memwall's kernel), "packed" (memwall's kernel on a
        copy of W packed in panels), "bmm" (row split), "linear"."""
        if path == "c" and self.weight.dtype == torch.bfloat16:
            y = cpu_kernels.bf16_linear(x, self.weight)
        elif path == "c":
            y = cpu_kernels.fp32_linear(x, self.weight)
        elif path == "packed":
            y = cpu_kernels.fp32_packed_linear(x, self.weight)
        elif path == "bmm":
            rows = x.reshape(-1, self.in_features)
            slabs = self.weight.view(
                self.splits, self.out_features // self.splits, self.in_features
            )
            y = torch.bmm(slabs, rows.t().expand(self.splits, -1, -1))  # [splits, out/splits, rows]
            y = y.view(self.out_features, -1).t().reshape(*x.shape[:-1], self.out_features)
        else:
            return F.linear(x, self.weight, self.bias)
        return y if self.bias is None else y + self.bias

    def paths_for(self, x: torch.Tensor) -> tuple[str, ...]:
        """The paths that can take x, for kernel_paths.choose."""
        if x.device.type != "cpu" or x.shape[-1] != self.in_features:
            return ("linear",)  # F.linear also raises the usual error for a wrong width
        fits = cpu_kernels.fp32_fits(x, self.weight) or cpu_kernels.bf16_fits(x, self.weight)
        c = ("c",) if fits else ()
        bmm = ("bmm",) if self.splits > 1 and x.dtype == self.weight.dtype else ()
        return (*c, *bmm, "linear")

    def step_paths_for(self, x: torch.Tensor) -> tuple[str, ...]:
        """The paths for the fast decode step (cpu/fast_decode.py): paths_for's, and "packed"
        for batched decode's row counts (PACKED_ROWS)."""
        rows = x.numel() // max(x.shape[-1], 1)
        packed = PACKED_ROWS[0] <= rows <= PACKED_ROWS[1] and cpu_kernels.packed_fits(
            x, self.weight
        )
        options = self.paths_for(x)
        return (options[0], "packed", *options[1:]) if packed and "c" in options else options

    def kernel_key(self) -> tuple[str, str]:
        fmt = FORMAT_NAMES.get(self.weight.dtype, str(self.weight.dtype))
        return fmt, f"{self.out_features}x{self.in_features}"

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, splits={self.splits}"
