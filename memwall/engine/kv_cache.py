"""An explicit, preallocated key/value cache.

One tensor for keys and one for values, shaped [layers, batch, kv_heads, max_tokens, head_dim],
allocated once. Each step writes its new keys/values at the current length and attention reads the
prefix [0, length). Its size is exactly the cost model's 2 x layers x kv_heads x head_dim x bytes per
token, which `nbytes` reports from the real tensors.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(
        self, n_layers, batch, max_tokens, n_kv_heads, head_dim, dtype=torch.float32, device="cpu"
    ):
        if min(n_layers, batch, max_tokens, n_kv_heads, head_dim) <= 0:
            raise ValueError("KVCache sizes must all be positive")
        shape = (n_layers, batch, n_kv_heads, max_tokens, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.max_tokens = max_tokens
        self.length = 0  # tokens stored, committed after the last layer of a step
        self._pending = 0  # tokens being written by the step in flight

    @classmethod
    def for_model(cls, model, batch=1, max_tokens=None, dtype=None, device=None):
        p = next(model.parameters())
        return cls(
            model.n_layers,
            batch,
            max_tokens or model.max_positions,
            model.n_kv_heads,
            model.head_dim,
            dtype or p.dtype,
            device or p.device,
        )

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Store this step's k/v [batch, kv_heads, tokens, head_dim]; return the whole cached prefix."""
        start, tokens = self.length, k.shape[2]
        end = start + tokens
        if end > self.max_tokens:
            raise ValueError(
                f"KV cache is full: {end} tokens needed, room for {self.max_tokens}. "
                "Allocate a larger cache (max_tokens) or use a shorter prompt."
            )
        self.keys[layer, :, :, start:end] = k
        self.values[layer, :, :, start:end] = v
        self._pending = tokens
        return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]

    def commit(self):
        """Called by the model after its last layer: the step's tokens become part of the context."""
        self.length += self._pending
        self._pending = 0

    def rollback(self, length: int):
        """Forget everything after `length` tokens (e.g. rejected speculative tokens)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}; the cache holds {self.length} tokens")
        self.length = length

    @property
    def nbytes(self) -> int:
        """Bytes allocated for keys and values (the whole preallocated capacity)."""
        return self.keys.numel() * self.keys.element_size() * 2

    def bytes_used(self) -> int:
        """Bytes that hold live tokens: what a decode step actually reads."""
        return self.nbytes * self.length // self.max_tokens
