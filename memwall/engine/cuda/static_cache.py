"""A static KV cache: buffers allocated once, written in place, read whole.

The readable `KVCache` hands attention the prefix [0, length): a tensor whose shape grows by one
every step. A CUDA graph replays fixed kernels on fixed addresses with fixed shapes, so a step
that must be captured once and replayed many times cannot slice a growing prefix. This cache keeps
the readable layout per layer ([rows, kv_heads, max_tokens, head_dim]) but the step that uses it
writes the new keys and values at slots given as a tensor (`index_copy_`) and attends over all
max_tokens slots, with a mask that hides the ones not written yet (gpt-fast's approach). The price
is that attention reads the whole capacity every decode step (a prefill, run eagerly, reads only
the slots written), so the cache is sized to the request (prompt + new tokens), never to the
model's full context.

`rows` is the batch the compiled step runs: a batch is padded up to the next size that has a
captured graph (as nano-vllm does), and the padded rows compute on and are thrown away.
"""

from __future__ import annotations

import torch


class StaticKVCache:
    def __init__(
        self,
        n_layers: int,
        batch: int,
        max_tokens: int,
        n_kv_heads: int,
        head_dim: int,
        dtype=torch.float32,
        device="cpu",
        rows: int | None = None,
        buffers: tuple[list, list] | None = None,
    ):
        rows = batch if rows is None else rows
        if min(n_layers, batch, max_tokens, n_kv_heads, head_dim) <= 0 or rows < batch:
            raise ValueError("StaticKVCache sizes must all be positive, and rows >= batch")
        shape = (rows, n_kv_heads, max_tokens, head_dim)
        if buffers is not None:
            # A dropped cache's buffers, at the addresses a graph was recorded on: replaying it
            # needs no new recording. Zeroed, so no value of the last request can leak in.
            self.layer_keys, self.layer_values = buffers
            if self.layer_keys[0].shape != shape or self.dtype != dtype:
                raise ValueError("the buffers to reuse have another shape or dtype")
            # Buffers made under inference mode can be written only inside it.
            with torch.inference_mode(self.layer_keys[0].is_inference()):
                for buffer in (*self.layer_keys, *self.layer_values):
                    buffer.zero_()
        else:
            self.layer_keys, self.layer_values = self._allocate(n_layers, shape, dtype, device)
        self.batch, self.rows, self.max_tokens = batch, rows, max_tokens
        self.length = 0  # tokens stored in every sequence

    @staticmethod
    def _allocate(n_layers, shape, dtype, device):
        # One tensor per layer, not one for all: a compiled step that writes into a slice of one
        # big input is turned into a copy of all of it (a functional update), one per layer and
        # step; a whole tensor written in place stays in place.
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        for buffer in (*keys, *values):
            # Their addresses are part of a captured graph: marked so that the compiler treats
            # them as fixed buffers it may write in place (like a module's parameters), not as
            # fresh inputs to copy in. A cache at new addresses makes the graph be recorded
            # again, which is cheap; it is not compiled again (no guard on the address: older
            # torch guards by default, and then compiles the step again for every new cache).
            torch._dynamo.mark_static_address(buffer, guard=False)
            # Caches of other lengths reuse the compiled step (one compile, not one per request).
            torch._dynamo.maybe_mark_dynamic(buffer, 2)
        return keys, values

    @property
    def dtype(self) -> torch.dtype:
        return self.layer_keys[0].dtype

    def rollback(self, length: int) -> None:
        """Forget everything after `length` tokens (e.g. rejected speculative tokens): the slots
        stay, and the mask hides them until they are written again."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot roll back to {length}; the cache holds {self.length} tokens")
        self.length = length

    @property
    def keys(self) -> torch.Tensor:
        """All layers' keys in the readable cache's layout [layers, rows, kv_heads, max_tokens,
        head_dim]: a copy, for reading (write through `layer_keys`)."""
        return torch.stack(self.layer_keys)

    @property
    def values(self) -> torch.Tensor:
        return torch.stack(self.layer_values)

    @property
    def device(self) -> torch.device:
        return self.layer_keys[0].device

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values for the real sequences (the padded rows are not counted)."""
        first = self.layer_keys[0]
        per_row = first[:1].numel() * first.element_size()
        return 2 * len(self.layer_keys) * per_row * self.batch

    def bytes_used(self) -> int:
        return self.nbytes * self.length // self.max_tokens
