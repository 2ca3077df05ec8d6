"""Weight-only int8/int4 linears: packing round trips, kernels against the reference path, bytes."""

import os
import shutil

import pytest
import torch

from memwall import cost, quality
from memwall.engine import Transformer
from memwall.engine.cpu import kernels as cpu_kernels
from memwall.engine.cpu.linears import cpu_int4_block, from_cpu_kernel_layout, twin_of
from memwall.engine.linear import Linear
from memwall.engine.quant import (
    Int4Linear,
    Int8Linear,
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    quantize,
    quantize_int4,
    quantize_int8,
    unpack_int4,
)


def state_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


@pytest.mark.parametrize("shape", [(2,), (3, 8), (5, 7, 64)])
def test_int4_pack_unpack_is_exact(shape):
    codes = torch.randint(
        0, 16, shape, generator=torch.Generator().manual_seed(0), dtype=torch.uint8
    )
    packed = pack_int4(codes)
    assert (
        packed.dtype == torch.uint8 and packed.shape[-1] == shape[-1] // 2
    )  # half a byte per code
    assert torch.equal(unpack_int4(packed), codes)


def test_pack_int4_puts_even_index_in_low_nibble():
    assert pack_int4(torch.tensor([0x3, 0xA], dtype=torch.uint8)).item() == 0xA3
    with pytest.raises(ValueError, match="even"):
        pack_int4(torch.zeros(3, dtype=torch.uint8))


def test_int8_round_trip_error_is_at_most_half_a_step():
    weight = torch.randn(64, 96, generator=torch.Generator().manual_seed(1)) * 3
    codes, scales = quantize_int8(weight)
    assert codes.dtype == torch.int8 and codes.abs().max() <= 127 and scales.shape == (64,)
    error = (dequantize_int8(codes, scales) - weight).abs()
    assert (error <= scales.float()[:, None] / 2 * (1 + 1e-5)).all()


def test_int8_codes_are_rounded_a_slab_at_a_time_as_they_would_be_whole(monkeypatch):
    from memwall.engine import quant

    weight = torch.randn(50, 64, generator=torch.Generator().manual_seed(6))
    whole = quantize_int8(weight)
    monkeypatch.setattr(quant, "SLAB_ROWS", 16)  # 16, 16, 16 and 2 rows
    slabbed = quantize_int8(weight)
    assert all(torch.equal(a, b) for a, b in zip(whole, slabbed))
    scales = (weight.abs().amax(dim=1) / 127 * (1 + 2**-7)).to(torch.bfloat16)
    expected = (weight / scales.float()[:, None]).round().clamp(-127, 127).to(torch.int8)
    assert torch.equal(slabbed[0], expected) and torch.equal(slabbed[1], scales)


@pytest.mark.parametrize("group_size", [16, 32, 64])
def test_int4_round_trip_error_is_about_half_a_step(group_size):
    weight = torch.randn(48, 128, generator=torch.Generator().manual_seed(2))
    codes, scale_zero = quantize_int4(weight, group_size)
    assert codes.max() <= 15 and scale_zero.shape == (128 // group_size, 48, 2)
    step = scale_zero[..., 0].float().t().repeat_interleave(group_size, dim=1)
    error = (dequantize_int4(codes, scale_zero, group_size) - weight).abs()
    assert (error <= step * 0.51).all()  # half a step, plus the bf16 rounding of the offset


@pytest.mark.parametrize("layer_class", [Int8Linear, Int4Linear])
def test_a_large_layer_converts_its_codes_a_slab_at_a_time(monkeypatch, layer_class):
    """The readable layers' output is the same whether the weight is converted whole or in
    slabs of rows (the last slab shorter), with a bias and a batch of sequences."""
    from memwall.engine import quant

    generator = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(50, 64, generator=generator), torch.randn(50, generator=generator)
    layer = layer_class.from_weight(weight, bias)
    x = torch.randn(2, 3, 64, generator=generator)
    whole = torch.nn.functional.linear(x, layer.weight, bias)
    monkeypatch.setattr(quant, "SLAB_ROWS", 16)
    seen = []
    slabbed = quant.linear_by_slabs
    monkeypatch.setattr(
        quant,
        "linear_by_slabs",
        lambda x, rows, n: slabbed(x, lambda a, b: seen.append(b - a) or rows(a, b), n),
    )
    torch.testing.assert_close(layer(x), whole, rtol=1e-5, atol=1e-5)
    assert seen == [16, 16, 16, 2]


def test_cpu_kernel_layout_is_understood():
    block = cpu_int4_block()
    if block is None:
        pytest.skip("no PyTorch CPU int4 kernel here")
    codes = torch.randint(
        0, 16, (2 * block, 96), generator=torch.Generator().manual_seed(3), dtype=torch.int32
    )
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert packed.numel() == codes.numel() // 2
    assert torch.equal(from_cpu_kernel_layout(packed, block), codes.to(torch.uint8))


def test_pytorch_int8_kernel_matches_reference_path():
    weight = torch.randn(96, 160, generator=torch.Generator().manual_seed(4))
    layer = Int8Linear.from_weight(weight, bias=torch.randn(96))
    x = torch.randn(2, 3, 160, generator=torch.Generator().manual_seed(5))
    ours = twin_of(layer).run("torch", x)
    assert ours.shape == (2, 3, 96)
    # The kernel takes bf16 activations and returns bf16: compare at that precision.
    reference = layer(x.bfloat16().float())
    assert (ours - reference).abs().max() <= 1e-2 * reference.abs().max()


@pytest.mark.parametrize("out_features,group_size", [(64, 32), (128, 64), (96, 32), (40, 32)])
def test_pytorch_int4_kernel_matches_reference_path(out_features, group_size):
    weight = torch.randn(out_features, 128, generator=torch.Generator().manual_seed(6))
    layer = Int4Linear.from_weight(weight, group_size=group_size)
    twin = twin_of(layer)
    for rows in (1, 5):
        x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows))
        with cpu_kernels.switched_off():
            ours = twin(x)
        # The kernel takes bf16 activations and returns bf16: compare at that precision.
        reference = layer(x.bfloat16().float())
        assert (ours - reference).abs().max() <= 1e-2 * reference.abs().max()


def test_memwall_cpu_kernels_build_where_they_can():
    """On an x86 CPU with AVX2 and a C compiler (the course machine, CI) the kernels must build."""
    can_build = (
        torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
        and (shutil.which("cc") or shutil.which("gcc"))
        and os.environ.get("MEMWALL_CPU_KERNELS") != "0"
    )
    if not can_build:
        pytest.skip("no AVX2 CPU or C compiler here: the CPU twins use PyTorch's kernels")
    assert cpu_kernels.available(), cpu_kernels.unavailable_reason()


needs_cpu_kernels = pytest.mark.skipif(
    not cpu_kernels.available(), reason=f"memwall's CPU kernels: {cpu_kernels.unavailable_reason()}"
)


@needs_cpu_kernels
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize(
    "scheme,group_size", [("int8", None), ("int4", 32), ("int4", 64), ("int4", 96)]
)
def test_memwall_cpu_kernels_match_reference_path(scheme, group_size, rows):
    weight = torch.randn(80, 192, generator=torch.Generator().manual_seed(rows))
    bias = torch.randn(80, generator=torch.Generator().manual_seed(9))
    if scheme == "int8":
        layer = Int8Linear.from_weight(weight, bias)
    else:
        layer = Int4Linear.from_weight(weight, bias, group_size)
    twin = twin_of(layer)
    if scheme == "int4":
        assert not twin.kernel_layout  # 80 rows fill no block of that layout: the plain one
    x = torch.randn(rows, 192, generator=torch.Generator().manual_seed(10 + rows))
    ours, reference = twin.run("c", x), layer(x)
    # fp32 activations all the way: only the order of the additions differs.
    assert (ours - reference).abs().max() <= 1e-5 * reference.abs().max()


@needs_cpu_kernels
def test_memwall_cpu_kernels_follow_the_thread_count():
    layer = twin_of(
        Int8Linear.from_weight(torch.randn(64, 128, generator=torch.Generator().manual_seed(11)))
    )
    x = torch.randn(1, 128, generator=torch.Generator().manual_seed(12))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single = layer(x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(single, layer(x))  # each output is one thread's sum, whatever the split


def test_memwall_cpu_kernels_fail_softly(monkeypatch, tmp_path):
    """A broken compiler or MEMWALL_CPU_KERNELS=0 leaves a reason and PyTorch's kernels in charge."""
    try:
        monkeypatch.delenv("MEMWALL_CPU_KERNELS", raising=False)
        monkeypatch.setenv("MEMWALL_CACHE", str(tmp_path))  # nothing built yet: it must compile
        monkeypatch.setenv("CC", "false")
        # PyTorch's packed kernel (bf16 activations) is what the fixed rule falls back to; a
        # pinned path (dequant: fp32 activations) would give other bits.
        monkeypatch.setenv("MEMWALL_KERNEL_PATH", "fixed")
        cpu_kernels.library.cache_clear()
        if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
            assert not cpu_kernels.available() and "failed" in cpu_kernels.unavailable_reason()
        generator = torch.Generator().manual_seed(0)
        layer = Int8Linear.from_weight(torch.randn(32, 64, generator=generator))
        x = torch.randn(1, 64, generator=generator)
        assert torch.allclose(twin_of(layer)(x), layer(x.bfloat16().float()), rtol=1e-2, atol=1e-2)
        monkeypatch.setenv("MEMWALL_CPU_KERNELS", "0")
        cpu_kernels.library.cache_clear()
        assert (
            not cpu_kernels.available()
            and "MEMWALL_CPU_KERNELS" in cpu_kernels.unavailable_reason()
        )
    finally:
        monkeypatch.undo()
        cpu_kernels.library.cache_clear()


def test_int4_codes_survive_either_storage_layout():
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(7))
    codes, scale_zero = quantize_int4(weight, 32)
    for layer in (Int4Linear(codes, scale_zero, 32), twin_of(Int4Linear(codes, scale_zero, 32))):
        assert torch.equal(layer.codes(), codes)
        assert torch.equal(layer.weight, dequantize_int4(codes, scale_zero, 32))


@pytest.mark.parametrize("group_size", [32, 64])
def test_int4_layer_bytes_match_the_cost_model(group_size):
    layer = Int4Linear.from_weight(torch.randn(64, 192), group_size=group_size)
    assert state_bytes(layer) == 64 * 192 * cost.bytes_per_element(f"int4-g{group_size}")


def test_int8_layer_bytes_are_one_per_weight_plus_a_scale_per_row():
    layer = Int8Linear.from_weight(torch.randn(64, 192))
    assert state_bytes(layer) == 64 * 192 * cost.bytes_per_element("int8") + 64 * 2


def test_quantize_swaps_every_linear_and_can_copy(tiny_engine):
    copy = quantize(tiny_engine, "int4", group_size=32, inplace=False)
    assert (
        isinstance(tiny_engine.lm_head, Linear) and tiny_engine.lm_head.weight.numel() == 64 * 256
    )  # untouched
    assert not any(isinstance(m, Linear) for m in copy.modules())
    assert isinstance(copy.lm_head, Int4Linear) and isinstance(copy.blocks[0].mlp.down, Int4Linear)
    kept = quantize(tiny_engine, "int8", inplace=False, head="float")
    assert isinstance(kept.lm_head, Linear) and isinstance(kept.blocks[0].attn.qkv, Int8Linear)
    mixed = quantize(tiny_engine, "int4", inplace=False, head="int8")
    assert isinstance(mixed.lm_head, Int8Linear) and isinstance(
        mixed.blocks[0].attn.qkv, Int4Linear
    )


def test_quantized_tiny_model_predicts_like_fp32(tiny_engine):
    model = quantize(tiny_engine, "int8", inplace=False)
    tokens = torch.randint(0, 256, (1, 64), generator=torch.Generator().manual_seed(8))
    with torch.inference_mode():
        agreement = (
            (model(tokens).argmax(-1) == tiny_engine(tokens).argmax(-1)).float().mean().item()
        )
    assert agreement >= 0.85  # a random model with sharpened weights amplifies every rounding error


def test_quantize_rejects_bad_input(tiny_engine):
    with pytest.raises(ValueError, match="int8, int4"):
        quantize(tiny_engine, "int3", inplace=False)
    with pytest.raises(ValueError, match="same, int8, int4, float"):
        quantize(tiny_engine, "int8", inplace=False, head="fp8")
    with pytest.raises(ValueError, match="does not divide"):
        quantize(tiny_engine, "int4", group_size=48, inplace=False)  # d_model 64


@pytest.mark.slow
@pytest.mark.parametrize(
    "scheme,group_size,head,min_agreement",
    [("int8", 32, "same", 0.9), ("int4", 32, "int8", 0.95), ("int4", 64, "int8", 0.7)],
)
def test_quantized_smollm2_bytes_and_predictions(
    smollm2, smollm2_engine, scheme, group_size, head, min_agreement
):
    spec = "smollm2-135m"
    assert smollm2_engine.weight_bytes_per_step() == pytest.approx(
        cost.weight_bytes(spec, "fp32"), rel=1e-3
    )
    model = quantize(smollm2_engine, scheme, group_size=group_size, inplace=False, head=head)

    def dtype_of(module):
        return "int8" if isinstance(module, Int8Linear) else f"int4-g{module.group_size}"

    linears = [m for m in model.modules() if isinstance(m, (Int8Linear, Int4Linear))]
    assert len(linears) == 4 * 30 + 1
    assert sum(state_bytes(m) for m in linears) == sum(
        m.out_features * m.in_features * cost.bytes_per_element(dtype_of(m))
        + (2 * m.out_features if isinstance(m, Int8Linear) else 0)
        for m in linears
    )
    # The whole model against the cost model (what differs: fp32 norms, one embedding row, int8 row scales).
    body, head_params = dtype_of(linears[0]), model.lm_head.in_features * model.lm_head.out_features
    predicted = cost.weight_bytes(spec, body) + head_params * (
        cost.bytes_per_element(dtype_of(model.lm_head)) - cost.bytes_per_element(body)
    )
    assert model.weight_bytes_per_step() == pytest.approx(predicted, rel=0.01)

    # 256 tokens of memwall's evaluation text: on a 39-token sentence one near-tie of the fp32 model
    # (top-2 logits 0.03 apart) moved agreement by 2.6 points depending on the kernel path.
    tokens = torch.tensor([quality.eval_token_ids(smollm2[1], 256)])
    with torch.inference_mode():
        agreement = (
            (model(tokens).argmax(-1) == smollm2_engine(tokens).argmax(-1)).float().mean().item()
        )
    assert agreement >= min_agreement


@pytest.mark.slow
def test_group_128_does_not_fit_smollm2(smollm2_engine):
    with pytest.raises(ValueError, match="576"):
        quantize(smollm2_engine, "int4", group_size=128, inplace=False)


def test_transformer_type_is_kept(tiny_engine):
    assert isinstance(quantize(tiny_engine, "int8", inplace=False), Transformer)


def test_bench_decode_quant_option(tiny_hf):
    from memwall.bench import bench_decode

    kwargs = dict(
        prompt_tokens=4, new_tokens=3, repeats=1, warmup=0, bandwidth=1e10, progress=False
    )
    fp32 = bench_decode(tiny_hf, "memwall", **kwargs)
    int4 = bench_decode(tiny_hf, "memwall", quant="int4", group_size=32, **kwargs)
    assert int4["quant"] == "int4-g32" and "quant" not in fp32
    assert int4["weight_bytes"] < fp32["weight_bytes"] / 4
    with pytest.raises(ValueError, match="memwall"):
        bench_decode(tiny_hf, "hf", quant="int8", **kwargs)
    both = bench_decode(tiny_hf, "memwall", quant="none,int8,int4", group_size=32, **kwargs)
    assert list(both["tok_per_s_over_first"]) == ["memwall", "memwall-int8", "memwall-int4-g32"]
    assert both["tok_per_s_over_first"]["memwall"] == 1.0
    assert both["memwall-int8"]["weight_bytes"] < both["memwall"]["weight_bytes"] / 3
    assert both["memwall-int4-g32"]["weight_bytes"] == int4["weight_bytes"]
    assert both["memwall-int8"]["tok_per_s"] / both["memwall"]["tok_per_s"] == pytest.approx(
        both["tok_per_s_over_first"]["memwall-int8"]
    )
    for bad in ("int3", "int8,int8", ""):
        with pytest.raises(ValueError, match="none, int8, int4"):
            bench_decode(tiny_hf, "memwall", quant=bad, **kwargs)
    with pytest.raises(ValueError, match="side by side"):
        bench_decode(tiny_hf, "compare", quant="none,int8", **kwargs)


def test_a_quantized_copy_shares_the_tensors_it_keeps(tiny_engine):
    quantized = quantize(tiny_engine, "int8", inplace=False)
    assert quantized.embed.weight.data_ptr() == tiny_engine.embed.weight.data_ptr()
    assert quantized.norm.weight.data_ptr() == tiny_engine.norm.weight.data_ptr()
    assert isinstance(tiny_engine.blocks[0].attn.qkv, Linear)  # the original is untouched
    tokens = torch.tensor([[1, 2, 3]])
    assert torch.isfinite(quantized(tokens)).all() and torch.isfinite(tiny_engine(tokens)).all()
