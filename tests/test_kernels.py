"""memwall's C kernels: the checks before a pointer reaches C, and every kernel variant against
the reference path on the shapes it serves."""

import contextlib
import itertools
import os
import time

import pytest
import torch
import torch.nn.functional as F

from memwall.engine.cpu import calibrate
from memwall.engine.cpu import kernels as cpu_kernels
from memwall.engine.cpu.linears import twin_of
from memwall.engine.linear import Linear
from memwall.engine.quant import Int4Linear, Int8Linear

needs_cpu_kernels = pytest.mark.skipif(
    not cpu_kernels.available(), reason=f"memwall's CPU kernels: {cpu_kernels.unavailable_reason()}"
)


def seeded(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def f_linear_error(x, weight) -> str:
    with pytest.raises(RuntimeError) as caught:
        F.linear(x, weight)
    return str(caught.value)


@pytest.mark.parametrize(
    "make_layer",
    [
        lambda w: Linear(32, 64).set_weight(w),
        lambda w: Int8Linear.from_weight(w),
        lambda w: Int4Linear.from_weight(w, group_size=32),
    ],
    ids=["fp32", "int8", "int4"],
)
def test_a_wrong_input_width_raises_what_f_linear_raises(make_layer):
    weight = seeded(64, 32)
    layer = make_layer(weight)
    x = seeded(1, 40, seed=1)  # wider than the layer: C would read past the weights
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        layer(x)


@needs_cpu_kernels
def test_the_kernel_wrappers_check_before_calling_c():
    weight = seeded(64, 32)
    x = seeded(1, 40, seed=1)
    with pytest.raises(RuntimeError) as caught:
        cpu_kernels.fp32_linear(x, weight)
    assert str(caught.value) == f_linear_error(x, weight)
    codes = torch.zeros(64, 32, dtype=torch.int8)
    scales = torch.ones(64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        cpu_kernels.int8_linear(x, codes, scales)
    with pytest.raises(TypeError, match="bfloat16"):  # scales of the wrong dtype
        cpu_kernels.int8_linear(seeded(1, 32), codes, scales.float())
    with pytest.raises(TypeError, match="fp32 CPU activations"):
        cpu_kernels.fp32_linear(seeded(1, 32).double(), weight)
    with pytest.raises(ValueError, match="contiguous"):
        cpu_kernels.fp32_linear(seeded(1, 64), seeded(64, 64).t())
    packed = torch.zeros(64, 16, dtype=torch.uint8)
    scale_zero = torch.ones(1, 64, 2, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        cpu_kernels.int4_linear(x, packed, scale_zero, 32)
    with pytest.raises(TypeError, match="scale_zero"):
        cpu_kernels.int4_linear(seeded(1, 32), packed, scale_zero[:, :32], 32)


@needs_cpu_kernels
def test_the_output_dtype_follows_the_input_not_the_default_dtype():
    weight, x = seeded(64, 32), seeded(2, 32, seed=1)
    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        out = cpu_kernels.fp32_linear(x, weight)
        int8 = Int8Linear.from_weight(weight)
        int8_out = cpu_kernels.int8_linear(x, int8.codes, int8.scales)
    finally:
        torch.set_default_dtype(previous)
    assert out.dtype == int8_out.dtype == torch.float32
    assert torch.allclose(out, x @ weight.t(), atol=1e-5)


# ---- every variant against the reference path ---------------------------------------------------


def runnable_variants():
    if not cpu_kernels.available():
        return []
    from memwall.engine.cpu import build

    return [name for name in build.VARIANTS if build.runnable(name)]


VARIANTS = runnable_variants()
# 2-4 rows take the AVX-512/AVX2 decode tile; 5-7 leave 1-3 rows to the 4-row tile's remainder
ROWS = [1, 2, 3, 4, 5, 6, 7, 9, 17]


def close(ours, reference):
    return (ours - reference).abs().max() <= 1e-5 * reference.abs().max()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "out_features, in_features", [(4, 8), (12, 40), (20, 96), (64, 200), (8, 2056)]
)
def test_fp32_kernel_of_every_variant_matches_f_linear(variant, out_features, in_features):
    lib = cpu_kernels.variant_library(variant)
    weight = seeded(out_features, in_features)
    for rows in ROWS:
        x = seeded(rows, in_features, seed=rows)
        batched = cpu_kernels.fp32_linear(x, weight, lib=lib)
        assert close(batched, (x.double() @ weight.double().t()).float())
        for i in (0, rows - 1):  # each row gets the same bits alone as in a batch
            assert torch.equal(
                cpu_kernels.fp32_linear(x[i : i + 1], weight, lib=lib)[0], batched[i]
            )


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("out_features, in_features", [(4, 8), (7, 5), (33, 40), (96, 576)])
def test_bf16_kernel_of_every_variant_matches_f_linear(variant, out_features, in_features):
    """Sums in fp32 rounded once to bf16: within a bf16 rounding of the exact products' sum, and
    each row the same bits alone as in a batch."""
    lib = cpu_kernels.variant_library(variant)
    weight = seeded(out_features, in_features).bfloat16()
    for rows in ROWS:
        x = seeded(rows, in_features, seed=rows).bfloat16()
        batched = cpu_kernels.bf16_linear(x, weight, lib=lib)
        exact = x.double() @ weight.double().t()
        assert batched.dtype == torch.bfloat16
        assert torch.allclose(batched.double(), exact, rtol=2**-8, atol=1e-3 * exact.abs().max())
        for i in (0, rows - 1):
            assert torch.equal(
                cpu_kernels.bf16_linear(x[i : i + 1], weight, lib=lib)[0], batched[i]
            )


def test_bf16_kernel_checks_its_inputs():
    weight = seeded(8, 32).bfloat16()
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        cpu_kernels.bf16_linear(seeded(1, 40).bfloat16(), weight)
    with pytest.raises(TypeError, match="bf16 CPU activations"):
        cpu_kernels.bf16_linear(seeded(1, 32), weight)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize(
    "out_features, in_features", [(4, 8), (7, 5), (33, 40), (40, 37), (64, 200), (96, 576)]
)
def test_packed_fp32_kernel_of_every_variant_matches_f_linear(variant, out_features, in_features):
    """Any width (the last panel is partly padding), and every tile (AVX-512: 12, 8, 4, 2 and 1
    rows; AVX2: 3, 2 and 1)."""
    lib = cpu_kernels.variant_library(variant)
    weight = seeded(out_features, in_features)
    for rows in [*ROWS, 12, 15, 16, 29, 70]:
        x = seeded(rows, in_features, seed=rows)
        batched = cpu_kernels.fp32_packed_linear(x, weight, lib=lib)
        assert close(batched, (x.double() @ weight.double().t()).float())
        for i in (0, rows - 1):  # each row gets the same bits alone as in a batch
            alone = cpu_kernels.fp32_packed_linear(x[i : i + 1], weight, lib=lib)
            assert torch.equal(alone[0], batched[i])


@needs_cpu_kernels
def test_the_packed_copy_is_made_once_and_again_after_the_weights_change():
    weight, x = seeded(40, 32), seeded(3, 32, seed=1)
    panels = cpu_kernels.panels_of(weight)
    assert panels.shape == (2, 32, cpu_kernels.PANEL)
    assert torch.equal(panels[1, :, :8], weight[32:].t()) and not panels[1, :, 8:].any()
    assert cpu_kernels.panels_of(weight) is panels
    with torch.no_grad():
        weight[5].mul_(2.0)  # in place: a new version of the same tensor
    assert cpu_kernels.panels_of(weight) is not panels
    assert close(cpu_kernels.fp32_packed_linear(x, weight), x @ weight.t())
    with pytest.raises(RuntimeError) as caught:
        cpu_kernels.fp32_packed_linear(seeded(1, 40), weight)
    assert str(caught.value) == f_linear_error(seeded(1, 40), weight)
    with pytest.raises(TypeError, match="float32"):
        cpu_kernels.fp32_packed_linear(x, weight.bfloat16())
    with torch.inference_mode():  # weights made there keep no version count
        made_there = seeded(8, 32)
        assert close(cpu_kernels.fp32_packed_linear(x, made_there), x @ made_there.t())


def attend_one(lib, qkv, keys, values, heads, lengths, threads, tables=None):
    """The C attention of one new token per row against its cached ones (decode_attention.h): row r's
    query is at position lengths[r] - 1. keys and values are blocks [n_blocks, kv_heads,
    block_size, head_dim]; without `tables`, block r is row r's whole cache."""
    rows, _, head_dim = qkv.shape
    kv_heads, block_size = keys.shape[1], keys.shape[2]
    lengths = torch.as_tensor(lengths).expand(rows)
    positions = (lengths - 1).contiguous()
    tables = torch.arange(rows)[:, None] if tables is None else tables.contiguous()
    out = torch.empty(rows, heads, head_dim)
    scratch = torch.empty(lib.attend_scratch_floats(rows, heads, head_dim, int(lengths.max())))
    ptr = torch.Tensor.data_ptr
    lib.attend_one(
        *map(ptr, (qkv, keys, values, out)),
        *(heads, kv_heads, head_dim),
        *map(ptr, (positions, tables)),
        *(tables.shape[1], block_size),
        ptr(scratch),
        threads,
        rows,
    )
    return out


@pytest.mark.parametrize("variant", VARIANTS)
def test_decode_ops_of_every_variant_match_pytorch(variant):
    """The fast decode step's fused ops (decode_ops.h), with their vectorized exp, on odd sizes
    and on inputs far outside exp's useful range."""
    lib = cpu_kernels.variant_library(variant)
    ptr = torch.Tensor.data_ptr
    # 8 rows of 1536: the threaded branch
    for d_ff, rows in ((1, 1), (7, 1), (37, 1), (1536, 1), (1536, 8)):
        gate_up = seeded(rows, 2 * d_ff, seed=d_ff) * 30
        gate_up[:, 0] = -300.0  # exp(300) overflows a float: SiLU's answer is still about 0
        out = torch.empty(rows, d_ff)
        lib.silu_mul(ptr(gate_up), ptr(out), d_ff, rows, 2)
        gate, up = gate_up.double().split(d_ff, dim=1)
        assert torch.allclose(out.double(), F.silu(gate) * up, rtol=1e-6, atol=1e-30)
    rows, max_tokens = 3, 40
    # head_dim 24: a part of 32 columns only; 72: two whole ones and a part. 200 tokens:
    # threaded; 600: three chunks of keys to merge. Groups of 3, 5 (a pass of 4 heads, then 1)
    # and 1 query head per key/value head.
    cases = itertools.product(((6, 2), (10, 2), (4, 4)), (24, 72), (1, 5, 33, 200, 600))
    for (heads, kv_heads), head_dim, length in cases:
        max_tokens = max(max_tokens, length)
        qkv = seeded(rows, heads + 2 * kv_heads, head_dim, seed=length) * 4
        caches = seeded(2, rows, kv_heads, max_tokens, head_dim, seed=length + 1)
        keys, values = caches.unbind(0)
        out = attend_one(lib, qkv, keys, values, heads, length, threads=2)
        q = qkv[:, :heads, None]  # [rows, heads, 1, head_dim]
        k = keys[:, :, :length].repeat_interleave(heads // kv_heads, 1)
        v = values[:, :, :length].repeat_interleave(heads // kv_heads, 1)
        reference = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        assert close(out.double(), reference[:, :, 0])
        # the last row alone, on one thread, gets the same bits as in the batch on two
        alone = attend_one(lib, qkv[-1:], keys[-1:], values[-1:], heads, length, threads=1)
        assert torch.equal(alone[0], out[-1])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("block_size", [1, 4, 7, 16, 300])
def test_attention_reads_a_paged_cache_in_place(variant, block_size):
    """Rows of different lengths (one crossing ATTEND_CHUNK twice), their blocks scattered over
    a pool: each row against its own tokens, read through its block table."""
    lib = cpu_kernels.variant_library(variant)
    heads, kv_heads, head_dim = 6, 2, 72
    lengths = torch.tensor([5, 600, 1, 257, 33])
    needed = [-(-int(n) // block_size) for n in lengths]
    g = torch.Generator().manual_seed(block_size)
    order = torch.randperm(sum(needed) + 3, generator=g)  # blocks in no order, a few free
    tables = torch.zeros(len(lengths), max(needed), dtype=torch.long)
    for row, count in enumerate(needed):
        tables[row, :count], order = order[:count], order[count:]
    qkv = seeded(len(lengths), heads + 2 * kv_heads, head_dim, seed=block_size) * 4
    pool = seeded(2, sum(needed) + 3, kv_heads, block_size, head_dim, seed=block_size + 1)
    keys, values = pool.unbind(0)
    out = attend_one(lib, qkv, keys, values, heads, lengths, threads=2, tables=tables)
    for row, length in enumerate(lengths.tolist()):
        t = torch.arange(length)
        blocks = tables[row, t // block_size]
        k, v = (c[blocks, :, t % block_size].transpose(0, 1) for c in (keys, values))
        q = qkv[row, :heads, None].double()  # [heads, 1, head_dim]
        group = heads // kv_heads
        k, v = (c.repeat_interleave(group, 0).double() for c in (k, v))
        reference = F.scaled_dot_product_attention(q, k, v)
        assert close(out[row].double(), reference[:, 0])
        # alone, on one thread, the row gets the bits it got in the batch
        alone = attend_one(
            lib, qkv[row : row + 1], keys, values, heads, [length], 1, tables[row : row + 1]
        )
        assert torch.equal(alone[0], out[row])


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("path", ["c", "c_row", "c_many"])
@pytest.mark.parametrize(
    "out_features, in_features", [(4, 32), (20, 96), (36, 160), (7, 64), (8, 576)]
)
def test_int8_kernels_of_every_variant_match_the_reference(
    variant, path, out_features, in_features
):
    if path == "c_many" and out_features % 4:
        pytest.skip("the many-rows kernel takes out % 4 == 0 (its wrapper says so)")
    lib = cpu_kernels.variant_library(variant)
    layer = Int8Linear.from_weight(seeded(out_features, in_features))
    for rows in ROWS:
        x = seeded(rows, in_features, seed=rows)
        ours = cpu_kernels.int8_linear(x, layer.codes, layer.scales, path, lib=lib)
        assert close(ours, F.linear(x, layer.weight))
        alone = cpu_kernels.int8_linear(x[-1:], layer.codes, layer.scales, path, lib=lib)
        assert torch.equal(alone[0], ours[-1])


def w8a8_reference(x, layer):
    """The w8a8 path's arithmetic in PyTorch: each row of x rounded to int8 with its own scale
    (its largest magnitude / 127), exact integer dot products, then the two scales."""
    largest = x.abs().amax(-1, keepdim=True)
    scale = torch.where(largest > 0, largest / 127, torch.ones_like(largest))
    codes = torch.round(x * (1 / scale)).clamp(-127, 127)
    dot = codes.to(torch.int64) @ layer.codes.to(torch.int64).T
    return layer.scales.float() * scale * dot.float()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("out_features, in_features", [(4, 32), (20, 96), (7, 64), (12, 576)])
def test_w8a8_kernel_of_every_variant_is_exactly_its_integer_arithmetic(
    variant, out_features, in_features
):
    """Integer sums are exact, so every variant (AVX-512 with VNNI where the CPU has it, the
    compilers' vectors elsewhere) and every batch gives the reference's bits; and the rounded
    activations keep the result within 2% of the int8 weights' exact product."""
    lib = cpu_kernels.variant_library(variant)
    layer = Int8Linear.from_weight(seeded(out_features, in_features))
    for rows in ROWS:
        x = seeded(rows, in_features, seed=rows)
        if rows > 2:
            x[1] = 0.0  # an all-zero row: scale 1, not a division by zero
        ours = cpu_kernels.int8_linear(x, layer.codes, layer.scales, "w8a8", lib=lib)
        assert torch.equal(ours, w8a8_reference(x, layer)), rows
        exact = F.linear(x, layer.weight)
        assert (ours - exact).abs().max() <= 2e-2 * exact.abs().max()


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("many", [False, True], ids=["few rows", "many rows"])
@pytest.mark.parametrize(
    "out_features, in_features, group_size",
    [(4, 32, 32), (20, 192, 32), (20, 192, 64), (12, 192, 96), (36, 160, 160), (8, 256, 128)],
)
def test_int4_kernels_of_every_variant_match_the_reference(
    variant, many, out_features, in_features, group_size
):
    lib = cpu_kernels.variant_library(variant)
    layer = Int4Linear.from_weight(seeded(out_features, in_features), group_size=group_size)
    for rows in ROWS:
        x = seeded(rows, in_features, seed=rows)
        ours = cpu_kernels.int4_linear(
            x, layer.packed, layer.scale_zero, group_size, many=many, lib=lib
        )
        assert close(ours, F.linear(x, layer.weight))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_gives_the_same_bits_for_any_thread_count(variant):
    lib = cpu_kernels.variant_library(variant)
    layer = Int4Linear.from_weight(seeded(64, 128), group_size=32)
    weight, x = seeded(64, 128, seed=3), seeded(3, 128, seed=4)
    threads = torch.get_num_threads()

    def run():
        return [
            cpu_kernels.fp32_linear(x, weight, lib=lib),
            cpu_kernels.fp32_packed_linear(x, weight, lib=lib),
            cpu_kernels.int4_linear(x, layer.packed, layer.scale_zero, 32, lib=lib),
            cpu_kernels.int4_linear(x, layer.packed, layer.scale_zero, 32, many=True, lib=lib),
        ]

    try:
        torch.set_num_threads(1)
        single = run()
    finally:
        torch.set_num_threads(threads)
    for alone, shared in zip(single, run()):
        assert torch.equal(alone, shared)


# ---- building ------------------------------------------------------------------------------------


def fake_compiler(tmp_path, version: str) -> str:
    """A cc that rejects -fopenmp (as Apple's clang does) and reports `version`."""
    import shutil

    real = shutil.which("cc") or shutil.which("gcc")
    script = tmp_path / "cc"
    script.write_text(
        "#!/bin/sh\n"
        f'[ "$1" = --version ] && echo "{version}" && exit 0\n'
        'for a in "$@"; do [ "$a" = -fopenmp ] && echo "unsupported option -fopenmp" >&2 && exit 1; done\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


@needs_cpu_kernels
@pytest.mark.once
def test_the_build_retries_without_openmp_and_keys_on_the_compiler(monkeypatch, tmp_path):
    from memwall.engine.cpu import build

    monkeypatch.setenv("MEMWALL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("CC", fake_compiler(tmp_path, "fakecc 1.0"))
    first = build.build("portable")
    assert "-fopenmp" not in build.BASE_FLAGS and first.exists()
    lib = build.load("portable")
    weight, x = seeded(8, 16), seeded(2, 16, seed=1)
    assert close(cpu_kernels.fp32_linear(x, weight, lib=lib), x @ weight.t())
    monkeypatch.setenv("CC", fake_compiler(tmp_path, "fakecc 2.0"))
    build.compiler_version.cache_clear()
    assert build.build("portable") != first  # a new compiler version builds afresh


@pytest.mark.once
def test_build_kernels_command_reports_each_variant(capsys, monkeypatch, tmp_path):
    import json

    from memwall.cli import main

    monkeypatch.setenv("MEMWALL_CACHE", str(tmp_path))
    code = main(["build-kernels", "--json", "--forget-paths"])
    report = json.loads(capsys.readouterr().out)
    assert set(report["variants"]) == {"avx512", "avx2", "portable"}
    assert report["in_use"] == cpu_kernels.variant()
    assert code == (0 if cpu_kernels.library() is not None else 1)
    assert report["forgot_paths"].startswith(str(tmp_path))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("many", [False, True], ids=["few rows", "many rows"])
@pytest.mark.parametrize("block", [32, 64])
@pytest.mark.parametrize(
    "out_features, in_features, group_size", [(64, 96, 32), (128, 192, 64), (192, 256, 128)]
)
def test_int4_kernels_on_pytorchs_layout_match_the_reference(
    variant, many, block, out_features, in_features, group_size
):
    from memwall.engine.quant import quantize_int4

    lib = cpu_kernels.variant_library(variant)
    weight = seeded(out_features, in_features)
    codes, scale_zero = quantize_int4(weight, group_size)
    # PyTorch's blocked layout for either block size, built by hand (linears.from_cpu_kernel_layout
    # is its inverse), so both are tested whatever this CPU's PyTorch uses.
    blocks = codes.reshape(out_features // block, block, in_features).transpose(1, 2)
    packed = (blocks[..., : block // 2] | (blocks[..., block // 2 :] << 4)).reshape(
        out_features, in_features // 2
    )
    from memwall.engine.cpu.linears import from_cpu_kernel_layout
    from memwall.engine.quant import dequantize_int4

    assert torch.equal(from_cpu_kernel_layout(packed, block), codes)
    reference_weight = dequantize_int4(codes, scale_zero, group_size)
    for rows in ROWS:
        x = seeded(rows, in_features, seed=rows)
        ours = cpu_kernels.int4_blocked_linear(
            x, packed.contiguous(), scale_zero, group_size, block, many=many, lib=lib
        )
        assert close(ours, F.linear(x, reference_weight))
        alone = cpu_kernels.int4_blocked_linear(
            x[-1:], packed.contiguous(), scale_zero, group_size, block, many=many, lib=lib
        )
        assert torch.equal(alone[0], ours[-1])


# ---- kernel paths: pinned, fixed, measured ----------------------------------------------------------


def layers_of_every_format():
    weight, bias = seeded(128, 64), seeded(128, seed=5)
    readable = {
        "fp32": Linear(64, 128, bias=True).set_weight(weight, bias),
        "int8": Int8Linear.from_weight(weight, bias),
        "int4": Int4Linear.from_weight(weight, bias, group_size=32),
    }
    return {fmt: twin_of(layer) for fmt, layer in readable.items()}


@pytest.mark.parametrize("rows", [1, 5, 40])
def test_every_path_a_layer_offers_gives_the_reference_result(rows):
    x = seeded(rows, 64, seed=6)
    for fmt, layer in layers_of_every_format().items():
        reference = F.linear(x, layer.weight, layer.bias) if fmt == "fp32" else layer.readable[0](x)
        for path in getattr(layer, "step_paths_for", layer.paths_for)(x):
            ours = layer.run(path, x)
            # PyTorch's packed kernels round the activations to bf16 first, w8a8 to int8.
            tolerance = {"torch": 1e-2, "w8a8": 2e-2}.get(path, 1e-5)
            assert (ours - reference).abs().max() <= tolerance * reference.abs().max(), (fmt, path)


def test_a_pinned_path_is_taken_and_a_bad_pin_names_the_choices(monkeypatch):
    from memwall.engine.cpu import path_choice as paths

    layers = layers_of_every_format()
    x = seeded(1, 64)
    monkeypatch.setenv(paths.ENV, "fp32:linear,int8:dequant,int4:dequant")
    assert [paths.choose(layer, x) for layer in layers.values()] == ["linear", "dequant"] * 1 + [
        "dequant"
    ]
    monkeypatch.setenv(paths.ENV, "fp32:bmm")
    # bmm needs 2+ threads; a pin that cannot apply falls back to the fixed rule.
    fallback = paths.fixed_path("fp32", 1, layers["fp32"].paths_for(x))
    expected = "bmm" if layers["fp32"].splits > 1 else fallback
    assert paths.choose(layers["fp32"], x) == expected
    monkeypatch.setenv(paths.ENV, "fp32:fast")
    with pytest.raises(ValueError, match="fp32: c, packed, bmm, linear"):
        paths.choose(layers["fp32"], x)


def test_the_fixed_rule_uses_c_kernels_for_few_rows_where_they_exist(monkeypatch):
    from memwall.engine.cpu import path_choice as paths

    monkeypatch.setenv(paths.ENV, "fixed")
    layers = layers_of_every_format()
    few, many = seeded(2, 64), seeded(300, 64)
    if cpu_kernels.available():
        assert paths.choose(layers["fp32"], few) == "c"
        assert paths.choose(layers["int4"], few) == "c"
        assert paths.choose(layers["int4"], many) == "c_many"
    else:
        assert paths.choose(layers["int8"], few) in ("torch", "dequant")
    assert paths.choose(layers["fp32"], many) == "linear"


@contextlib.contextmanager
def measured_paths(monkeypatch, cache_dir, busy):
    """paths, measuring afresh into `cache_dir` on a machine that looks busy or not."""
    from memwall.engine.cpu import path_choice as paths

    monkeypatch.setenv("MEMWALL_CACHE", str(cache_dir))
    monkeypatch.setenv(paths.ENV, "auto")
    monkeypatch.setattr(paths, "machine_busy", lambda: busy)
    paths.forget()
    try:
        yield paths
    finally:
        paths._memo.clear()
        paths._decisions.cache_clear()


def test_measured_choices_are_cached_per_machine(monkeypatch, tmp_path, capsys):
    """Which path wins is the machine's business; that one is chosen, kept and reported is ours."""
    with measured_paths(monkeypatch, tmp_path, busy=False) as paths:
        layer = layers_of_every_format()["int8"]
        x = seeded(3, 64)
        chosen = paths.choose(layer, x)
        assert chosen in layer.paths_for(x)
        assert "timing kernel paths" in capsys.readouterr().err or paths._announced
        report = paths.chosen_paths()
        assert report["paths"]["int8"] == {"128x64 float32 <= 4 rows": chosen}
        assert report["machine"]["threads"] == torch.get_num_threads()
        assert paths.cache_file().exists() and str(tmp_path) in report["cache_file"]
        from memwall.engine.cpu import info_rows

        assert ("paths int8", f"<=4 rows: {chosen}") in info_rows()
        paths._decisions.cache_clear()  # a new process reads the file instead of measuring
        paths._memo.clear()
        monkeypatch.setattr(paths, "_measure", lambda *args: pytest.fail("measured again"))
        assert paths.choose(layer, x) == chosen


def test_a_choice_timed_on_a_busy_machine_is_not_kept(monkeypatch, tmp_path):
    with measured_paths(monkeypatch, tmp_path, busy=True) as paths:
        layer = layers_of_every_format()["int8"]
        chosen = paths.choose(layer, seeded(3, 64))
        assert chosen in layer.paths_for(seeded(3, 64))
        assert not paths.cache_file().exists()


@needs_cpu_kernels
@pytest.mark.parametrize("rows", [1, 5])
def test_calibration_runs_c_paths_from_c_and_others_through_python(monkeypatch, rows):
    """The fast decode step runs memwall's kernels from its loop in C and calls back into Python
    for PyTorch's paths; calibration times each path the same way, on the same results."""

    x = seeded(rows, 64, seed=3)
    for layer in layers_of_every_format().values():
        expected = {path: layer.run(path, x) for path in layer.paths_for(x)}
        through_python = []
        monkeypatch.setattr(layer, "run", lambda path, x, seen=through_python: seen.append(path))
        for path in expected:
            result = calibrate._calls([layer], path, x)()
            if path in calibrate.C_PATHS:
                assert torch.equal(result, expected[path]), (layer, path)
        assert set(through_python) == set(expected) - set(calibrate.C_PATHS), layer
        monkeypatch.undo()


@needs_cpu_kernels
def test_calibration_times_copies_and_leaves_the_layer_unpacked(monkeypatch, tmp_path):
    """Timing the "packed" path packs the copies it times; the layer itself gets a packed copy
    of its weights only when it runs on that path."""
    with measured_paths(monkeypatch, tmp_path, busy=False) as paths:
        monkeypatch.setattr(calibrate, "copies_to_overflow", lambda layer: 2)
        layer, x = layers_of_every_format()["fp32"], seeded(6, 64)
        assert "packed" not in layer.paths_for(x)  # the readable engine keeps one copy
        assert "packed" in layer.step_paths_for(x)
        assert "packed" not in layer.step_paths_for(seeded(4, 64))  # 5 to 64 rows: batches
        readable, step = paths.choose(layer, x), paths.choose(layer, x, fast_step=True)
        assert readable in layer.paths_for(x) and step in layer.step_paths_for(x)
        assert any(name.endswith(":step") for name in paths._decisions())
        assert id(layer.weight) not in cpu_kernels._panels
        layer.run("packed", x)
        assert id(layer.weight) in cpu_kernels._panels


class TimedPaths(torch.nn.Module):
    """A layer whose paths take the given times (seconds), for the calibration's rules."""

    def __init__(self, seconds: dict[str, float]):
        super().__init__()
        self.seconds = seconds

    def kernel_key(self):
        return ("fp32", "8x8")

    def paths_for(self, x):
        return tuple(self.seconds)

    def run(self, path, x):
        time.sleep(self.seconds[path])
        return x


@pytest.mark.parametrize(
    # 10 ms samples: a sleep overshoots by up to a few tenths of a millisecond on a loaded machine
    ("bmm_seconds", "expected"),
    [(9.8e-3, "c"), (3e-3, "bmm")],
    ids=["close", "clear-win"],
)
def test_another_path_replaces_the_fixed_one_only_when_clearly_faster(
    monkeypatch, tmp_path, bmm_seconds, expected
):
    with measured_paths(monkeypatch, tmp_path, busy=False) as paths:
        monkeypatch.setattr(calibrate, "copies_to_overflow", lambda layer: 1)
        layer = TimedPaths({"c": 10e-3, "bmm": bmm_seconds, "linear": 30e-3})
        assert paths.choose(layer, seeded(1, 8)) == expected


def test_the_approximate_path_is_never_measured_only_pinned(monkeypatch, tmp_path):
    with measured_paths(monkeypatch, tmp_path, busy=False) as paths:
        monkeypatch.setattr(calibrate, "copies_to_overflow", lambda layer: 1)
        layer = TimedPaths({"c": 1e-3, "w8a8": 1e-4, "linear": 3e-3})  # w8a8 the fastest
        assert paths.choose(layer, seeded(1, 8)) == "c"
        monkeypatch.setenv(paths.ENV, "int8:w8a8")
        int8, x = layers_of_every_format()["int8"], seeded(1, 64)
        offered = int8.paths_for(x)  # without the C kernels, the pin falls back to the rule
        expected = "w8a8" if "w8a8" in offered else paths.fixed_path("int8", 1, offered)
        assert paths.choose(int8, x) == expected


@pytest.mark.parametrize("cache_mib, budget_mib", [(32, 256), (480, 256), (480, 2048)])
def test_a_calibration_sample_overflows_the_cache_within_the_memory_budget(
    monkeypatch, cache_mib, budget_mib
):
    """Twice the last-level cache of copies (64 MiB at least), but never more than the memory
    budget allows: a cache bigger than the budget is then what the samples read from."""
    monkeypatch.setattr(calibrate, "last_level_cache_bytes", lambda: cache_mib << 20)
    monkeypatch.setattr(calibrate, "buffer_budget_bytes", lambda: budget_mib << 20)
    layer, size = Linear(576, 960), 576 * 960 * 4
    copies = calibrate.copies_to_overflow(layer)
    target = min(max(2 * cache_mib, 64), max(budget_mib, 64)) << 20
    assert copies * size >= target > (copies - 1) * size
    assert calibrate.copies_to_overflow(Linear(8, 8)) == calibrate.MAX_COPIES  # a toy layer: capped


def test_the_last_level_cache_is_read_from_the_machine():
    if os.path.exists("/sys/devices/system/cpu/cpu0/cache/index0/size"):
        assert calibrate.last_level_cache_bytes() >= 1 << 20


def test_a_layer_bound_by_arithmetic_is_timed_over_fewer_copies():
    """A layer that streams its weights from cache slower than SLOW_MEMORY (prefill's many rows)
    is timed over copies that last as long as a memory-bound layer's; a faster one over all."""
    layer = Linear(576, 960)
    size, overflow = 576 * 960 * 4, calibrate.copies_to_overflow(layer)
    assert calibrate.copies_for(layer, size / 20e9) == overflow  # 20 GB/s from cache
    quarter = calibrate.copies_for(layer, size / (calibrate.SLOW_MEMORY / 4))
    assert overflow / 4 <= quarter <= overflow / 4 + 1
    assert calibrate.copies_for(layer, 10.0) == 1


@pytest.mark.parametrize(
    "bound_by, linear_time, rounds",
    [("memory", 2.0, 5), ("arithmetic", 2.0, 3), ("memory", 0.93, 15), ("arithmetic", 0.97, 9)],
)
def test_calibration_rounds(monkeypatch, bound_by, linear_time, rounds):
    """Five timed rounds per path when a layer streams from memory, three when it is bound by
    arithmetic (timed over fewer copies), and three times as many for a close call (a path at
    0.90-1.00 of the fixed rule's time); each after a warm-up call and a call from cache."""
    layer = twin_of(Linear(32, 64))
    monkeypatch.setattr(calibrate, "copies_to_overflow", lambda layer: 4)
    monkeypatch.setattr(calibrate, "copies_for", lambda layer, s: 4 if bound_by == "memory" else 2)
    # each sample is named by its path, and takes 1 s (bmm) or linear_time (linear)
    monkeypatch.setattr(calibrate, "_calls", lambda layers, path, sample: path)
    calls = []
    monkeypatch.setattr(
        calibrate,
        "_seconds",
        lambda path: calls.append(path) or (linear_time if path == "linear" else 1.0),
    )
    winner = calibrate.fastest(layer, 32, torch.float32, 1, ["bmm", "linear"], "bmm")
    assert len(calls) == 2 * (1 + rounds)  # two paths: one call from cache, then the rounds
    assert winner == ("linear" if linear_time < calibrate.CLEAR_WIN else "bmm")


def test_a_calibration_copy_holds_only_its_layers_weights():
    """A layer whose weight is a view into a larger buffer (as a model loaded into one allocation
    would be) is copied by its own elements, not by the whole buffer."""
    buffer = torch.randn(4 * 64 * 32)
    layer = twin_of(Linear(32, 64))
    layer.weight = torch.nn.Parameter(
        buffer[64 * 32 : 2 * 64 * 32].view(64, 32), requires_grad=False
    )
    twin = calibrate.copy_of(layer)
    assert twin.weight.untyped_storage().nbytes() == 64 * 32 * 4
    assert (
        torch.equal(twin.weight, layer.weight) and twin.weight.data_ptr() != layer.weight.data_ptr()
    )
    x = seeded(2, 32)
    assert torch.equal(twin.run("bmm", x), layer.run("bmm", x))
