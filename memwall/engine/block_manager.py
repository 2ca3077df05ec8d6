"""The block manager of a paged KV cache: fixed-size blocks, a free list, a block table per sequence.

PagedAttention (Kwon et al. 2023, the vLLM paper) manages KV memory the way an operating system
manages RAM: the cache is cut into blocks of `block_size` token slots, a sequence owns a list of
blocks (its *block table*, like a page table) that need not be contiguous, and blocks are handed
out from a free list one at a time as the sequence grows. A sequence therefore wastes at most the
unused tail of its last block, instead of every slot between its current length and the longest
it might ever get, which is what reserving a contiguous region per request costs.

This class is bookkeeping only (no tensors): `paged_cache.PagedKVCache` owns the memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


class OutOfBlocks(RuntimeError):
    """Not enough free blocks right now. The scheduler answers by waiting or preempting."""


@dataclass(frozen=True)
class MemoryUse:
    """A snapshot of the cache: slots that hold tokens against slots handed out."""

    used_slots: int  # tokens stored
    allocated_slots: int  # blocks handed out x block_size
    total_slots: int  # the whole cache

    @property
    def wasted_slots(self) -> int:
        """Allocated but empty: the unused tails of each sequence's last block."""
        return self.allocated_slots - self.used_slots


class BlockManager:
    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(
                f"n_blocks and block_size must be >= 1, got {n_blocks} and {block_size}"
            )
        self.n_blocks, self.block_size = n_blocks, block_size
        # Reversed so blocks are handed out 0, 1, 2, ... from a fresh cache (easier to read).
        self.free_blocks: list[int] = list(range(n_blocks))[::-1]
        self.tables: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}

    @property
    def capacity_tokens(self) -> int:
        return self.n_blocks * self.block_size

    @property
    def n_free(self) -> int:
        return len(self.free_blocks)

    def blocks_for(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    def add(self, seq_id) -> None:
        if seq_id in self.tables:
            raise ValueError(f"sequence {seq_id!r} is already in the cache")
        self.tables[seq_id], self.lengths[seq_id] = [], 0

    def extra_blocks_needed(self, seq_id, new_tokens: int) -> int:
        """Blocks `seq_id` must gain to store `new_tokens` more tokens."""
        total = self.lengths[seq_id] + new_tokens
        return max(0, self.blocks_for(total) - len(self.tables[seq_id]))

    def reserve(self, seq_ids, new_tokens: int) -> None:
        """Make room for `new_tokens` more tokens in each sequence, or change nothing and raise."""
        wanted = sum(self.extra_blocks_needed(s, new_tokens) for s in seq_ids)
        if wanted > self.n_free:
            raise OutOfBlocks(f"{wanted} blocks needed, {self.n_free} free")
        for seq_id in seq_ids:
            for _ in range(self.extra_blocks_needed(seq_id, new_tokens)):
                self.tables[seq_id].append(self.free_blocks.pop())

    def advance(self, seq_id, new_tokens: int) -> None:
        """Record that `new_tokens` tokens were written (their blocks were reserved first)."""
        length = self.lengths[seq_id] + new_tokens
        if self.blocks_for(length) > len(self.tables[seq_id]):
            raise RuntimeError(f"sequence {seq_id!r} wrote past its blocks; call reserve() first")
        self.lengths[seq_id] = length

    def free(self, seq_id) -> None:
        """Give a finished (or preempted) sequence's blocks back to the free list."""
        self.free_blocks.extend(reversed(self.tables.pop(seq_id)))
        del self.lengths[seq_id]

    def slot(self, seq_id, position: int) -> int:
        """The flat cache slot that holds token `position` of `seq_id`: through its block table."""
        block = self.tables[seq_id][position // self.block_size]
        return block * self.block_size + position % self.block_size

    def memory_use(self) -> MemoryUse:
        allocated = sum(len(t) for t in self.tables.values()) * self.block_size
        return MemoryUse(
            used_slots=sum(self.lengths.values()),
            allocated_slots=allocated,
            total_slots=self.capacity_tokens,
        )
