"""The scheduler's paged KV cache, laid out for a compiled decode step, and that step.

The continuous-batching scheduler (`engine/scheduler.py`) keeps its KV cache in blocks handed out
to sequences through block tables (`PagedKVCache`). Its decode steps are the server's whole
workload, so on a GPU they must replay as CUDA graphs too, and a graph needs fixed shapes and
fixed addresses. Here a step takes the block tables and positions as tensors: each sequence's new
keys and values are written into its block in place, and attention gathers each sequence's blocks
through its table and reads them all under a mask, as the static cache's step reads all its slots.
Shapes are kept to a few: a batch is padded up to a captured size (`runner.BATCH_SIZES`), the
tables' width up to a power of two of blocks (two at least).

Two differences from the readable `PagedKVCache`, both for the compiler:
- one pool tensor per layer (a write into a slice of one big input is compiled into a copy of all
  of it, as `static_cache.py` explains);
- a scratch block past the last one, never handed out: the padded rows write there, so that they
  never touch a real sequence's blocks.
The gather copies a batch's blocks once per layer, as the readable paged path does: a kernel that
reads the blocks in place (vLLM's paged attention) saves that copy, plain PyTorch has none.
Prefill passes (many tokens, rarely launch-bound) run the readable model on this same cache.
"""

from __future__ import annotations

import torch

from memwall.engine.cuda.step import layers_over_cache
from memwall.engine.paged_cache import PagedKVCache


class CompiledPagedCache(PagedKVCache):
    @staticmethod
    def _pools(shape, dtype, device):
        n_layers, n_blocks, *block = shape
        pools = []
        for _ in range(2 * n_layers):
            pool = torch.zeros(n_blocks + 1, *block, dtype=dtype, device=device)  # + scratch
            # Fixed addresses a graph may write in place, as the static cache's buffers are.
            torch._dynamo.mark_static_address(pool, guard=False)
            torch._dynamo.maybe_mark_dynamic(pool, 0)  # caches of other sizes share one compile
            pools.append(pool)
        return pools[:n_layers], pools[n_layers:]

    @property
    def scratch_block(self) -> int:
        return self.blocks.n_blocks

    @property
    def nbytes(self) -> int:
        """The blocks' bytes, keys and values, the scratch block left out."""
        pool = self.keys[0]
        return 2 * len(self.keys) * pool[:-1].numel() * pool.element_size()

    def step_inputs(self, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The one-token pass begun, as the compiled step takes it: each row's position [rows]
        and block table [rows, width], padded to `rows` (the padded rows at position 0 of the
        scratch block) and to a width of a power of two blocks, two at least."""
        tables, starts = self.batch_tables, self.batch_starts
        if tables is None or self.new_tokens != 1:
            raise RuntimeError("call begin(seq_ids, 1) before a compiled decode step")
        batch, width = tables.shape
        # Never one block: a size of 1 is compiled apart from the others (it is specialised).
        padded_width = min(max(2, 1 << (width - 1).bit_length()), max(2, self.blocks.n_blocks))
        table = torch.full((rows, padded_width), self.scratch_block, dtype=torch.long)
        table[:batch, :width] = tables
        positions = torch.zeros(rows, dtype=torch.long)
        positions[:batch] = starts
        return positions.to(self.device), table.to(self.device)


def decode_paged(model, tokens, positions, tables, keys, values) -> torch.Tensor:
    """One new token per row: tokens [rows, 1] at `positions` [rows] of the sequences whose blocks
    are `tables` [rows, width], over pools keys/values (one [blocks, kv_heads, block_size,
    head_dim] tensor per layer) -> logits [rows, 1, vocab]."""
    rows = tokens.shape[0]
    block_size = keys[0].shape[2]
    here = tables.gather(1, (positions // block_size)[:, None])[:, 0]  # the block written to
    offset = positions % block_size
    slots = tables.shape[1] * block_size
    # Slot j of a row's gathered blocks is its position j: it sees the ones up to its own.
    visible = torch.arange(slots, device=tokens.device) <= positions[:, None]
    visible = visible[:, None, None]  # [rows, 1, T=1, slots]

    def remember(layer, k, v):
        gathered = []
        for pool, new in ((keys[layer], k), (values[layer], v)):
            pool[here, :, offset] = new[:, :, 0].to(pool.dtype)  # in place, [rows, kv_heads, d]
            blocks = pool[tables]  # [rows, width, kv_heads, block_size, head_dim]
            gathered.append(blocks.transpose(1, 2).reshape(rows, pool.shape[1], slots, -1))
        return gathered

    x = model.embed(tokens)
    cos = model.rotary.cos[positions[:, None]].to(x.dtype)[:, None]  # [rows, 1, 1, head_dim]
    sin = model.rotary.sin[positions[:, None]].to(x.dtype)[:, None]
    x = layers_over_cache(model, x, cos, sin, visible, remember)
    return model.lm_head(model.norm(x))


def warm_up(model, block_size: int = 16) -> None:
    """Compile `model`'s paged decode step for one row and for several (one row is compiled on
    its own: a size of 1 is specialised) on a small cache of its own, so that a server's first
    requests do not wait for the compiler. The graphs for the server's cache are recorded on its
    first steps."""
    from memwall.engine.scheduler import Request, Scheduler

    for batch in (1, 2):
        scheduler = Scheduler(model, n_blocks=2 * batch, block_size=block_size, max_batch=batch)
        scheduler.run([Request(i, [0], 2) for i in range(batch)])
