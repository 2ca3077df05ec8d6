"""The cost model: every worked number in DESIGN.md, plus the ledger's bookkeeping."""

import dataclasses

import pytest

from memwall import cost
from memwall.hardware import CATALOG as HARDWARE
from memwall.specs import CATALOG as MODELS
from memwall.specs import ModelSpec

KiB = 1024

# DESIGN.md's KV example: 16 layers, 8 KV heads, head dim 128 (the other fields don't enter the KV math).
KV_EXAMPLE = ModelSpec(
    name="kv-example",
    n_layers=16,
    d_model=4096,
    n_heads=32,
    n_kv_heads=8,
    head_dim=128,
    d_ff=14336,
    vocab_size=32000,
    tied_embeddings=False,
    max_context=8192,
)


# ---- the worked numbers ------------------------------------------------------------------------


def test_one_billion_params_in_16_bit_is_2_gb():
    assert cost.weight_bytes_for_params(1e9, "bf16") == 2e9
    assert cost.weight_bytes_for_params(1e9, "fp16") == 2e9


def test_kv_cache_worked_example():
    assert cost.kv_bytes_per_token(KV_EXAMPLE, "bf16") == 64 * KiB
    # DESIGN.md's "512 MB" and "8 GB" count 1,000 KiB as a MB: 8,000 x 64 KiB = 512,000 KiB.
    assert cost.kv_cache_bytes(KV_EXAMPLE, 8000, kv_dtype="bf16") == 512_000 * KiB
    assert cost.kv_cache_bytes(KV_EXAMPLE, 8000, batch=16, kv_dtype="bf16") == 8_192_000 * KiB


def test_100_gbs_ceilings_for_a_2_gb_model_and_its_4_bit_version():
    laptop = HARDWARE["laptop-100gbs"]
    assert (
        cost.bandwidth_bound_tokens_per_s(cost.weight_bytes_for_params(1e9, "bf16"), laptop) == 50
    )
    assert cost.weight_bytes_for_params(1e9, "int4") == 0.5e9
    assert (
        cost.bandwidth_bound_tokens_per_s(cost.weight_bytes_for_params(1e9, "int4"), laptop) == 200
    )


def test_llama_3_8b_on_h100_sxm():
    decode = cost.step("llama-3-8b", batch=1, context=0, weight_dtype="bf16")
    assert decode.weight_bytes == pytest.approx(16.06e9, rel=1e-3)
    seconds = cost.step_time_lower_bound(decode, "h100-sxm")
    assert 4.7e-3 < seconds < 4.9e-3
    rate = cost.tokens_per_s_ceiling(decode, "h100-sxm")
    assert 205 < rate.per_user < 212 and rate.total == rate.per_user


def test_h100_ridge_point_and_batch_1_intensity():
    assert round(cost.ridge_point("h100-sxm", "bf16")) == 295
    decode = cost.step("llama-3-8b", batch=1, context=16, weight_dtype="bf16")
    assert 0.9 < decode.arithmetic_intensity < 1.1


# ---- dtypes ----------------------------------------------------------------------------------


def test_bytes_per_element():
    assert cost.bytes_per_element("fp32") == 4
    assert cost.bytes_per_element("int8") == 1
    assert cost.bytes_per_element("q4_1") * 8 == 5  # 20 bytes per block of 32 weights = 5 bits
    assert cost.bytes_per_element("int4-g128") == 0.5 + 4 / 128  # fp16 scale + fp16 zero per group


@pytest.mark.parametrize("dtype", ["fp64", "int3", "int4-g0", "int4-gx", "fp32-g64", ""])
def test_unknown_dtype_names_the_choices(dtype):
    with pytest.raises(ValueError, match="bf16"):
        cost.bytes_per_element(dtype)


# ---- weights ---------------------------------------------------------------------------------


def test_weight_bytes_is_params_times_bytes():
    for spec in MODELS.values():
        if spec.n_experts == 1:
            assert cost.weight_bytes(spec, "fp32") == 4 * spec.n_params
    assert cost.weight_bytes("smollm2-135m", "fp32") == 538_060_032  # DESIGN.md's 538 MB


def test_untied_input_embedding_can_be_counted_as_rows():
    full = cost.weight_bytes("llama-3-8b", "bf16")
    rows_only = cost.weight_bytes("llama-3-8b", "bf16", count_input_embedding=False)
    assert full - rows_only == 2 * (128256 * 4096 - 4096)  # table out, one row in
    # A tied table is read whole as the output head, so nothing changes.
    assert cost.weight_bytes("smollm2-135m", count_input_embedding=False) == cost.weight_bytes(
        "smollm2-135m"
    )


def test_mixture_of_experts_reads_active_experts_at_batch_1_and_most_at_large_batch():
    mixtral = MODELS["mixtral-8x7b"]
    assert cost.weight_bytes(mixtral, "bf16") == pytest.approx(2 * mixtral.n_params_active)
    assert cost.expected_experts_touched(mixtral, 1) == 2
    assert cost.expected_experts_touched(mixtral, 64) == pytest.approx(8, rel=1e-6)
    assert cost.weight_bytes(mixtral, "bf16", tokens=64) == pytest.approx(
        2 * mixtral.n_params, rel=1e-6
    )
    assert cost.weight_storage_bytes(mixtral, "bf16") == 2 * mixtral.n_params


# ---- one step --------------------------------------------------------------------------------


def test_batching_reads_weights_once():
    one, sixteen = cost.step("llama-3-8b", batch=1), cost.step("llama-3-8b", batch=16)
    assert sixteen.weight_bytes == one.weight_bytes
    assert sixteen.kv_bytes == 16 * one.kv_bytes
    assert sixteen.flops == 16 * one.flops
    assert sixteen.arithmetic_intensity == pytest.approx(16 * one.arithmetic_intensity, rel=0.05)


def test_kv_bytes_read_context_and_write_new_tokens():
    spec = MODELS["smollm2-135m"]
    ledger = cost.step(spec, batch=3, context=100, new_tokens=5, weight_dtype="fp32")
    assert ledger.kv_dtype == "fp32"
    assert ledger.kv_bytes == 3 * 105 * cost.kv_bytes_per_token(spec, "fp32")
    assert ledger.total_bytes == ledger.weight_bytes + ledger.kv_bytes + ledger.activation_bytes


def test_flops_formula():
    spec = MODELS["llama-3.2-1b"]
    ledger = cost.step(spec, batch=2, context=10, new_tokens=3)
    attended = 2 * (3 * 10 + 1 + 2 + 3)  # causal: the i-th new token sees context + i positions
    attention = 4 * spec.n_layers * spec.n_heads * spec.head_dim * attended
    assert ledger.flops == 2 * 6 * cost.matmul_params_per_token(spec) + attention
    # The matmuls are every parameter except the lookup table, plus the (tied) output head.
    norms = spec.n_layers * spec.n_norm_params_per_layer + spec.n_final_norm_params
    assert cost.matmul_params_per_token(spec) == spec.n_params - norms


def test_long_context_large_batch_is_dominated_by_kv():
    short = cost.step("llama-3-8b", batch=1, context=128)
    long = cost.step("llama-3-8b", batch=64, context=8000)
    assert short.weight_bytes > 100 * short.kv_bytes
    assert long.kv_bytes > long.weight_bytes


def test_quantized_weights_compute_in_bf16_and_keep_a_bf16_cache():
    ledger = cost.step("llama-3-8b", weight_dtype="int4")
    assert (ledger.compute_dtype, ledger.kv_dtype) == ("bf16", "bf16")
    assert ledger.weight_bytes == pytest.approx(cost.step("llama-3-8b").weight_bytes / 4)


def test_prefill_is_compute_bound_on_h100():
    prefill = cost.step("llama-3-8b", context=0, new_tokens=4096)
    assert prefill.arithmetic_intensity > cost.ridge_point("h100-sxm")
    assert cost.step_time_lower_bound(prefill, "h100-sxm") == cost.compute_time(prefill, "h100-sxm")


def test_missing_16_bit_rate_falls_back_without_underestimating_speed():
    assert cost.peak_flops("t4", "bf16") == 65e12  # T4 has fp16 only
    cpu_like = dataclasses.replace(HARDWARE["t4"], name="cpu", peak_flops={"fp32": 1e11})
    assert cost.peak_flops(cpu_like, "bf16") == 1e11
    with pytest.raises(ValueError, match="fp32"):
        cost.peak_flops(cpu_like, "int8")


# ---- memory budget ---------------------------------------------------------------------------


def test_memory_budget():
    weights = cost.weight_storage_bytes("llama-3-8b", "bf16")
    per_user = cost.kv_cache_bytes("llama-3-8b", 8192)
    assert (
        cost.memory_budget("llama-3-8b", "h100-sxm", 8192)
        == int((80e9 - weights) // per_user)
        == 59
    )
    assert cost.memory_budget("llama-3-70b", "h100-sxm", 1024) == 0  # 141 GB of weights don't fit
    assert cost.memory_budget("llama-3-70b", "h100-sxm", 1024, weight_dtype="int4") > 0


# ---- calc ------------------------------------------------------------------------------------


def test_calc_summarises_the_ledger():
    result = cost.calc("llama-3-8b", "h100-sxm", "bf16", context=8192, batch=16)
    ledger = cost.step("llama-3-8b", batch=16, context=8191)
    assert result["weight_bytes"] == ledger.weight_bytes
    assert result["kv_bytes_per_token"] == 128 * KiB
    assert result["kv_bytes_total"] == cost.kv_cache_bytes("llama-3-8b", 8192, 16) == 16 * 2**30
    assert result["step_time_s"] == cost.step_time_lower_bound(ledger, "h100-sxm")
    assert result["tokens_per_s_total"] == pytest.approx(16 * result["tokens_per_s_per_user"])
    assert result["bound"] == "memory"
    assert result["fits"] is True and result["max_users"] == 59
    assert (
        result["memory_needed_bytes"] == result["weight_storage_bytes"] + result["kv_bytes_total"]
    )


def test_calc_with_fewer_kv_heads_shrinks_the_cache():
    mha = cost.calc("llama-3-8b", "h100-sxm", context=8192, kv_heads=32)
    mqa = cost.calc("llama-3-8b", "h100-sxm", context=8192, kv_heads=1)
    assert mha["kv_bytes_per_token"] == 32 * mqa["kv_bytes_per_token"]
    assert mqa["max_users"] > mha["max_users"]


def test_calc_reports_when_it_does_not_fit():
    result = cost.calc("llama-3-70b", "l4", context=1024)
    assert result["fits"] is False and result["max_users"] == 0


# ---- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"batch": 0}, "batch"),
        ({"batch": -3}, "batch"),
        ({"batch": 1.5}, "batch"),
        ({"context": -1}, "context"),
        ({"new_tokens": 0}, "new_tokens"),
        ({"context": 8192}, "maximum of 8192"),  # 8192 cached + 1 new is one too many
        ({"weight_dtype": "fp64"}, "choose from"),
        ({"kv_dtype": "int2"}, "choose from"),
    ],
)
def test_step_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        cost.step("llama-3-8b", **kwargs)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"context": 0}, "context"),
        ({"context": 10**6}, "maximum"),
        ({"batch": 0}, "batch"),
        ({"dtype": "float32"}, "choose from"),
        ({"kv_heads": 3}, "multiple"),
        ({"kv_heads": 0}, "kv_heads"),
        ({"model": "llama-5"}, "llama-3-8b"),
        ({"hardware": "b200"}, "h100-sxm"),
    ],
)
def test_calc_rejects_bad_input(kwargs, message):
    args = {"model": "llama-3-8b", "hardware": "h100-sxm", **kwargs}
    with pytest.raises(ValueError, match=message):
        cost.calc(**args)


def test_other_bad_input():
    with pytest.raises(ValueError, match="maximum"):
        cost.kv_cache_bytes("gpt2", 2000)
    with pytest.raises(ValueError, match="positive"):
        cost.weight_bytes_for_params(0)
    with pytest.raises(ValueError, match="positive"):
        cost.bandwidth_bound_tokens_per_s(0, "h100-sxm")
    with pytest.raises(ValueError, match="context"):
        cost.memory_budget("gpt2", "t4", 0)


def test_cost_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, memwall.cost; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_gpt2_position_table_is_looked_up_not_streamed():
    full = cost.weight_bytes("gpt2", "fp32")
    rows_only = cost.weight_bytes("gpt2", "fp32", tokens=2, count_input_embedding=False)
    assert full - rows_only == 4 * (1024 * 768 - 2 * 768)


def test_the_two_rows_add_up_to_the_step():
    ledger = cost.step("llama-3-8b", batch=4, context=100, new_tokens=3)
    matmuls, attention = cost.ledger_rows(ledger)
    assert (matmuls.name, attention.name) == ("weight matmuls", "attention")
    assert matmuls.flops + attention.flops == ledger.flops
    assert matmuls.bytes + attention.bytes == ledger.total_bytes
    assert attention.bytes == ledger.kv_bytes
    assert matmuls.flops == 2 * 12 * cost.matmul_params_per_token("llama-3-8b")


def test_batch_1024_of_llama_3_8b_has_compute_bound_matmuls():
    result = cost.calc("llama-3-8b", "h100-sxm", context=1024, batch=1024)
    # As a whole the step is dominated by its 137 GB of KV reads...
    assert result["memory_time_s"] > result["compute_time_s"]
    # ...but the matmuls alone are far past the ridge point, and only attention is memory-bound.
    assert result["matmul_bound"] == "compute" and result["attention_bound"] == "memory"
    assert result["matmul_arithmetic_intensity"] > 2 * result["ridge_point"]
    assert result["bound"] == "mixed"
    assert result["sequential_step_time_s"] == pytest.approx(
        result["matmul_time_s"] + result["attention_time_s"]
    )
    assert result["sequential_step_time_s"] > result["step_time_s"]


def test_batch_1_rows_are_both_memory_bound_and_keep_the_worked_numbers():
    result = cost.calc("llama-3-8b", "h100-sxm", context=1, batch=1)
    assert result["bound"] == result["matmul_bound"] == result["attention_bound"] == "memory"
    assert result["sequential_step_time_s"] == pytest.approx(result["step_time_s"])
    assert round(result["matmul_arithmetic_intensity"]) == 1  # batch-1 decode: about 1


@pytest.mark.parametrize("kv_heads", [32, 8, 4, 1])
def test_gqa_raises_attention_intensity_by_heads_over_kv_heads(kv_heads):
    # bf16 KV: 4 H d FLOPs per position over 2 G d x 2 bytes = H / G FLOPs per byte, any context.
    for context, batch in ((512, 1), (8192, 16)):
        result = cost.calc(
            "llama-3-8b", "h100-sxm", context=context, batch=batch, kv_heads=kv_heads
        )
        assert result["attention_arithmetic_intensity"] == pytest.approx(32 / kv_heads)
