"""The CUDA backend's compiled path, run on the CPU under torch.compile: it must give the readable
engine's logits (close) and greedy tokens (identical), batched and quantized too; its int4 layout
conversion must reproduce memwall's dequantization; `accelerate` must pick the backend from the
weights' device; `bench batch` must make its tensors on the model's device; and the scheduler (the
server's engine) must run its decode steps compiled on its paged cache, with the readable tokens.

Compiling costs seconds per variant on a CPU, so one tiny model is compiled once per module and
the variants that need another compile use models of two layers."""

import pytest
import torch
import torch.nn.functional as F

from memwall import models
from memwall.engine import Transformer, decode_step, generate, prefill
from memwall.engine.accelerate import accelerate
from memwall.engine.batch import generate_batch
from memwall.engine.cuda import CompiledDecoder, StaticKVCache, compiled, padded_rows
from memwall.engine.cuda.int4 import TinyGemmInt4Linear, inner_k_tiles, tinygemm_uint8
from memwall.engine.cuda.paged import CompiledPagedCache, decode_paged
from memwall.engine.cuda.runner import RECOMPILE_LIMIT
from memwall.engine.cuda.step import forward_static
from memwall.engine.kv_cache import KVCache
from memwall.engine.paged_cache import PagedKVCache
from memwall.engine.quant import Int4Linear, dequantize_int4, pack_int4, quantize, quantize_int4
from memwall.engine.scheduler import Request, Scheduler
from memwall.specs import ModelSpec

PROMPT = [5, 17, 42, 5, 17, 99, 3, 5, 17, 61, 8]


def two_layer_engine(d_model=64, dtype=torch.float32, seed=3):
    """A smaller engine for the variants that need a compile of their own (int8, int4, bf16)."""
    spec = ModelSpec(
        name="two",
        n_layers=2,
        d_model=d_model,
        n_heads=4,
        n_kv_heads=2,
        head_dim=d_model // 4,
        d_ff=2 * d_model,
        vocab_size=256,
        tied_embeddings=True,
        max_context=128,
    )
    hf = models.random_init(spec, dtype=torch.float32, seed=seed)
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() == 2:
                p.mul_(8)  # sharp logits: greedy ties would otherwise flip on rounding
    return Transformer.from_hf(hf.to(dtype))


@pytest.fixture(scope="module")
def fast(tiny_engine):
    return compiled(tiny_engine)


def stepwise_logits(model, prompt, steps):
    """Prefill then `steps` greedy decode steps on `model`'s own cache: the logits of each."""
    cache = model.new_cache(batch=1, max_tokens=len(prompt) + steps + 1)
    with torch.inference_mode():
        logits = [prefill(model, torch.tensor([prompt]), cache)]
        for _ in range(steps):
            logits.append(decode_step(model, logits[-1].argmax(-1), cache))
    return torch.stack(logits), cache


def test_compiled_decode_matches_the_readable_engine(tiny_engine, fast):
    ours, cache = stepwise_logits(fast, PROMPT, 12)
    ref, _ = stepwise_logits(tiny_engine, PROMPT, 12)
    assert isinstance(cache, StaticKVCache) and fast.fallback_reason(cache) is None
    assert (ours - ref).abs().max() < 1e-4 * ref.abs().max()
    assert generate(fast, PROMPT, 30).tokens == generate(tiny_engine, PROMPT, 30).tokens
    # another prompt length: a cache of another capacity reuses the compiled step
    assert generate(fast, PROMPT[:4], 20).tokens == generate(tiny_engine, PROMPT[:4], 20).tokens


def test_compiled_batched_decode_pads_to_a_captured_size(tiny_engine, fast):
    prompts = [PROMPT, PROMPT[3:], [9, 4, 200]]  # ragged: left padding, positions and a mask
    out = generate_batch(fast, prompts, 10)
    assert padded_rows(3) == 4 and fast.new_cache(batch=3, max_tokens=8).rows == 4
    for prompt, tokens in zip(prompts, out.tokens):
        assert tokens == generate(tiny_engine, prompt, 10).tokens
    same_length = generate_batch(fast, [PROMPT[:5], PROMPT[2:7]], 8)  # no mask: plain steps
    assert same_length.tokens == generate_batch(tiny_engine, [PROMPT[:5], PROMPT[2:7]], 8).tokens


def test_speculative_verify_passes_run_on_the_static_cache(tiny_engine, fast):
    from memwall.engine.drafts import PromptLookupDraft
    from memwall.engine.speculative import speculative_generate

    plain = generate(tiny_engine, PROMPT, 24).tokens
    assert speculative_generate(fast, PromptLookupDraft(2), PROMPT, 24, k=3).tokens == plain


def test_a_pass_of_several_tokens_reads_only_the_slots_written(tiny_engine, fast, monkeypatch):
    # A prefill into a cache with room for far more tokens: attention must see the prompt's
    # slots, not the whole capacity (a [T, capacity] score matrix per head would be the cost).
    from memwall.engine.cuda import step

    slots_seen, attend_many = [], step.attend_many

    def spy(q, k, v, mask):
        slots_seen.append((q.shape[2], k.shape[2], mask.shape[-1]))
        return attend_many(q, k, v, mask)

    monkeypatch.setattr(step, "attend_many", spy)
    cache = fast.new_cache(batch=1, max_tokens=100)
    with torch.inference_mode():
        ours = prefill(fast, torch.tensor([PROMPT]), cache)
        ref = prefill(tiny_engine, torch.tensor([PROMPT]), tiny_engine.new_cache(1, 100))
    n = len(PROMPT)
    assert slots_seen == [(n, n, n)] * tiny_engine.n_layers
    assert (ours - ref).abs().max() < 1e-5 * ref.abs().max()
    assert cache.length == n and not cache.layer_keys[0][:, :, n:].any()  # written in place
    assert cache.layer_keys[0][:, :, :n].abs().sum() > 0


def test_other_caches_go_to_the_readable_model(tiny_engine, fast):
    cache = KVCache.for_model(tiny_engine, 1, 20)
    assert "new_cache()" in fast.fallback_reason(cache)
    tokens = torch.tensor([PROMPT])
    with torch.inference_mode():
        assert torch.equal(
            fast(tokens, cache), tiny_engine(tokens, KVCache.for_model(tiny_engine, 1, 20))
        )
        assert torch.equal(fast(tokens), tiny_engine(tokens))  # no cache at all
    assert fast.n_layers == tiny_engine.n_layers  # attributes pass through to the readable model


def test_a_dropped_caches_buffers_are_reused_zeroed_and_a_live_ones_never(fast):
    first = fast.new_cache(batch=3, max_tokens=16)
    address = first.layer_keys[0].data_ptr()
    first.layer_values[1].fill_(7.0)
    del first
    second = fast.new_cache(batch=3, max_tokens=16)  # a graph recorded on them replays as it is
    assert second.layer_keys[0].data_ptr() == address and second.layer_values[1].abs().sum() == 0
    third = fast.new_cache(batch=3, max_tokens=16)  # `second` is alive: buffers of its own
    assert {third.layer_keys[0].data_ptr(), third.layer_values[1].data_ptr()}.isdisjoint(
        {t.data_ptr() for t in (*second.layer_keys, *second.layer_values)}
    )
    assert third.nbytes == 2 * fast.n_layers * 3 * fast.n_kv_heads * 16 * fast.head_dim * 4


def test_a_step_the_compiler_cannot_build_runs_uncompiled_and_says_why(tiny_engine):
    class NoCompiler(torch._dynamo.exc.TorchDynamoException):
        pass

    def failing(*arguments):
        raise NoCompiler("no Triton here")

    fast = compiled(tiny_engine)
    fast._compiled = dict.fromkeys(fast._compiled, failing)  # a machine without a compiler
    with pytest.warns(RuntimeWarning, match="no Triton here"):
        tokens = generate(fast, PROMPT, 8).tokens
    assert tokens == generate(tiny_engine, PROMPT, 8).tokens
    assert "no Triton here" in fast.compile_failure


def test_a_step_past_the_recompile_limit_runs_uncompiled_and_says_why():
    # A long process (a notebook, a benchmark) compiles a variant per model, mask and batch
    # shape; past dynamo's limit a fullgraph compile raises instead of running eagerly.
    model = two_layer_engine()
    fast = CompiledDecoder(model, backend="eager")
    torch._dynamo.reset()
    with torch._dynamo.config.patch(**{RECOMPILE_LIMIT: 1}):
        assert generate(fast, PROMPT, 4).tokens == generate(model, PROMPT, 4).tokens  # compiled
        prompts = [PROMPT, PROMPT[4:]]  # ragged: a step with a mask, another variant
        with pytest.warns(RuntimeWarning, match="failed to build"):
            tokens = generate_batch(fast, prompts, 6).tokens
    assert tokens == generate_batch(model, prompts, 6).tokens
    assert fast.compile_failure is not None


def test_bad_calls_are_refused_clearly(fast):
    cache = fast.new_cache(batch=1, max_tokens=4)
    with torch.inference_mode(), pytest.raises(ValueError, match="KV cache is full"):
        fast(torch.tensor([PROMPT[:5]]), cache)
    with torch.inference_mode(), pytest.raises(ValueError, match="2 sequences"):
        fast(torch.tensor([[1], [2]]), cache)
    with pytest.raises(ValueError, match="Transformer"):
        compiled(torch.nn.Linear(4, 4))
    assert compiled(fast) is fast


def test_quantized_and_bf16_models_compile_and_match(tiny_engine):
    int8 = quantize(two_layer_engine(), "int8", inplace=True)
    int4 = quantize(two_layer_engine(seed=4), "int4", group_size=32, inplace=True)
    bf16 = two_layer_engine(dtype=torch.bfloat16, seed=5)
    # int8: the readable math, fused; int4: tinygemm rounds its rows and outputs to bf16 (where
    # the CPU has the kernel); bf16: every product is rounded, and fused kernels sum in another order
    for model, tolerance in ((int8, 1e-4), (int4, 2e-2), (bf16, 2e-2)):
        fast = compiled(model)
        ours, _ = stepwise_logits(fast, PROMPT, 6)
        ref, _ = stepwise_logits(model, PROMPT, 6)
        assert (ours.float() - ref.float()).abs().max() < tolerance * ref.float().abs().max()
        assert generate(fast, PROMPT, 12).tokens == generate(model, PROMPT, 12).tokens
    has_cpu_tinygemm = hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu")
    twins = [m for m in compiled(int4).modules() if isinstance(m, TinyGemmInt4Linear)]
    assert bool(twins) == has_cpu_tinygemm


def refusing_bf16(graph, inputs):
    """A compiler backend that refuses bf16 inputs as inductor does on a GPU without bf16."""
    from torch._dynamo.exc import SkipFrame

    if any(isinstance(t, torch.Tensor) and t.dtype == torch.bfloat16 for t in inputs):
        raise SkipFrame("BF16 is not supported")
    return graph.forward


def test_a_gpu_without_bf16_gets_no_bf16_graph_input(monkeypatch):
    # A T4 or V100: the compiler refuses a graph with a bf16 input there (and skips the step's
    # code for the rest of the process), as this backend does; the quantized layers' bf16
    # scales must reach it as fp32, and bf16 weights must not reach it at all.
    import memwall.engine.cuda as cuda_backend

    monkeypatch.setattr(cuda_backend, "native_half_dtype", lambda device: torch.float16)
    graphs = []

    def without_bf16(graph, inputs):
        graphs.append({t.dtype for t in inputs if isinstance(t, torch.Tensor)})
        return refusing_bf16(graph, inputs)

    int8 = quantize(two_layer_engine(seed=6), "int8", inplace=True)
    int4 = quantize(two_layer_engine(seed=7), "int4", group_size=32, inplace=True)
    for model in (int8, int4):  # int4: no tinygemm on such a GPU, the readable layers compiled
        fast = compiled(model, int4=False, compile_backend=without_bf16)
        assert not any(t.dtype == torch.bfloat16 for t in fast.model.buffers())
        assert any(t.dtype == torch.bfloat16 for t in model.buffers())  # the model's own kept
        ours, _ = stepwise_logits(fast, PROMPT, 6)
        ref, _ = stepwise_logits(model, PROMPT, 6)
        assert (ours - ref).abs().max() < 1e-4 * ref.abs().max()
        assert fast.compile_failure is None
    assert graphs and all(torch.bfloat16 not in dtypes for dtypes in graphs)  # none refused

    graphs.clear()
    bf16 = two_layer_engine(dtype=torch.bfloat16, seed=8)
    with pytest.warns(RuntimeWarning, match="load the model in fp16"):
        fast = compiled(bf16, compile_backend=without_bf16)
    assert generate(fast, PROMPT, 8).tokens == generate(bf16, PROMPT, 8).tokens
    assert not graphs and "fp16" in fast.compile_failure


# ---- int4: memwall's format against tinygemm's, with plain tensors -------------------------------


def test_tinygemm_is_left_to_torch_builds_that_have_it():
    from memwall.engine.cuda.int4 import cuda_build_reason

    assert "CUDA 12" in cuda_build_reason("11.8")
    assert cuda_build_reason("12.4") is None and cuda_build_reason("13.0") is None
    assert cuda_build_reason(None) is None  # ROCm's builds (and CPU-only ones) have no CUDA


def test_tinygemm_byte_order_is_memwalls_with_the_nibbles_swapped():
    codes = torch.randint(0, 16, (8, 64), dtype=torch.uint8)
    # tinygemm's CUDA converter (torch >= 2.5) wants the even index in the high nibble
    expected = (codes[:, ::2] << 4) | codes[:, 1::2]
    assert torch.equal(tinygemm_uint8(pack_int4(codes)), expected)
    assert inner_k_tiles(4096) == 8 and inner_k_tiles(96) == 2 and inner_k_tiles(40) is None


@pytest.mark.skipif(
    not hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu"), reason="no CPU int4 kernel"
)
@pytest.mark.parametrize("group_size", [32, 128])
def test_tinygemm_scale_and_zero_convention_is_memwalls(group_size):
    """w = (q - 8) * s + z with (s, z) as [in / group, out, 2]: the kernel, fed memwall's tensors
    unchanged, computes what memwall's dequantization says."""
    torch.manual_seed(0)
    weight = torch.randn(48, 256)
    layer = Int4Linear.from_weight(weight, group_size=group_size)
    x = torch.randn(3, 256).to(torch.bfloat16)
    twin = TinyGemmInt4Linear(layer)
    reference = F.linear(x.float(), dequantize_int4(*quantize_int4(weight, group_size), group_size))
    ours = twin(x).float()
    # the kernel's bf16 output rounds at about 2^-8 of each value's size
    assert (ours - reference).abs().max() < 2e-2 * reference.abs().max()
    # a wrong convention (no -8, or the scale and offset swapped) is far off
    scale, zero = layer.scale_zero.float().transpose(0, 1).unbind(-1)
    wrong = layer.codes().float().reshape(48, -1, group_size) * scale[..., None] + zero[..., None]
    assert (F.linear(x.float(), wrong.reshape(48, 256)) - reference).abs().max() > 0.5


# ---- the door, and the benchmark's devices -------------------------------------------------------


def test_accelerate_picks_the_backend_from_the_weights_device(tiny_engine):
    from memwall.engine.cpu.fast_decode import FastDecoder

    assert isinstance(accelerate(tiny_engine), FastDecoder)  # weights on the CPU
    assert isinstance(accelerate(tiny_engine, backend="compiled"), CompiledDecoder)
    with pytest.raises(ValueError, match="auto, cpu, compiled"):
        accelerate(tiny_engine, backend="gpu")
    meta = torch.nn.Module()
    meta.blocks = torch.nn.ModuleList([torch.nn.Linear(2, 2, device="meta")])
    with pytest.raises(ValueError, match="cpu or cuda, not meta"):
        accelerate(meta)
    with pytest.raises(ValueError, match="whole model"):
        accelerate(torch.nn.Linear(2, 2), backend="compiled")


def test_bench_batch_makes_every_tensor_on_the_models_device(tiny_engine, fast, monkeypatch):
    from memwall.bench import batch as bench_batch

    made_on = []
    real = bench_batch.cache_with_context

    def recording(model, batch, context, max_tokens, generator):
        made_on.append(generator.device)
        return real(model, batch, context, max_tokens, generator)

    monkeypatch.setattr(bench_batch, "cache_with_context", recording)
    for model in (tiny_engine, fast):
        assert bench_batch.time_decode_steps(model, 2, context=5, new_tokens=3)["step_s"] > 0
    assert made_on == [bench_batch.model_device(tiny_engine)] * 2
    generator = torch.Generator().manual_seed(0)
    # the random context lands in the static cache's per-layer buffers, not in a copy
    cache = real(fast, 2, 5, 9, generator)
    assert cache.length == 5 and cache.layer_keys[1][:2, :, :5].abs().sum() > 0
    assert cache.layer_values[0][:, :, 5:].abs().sum() == 0


def test_a_dropped_caches_buffers_are_reused_in_and_out_of_inference_mode(tiny_engine, fast):
    # buffers made under inference mode (as `bench batch` makes its caches) are inference
    # tensors: zeroing them for reuse outside it must not fail
    with torch.inference_mode():
        first = fast.new_cache(batch=1, max_tokens=9)
        first.layer_keys[0].fill_(1.0)  # what a request left behind
    assert first.layer_keys[0].is_inference()  # new buffers, not another test's left in the pool
    addresses = [t.data_ptr() for t in first.layer_keys]
    del first
    again = fast.new_cache(batch=1, max_tokens=9)
    assert [t.data_ptr() for t in again.layer_keys] == addresses
    assert all(not t.any() for t in (*again.layer_keys, *again.layer_values))


def test_the_variable_makes_accelerate_take_the_compiled_path(tiny_engine, monkeypatch):
    monkeypatch.setenv("MEMWALL_ACCELERATE", "compiled")
    assert isinstance(accelerate(tiny_engine), CompiledDecoder)
    monkeypatch.setenv("MEMWALL_ACCELERATE", "gpu")
    with pytest.raises(ValueError, match="MEMWALL_ACCELERATE='gpu' is not a backend"):
        accelerate(tiny_engine)


def test_bench_speculative_fast_runs_the_compiled_target(tiny_engine, monkeypatch):
    from memwall.bench.speculative import bench_speculative

    monkeypatch.setenv("MEMWALL_ACCELERATE", "compiled")
    result = bench_speculative(tiny_engine, "lookup:2", k=3, new_tokens=12, repeats=1,
                               warmup=0, progress=False, fast=True)  # fmt: skip
    assert result["fast"] and result["fallback"] is None
    assert result["identical_to_plain"]


def scheduler_stream():
    """Ragged prompts arriving over time, enough of them for joins, retirements and a preemption
    on a small cache: every decode step has another batch size or table width."""
    g = torch.Generator().manual_seed(1)
    stream = []
    for i in range(9):
        prompt = torch.randint(0, 256, (int(torch.randint(1, 40, (1,), generator=g)),), generator=g)
        new = int(torch.randint(2, 30, (1,), generator=g))
        stream.append(Request(i, prompt.tolist(), new, arrival_step=2 * i))
    return stream


def test_the_schedulers_decode_steps_run_compiled_on_its_paged_cache(tiny_engine, fast):
    readable = Scheduler(tiny_engine, n_blocks=20, block_size=8, max_batch=5)
    expected = [r.tokens for r in readable.run(scheduler_stream())]
    scheduler = Scheduler(fast, n_blocks=20, block_size=8, max_batch=5)
    cache = scheduler.cache
    assert isinstance(cache, CompiledPagedCache) and fast.fallback_reason(cache) is None
    compiled_steps, step = [], fast._compiled[decode_paged]
    fast._compiled[decode_paged] = lambda *a: compiled_steps.append(a[1].shape[0]) or step(*a)
    try:
        results = scheduler.run(scheduler_stream())
    finally:
        fast._compiled[decode_paged] = step
    assert [r.tokens for r in results] == expected
    assert scheduler.preemptions == readable.preemptions > 0  # a preempted request came back
    # every decode step ran compiled, its batch padded to a captured size
    assert compiled_steps == [padded_rows(b) for b in scheduler.batch_sizes]
    assert set(scheduler.batch_sizes) >= {1, 3}  # a padded batch among them
    # The blocks hold the readable run's keys and values: the padded rows wrote only the scratch
    # block, past the ones handed out.
    for layer in range(tiny_engine.n_layers):
        for ours, theirs in (
            (cache.keys, readable.cache.keys),
            (cache.values, readable.cache.values),
        ):
            torch.testing.assert_close(ours[layer][:-1], theirs[layer], rtol=1e-4, atol=1e-4)
    assert cache.nbytes == readable.cache.nbytes


def test_the_compiled_paged_step_gives_the_readable_logits(tiny_engine, fast):
    prompts = {"a": PROMPT, "b": PROMPT[2:9], "c": [7, 3, 250]}
    logits = []
    for model in (tiny_engine, fast):
        cache = (
            model.new_paged_cache(12, 4) if model is fast else PagedKVCache.for_model(model, 12, 4)
        )
        with torch.inference_mode():
            for name, prompt in prompts.items():
                cache.add_sequence(name)
                positions, mask = cache.begin([name], len(prompt))
                model(torch.tensor([prompt]), cache, positions=positions, mask=mask)
            steps = []
            for token in (11, 12, 13):
                positions, mask = cache.begin(list(prompts), 1)
                tokens = torch.full((len(prompts), 1), token)
                steps.append(model(tokens, cache, positions=positions, mask=mask))
        logits.append(torch.cat(steps))
    torch.testing.assert_close(
        logits[1], logits[0], rtol=1e-4, atol=1e-4 * logits[0].abs().max().item()
    )
    plain = PagedKVCache.for_model(tiny_engine, 4, 4)
    assert "new_paged_cache()" in fast.fallback_reason(plain)


def test_caches_at_new_addresses_reuse_the_compiled_steps():
    # A graph is recorded again on a new cache, which is cheap; compiling again is not (seconds on
    # a CPU, a minute for a large model on a GPU), and a few dozen caches would exhaust dynamo's
    # recompile limit.
    compiles = []
    fast = CompiledDecoder(two_layer_engine(), backend=lambda graph, inputs: compiles.append(1)
                           or graph.forward)  # fmt: skip
    for prompt in (PROMPT, PROMPT[:4], PROMPT[5:]):  # three static caches, three lengths
        generate(fast, prompt, 4)
    assert len(compiles) == 1
    schedulers = []  # kept alive, so that every cache lies at new addresses
    for batch in (1, 2, 3):
        schedulers.append(Scheduler(fast, n_blocks=8 + batch, block_size=4, max_batch=batch))
        schedulers[-1].run([Request(i, PROMPT[:3], 6) for i in range(batch)])
    assert len(compiles) == 1 + 2  # the paged step: one row apart (specialised), then the rest


def graph_facts(step, *arguments):
    """`step(*arguments)` traced by the compiler as `torch.compile` would trace it, with a
    backend that only records what CUDA graph trees check before they record a graph (they skip
    the graph, and the step runs launch by launch, when it writes an input that is not static or
    holds a tensor on another device): -> (the inputs it writes, the inputs marked static, the
    devices of every value in the graph)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    facts = {}

    def record(graph, example_inputs):
        meta = torch._guards.TracingContext.get().fw_metadata
        facts["written"] = {i for i, info in enumerate(meta.input_info) if info.mutates_data}
        facts["static"] = set(meta.static_input_indices)
        facts["devices"] = {
            node.meta["val"].device
            for node in graph.graph.nodes
            if isinstance(node.meta.get("val"), torch.Tensor)
        }
        return make_boxed_func(graph.forward)

    torch._dynamo.reset()  # the same step compiled elsewhere in this process is traced afresh
    with torch.inference_mode():
        torch.compile(step, backend=aot_autograd(fw_compiler=record), fullgraph=True)(*arguments)
    return facts["written"], facts["static"], facts["devices"]


@pytest.mark.parametrize("weights", ["fp32", "bf16", "int8"])
def test_the_compiled_steps_meet_the_conditions_of_cuda_graphs(weights):
    # On the meta device (shapes, no data) a tensor made without the model's device shows up as
    # a CPU tensor, which would make the GPU skip the graph.
    meta = torch.device("meta")
    model = two_layer_engine(dtype=torch.bfloat16 if weights == "bf16" else torch.float32)
    model = (quantize(model, weights) if weights == "int8" else model).to(meta)
    tokens = torch.zeros(2, 1, dtype=torch.long, device=meta)
    positions = torch.zeros(2, dtype=torch.long, device=meta)
    static = StaticKVCache(2, 2, 16, 2, 16, torch.float32, meta)
    slots = torch.arange(16, device=meta)[5:6]
    paged = CompiledPagedCache.for_model(model, 8, 4)
    tables = torch.zeros(2, 2, dtype=torch.long, device=meta)
    static_step = (tokens, None, slots, static.layer_keys, static.layer_values, None, False)
    paged_step = (tokens, positions, tables, paged.keys, paged.values)
    for step, arguments in ((forward_static, static_step), (decode_paged, paged_step)):
        written, marked_static, devices = graph_facts(step, model, *arguments)
        assert len(written) == 2 * model.n_layers  # each layer's keys and values, in place
        assert written <= marked_static, f"{step.__name__} writes inputs a graph cannot keep"
        assert devices == {meta}, f"{step.__name__} makes tensors on {devices - {meta}}"
