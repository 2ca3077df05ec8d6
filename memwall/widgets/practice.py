"""Helpers that exercise widgets and checks share: workloads and error measures, no answers.

They take the function to study as an argument (the student's, or the key's reference), so a
widget can draw the student's curve with them; none of them computes an exercise's answer.
"""

import math

import numpy as np


def grouped_attention(q, k, v):
    """Softmax attention where query head h reads KV head h // (query heads / KV heads)."""
    from memwall.engine.layers import attend

    return attend(q, k, v)


def attention_after_pooling(pool, q, k, v, n_groups):
    """The attention output once `pool` has turned k and v into n_groups KV heads."""
    import torch

    pooled_k, pooled_v = (
        torch.as_tensor(pool(t.clone(), n_groups), dtype=torch.float64) for t in (k, v)
    )
    expected_shape = (k.shape[0], n_groups, k.shape[2], k.shape[3])
    if tuple(pooled_k.shape) != expected_shape:
        raise ValueError(f"expected pooled shape {expected_shape}, got {tuple(pooled_k.shape)}")
    return grouped_attention(q, pooled_k, pooled_v)


def pooling_error(pool, n_groups, similarity=0.5, n_kv_heads=8, tokens=64, head_dim=32, seed=0):
    """How far attention moves when `pool` merges n_kv_heads KV heads into n_groups (for the widget).

    Each head's keys and values are similarity x a part shared by all heads + (1 - similarity) x
    their own part. Returns |output after pooling - output before| / |output before|: 0 when all
    heads are alike (similarity 1), large when they are unrelated, as in a model never trained to share.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)

    def heads(count):
        shared = torch.randn(1, 1, tokens, head_dim, generator=generator, dtype=torch.float64)
        own = torch.randn(1, count, tokens, head_dim, generator=generator, dtype=torch.float64)
        return similarity * shared + (1 - similarity) * own

    q, k, v = heads(n_kv_heads), heads(n_kv_heads), heads(n_kv_heads)
    before = grouped_attention(q, k, v)
    after = attention_after_pooling(pool, q, k, v, n_groups)
    return ((after - before).norm() / before.norm()).item()


def random_events(rng, n_events, n_blocks, block_size, max_sequences=5):
    """A stream of appends (prompts, then mostly single decode tokens) and frees that never needs
    more than n_blocks blocks, so any correct allocator can serve it."""
    events, lengths, next_seq = [], {}, 0

    def blocks_after(seq, tokens):
        others = sum(math.ceil(n / block_size) for s, n in lengths.items() if s != seq)
        return others + math.ceil((lengths.get(seq, 0) + tokens) / block_size)

    while len(events) < n_events:
        roll = rng.random()
        if lengths and (roll < 0.15 or len(lengths) >= max_sequences):
            seq = rng.choice(sorted(lengths))
            events.append(("free", seq))
            del lengths[seq]
            continue
        if not lengths or roll < 0.35:
            seq, tokens = next_seq, rng.randint(1, 3 * block_size)
        else:
            seq, tokens = rng.choice(sorted(lengths)), 1
        if blocks_after(seq, tokens) > n_blocks:
            if lengths:
                seq = rng.choice(sorted(lengths))
                events.append(("free", seq))
                del lengths[seq]
            continue
        if seq == next_seq:
            next_seq += 1
        events.append(("append", seq, tokens))
        lengths[seq] = lengths.get(seq, 0) + tokens
    return events


def blocks_in_use(allocator, events, n_blocks, block_size):
    """How many blocks `allocator` holds after `events`: a number, for plots."""
    return sum(len(table) for table in allocator(events, n_blocks, block_size).values())


def relative_rms_error(quantize, bits, outlier=0.0, seed=0):
    """How far `quantize(w, bits)` lands from w, relative to w's RMS, on a fixed random matrix with
    one weight per row multiplied by `outlier` (for the widget)."""
    w = np.random.default_rng(seed).normal(0, 1, (64, 256)).astype(np.float32)
    if outlier:
        w[:, 0] *= outlier
    error = np.asarray(quantize(w, bits), dtype=np.float64) - w
    return float(np.sqrt((error**2).mean()) / np.sqrt((w.astype(np.float64) ** 2).mean()))
