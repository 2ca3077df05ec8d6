"""The continuous-batching scheduler over accelerate(model): its decode steps run the fused C step
on the paged KV cache, read in place, and give the readable engine's tokens and logits."""

import pytest
import torch

from memwall.engine.cpu import kernels as cpu_kernels
from memwall.engine.cpu.fast_decode import accelerate
from memwall.engine.quant import quantize
from memwall.engine.scheduler import Request, Scheduler

# decode_attention.h: the C attention cuts a row's context into chunks of this many tokens
ATTEND_CHUNK = 256


@pytest.fixture(scope="module")
def long_context_model():
    """A tiny random model whose context reaches past one attention chunk."""
    from memwall import models
    from memwall.engine import Transformer
    from memwall.specs import ModelSpec

    spec = ModelSpec(
        name="tiny",
        n_layers=2,
        d_model=96,
        n_heads=6,  # groups of 3 query heads per key/value head, as SmolLM2's
        n_kv_heads=2,
        head_dim=16,
        d_ff=160,
        vocab_size=256,
        tied_embeddings=True,
        max_context=ATTEND_CHUNK + 64,
    )
    hf = models.random_init(spec, dtype=torch.float32, seed=3)
    with torch.no_grad():  # sharpen the logits, so that greedy ties cannot flip on rounding
        for p in hf.parameters():
            if p.dim() == 2:
                p.mul_(8)
    return Transformer.from_hf(hf)


def requests():
    """A long prompt whose decoding crosses ATTEND_CHUNK, and short ones joining mid-stream."""
    g = torch.Generator().manual_seed(11)
    stream = [Request("long", torch.randint(0, 256, (ATTEND_CHUNK - 6,), generator=g).tolist(), 16)]
    for i in range(8):
        prompt = int(torch.randint(1, 30, (1,), generator=g))
        new = int(torch.randint(2, 24, (1,), generator=g))
        tokens = torch.randint(0, 256, (prompt,), generator=g).tolist()
        stream.append(Request(i, tokens, new, arrival_step=1 + 2 * i))
    return stream


def run_recording(model, **settings):
    """Results of a scheduler run, and the logits of every forward pass (prefill or decode)."""
    scheduler = Scheduler(model, max_batch=6, **settings)
    calls, real_forward = [], model.forward

    def recording_forward(tokens, *args, **kwargs):
        logits = real_forward(tokens, *args, **kwargs)
        calls.append((tuple(tokens.shape), logits.clone()))
        return logits

    model.forward = recording_forward
    try:
        results = scheduler.run(requests())
    finally:
        del model.forward
    return scheduler, results, calls


SETTINGS = {
    "blocks of 4, preempting": dict(n_blocks=90, block_size=4),
    "chunked prefill, blocks of 16": dict(n_blocks=64, block_size=16, prefill_chunk=12),
    # pieces of one prompt token are one-token steps too: those run fused as well
    "prefill a token a step, blocks of 8": dict(n_blocks=64, block_size=8, prefill_chunk=1),
}


@pytest.mark.parametrize("scheme", ["fp32", "int8", "int4"])
@pytest.mark.parametrize("setting", SETTINGS)
def test_served_decode_steps_run_fused_and_match_the_readable_engine(
    long_context_model, scheme, setting, monkeypatch
):
    # fp32 activations on both sides (PyTorch's packed paths would round them to bf16)
    monkeypatch.setenv("MEMWALL_KERNEL_PATH", "fixed")
    fused = cpu_kernels.available()
    if scheme != "fp32" and not fused:  # then the twins run PyTorch's bf16-activation kernels
        pytest.skip(f"memwall's CPU kernels: {cpu_kernels.unavailable_reason()}")
    model = long_context_model
    if scheme != "fp32":
        model = quantize(model, scheme, inplace=False)
    fast = accelerate(model)
    readable, expected, reference_calls = run_recording(model, **SETTINGS[setting])
    served, results, calls = run_recording(fast, **SETTINGS[setting])

    if setting.endswith("preempting"):
        assert readable.preemptions > 0  # the cache really was too small for everyone
    else:  # prompts went in chunks
        assert max(shape[1] for shape, _ in calls) == SETTINGS[setting]["prefill_chunk"]
    longest = next(r for r in results if r.request_id == "long")
    assert ATTEND_CHUNK - 6 + len(longest.tokens) > ATTEND_CHUNK  # crossed a chunk decoding
    for result, reference in zip(results, expected):
        assert result.error is None and result.tokens == reference.tokens
    assert [shape for shape, _ in calls] == [shape for shape, _ in reference_calls]
    for (_, ours), (_, theirs) in zip(calls, reference_calls):
        assert (ours - theirs).abs().max() <= 1e-5 * theirs.abs().max() + 1e-4
    # every one-token step of the served run (each decode step) went through the C step
    assert served.batch_sizes == readable.batch_sizes and max(served.batch_sizes) > 1
    one_token_steps = sum(shape[1] == 1 for shape, _ in calls)
    assert one_token_steps >= len(served.batch_sizes)
    assert fast.fused_steps == (one_token_steps if fused else 0)
    assert served.cache.blocks.n_free == served.cache.blocks.n_blocks


def test_the_fused_step_writes_the_paged_cache_as_the_readable_engine_does(long_context_model):
    if not cpu_kernels.available():
        pytest.skip(f"memwall's CPU kernels: {cpu_kernels.unavailable_reason()}")
    fast = accelerate(long_context_model)
    caches = []
    for model in (long_context_model, fast):
        scheduler = Scheduler(model, n_blocks=40, block_size=4, max_batch=4)
        scheduler.run([Request(i, list(range(1 + i, 9 + 3 * i)), 5) for i in range(3)])
        caches.append(scheduler.cache)
    assert fast.fused_steps > 0
    assert torch.allclose(caches[0].keys, caches[1].keys, atol=1e-5)
    assert torch.allclose(caches[0].values, caches[1].values, atol=1e-5)


def test_paged_steps_the_fused_step_cannot_take_fall_back(long_context_model):
    fast = accelerate(long_context_model)
    scheduler = Scheduler(fast, n_blocks=16, block_size=4)
    cache = scheduler.cache
    cache.add_sequence("a")
    positions, mask = cache.begin(["a"], 3)
    assert not fast.handles(torch.zeros(1, 3, dtype=torch.long), cache, positions, mask)
    cache.commit()
    positions, mask = cache.begin(["a"], 1)
    tokens = torch.zeros(1, 1, dtype=torch.long)
    # positions other than the ones begin() gave cannot be implied by the tables
    assert not fast.handles(tokens, cache, positions + 1, mask)
    assert fast.handles(tokens, cache, positions, mask) == cpu_kernels.available()
    with cpu_kernels.switched_off():
        assert "off" in fast.fallback_reason(cache)
        assert not fast.handles(tokens, cache, positions, mask)
