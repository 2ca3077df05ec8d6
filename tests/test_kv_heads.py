"""KV-head conversion: pooled models match a transformers model built with pooled weights,
expanded models match the original exactly, and the cache shrinks or grows with the head count."""

import pytest
import torch

from memwall.engine import Transformer
from memwall.engine.kv_heads import (
    convert_kv_heads,
    expand_kv_heads,
    pool_heads,
    pool_kv_heads,
    repeat_heads,
)
from memwall.specs import ModelSpec

TOLERANCE = 1e-4


def tiny_spec(n_kv_heads):
    return ModelSpec(
        name="tiny",
        n_layers=3,
        d_model=64,
        n_heads=4,
        n_kv_heads=n_kv_heads,
        head_dim=16,
        d_ff=160,
        vocab_size=256,
        tied_embeddings=True,
        max_context=256,
    )


def reference_pool(weight, n_heads, n_groups):
    """Head-by-head average, written as a loop so it shares no code with pool_heads."""
    head_dim, per_group = weight.shape[0] // n_heads, n_heads // n_groups
    heads = [weight[h * head_dim : (h + 1) * head_dim] for h in range(n_heads)]
    return torch.cat(
        [sum(heads[g * per_group : (g + 1) * per_group]) / per_group for g in range(n_groups)]
    )


def hf_with_pooled_kv(hf, n_kv_heads):
    """A transformers model built for n_kv_heads whose K/V projections are the pooled originals."""
    from memwall import models

    pooled = models.random_init(tiny_spec(n_kv_heads), dtype=torch.float32, seed=5)
    state = {name: tensor.clone() for name, tensor in hf.state_dict().items()}
    for name, tensor in state.items():
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            state[name] = reference_pool(tensor, hf.config.num_key_value_heads, n_kv_heads)
    pooled.load_state_dict(state)
    return pooled


def tokens(seed, shape=(2, 19)):
    return torch.randint(0, 256, shape, generator=torch.Generator().manual_seed(seed))


def test_pool_heads_and_repeat_heads_on_small_tensors():
    weight = torch.randn(6 * 4, 5)
    assert torch.allclose(pool_heads(weight, 6, 2), reference_pool(weight, 6, 2))
    assert torch.allclose(pool_heads(weight, 6, 1), weight.view(6, 4, 5).mean(0))
    repeated = repeat_heads(weight, 6, 12)
    assert torch.equal(repeated.view(12, 4, 5)[1::2], weight.view(6, 4, 5))
    assert torch.equal(repeated.view(12, 4, 5)[0::2], weight.view(6, 4, 5))
    assert torch.equal(pool_heads(repeated, 12, 6), weight)  # pooling undoes repeating
    bias = torch.randn(6 * 4)
    assert torch.allclose(pool_heads(bias, 6, 3), reference_pool(bias[:, None], 6, 3)[:, 0])


def test_pooled_engine_matches_transformers_with_pooled_weights(tiny_hf, tiny_engine):
    mqa = pool_kv_heads(tiny_engine, 1)
    reference = hf_with_pooled_kv(tiny_hf, 1)
    batch = tokens(7)
    with torch.inference_mode():
        assert (mqa(batch) - reference(batch).logits).abs().max() < TOLERANCE
        # and pooling really changed the model
        assert (mqa(batch) - tiny_engine(batch)).abs().max() > 1e-2


def test_pooled_engine_decodes_with_its_cache_like_transformers(tiny_hf, tiny_engine):
    mqa, reference = pool_kv_heads(tiny_engine, 1), hf_with_pooled_kv(tiny_hf, 1)
    sequence = tokens(8, (1, 12))
    cache = mqa.new_cache(max_tokens=16)
    with torch.inference_mode():
        mqa(sequence[:, :8], cache)
        steps = [mqa(sequence[:, i : i + 1], cache)[:, -1] for i in range(8, 12)]
        full = reference(sequence).logits[:, 8:12]
    assert (torch.stack(steps, 1) - full).abs().max() < TOLERANCE


def test_expanded_engine_gives_identical_outputs(tiny_engine):
    mha = expand_kv_heads(tiny_engine, 4)
    batch = tokens(9)
    with torch.inference_mode():
        assert (mha(batch) - tiny_engine(batch)).abs().max() < 1e-5
        cache_gqa, cache_mha = tiny_engine.new_cache(max_tokens=20), mha.new_cache(max_tokens=20)
        tiny_engine(batch[:1], cache_gqa)
        mha(batch[:1], cache_mha)
        step = batch[:1, :1]
        assert (mha(step, cache_mha) - tiny_engine(step, cache_gqa)).abs().max() < 1e-5


def test_cache_bytes_follow_the_kv_head_count(tiny_engine):
    sizes = {n: convert_kv_heads(tiny_engine, n).new_cache(max_tokens=32).nbytes for n in (1, 2, 4)}
    assert sizes[1] * 2 == sizes[2] and sizes[2] * 2 == sizes[4]
    # 2 (K and V) x layers x KV heads x head_dim x 4 bytes x tokens
    assert sizes[1] == 2 * 3 * 1 * 16 * 4 * 32


def test_conversion_leaves_the_original_alone_and_shares_other_weights(tiny_engine):
    before = tiny_engine.blocks[0].attn.qkv.weight.clone()
    mqa = convert_kv_heads(tiny_engine, 1)
    assert tiny_engine.n_kv_heads == 2 and tiny_engine.blocks[0].attn.n_kv_heads == 2
    assert torch.equal(tiny_engine.blocks[0].attn.qkv.weight, before)
    assert mqa.blocks[0].attn.qkv.weight.shape == (4 * 16 + 2 * 16, 64)
    assert mqa.blocks[0].mlp.down.weight is tiny_engine.blocks[0].mlp.down.weight
    assert mqa.lm_head.weight is tiny_engine.lm_head.weight


def test_convert_to_the_same_count_is_a_no_op(tiny_engine):
    assert convert_kv_heads(tiny_engine, 2) is tiny_engine


@pytest.mark.parametrize("bad", [0, 3, 5, -1, 2.0, True, "1"])
def test_invalid_head_counts_name_the_valid_choices(tiny_engine, bad):
    with pytest.raises(ValueError, match="choose from 1, 2, 4"):
        convert_kv_heads(tiny_engine, bad)


def test_direction_errors(tiny_engine):
    with pytest.raises(ValueError, match="expand_kv_heads"):
        pool_kv_heads(tiny_engine, 4)
    with pytest.raises(ValueError, match="pool_kv_heads"):
        expand_kv_heads(tiny_engine, 1)
    with pytest.raises(ValueError, match="multiple"):
        pool_heads(torch.zeros(12, 3), 3, 2)


@pytest.mark.slow
def test_smollm2_expanded_to_mha_keeps_its_outputs(smollm2_engine):
    mha = expand_kv_heads(smollm2_engine, 9)
    batch = torch.randint(0, 49152, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert (mha(batch) - smollm2_engine(batch)).abs().max() < TOLERANCE
    assert mha.new_cache(max_tokens=64).nbytes == 3 * smollm2_engine.new_cache(max_tokens=64).nbytes


def test_random_init_engine_round_trip():
    """Expanding then pooling back returns the very same weights."""
    from memwall import models

    engine = Transformer.from_hf(models.random_init(tiny_spec(2), dtype=torch.float32, seed=3))
    back = pool_kv_heads(expand_kv_heads(engine, 4), 2)
    for a, b in zip(engine.blocks, back.blocks):
        assert torch.allclose(a.attn.qkv.weight, b.attn.qkv.weight)
