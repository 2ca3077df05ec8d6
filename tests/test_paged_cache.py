"""The paged KV cache: block tables and a free list, and the same outputs as the contiguous cache."""

import pytest
import torch

from memwall.engine import generate
from memwall.engine.block_manager import BlockManager, OutOfBlocks
from memwall.engine.paged_cache import PagedKVCache


def test_blocks_come_from_the_free_list_and_go_back():
    manager = BlockManager(n_blocks=6, block_size=4)
    manager.add("a"), manager.add("b")
    manager.reserve(["a"], 5)  # 5 tokens -> 2 blocks
    manager.advance("a", 5)
    manager.reserve(["b"], 4)  # exactly one block
    manager.advance("b", 4)
    assert manager.tables == {"a": [0, 1], "b": [2]}
    assert manager.n_free == 3
    manager.reserve(["a", "b"], 1)  # a fits in its 2nd block; b needs a new one
    assert manager.tables["a"] == [0, 1] and manager.tables["b"] == [2, 3]
    manager.free("a")
    assert manager.n_free == 4 and "a" not in manager.tables
    manager.add("c")
    manager.reserve(["c"], 1)
    assert manager.tables["c"] == [0]  # a freed block is reused: tables need not be contiguous


def test_slot_goes_through_the_block_table():
    manager = BlockManager(n_blocks=4, block_size=4)
    manager.add("x"), manager.add("y")
    manager.reserve(["x"], 1), manager.reserve(["y"], 1), manager.reserve(["x"], 8)
    assert manager.tables["x"] == [0, 2]
    assert [manager.slot("x", p) for p in (0, 3, 4, 7)] == [0, 3, 8, 11]


def test_reserve_is_all_or_nothing():
    manager = BlockManager(n_blocks=3, block_size=2)
    manager.add("a"), manager.add("b")
    manager.reserve(["a"], 4)
    with pytest.raises(OutOfBlocks):
        manager.reserve(["a", "b"], 3)  # needs 1 + 2 blocks, only 1 free
    assert manager.tables == {"a": [0, 1], "b": []} and manager.n_free == 1


def test_memory_use_counts_only_last_block_tails():
    manager = BlockManager(n_blocks=10, block_size=8)
    for seq_id, length in (("a", 9), ("b", 16), ("c", 1)):
        manager.add(seq_id)
        manager.reserve([seq_id], length)
        manager.advance(seq_id, length)
    use = manager.memory_use()
    assert (use.used_slots, use.allocated_slots, use.total_slots) == (26, 40, 80)
    assert use.wasted_slots == 7 + 0 + 7


def test_bad_sizes_and_misuse_are_rejected(tiny_engine):
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(n_blocks=4, block_size=0)
    manager = BlockManager(n_blocks=4, block_size=4)
    manager.add("a")
    with pytest.raises(ValueError, match="already"):
        manager.add("a")
    with pytest.raises(RuntimeError, match="reserve"):
        manager.advance("a", 1)
    cache = PagedKVCache.for_model(tiny_engine, n_blocks=4, block_size=4)
    with pytest.raises(RuntimeError, match="begin"):
        tiny_engine(torch.tensor([[1]]), cache, positions=torch.tensor([0]))


@torch.inference_mode()
def paged_generate(model, cache, prompts, new_tokens):
    """Greedy decoding of several prompts as one ragged batch on the paged cache."""
    tokens = []
    for i, prompt in enumerate(
        prompts
    ):  # prefill each prompt on its own; it yields the first token
        cache.add_sequence(i)
        positions, mask = cache.begin([i], len(prompt))
        logits = model(torch.tensor([prompt]), cache, positions=positions, mask=mask)
        tokens.append([int(logits[0, -1].argmax())])
    for _ in range(new_tokens - 1):  # then decode all of them together, lengths still differing
        positions, mask = cache.begin(range(len(prompts)), 1)
        logits = model(
            torch.tensor([[t[-1]] for t in tokens]), cache, positions=positions, mask=mask
        )
        for t, new in zip(tokens, logits[:, -1].argmax(-1).tolist()):
            t.append(new)
    return tokens


def test_paged_outputs_equal_the_contiguous_cache(tiny_engine):
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (5, 13, 2)]
    # Blocks of 4 over a fragmented free list: sequences interleave block by block as they grow.
    cache = PagedKVCache.for_model(tiny_engine, n_blocks=32, block_size=4)
    ours = paged_generate(tiny_engine, cache, prompts, 20)
    assert ours == [generate(tiny_engine, p, 20).tokens for p in prompts]
    tables = cache.blocks.tables
    assert any(
        b - a != 1 for t in tables.values() for a, b in zip(t, t[1:])
    )  # really non-contiguous


def test_paged_logits_match_the_contiguous_cache(tiny_engine):
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(6))
    contiguous = tiny_engine.new_cache(max_tokens=16)
    paged = PagedKVCache.for_model(tiny_engine, n_blocks=8, block_size=2)
    paged.add_sequence("s")
    with torch.inference_mode():
        expected = tiny_engine(prompt, contiguous)
        positions, mask = paged.begin(["s"], 9)
        got = tiny_engine(prompt, paged, positions=positions, mask=mask)
        assert (got - expected).abs().max() < 1e-5
        token = expected[:, -1:].argmax(-1)
        expected = tiny_engine(token, contiguous)
        positions, mask = paged.begin(["s"], 1)
        got = tiny_engine(token, paged, positions=positions, mask=mask)
        assert (got - expected).abs().max() < 1e-5
    assert paged.sequence_length("s") == contiguous.length == 10


def test_cache_size_is_blocks_times_per_token_bytes(tiny_engine):
    cache = PagedKVCache.for_model(tiny_engine, n_blocks=5, block_size=8)
    per_token = 2 * 3 * 2 * 16 * 4  # K and V x layers x kv_heads x head_dim x fp32
    assert cache.nbytes == per_token * 5 * 8 and cache.bytes_per_slot == per_token
