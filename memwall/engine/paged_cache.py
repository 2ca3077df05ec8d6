"""A paged KV cache the engine's model runs on, with the same update()/commit() interface as KVCache.

Keys and values live in one pool of blocks per layer, [layers, blocks, kv_heads, block_size,
head_dim]. Which blocks belong to which sequence is the block manager's business (block tables and
a free list, Kwon et al. 2023). Sequences in one batch may have different lengths: the layout is
ragged, with no pad slots stored. A block is laid out as a contiguous KVCache of one sequence and
block_size tokens, so a kernel that reads the blocks in place through the tables (the CPU fast
path's attention, engine/cpu/decode_attention.h) runs the contiguous cache as the case of one
block per sequence.

A forward pass over a batch goes:
    positions, mask = cache.begin(seq_ids, new_tokens)   # reserve blocks, pick the batch
    logits = model(tokens, cache, positions=positions, mask=mask)
The model calls `update(layer, k, v)` in every layer, which writes the new keys/values through the
block tables and returns each sequence's whole context as a padded [batch, kv_heads, keys, head_dim]
tensor; `commit()` (called by the model after the last layer) advances the lengths.

Plain PyTorch has no kernel that reads the blocks in place, so `update` gathers them into a dense
tensor first: an extra copy of the batch's KV bytes per layer, which a fused kernel does not pay.
The block tables, the free list and the memory saved are the same.
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
        shape = (n_layers, n_blocks, n_kv_heads, block_size, head_dim)
        # keys[layer] is that layer's pool of blocks [n_blocks, kv_heads, block_size, head_dim]
        self.keys, self.values = self._pools(shape, dtype, device)
        self.device = torch.device(device)
        self._batch: list = []
        self.new_tokens = 0
        # The pass begun: each row's block table [batch, width] and first new position [batch]
        # (CPU long tensors, for a kernel that reads the blocks in place); None between passes.
        self.batch_tables = self.batch_starts = None
        self._positions, self._keys = None, 0  # [batch, new_tokens], the longest context
        self._given = (None, None)  # the positions and mask begin() returned
        self._write_slots = self._read_slots = None  # what update() needs, made on first use

    @staticmethod
    def _pools(shape, dtype, device):
        """The keys' and the values' memory (the compiled GPU path lays it out its own way)."""
        keys = torch.zeros(shape, dtype=dtype, device=device)
        return keys, torch.zeros_like(keys)

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
        blocks = self.blocks
        blocks.reserve(seq_ids, new_tokens)
        self._batch, self.new_tokens = seq_ids, new_tokens
        starts = [blocks.lengths[s] for s in seq_ids]
        keys = max(starts) + new_tokens
        # A table may hold blocks reserved ahead (a prompt being prefilled in chunks): those are
        # cut off. Shorter tables are padded with block 0: key positions past a sequence's end are
        # masked out (and the C attention never reads them), so any valid block will do.
        width = blocks.blocks_for(keys)
        tables = [blocks.tables[s][:width] for s in seq_ids]
        self.batch_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables])
        self.batch_starts = torch.tensor(starts)
        self._positions = self.batch_starts[:, None] + torch.arange(new_tokens)
        self._keys = keys
        self._write_slots = self._read_slots = None
        # Key j of sequence b is its position j, so "attend to j <= my position" is the whole rule.
        mask = torch.arange(keys) <= self._positions[:, :, None]
        self._given = (self._positions.to(self.device), mask[:, None].to(self.device))
        return self._given

    def implies(self, positions, mask) -> bool:
        """Whether `positions` and `mask` are those begin() returned for the pass in flight (or
        None): then the tables and starts say all they do, and a kernel may go by those."""
        given_positions, given_mask = self._given
        return (positions is None or positions is given_positions) and (
            mask is None or mask is given_mask
        )

    def _slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each (sequence, kv head, key position)'s row of a layer's pool seen as [slots,
        head_dim], through the block tables: the rows to read [batch, kv_heads, keys], and of
        them the rows this pass writes [batch, kv_heads, new_tokens]."""
        bs, kv_heads = self.blocks.block_size, self.keys[0].shape[1]
        key_pos = torch.arange(self._keys)
        blocks = self.batch_tables[:, key_pos // bs]  # [batch, keys]
        heads = torch.arange(kv_heads)[None, :, None]
        read = (blocks[:, None, :] * kv_heads + heads) * bs + key_pos % bs
        write = read.gather(2, self._positions[:, None, :].expand(-1, kv_heads, -1))
        return read.to(self.device), write.to(self.device)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write k/v [batch, kv_heads, new_tokens, head_dim]; return every sequence's keys/values so far."""
        batch, kv_heads, tokens, head_dim = k.shape
        if self.batch_tables is None or batch != len(self._batch) or tokens != self.new_tokens:
            raise RuntimeError(
                "call begin(seq_ids, new_tokens) for this batch before running the model"
            )
        if self._read_slots is None:
            self._read_slots, self._write_slots = self._slots()
        read, write = self._read_slots, self._write_slots
        out = []
        for pool, new in ((self.keys[layer], k), (self.values[layer], v)):
            pool = pool.view(-1, head_dim)
            pool.index_copy_(0, write.flatten(), new.reshape(-1, head_dim))
            out.append(pool.index_select(0, read.flatten()).view(*read.shape, head_dim))
        return out[0], out[1]

    def commit(self) -> None:
        for seq_id in self._batch:
            self.blocks.advance(seq_id, self.new_tokens)
        self.batch_tables = self.batch_starts = self._positions = None
        self._given = (None, None)
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
