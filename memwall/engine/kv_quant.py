"""An int8 KV cache: keys and values stored as int8 with one fp32 scale per token and KV head.

Weight quantization shrinks the fixed cost of a step; the KV cache is the cost that grows with
context x users, so at long context it is the cache that needs shrinking. Each cached vector (one
token, one KV head, `head_dim` numbers) is stored symmetrically as int8 codes times its own scale,
absmax / 127. That is 1 byte per number plus 4 bytes per vector, i.e. `memwall.cost`'s
"int8-g<head_dim>" KV dtype (1.0625 bytes per number for head_dim 64, against 2 for bf16).

Same interface as `KVCache`: `update` stores this step's keys/values and returns the whole prefix,
dequantized to the compute dtype so attention is unchanged. That dequantization is extra work a
fused kernel would avoid by reading the int8 codes directly; chapter 7 measures what it costs.
"""

from __future__ import annotations

import torch

from memwall.engine.kv_cache import KVCache

SCALE_DTYPE = torch.float32


def quantize_per_vector(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., head_dim] float -> (int8 codes [..., head_dim], scales [..., 1]); x ~ codes * scales."""
    scales = (x.abs().amax(dim=-1, keepdim=True).float() / 127).clamp(
        min=torch.finfo(torch.float32).tiny
    )
    codes = torch.round(x.float() / scales).clamp(-127, 127).to(torch.int8)
    return codes, scales.to(SCALE_DTYPE)


class KVCacheInt8(KVCache):
    """A preallocated cache [layers, batch, kv_heads, max_tokens, head_dim] of int8 codes, plus scales."""

    def __init__(
        self, n_layers, batch, max_tokens, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"
    ):
        if min(n_layers, batch, max_tokens, n_kv_heads, head_dim) <= 0:
            raise ValueError("KVCacheInt8 sizes must all be positive")
        shape = (n_layers, batch, n_kv_heads, max_tokens, head_dim)
        self.keys = torch.zeros(shape, dtype=torch.int8, device=device)
        self.values = torch.zeros(shape, dtype=torch.int8, device=device)
        self.key_scales = torch.zeros(shape[:-1] + (1,), dtype=SCALE_DTYPE, device=device)
        self.value_scales = torch.zeros(shape[:-1] + (1,), dtype=SCALE_DTYPE, device=device)
        self.dtype = dtype  # what `update` hands back to attention
        self.max_tokens = max_tokens
        self.length = 0
        self._pending = 0

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Quantize and store this step's k/v [batch, kv_heads, tokens, head_dim]; return the
        dequantized prefix, this step's tokens included."""
        start, tokens = self.length, k.shape[2]
        end = start + tokens
        if end > self.max_tokens:
            raise ValueError(
                f"KV cache is full: {end} tokens needed, room for {self.max_tokens}. "
                "Allocate a larger cache (max_tokens) or use a shorter prompt."
            )
        for codes, scales, new in (
            (self.keys, self.key_scales, k),
            (self.values, self.value_scales, v),
        ):
            codes[layer, :, :, start:end], scales[layer, :, :, start:end] = quantize_per_vector(new)
        self._pending = tokens
        return self._dequantized(self.keys, self.key_scales, layer, end), self._dequantized(
            self.values, self.value_scales, layer, end
        )

    def _dequantized(self, codes, scales, layer, end):
        return codes[layer, :, :, :end].to(self.dtype) * scales[layer, :, :, :end].to(self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes allocated for codes and scales, keys and values (the whole preallocated capacity)."""
        return sum(
            t.numel() * t.element_size()
            for t in (self.keys, self.values, self.key_scales, self.value_scales)
        )
