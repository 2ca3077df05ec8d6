"""The engine's linear layer: y = x W^T + b, with W stored as [out_features, in_features].

A decode step multiplies a few activation rows by each weight matrix, so it reads every weight
once for very little arithmetic: the product is memory-bound, and its time is the matrix's bytes
over the memory bandwidth (chapter 3). The readable layer leaves the arithmetic to `F.linear`.
How fast a given machine runs this product is the business of its backend (`accelerate(model)`
swaps this layer for a twin that picks the fastest kernel there); the readable layer is the
reference those kernels are tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """y = x W^T + b for W of shape [out_features, in_features]."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = False,
        device=None,
        dtype=None,
    ):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        device = device or torch.empty(0).device  # honours a surrounding `with torch.device(...)`
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
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, bias={self.bias is not None}"
