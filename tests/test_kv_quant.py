"""The int8 KV cache: error bound, bytes against the cost model, cache semantics, decode quality."""

import pytest
import torch

from memwall import cost
from memwall.engine import decode_step, prefill
from memwall.engine.kv_quant import KVCacheInt8, quantize_per_vector
from memwall.specs import ModelSpec


def test_per_vector_error_is_at_most_half_a_step():
    x = torch.randn(2, 3, 5, 64, generator=torch.Generator().manual_seed(0)) * 4
    codes, scales = quantize_per_vector(x)
    assert codes.dtype == torch.int8 and scales.shape == (2, 3, 5, 1)
    assert ((codes.float() * scales - x).abs() <= scales / 2 * (1 + 1e-5)).all()


def test_bytes_match_the_cost_model(tiny_hf, tiny_engine):
    cache = KVCacheInt8.for_model(tiny_engine, batch=3, max_tokens=100)
    # One fp32 scale per head_dim numbers: the cost model's group-wise "int8-g16" for head_dim 16.
    assert cache.nbytes == cost.kv_cache_bytes(
        ModelSpec.from_hf_config(tiny_hf.config), 100, batch=3, kv_dtype="int8-g16"
    )
    fp32 = tiny_engine.new_cache(batch=3, max_tokens=100)
    assert cache.nbytes / fp32.nbytes == pytest.approx((1 + 4 / 16) / 4)


def test_update_commit_rollback():
    cache = KVCacheInt8(n_layers=2, batch=1, max_tokens=8, n_kv_heads=2, head_dim=4)
    k, v = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 4)
    for layer in range(2):
        keys, values = cache.update(layer, k, v)
        assert keys.shape == (1, 2, 3, 4) and keys.dtype == torch.float32
        torch.testing.assert_close(keys, k, atol=k.abs().max().item() / 127, rtol=0)
    assert cache.length == 0
    cache.commit()
    assert cache.length == 3 and cache.bytes_used() == cache.nbytes * 3 // 8
    keys, _ = cache.update(0, k[:, :, :1], v[:, :, :1])
    assert keys.shape[2] == 4
    cache.commit()
    cache.rollback(2)
    assert cache.length == 2
    with pytest.raises(ValueError, match="full"):
        cache.update(0, torch.randn(1, 2, 7, 4), torch.randn(1, 2, 7, 4))


def test_int8_cache_decodes_like_fp32(tiny_engine):
    """Teacher-forced over the same tokens, the int8 cache picks the fp32 cache's next token."""
    tokens = torch.randint(0, 256, (1, 80), generator=torch.Generator().manual_seed(1))
    caches = [
        tiny_engine.new_cache(max_tokens=80),
        KVCacheInt8.for_model(tiny_engine, max_tokens=80),
    ]
    with torch.inference_mode():
        logits = [[prefill(tiny_engine, tokens[:, :16], c)] for c in caches]
        for position in range(16, 79):
            for cache, out in zip(caches, logits):
                out.append(decode_step(tiny_engine, tokens[:, position], cache))
    fp32, int8 = (torch.cat(out) for out in logits)
    assert (fp32.argmax(-1) == int8.argmax(-1)).float().mean() >= 0.95
    assert (fp32 - int8).abs().max() < 0.05 * fp32.abs().max()
