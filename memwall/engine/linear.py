"""The engine's linear layer, laid out so a memory-bound matrix-vector product uses every core.

Decode multiplies one activation row by each weight matrix, so it streams the weights at whatever
rate the hardware can read them. On this course's 2-core AMD CPU, MKL's fp32 matrix-vector kernel
runs on one core and reaches about a third of the machine's read bandwidth (see chapter 3). The fix
is the "split-K" layout: store W^T as `splits` contiguous slabs along the input dimension, let one
batched matmul give each core its own slab, and add the partial products. On a GPU one F.linear
already saturates memory, so `splits` is 1 there and the layout is the usual [out, in].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def default_splits(device) -> int:
    return torch.get_num_threads() if torch.device(device).type == "cpu" else 1


class Linear(nn.Module):
    """y = x W^T + b for W of shape [out_features, in_features]."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, splits: int | None = None,
                 device=None, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        device = device or torch.empty(0).device  # honours a surrounding `with torch.device(...)`
        splits = splits or default_splits(device)
        self.splits = splits if splits > 1 and in_features % splits == 0 else 1
        if self.splits > 1:
            shape = (self.splits, in_features // self.splits, out_features)  # slabs of W^T
        else:
            shape = (out_features, in_features)
        self.stored = nn.Parameter(torch.empty(shape, device=device, dtype=dtype), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype),
                                 requires_grad=False) if bias else None

    @property
    def weight(self) -> torch.Tensor:
        """W as [out_features, in_features] (a view, whatever the stored layout)."""
        if self.splits == 1:
            return self.stored
        return self.stored.reshape(self.in_features, self.out_features).t()

    @torch.no_grad()
    def set_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> "Linear":
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"expected a weight of shape {(self.out_features, self.in_features)}, "
                             f"got {tuple(weight.shape)}")
        self.stored.copy_(weight if self.splits == 1 else weight.t().reshape(self.stored.shape))
        if bias is not None:
            self.bias.copy_(bias)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.splits == 1:
            return F.linear(x, self.stored, self.bias)
        rows = x.reshape(-1, self.splits, self.in_features // self.splits).transpose(0, 1)
        y = torch.bmm(rows, self.stored).sum(0)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, splits={self.splits}"
