"""A paged KV cache the engine's model runs on, with the same update()/commit() interface as KVCache.

Keys and values live in one pool of token slots per layer, [layers, blocks x block_size, kv_heads,
head_dim]. Which slots belong to which sequence is the block manager's business (block tables and
a free list, Kwon et al. 2023). Sequences in one batch may have different lengths: the layout is
ragged, with no pad slots stored.

A forward pass over a batch goes:
    positions, mask = cache.begin(seq_ids, new_tokens)   # reserve blocks, pick the batch
    logits = model(tokens, cache, positions=positions, mask=mask)
The model calls `update(layer, k, v)` in every layer, which writes the new keys/values through the
block tables and returns each sequence's whole context as a padded [batch, kv_heads, keys, head_dim]
tensor; `commit()` (called by the model after the last layer) advances the lengths.

A real PagedAttention kernel reads the blocks in place. Plain PyTorch has no such kernel, so
`update` gathers the blocks into a dense tensor first: an extra copy of the batch's KV bytes per
layer, which a fused kernel would not pay. The block tables, the free list and the memory saved
are the same.
"""

from __future__ import annotations

import torch

from memwall.engine.block_manager import BlockManager


class PagedKVCache:
    def __init__(
        self,
        n_layers,
        n_blocks,
        block_size,
        n_kv_heads,
        head_dim,
        dtype=torch.float32,
        device="cpu",
    ):
        if min(n_layers, n_kv_heads, head_dim) <= 0:
            raise ValueError("PagedKVCache sizes must all be positive")
        self.blocks = BlockManager(n_blocks, block_size)
        shape = (n_layers, n_blocks * block_size, n_kv_heads, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.device = torch.device(device)
        self._batch: list = []
        self._new_tokens = 0
        self._write_slots = self._read_slots = None

    @classmethod
    def for_model(cls, model, n_blocks: int, block_size: int = 16, dtype=None, device=None):
        p = next(model.parameters())
        return cls(
            model.n_layers,
            n_blocks,
            block_size,
            model.n_kv_heads,
            model.head_dim,
            dtype or p.dtype,
            device or p.device,
        )

    # ---- sequences -----------------------------------------------------------------------------

    def add_sequence(self, seq_id) -> None:
        self.blocks.add(seq_id)

    def free_sequence(self, seq_id) -> None:
        self.blocks.free(seq_id)

    def sequence_length(self, seq_id) -> int:
        return self.blocks.lengths[seq_id]

    # ---- one forward pass ------------------------------------------------------------------------

    def begin(self, seq_ids, new_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Reserve room for `new_tokens` more tokens in each of `seq_ids` (raises OutOfBlocks, having
        changed nothing, when there is none) and return the positions [batch, new_tokens] and the
        attention mask [batch, 1, new_tokens, keys] that the model needs for this batch."""
        seq_ids = list(seq_ids)
        if not seq_ids:
            raise ValueError("begin() needs at least one sequence")
        self.blocks.reserve(seq_ids, new_tokens)
        self._batch, self._new_tokens = seq_ids, new_tokens
        starts = torch.tensor([self.blocks.lengths[s] for s in seq_ids])
        positions = starts[:, None] + torch.arange(new_tokens)[None, :]
        keys = int(starts.max()) + new_tokens
        # Each key position's slot, through the block tables. Positions past a sequence's end point
        # at its first block: they are masked out, so any valid slot will do. A table may also hold
        # blocks reserved ahead (a prompt being prefilled in chunks); those are cut off.
        bs = self.blocks.block_size
        width = self.blocks.blocks_for(keys)
        tables = torch.tensor(
            [(self.blocks.tables[s] + self.blocks.tables[s][:1] * width)[:width] for s in seq_ids]
        )
        key_pos = torch.arange(keys)
        read = tables[:, key_pos // bs] * bs + key_pos % bs  # [batch, keys]
        self._read_slots = read.flatten().to(self.device)
        self._write_slots = read.gather(1, positions).flatten().to(self.device)
        # Key j of sequence b is its position j, so "attend to j <= my position" is the whole rule.
        mask = torch.arange(keys)[None, None, :] <= positions[:, :, None]
        return positions.to(self.device), mask[:, None].to(self.device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write k/v [batch, kv_heads, new_tokens, head_dim]; return every sequence's keys/values so far."""
        batch, kv_heads, tokens, head_dim = k.shape
        if self._write_slots is None or batch != len(self._batch) or tokens != self._new_tokens:
            raise RuntimeError(
                "call begin(seq_ids, new_tokens) for this batch before running the model"
            )
        rows = batch * tokens
        self.keys[layer].index_copy_(
            0, self._write_slots, k.transpose(1, 2).reshape(rows, kv_heads, head_dim)
        )
        self.values[layer].index_copy_(
            0, self._write_slots, v.transpose(1, 2).reshape(rows, kv_heads, head_dim)
        )
        keys = (
            self.keys[layer].index_select(0, self._read_slots).view(batch, -1, kv_heads, head_dim)
        )
        values = (
            self.values[layer].index_select(0, self._read_slots).view(batch, -1, kv_heads, head_dim)
        )
        return keys.transpose(1, 2), values.transpose(1, 2)

    def commit(self) -> None:
        for seq_id in self._batch:
            self.blocks.advance(seq_id, self._new_tokens)
        self._write_slots = self._read_slots = None

    @property
    def length(self) -> int:
        """The longest context in the current batch (the model checks it against max_positions)."""
        return max((self.blocks.lengths[s] for s in self._batch), default=0)

    @property
    def nbytes(self) -> int:
        return self.keys.numel() * self.keys.element_size() * 2

    @property
    def bytes_per_slot(self) -> int:
        return self.nbytes // self.blocks.capacity_tokens
