"""memwall's engine against the transformers reference: logits, greedy tokens, cache, sampling."""

import contextlib
import inspect

import pytest
import torch

from memwall.engine import (
    KVCache,
    Sampling,
    decode_step,
    generate,
    prefill,
    probabilities,
)
from memwall.engine.sampling import sample

TOLERANCE = 1e-4  # max abs difference of fp32 logits


def hf_step(hf, tokens, cache):
    """One transformers forward that extends `cache` (its keyword changed name across versions)."""
    key = "cache" if "cache" in inspect.signature(hf.forward).parameters else "past_key_values"
    return hf(tokens, use_cache=True, **{key: cache}).logits[:, -1]


def assert_logits_match(hf, engine, prompt, steps=16):
    from transformers import DynamicCache

    ref_cache, cache = DynamicCache(), engine.new_cache(max_tokens=prompt.shape[1] + steps + 1)
    with torch.inference_mode():
        ours = prefill(engine, prompt, cache)
        ref = hf_step(hf, prompt, ref_cache)
        worst = (ours - ref).abs().max().item()
        for _ in range(steps):
            token = ref.argmax(-1)
            ours, ref = decode_step(engine, token, cache), hf_step(hf, token[:, None], ref_cache)
            worst = max(worst, (ours - ref).abs().max().item())
    assert worst < TOLERANCE, f"max |logit difference| {worst:.2e} over prefill + {steps} steps"
    return worst


def hf_greedy(hf, prompt, new_tokens):
    """transformers' greedy generate, never stopping early (no end-of-sequence token)."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    # An explicit mask: otherwise a prompt token equal to pad_token_id would be masked out.
    out = hf.generate(prompt, attention_mask=torch.ones_like(prompt), generation_config=config)
    return out[0, prompt.shape[1] :].tolist()


def test_tiny_logits_match_transformers(tiny_hf, tiny_engine):
    prompt = torch.randint(0, 256, (1, 11), generator=torch.Generator().manual_seed(1))
    assert_logits_match(tiny_hf, tiny_engine, prompt)


def test_tiny_full_sequence_logits_match(tiny_hf, tiny_engine):
    tokens = torch.randint(0, 256, (2, 17), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert (tiny_engine(tokens) - tiny_hf(tokens).logits).abs().max() < TOLERANCE


def test_tiny_greedy_tokens_match_generate(tiny_hf, tiny_engine):
    prompt = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(3))
    assert generate(tiny_engine, prompt[0], 64).tokens == hf_greedy(tiny_hf, prompt, 64)


@pytest.mark.slow
def test_smollm2_logits_match_transformers(smollm2, smollm2_engine):
    hf, tokenizer = smollm2
    prompt = tokenizer("The memory wall is the gap between", return_tensors="pt").input_ids
    assert_logits_match(hf, smollm2_engine, prompt, steps=16)


@pytest.mark.slow
def test_smollm2_64_greedy_tokens_match_generate(smollm2, smollm2_engine):
    hf, tokenizer = smollm2
    prompt = tokenizer(
        "Once upon a time, in a small village by the sea,", return_tensors="pt"
    ).input_ids
    assert generate(smollm2_engine, prompt[0], 64).tokens == hf_greedy(hf, prompt, 64)


def test_cache_size_matches_formula(tiny_engine):
    cache = tiny_engine.new_cache(batch=2, max_tokens=50)
    per_token = 2 * 3 * 2 * 16 * 4  # 2 (K and V) x layers x kv_heads x head_dim x fp32 bytes
    assert cache.nbytes == per_token * 2 * 50


def test_cache_overflow_and_rollback_errors_are_clear(tiny_engine):
    cache = tiny_engine.new_cache(max_tokens=4)
    with torch.inference_mode(), pytest.raises(ValueError, match="KV cache is full"):
        tiny_engine(torch.zeros(1, 5, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="roll back"):
        cache.rollback(3)
    with pytest.raises(ValueError):
        KVCache(1, 1, 0, 1, 1)


def test_rollback_then_redo_gives_same_logits(tiny_engine):
    cache = tiny_engine.new_cache(max_tokens=32)
    prompt = torch.arange(10)[None]
    with torch.inference_mode():
        prefill(tiny_engine, prompt, cache)
        first = decode_step(tiny_engine, torch.tensor([5]), cache)
        decode_step(tiny_engine, torch.tensor([6]), cache)
        cache.rollback(10)
        again = decode_step(tiny_engine, torch.tensor([5]), cache)
    assert torch.equal(first, again)


def test_generate_rejects_bad_input(tiny_engine):
    with pytest.raises(ValueError, match="empty"):
        generate(tiny_engine, [], 4)
    with pytest.raises(ValueError, match="max_new_tokens"):
        generate(tiny_engine, [1, 2], 0)
    with pytest.raises(ValueError, match="context"):
        generate(tiny_engine, [1, 2], 1000)


def test_seeded_sampling_is_reproducible(tiny_engine):
    sampling = Sampling(temperature=0.8, top_p=0.9, seed=123)
    a = generate(tiny_engine, [1, 2, 3], 20, sampling).tokens
    b = generate(tiny_engine, [1, 2, 3], 20, sampling).tokens
    assert a == b


def test_top_p_keeps_smallest_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    probs = probabilities(logits, Sampling(temperature=1.0, top_p=0.7))
    assert torch.allclose(probs, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))
    with pytest.raises(ValueError):
        Sampling(top_p=0)


@pytest.mark.parametrize("temperature", [1e-300, 1e-40, 1e-30, 1e-6])
def test_a_tiny_temperature_is_a_distribution_or_greedy_never_nan(temperature):
    logits = torch.tensor([[3.0, 1.0, -2.0, 3.0 - 1e-3]])
    sampling = Sampling(temperature=temperature)
    if not sampling.greedy:
        probs = probabilities(logits, sampling)
        assert torch.isfinite(probs).all() and probs[0, 0] == 1
    assert sample(logits, sampling).item() == 0


@pytest.mark.parametrize(
    "options",
    [dict(temperature=float("nan")), dict(temperature=float("inf")), dict(seed=2**64)],
)
def test_sampling_refuses_values_it_cannot_use(options):
    with pytest.raises(ValueError):
        Sampling(**options)


def test_the_readable_linear_is_f_linear():
    from memwall.engine.linear import Linear

    weight, bias = torch.randn(48, 32), torch.randn(48)
    layer = Linear(32, 48, bias=True).set_weight(weight, bias)
    x = torch.randn(3, 5, 32)
    assert torch.equal(layer(x), torch.nn.functional.linear(x, weight, bias))
    with pytest.raises(ValueError, match=r"\(48, 32\)"):
        layer.set_weight(torch.randn(32, 48))


@pytest.mark.parametrize("c_kernel", [False, True], ids=["bmm row split", "memwall C kernel"])
def test_the_cpu_twin_of_linear_matches_f_linear(c_kernel):
    from memwall.engine.cpu import kernels as cpu_kernels
    from memwall.engine.cpu.linears import CpuLinear
    from memwall.engine.linear import Linear

    if c_kernel and not cpu_kernels.available():
        pytest.skip(f"memwall's CPU kernels: {cpu_kernels.unavailable_reason()}")
    weight, bias = torch.randn(48, 32), torch.randn(48)
    layer = Linear(32, 48, bias=True).set_weight(weight, bias)
    split, plain = CpuLinear(layer, splits=4), CpuLinear(layer, splits=1)
    assert split.splits == 4 and plain.splits == 1
    assert split.weight is layer.weight  # a twin shares the readable layer's tensors
    with contextlib.nullcontext() if c_kernel else cpu_kernels.switched_off():
        for shape in [(1, 1, 32), (3, 5, 32), (300, 32)]:  # decode, small batch, prefill
            x = torch.randn(shape)
            expected = torch.nn.functional.linear(x, weight, bias)
            assert split(x).shape == expected.shape
            assert torch.allclose(split(x), expected, atol=1e-5)
            assert torch.allclose(plain(x), expected, atol=1e-5)
    assert CpuLinear(Linear(32, 45), splits=4).splits == 1  # outputs that do not divide: no split


def test_c_kernel_gives_each_row_the_same_bits_alone_or_batched():
    """Batched decode must not change a sequence's output: each row's sums are computed the same
    way whatever the other rows and the thread count."""
    from memwall.engine.cpu import kernels as cpu_kernels

    if not cpu_kernels.available():
        pytest.skip(f"memwall's CPU kernels: {cpu_kernels.unavailable_reason()}")
    weight = torch.randn(40, 64, generator=torch.Generator().manual_seed(0))
    rows = torch.randn(7, 64, generator=torch.Generator().manual_seed(1))
    batched = cpu_kernels.fp32_linear(rows, weight)
    assert torch.allclose(batched, rows @ weight.t(), atol=1e-5)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for i in range(len(rows)):
            assert torch.equal(cpu_kernels.fp32_linear(rows[i : i + 1], weight)[0], batched[i])
    finally:
        torch.set_num_threads(threads)


# ---- the fast batch-1 decode path (engine/cpu/fast_decode.py) against the readable engine ----------


def fast_or_skip(engine):
    from memwall.engine.cpu import kernels as cpu_kernels
    from memwall.engine.cpu.fast_decode import accelerate

    if not cpu_kernels.available():
        pytest.skip(f"memwall's CPU kernels: {cpu_kernels.unavailable_reason()}")
    return accelerate(engine)


@pytest.mark.parametrize("scheme", ["fp32", "int8", "int4"])
def test_fast_decode_matches_the_readable_engine(tiny_engine, scheme, monkeypatch):
    from memwall.engine.quant import quantize

    # fp32 activations on both sides (PyTorch's packed kernels would round them to bf16, where a
    # last-bit difference from the fused norm can flip a rounding).
    monkeypatch.setenv("MEMWALL_KERNEL_PATH", "fixed")

    model = tiny_engine if scheme == "fp32" else quantize(tiny_engine, scheme, inplace=False)
    fast = fast_or_skip(model)
    prompt = torch.randint(0, 256, (1, 9), generator=torch.Generator().manual_seed(4))
    readable_cache, fast_cache = model.new_cache(max_tokens=40), model.new_cache(max_tokens=40)
    with torch.inference_mode():
        ours, reference = prefill(fast, prompt, fast_cache), prefill(model, prompt, readable_cache)
        for _ in range(24):
            token = reference.argmax(-1)
            ours, reference = (
                decode_step(fast, token, fast_cache),
                decode_step(model, token, readable_cache),
            )
            assert (ours - reference).abs().max() <= 1e-5 * reference.abs().max()
    assert fast_cache.length == readable_cache.length
    assert torch.allclose(fast_cache.keys, readable_cache.keys, atol=1e-5)
    assert generate(fast, prompt[0], 32).tokens == generate(model, prompt[0], 32).tokens


@pytest.mark.parametrize("scheme", ["fp32", "int8", "int4"])
def test_fast_batched_steps_give_each_row_the_bits_it_gets_alone(tiny_engine, scheme, monkeypatch):
    from memwall.engine.quant import quantize

    monkeypatch.setenv("MEMWALL_KERNEL_PATH", "fixed")  # one kernel path for 1 and 3 rows
    model = tiny_engine if scheme == "fp32" else quantize(tiny_engine, scheme, inplace=False)
    fast = fast_or_skip(model)
    prompts = torch.randint(0, 256, (3, 7), generator=torch.Generator().manual_seed(6))
    batched, readable = (model.new_cache(batch=3, max_tokens=20) for _ in range(2))
    alone = [model.new_cache(max_tokens=20) for _ in range(3)]
    with torch.inference_mode():
        tokens = prefill(model, prompts, readable).argmax(-1)
        for row, cache in enumerate(alone):  # the same cached bits in both layouts
            prefill(model, prompts[row : row + 1], cache)
            batched.keys[:, row], batched.values[:, row] = cache.keys[:, 0], cache.values[:, 0]
        batched.length = prompts.shape[1]
        for _ in range(10):
            logits = decode_step(fast, tokens, batched)
            reference = decode_step(model, tokens, readable)
            for row, cache in enumerate(alone):
                assert torch.equal(logits[row], decode_step(fast, tokens[row : row + 1], cache)[0])
            assert (logits - reference).abs().max() <= 1e-5 * reference.abs().max()
            tokens = logits.argmax(-1)


def assert_fast_steps_match(fast, model, seed: int, steps: int = 3, rows: int = 2):
    """`rows` sequences decoded `steps` times on the fast path and on the readable model, logits
    compared each step; returns the next tokens and the fast path's cache."""
    tokens = torch.randint(0, 256, (rows, 1), generator=torch.Generator().manual_seed(seed))
    fast_cache, readable_cache = (model.new_cache(batch=rows, max_tokens=8) for _ in range(2))
    with torch.inference_mode():
        for _ in range(steps):
            ours, reference = fast(tokens, fast_cache), model(tokens, readable_cache)
            assert (ours - reference).abs().max() <= 1e-5 * reference.abs().max()
            tokens = reference[:, -1:].argmax(-1)
    return tokens, fast_cache


def tiny_random_hf(seed=9, **changes):
    """A tiny random transformers model; `changes` override fields of its ModelSpec."""
    from memwall import models
    from memwall.specs import ModelSpec

    shape = dict(n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, head_dim=16, d_ff=160)
    shape |= dict(vocab_size=256, tied_embeddings=True, max_context=256) | changes
    return models.random_init(ModelSpec(name="tiny", **shape), dtype=torch.float32, seed=seed)


def tiny_qwen_style():
    """Biases on q, k and v (Qwen2's attention)."""
    return tiny_random_hf(qkv_bias=True)


def test_fast_decode_adds_the_qkv_bias_of_qwen_style_models(monkeypatch):
    from memwall.engine import Transformer

    monkeypatch.setenv("MEMWALL_KERNEL_PATH", "fixed")  # the C kernels, then the bias in C
    hf = tiny_qwen_style()
    assert hf.model.layers[0].self_attn.q_proj.bias.abs().max() > 0  # a dropped bias would show
    assert hf.model.layers[0].self_attn.o_proj.bias is None
    model = Transformer.from_hf(hf)
    assert model.blocks[0].attn.qkv.bias is not None
    tokens = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert (model(tokens) - hf(tokens).logits).abs().max() < TOLERANCE
    fast = fast_or_skip(model)
    assert_fast_steps_match(fast, model, seed=3)


def test_fast_decode_on_the_packed_path_follows_changes_to_the_weights(tiny_engine, monkeypatch):
    """The "packed" path reads a packed copy of the weights: a change made in place after the
    step's buffers were bound must reach it, as it reaches the readable model."""
    import copy

    monkeypatch.setenv("MEMWALL_KERNEL_PATH", "fp32:packed")
    model = copy.deepcopy(tiny_engine)
    fast = fast_or_skip(model)
    assert_fast_steps_match(fast, model, seed=7, rows=6)  # the path is offered for 5-64 rows
    assert {matmul.path for matmul in fast._plans[6].matmuls} == {"packed"}
    with torch.no_grad():
        model.blocks[0].mlp.down.weight.mul_(1.5)
    assert_fast_steps_match(fast, model, seed=8, rows=6)


def test_fast_decode_makes_no_packed_copy_that_the_memory_budget_cannot_hold(
    tiny_engine, monkeypatch
):
    """A packed copy is a second copy of the model's weights: where the whole copy does not fit
    the memory budget (a 1-2 GB container), no layer is offered the "packed" path, pinned or not."""
    import copy

    from memwall.engine.cpu import kernels, linears
    from memwall.engine.linear import Linear

    monkeypatch.setenv("MEMWALL_KERNEL_PATH", "fp32:packed")
    model = copy.deepcopy(tiny_engine)
    monkeypatch.setattr(linears, "buffer_budget_bytes", lambda: 4096)  # far below the model
    fast = fast_or_skip(model)
    assert_fast_steps_match(fast, model, seed=7, rows=6)
    assert not {matmul.path for matmul in fast._plans[6].matmuls} & {"packed"}
    assert not any(
        id(m.weight) in kernels._panels for m in model.modules() if isinstance(m, Linear)
    )


def test_fast_decode_runs_the_pinned_w8a8_path_as_the_readable_engine_does(
    tiny_engine, monkeypatch
):
    from memwall.engine.quant import quantize

    model = quantize(tiny_engine, "int8", inplace=False)
    tokens = torch.randint(0, 256, (2, 1), generator=torch.Generator().manual_seed(4))
    logits = {}
    for pin in ("int8:c", "int8:w8a8"):
        monkeypatch.setenv("MEMWALL_KERNEL_PATH", pin)
        fast = fast_or_skip(model)
        # w8a8 is approximate: the fused step runs it as its twins do through the readable code
        assert_fast_steps_match(fast, fast.model, seed=5)
        with torch.inference_mode():
            logits[pin] = fast(tokens, model.new_cache(batch=2, max_tokens=4))
    # the activations rounded to int8 move the logits, a little
    difference = (logits["int8:w8a8"] - logits["int8:c"]).abs().max()
    assert 0 < difference <= 0.05 * logits["int8:c"].abs().max()


def test_fast_decode_attends_across_chunks_of_a_long_cache():
    # 530 cached tokens: the C attention cuts them into chunks of 256 and merges the chunks'
    # softmaxes; 6 query heads on 2 key/value heads, as groups of 3 (SmolLM2's grouping).
    from memwall.bench.batch import cache_with_context
    from memwall.engine import Transformer

    model = Transformer.from_hf(tiny_random_hf(d_model=96, n_heads=6, max_context=640))
    fast = fast_or_skip(model)
    ours, reference = (
        cache_with_context(model, 2, 530, 600, torch.Generator().manual_seed(4)) for _ in range(2)
    )
    tokens = torch.randint(0, 256, (2, 1), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        for _ in range(2):
            got, expected = fast(tokens, ours), model(tokens, reference)
            assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()
            tokens = expected[:, -1:].argmax(-1)


def test_from_hf_refuses_biases_the_engine_has_no_place_for():
    # transformers' Llama with attention_bias=True also biases o_proj; dropping it would change
    # every logit without a word.
    from memwall.engine import Transformer

    hf = tiny_qwen_style()
    o_proj = hf.model.layers[1].self_attn.o_proj
    o_proj.bias = torch.nn.Parameter(torch.zeros(o_proj.out_features))
    with pytest.raises(ValueError, match="o_proj"):
        Transformer.from_hf(hf)


def test_fast_decode_calls_back_for_a_matmul_on_pytorchs_path(tiny_engine, monkeypatch):
    # Every matmul pinned to F.linear: the C loop over the layers runs each one through the
    # Python callback, and gets the readable engine's logits.
    monkeypatch.setenv("MEMWALL_KERNEL_PATH", "fp32:linear")
    fast = fast_or_skip(tiny_engine)
    tokens, cache = assert_fast_steps_match(fast, tiny_engine, seed=8)

    # An error inside the callback is raised from the step, not lost in C.
    def broken(path, x):
        raise RuntimeError("this layer is broken")

    monkeypatch.setattr(fast.model.blocks[1].mlp.down, "run", broken)
    with pytest.raises(RuntimeError, match="this layer is broken"), torch.inference_mode():
        fast(tokens, cache)


def test_a_dropped_fast_model_frees_its_weights_without_the_cyclic_gc(tiny_hf):
    # Chapter 7 drops each format's model before the next; a reference cycle through the C
    # callback kept them all alive until a garbage collection and pushed it over Binder's memory.
    import gc
    import weakref

    from memwall.engine import Transformer

    model = Transformer.from_hf(tiny_hf)
    fast = fast_or_skip(model)
    layer = weakref.ref(model.blocks[0].mlp.down)
    cache = model.new_cache(max_tokens=8)
    gc.disable()
    try:
        with torch.inference_mode():
            fast(torch.zeros(1, 1, dtype=torch.long), cache)
        del fast, model, cache
        assert layer() is None
    finally:
        gc.enable()


def test_fast_decode_leaves_other_steps_to_the_readable_engine(tiny_engine):
    from memwall.engine.cpu import kernels as cpu_kernels

    fast = fast_or_skip(tiny_engine)
    tokens = torch.randint(0, 256, (2, 1), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        prompts = torch.cat([tokens, tokens], dim=1)  # two tokens a sequence: a prefill
        # the twins' kernels sum in another order than F.linear: equal up to rounding
        batch = fast(prompts, tiny_engine.new_cache(batch=2, max_tokens=8))
        reference = tiny_engine(prompts, tiny_engine.new_cache(batch=2, max_tokens=8))
        assert (batch - reference).abs().max() <= 1e-5 * reference.abs().max()
        with cpu_kernels.switched_off():
            one = fast(tokens[:1], tiny_engine.new_cache(max_tokens=8))
            reference = tiny_engine(tokens[:1], tiny_engine.new_cache(max_tokens=8))
            assert (one - reference).abs().max() <= 1e-5 * reference.abs().max()
    full = tiny_engine.new_cache(max_tokens=1)
    with pytest.raises(ValueError, match="full"), torch.inference_mode():
        fast(tokens[:1], full)
        fast(tokens[:1], full)
    assert fast.n_layers == tiny_engine.n_layers  # the wrapper answers for the model


@pytest.mark.slow
def test_smollm2_fast_decode_logits_and_tokens_match_transformers(smollm2, smollm2_engine):
    hf, tokenizer = smollm2
    fast = fast_or_skip(smollm2_engine)
    prompt = tokenizer("The memory wall is the gap between", return_tensors="pt").input_ids
    assert_logits_match(hf, fast, prompt, steps=16)
    prompt = tokenizer(
        "Once upon a time, in a small village by the sea,", return_tensors="pt"
    ).input_ids
    assert generate(fast, prompt[0], 64).tokens == generate(smollm2_engine, prompt[0], 64).tokens


def test_bench_decode_times_the_fast_path_beside_the_readable_one(tiny_hf):
    from memwall.bench import bench_decode

    kwargs = dict(
        prompt_tokens=4, new_tokens=3, repeats=1, warmup=0, bandwidth=1e10, progress=False
    )
    both = bench_decode(tiny_hf, "memwall", quant="none,int8", fast="both", **kwargs)
    assert list(both["tok_per_s_over_first"]) == [
        "memwall",
        "memwall-fast",
        "memwall-int8",
        "memwall-int8-fast",
    ]
    assert both["memwall-fast"]["weight_bytes"] == both["memwall"]["weight_bytes"]
    with pytest.raises(ValueError, match="off, on, both"):
        bench_decode(tiny_hf, "memwall", fast="yes", **kwargs)


def test_the_fast_path_says_why_it_falls_back(tiny_engine):
    # Chapters 3 and 4 print this reason instead of comparing two runs of the same code.
    from memwall.engine.cpu import kernels as cpu_kernels

    fast = fast_or_skip(tiny_engine)
    assert fast.fallback_reason(tiny_engine.new_cache(max_tokens=8)) is None
    assert "fp32" in fast.fallback_reason(tiny_engine.new_cache(max_tokens=8, dtype=torch.bfloat16))
    with cpu_kernels.switched_off():
        assert "switched off" in fast.fallback_reason(tiny_engine.new_cache(max_tokens=8))
