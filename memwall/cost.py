"""The bytes-and-FLOPs ledger of one forward step, and what the roofline makes of it.

Every byte a step moves falls in one of three accounts:
- weights: read once per step, however many tokens the step processes (the fixed cost);
- KV cache: each sequence reads the keys and values of its whole context (grows with context x users);
- activations: the vectors flowing between layers (small in decode, large in prefill).

The FLOPs and bytes also fall in two rows that the roofline must see apart (`ledger_rows`):
- weight matmuls: every linear layer, with the weights and activations it moves. Its intensity
  grows with the tokens per step (batch x new tokens), so big batches make it compute-bound;
- attention: q.k and p.v over the KV cache. Each sequence reads its own cache, so batching does
  not raise its intensity; sharing KV heads does, by heads / KV heads (GQA, MQA).
Added together the two hide each other: batch 1,024 of Llama 3 8B looks memory-bound as a whole
while its matmuls are compute-bound.

The roofline (Williams et al., 2009) turns bytes and FLOPs into a lower bound on time:
    step time >= max(bytes / memory bandwidth, FLOPs / peak FLOP/s),
and so an upper bound on tokens/s. Measured speeds land below it, never above. The byte and
FLOP accounting follows Pope et al., 2022 ("Efficiently Scaling Transformer Inference") and
Kipply's "Transformer Inference Arithmetic".

Pure arithmetic: no torch, so the book's calculators and widgets stay instant. The static
page's calculator repeats these formulas in JavaScript (`widgets/calculator_core.js`): a change
here goes there too, and tests/test_calculator.py (which needs node) checks that both agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

from memwall.hardware import Hardware, get_hardware
from memwall.specs import ModelSpec, get_spec
from memwall.validate import count

# Bytes per stored element. Q4_1 (llama.cpp/GGUF) packs 32 weights as 4-bit codes plus an fp16
# scale and an fp16 minimum: 16 + 2 + 2 = 20 bytes per 32 weights, i.e. 5 bits per weight.
DTYPE_BYTES: dict[str, float] = {
    "fp32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "int8": 1,
    "int4": 0.5,
    "q4_1": 20 / 32,
}
# Group-wise integer formats are written "int4-g128": every group of 128 weights also stores an
# fp16 scale and an fp16 zero point, i.e. 4 more bytes per group.
GROUPED_BASES = ("int8", "int4")
GROUP_METADATA_BYTES = 4

# Dtypes the matmul units can run on. Weight-only formats (int8, int4, q4_1, ...) are dequantized
# to 16-bit for the multiply, as in chapter 7, so their compute runs at the bf16 rate.
FLOAT_COMPUTE_DTYPES = ("fp32", "fp16", "bf16")


def bytes_per_element(dtype: str) -> float:
    """Storage bytes per element of `dtype`, including group-wise metadata ("int4-g128")."""
    if dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    base, _, group = str(dtype).partition("-g")
    if base in GROUPED_BASES and group.isdigit() and int(group) > 0:
        return DTYPE_BYTES[base] + GROUP_METADATA_BYTES / int(group)
    raise ValueError(
        f"Unknown dtype {dtype!r}; choose from {', '.join(DTYPE_BYTES)}, "
        f"or a group-wise {'/'.join(GROUPED_BASES)} such as 'int4-g128'."
    )


def compute_dtype_for(weight_dtype: str) -> str:
    bytes_per_element(weight_dtype)  # validates
    return weight_dtype if weight_dtype in FLOAT_COMPUTE_DTYPES else "bf16"


# ---- input checks ------------------------------------------------------------------------------


def _check_context(spec: ModelSpec, tokens: int) -> None:
    if tokens > spec.max_context:
        raise ValueError(
            f"A context of {tokens} tokens exceeds {spec.name}'s maximum of "
            f"{spec.max_context}; choose a context between 1 and {spec.max_context}."
        )


# ---- weights -------------------------------------------------------------------------------------


def weight_bytes_for_params(n_params: float, dtype: str = "bf16") -> float:
    """Bytes to hold `n_params` parameters: the rule of thumb (1B params in bf16 = 2 GB)."""
    if not n_params > 0:
        raise ValueError(f"n_params must be positive, got {n_params!r}.")
    return n_params * bytes_per_element(dtype)


def weight_storage_bytes(spec: ModelSpec | str, dtype: str = "bf16") -> float:
    """Bytes the weights occupy in memory: every parameter, every expert."""
    return weight_bytes_for_params(get_spec(spec).n_params, dtype)


def expected_experts_touched(spec: ModelSpec | str, tokens: int = 1) -> float:
    """Experts per layer a step has to read when `tokens` tokens each pick n_active_experts.

    Assumes the router spreads tokens uniformly: an expert is missed by one token with probability
    1 - k/E, so by all of them with (1 - k/E)^tokens. One token reads exactly k experts; a big batch
    reads nearly all E, which is why MoE decode gets less from batching than a dense model.
    """
    spec = get_spec(spec)
    tokens = count("tokens", tokens, 1)
    if spec.n_experts == 1:
        return 1.0
    miss_one = 1 - spec.n_active_experts / spec.n_experts
    return spec.n_experts * (1 - miss_one**tokens)


def weight_bytes(
    spec: ModelSpec | str, dtype: str = "bf16", tokens: int = 1, count_input_embedding: bool = True
) -> float:
    """Weight bytes read by one step that processes `tokens` tokens (all sequences together).

    Every parameter is counted once per step, which is the rule of thumb the book quotes (Llama 3 8B
    is 16 GB in bf16). One subtlety: an untied input embedding table is never streamed whole, since
    each token reads one row of it. Counting it anyway overstates the bytes of untied models (by
    6.5% for Llama 3 8B) and makes the ceiling slightly pessimistic; pass
    `count_input_embedding=False` to count only the rows read. Tied models (SmolLM2, GPT-2,
    Llama 3.2) are exact either way, because their table is read whole as the output head.
    For a mixture of experts only the experts the step's tokens touch are read.
    """
    spec = get_spec(spec)
    tokens = count("tokens", tokens, 1)
    untouched_experts = spec.n_experts - expected_experts_touched(spec, tokens)
    params = spec.n_params - spec.n_layers * untouched_experts * spec.n_ffn_params_per_expert
    if not count_input_embedding:
        # Tables only ever looked up: an untied token table, and GPT-2's position table.
        lookup_only = spec.n_embedding_params - (
            spec.n_lm_head_params if spec.tied_embeddings else 0
        )
        lookup_tables = (0 if spec.tied_embeddings else 1) + (1 if spec.arch == "gpt2" else 0)
        params += -lookup_only + tokens * lookup_tables * spec.d_model
    return params * bytes_per_element(dtype)


# ---- KV cache ------------------------------------------------------------------------------------


def kv_bytes_per_token(spec: ModelSpec | str, kv_dtype: str = "bf16") -> float:
    """2 (key and value) x layers x KV heads x head dim x bytes: what each token adds to the cache."""
    spec = get_spec(spec)
    return 2 * spec.n_layers * spec.n_kv_heads * spec.head_dim * bytes_per_element(kv_dtype)


def kv_cache_bytes(
    spec: ModelSpec | str, context: int, batch: int = 1, kv_dtype: str = "bf16"
) -> float:
    """Bytes of KV cache for `batch` sequences of `context` tokens each."""
    spec = get_spec(spec)
    context, batch = count("context", context, 0), count("batch", batch, 1)
    _check_context(spec, context)
    return batch * context * kv_bytes_per_token(spec, kv_dtype)


# ---- one step ------------------------------------------------------------------------------------


def matmul_params_per_token(spec: ModelSpec | str) -> int:
    """Weights one token multiplies by: every linear layer it passes through, plus the output head.

    The input embedding is a lookup (no FLOPs); only the active experts count.
    """
    spec = get_spec(spec)
    per_layer = (
        spec.n_attention_params_per_layer
        + spec.n_router_params_per_layer
        + spec.n_active_experts * spec.n_ffn_params_per_expert
    )
    return spec.n_layers * per_layer + spec.n_lm_head_params


def activation_elements_per_token(spec: ModelSpec | str) -> int:
    """Elements a token's activations move: each matmul reads its input vector and writes its output.

    An estimate of the traffic between kernels. Attention scores are left out, because fused
    attention kernels (FlashAttention, SDPA) keep them on chip; norms and residual adds are fused
    away too. In decode this is tiny next to the weights; in long prefills it is not.
    """
    spec = get_spec(spec)
    q_out, kv_out = spec.n_heads * spec.head_dim, spec.n_kv_heads * spec.head_dim
    attention = (spec.d_model + q_out + 2 * kv_out) + (q_out + spec.d_model)
    if spec.arch == "gpt2":
        ffn = (spec.d_model + spec.d_ff) + (spec.d_ff + spec.d_model)
    else:  # gate and up each read the input and write d_ff; down reads d_ff and writes d_model
        ffn = 2 * (spec.d_model + spec.d_ff) + (spec.d_ff + spec.d_model)
    per_layer = attention + spec.n_active_experts * ffn
    return spec.n_layers * per_layer + spec.d_model + spec.vocab_size  # + output head


@dataclass(frozen=True)
class StepCost:
    """Bytes and FLOPs of one forward step over `batch` sequences, each adding `new_tokens` tokens
    after `context` cached ones."""

    batch: int
    context: int
    new_tokens: int
    weight_dtype: str
    kv_dtype: str
    compute_dtype: str
    weight_bytes: float
    kv_bytes: float
    activation_bytes: float
    flops: float  # all of them: weight matmuls + attention
    attention_flops: float = 0.0

    @property
    def tokens(self) -> int:
        return self.batch * self.new_tokens

    @property
    def matmul_flops(self) -> float:
        return self.flops - self.attention_flops

    @property
    def matmul_bytes(self) -> float:
        """The weights, and the activations the linear layers read and write."""
        return self.weight_bytes + self.activation_bytes

    @property
    def attention_bytes(self) -> float:
        """The KV cache read and written (q and the output are counted with the matmuls)."""
        return self.kv_bytes

    @property
    def total_bytes(self) -> float:
        return self.weight_bytes + self.kv_bytes + self.activation_bytes

    @property
    def arithmetic_intensity(self) -> float:
        """FLOPs per byte moved. Compare with the hardware's ridge point."""
        return self.flops / self.total_bytes


def step(
    spec: ModelSpec | str,
    batch: int = 1,
    context: int = 0,
    new_tokens: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str | None = None,
    count_input_embedding: bool = True,
) -> StepCost:
    """The ledger of one forward step.

    `context` tokens per sequence are already cached; the step adds `new_tokens` more to each of
    `batch` sequences. Decode is new_tokens=1; a prefill chunk or a speculative verify pass is
    new_tokens>1. The KV cache defaults to the compute dtype (bf16 for quantized weights).

    - weight bytes: see `weight_bytes`; read once for all batch x new_tokens tokens.
    - KV bytes: each sequence reads its `context` cached positions and writes `new_tokens` new ones:
      batch x (context + new_tokens) x kv_bytes_per_token.
    - FLOPs: 2 per multiply-add, so 2 x matmul_params_per_token per token, plus attention: per layer
      and attended position, q.k and p.v cost 2 x heads x head_dim each, i.e. 4 x heads x head_dim.
      With a causal mask the i-th new token (from 1) attends context + i positions.
    """
    spec = get_spec(spec)
    batch, context = count("batch", batch, 1), count("context", context, 0)
    new_tokens = count("new_tokens", new_tokens, 1)
    _check_context(spec, context + new_tokens)
    compute_dtype = compute_dtype_for(weight_dtype)
    kv_dtype = kv_dtype or compute_dtype
    tokens = batch * new_tokens

    attended_positions = batch * (new_tokens * context + new_tokens * (new_tokens + 1) // 2)
    attention_flops = 4 * spec.n_layers * spec.n_heads * spec.head_dim * attended_positions
    return StepCost(
        batch=batch,
        context=context,
        new_tokens=new_tokens,
        weight_dtype=weight_dtype,
        kv_dtype=kv_dtype,
        compute_dtype=compute_dtype,
        weight_bytes=weight_bytes(spec, weight_dtype, tokens, count_input_embedding),
        kv_bytes=batch * (context + new_tokens) * kv_bytes_per_token(spec, kv_dtype),
        activation_bytes=tokens
        * activation_elements_per_token(spec)
        * bytes_per_element(compute_dtype),
        flops=2 * tokens * matmul_params_per_token(spec) + attention_flops,
        attention_flops=attention_flops,
    )


class LedgerRow(NamedTuple):
    """One row of the split ledger: a kind of work with its own FLOPs, bytes and intensity."""

    name: str  # "weight matmuls" or "attention"
    flops: float
    bytes: float

    @property
    def arithmetic_intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else math.inf


def ledger_rows(cost: StepCost) -> tuple[LedgerRow, LedgerRow]:
    """(weight matmuls, attention) of one step. Their FLOPs and bytes add up to the step's."""
    return (
        LedgerRow("weight matmuls", cost.matmul_flops, cost.matmul_bytes),
        LedgerRow("attention", cost.attention_flops, cost.attention_bytes),
    )


# ---- the roofline ----------------------------------------------------------------------------------


def peak_flops(hw: Hardware | str, dtype: str = "bf16") -> float:
    """Dense peak FLOP/s of `hw` (an object or a catalog name) for `dtype`; see
    `Hardware.compute_rate` for chips without a rate for that dtype."""
    return get_hardware(hw).compute_rate(dtype)


def ridge_point(hw: Hardware | str, dtype: str = "bf16") -> float:
    """FLOPs per byte where the roofline bends (`Hardware.ridge_point`, for a name or object)."""
    return get_hardware(hw).ridge_point(dtype)


def memory_time(cost: StepCost, hw: Hardware | str) -> float:
    return cost.total_bytes / get_hardware(hw).memory_bandwidth


def compute_time(cost: StepCost, hw: Hardware | str, dtype: str | None = None) -> float:
    return cost.flops / peak_flops(hw, dtype or cost.compute_dtype)


def step_time_lower_bound(cost: StepCost, hw: Hardware | str, dtype: str | None = None) -> float:
    """Seconds the step takes at least: it cannot move its bytes or do its FLOPs any faster."""
    hw = get_hardware(hw)
    return max(memory_time(cost, hw), compute_time(cost, hw, dtype))


def row_floor(row: LedgerRow, hw: Hardware | str, dtype: str = "bf16") -> dict:
    """A row's own roofline: memory time, compute time, the larger (its floor), and its bound."""
    hw = get_hardware(hw)
    memory_s, compute_s = row.bytes / hw.memory_bandwidth, row.flops / peak_flops(hw, dtype)
    return {
        "flops": row.flops,
        "bytes": row.bytes,
        "arithmetic_intensity": row.arithmetic_intensity,
        "memory_time_s": memory_s,
        "compute_time_s": compute_s,
        "time_s": max(memory_s, compute_s),
        "bound": "memory" if memory_s >= compute_s else "compute",
    }


def split_bound(cost: StepCost, hw: Hardware | str, dtype: str | None = None) -> str:
    """ "memory" or "compute" when both rows agree; otherwise "mixed" (say which row is which)."""
    bounds = {row_floor(row, hw, dtype or cost.compute_dtype)["bound"] for row in ledger_rows(cost)}
    return bounds.pop() if len(bounds) == 1 else "mixed"


class TokenRate(NamedTuple):
    per_user: float  # tokens/s one sequence sees
    total: float  # tokens/s summed over the batch


def tokens_per_s_ceiling(cost: StepCost, hw: Hardware | str, dtype: str | None = None) -> TokenRate:
    """Upper bound on tokens/s: each sequence gains new_tokens per step of at least the bound above.
    (For a speculative verify pass, new_tokens counts positions checked, not tokens accepted.)"""
    seconds = step_time_lower_bound(cost, hw, dtype)
    return TokenRate(per_user=cost.new_tokens / seconds, total=cost.tokens / seconds)


def bandwidth_bound_tokens_per_s(bytes_per_step: float, hw: Hardware | str) -> float:
    """The decode rule of thumb: tokens/s <= bandwidth / bytes read per token.

    The memory roof alone. A ceiling is min(memory roof, compute roof): use
    `tokens_per_s_ceiling` (or `memwall.ceilings.ceiling` for measured bytes and FLOPs) wherever
    a step may be compute-bound (batches, prefill, speculative verification).
    """
    if not bytes_per_step > 0:
        raise ValueError(f"bytes_per_step must be positive, got {bytes_per_step!r}.")
    return get_hardware(hw).memory_bandwidth / bytes_per_step


def memory_budget(
    spec: ModelSpec | str,
    hw: Hardware | str,
    context: int,
    weight_dtype: str = "bf16",
    kv_dtype: str | None = None,
) -> int:
    """How many sequences of `context` tokens fit next to the weights (0 if the weights don't fit).

    An upper bound: it ignores activations, fragmentation and the framework's own memory.
    """
    spec, hw = get_spec(spec), get_hardware(hw)
    context = count("context", context, 1)
    kv_dtype = kv_dtype or compute_dtype_for(weight_dtype)
    free = hw.memory_bytes - weight_storage_bytes(spec, weight_dtype)
    if free <= 0:
        return 0
    return math.floor(free / kv_cache_bytes(spec, context, 1, kv_dtype))


def calc(
    model: ModelSpec | str,
    hardware: Hardware | str,
    dtype: str = "bf16",
    context: int = 1024,
    batch: int = 1,
    kv_dtype: str | None = None,
    kv_heads: int | None = None,
) -> dict:
    """Everything `memwall calc` prints, for decoding the last token of `batch` sequences of
    `context` tokens each (so each sequence attends to `context` cached positions, this one included)."""
    spec, hw = get_spec(model), get_hardware(hardware)
    if kv_heads is not None:
        spec = spec.with_kv_heads(count("kv_heads", kv_heads, 1))
    context, batch = count("context", context, 1), count("batch", batch, 1)
    cost = step(
        spec, batch=batch, context=context - 1, new_tokens=1, weight_dtype=dtype, kv_dtype=kv_dtype
    )
    rate = tokens_per_s_ceiling(cost, hw)
    memory_needed = weight_storage_bytes(spec, dtype) + kv_cache_bytes(
        spec, context, batch, cost.kv_dtype
    )
    mem_s, compute_s = memory_time(cost, hw), compute_time(cost, hw)
    matmuls, attention = (row_floor(row, hw, cost.compute_dtype) for row in ledger_rows(cost))
    return {
        "model": spec.name,
        "hardware": hw.name,
        "dtype": dtype,
        "kv_dtype": cost.kv_dtype,
        "compute_dtype": cost.compute_dtype,
        "context": context,
        "batch": batch,
        "n_kv_heads": spec.n_kv_heads,
        "n_params": spec.n_params,
        "n_params_active": spec.n_params_active,
        "weight_bytes": cost.weight_bytes,
        "weight_storage_bytes": weight_storage_bytes(spec, dtype),
        "kv_bytes_per_token": kv_bytes_per_token(spec, cost.kv_dtype),
        "kv_bytes_per_user": kv_cache_bytes(spec, context, 1, cost.kv_dtype),
        "kv_bytes_total": kv_cache_bytes(spec, context, batch, cost.kv_dtype),
        "activation_bytes": cost.activation_bytes,
        "bytes_per_step": cost.total_bytes,
        "flops_per_step": cost.flops,
        "arithmetic_intensity": cost.arithmetic_intensity,
        "ridge_point": ridge_point(hw, cost.compute_dtype),
        # Both rows memory-bound (or both compute-bound), or "mixed": see the two rows.
        "bound": split_bound(cost, hw),
        **{f"matmul_{key}": value for key, value in matmuls.items()},
        **{f"attention_{key}": value for key, value in attention.items()},
        # When the two run one after the other (as in memwall's engine), each at its own floor.
        "sequential_step_time_s": matmuls["time_s"] + attention["time_s"],
        "memory_bandwidth": hw.memory_bandwidth,
        "peak_flops": peak_flops(hw, cost.compute_dtype),
        "memory_time_s": mem_s,
        "compute_time_s": compute_s,
        "step_time_s": max(mem_s, compute_s),
        "tokens_per_s_per_user": rate.per_user,
        "tokens_per_s_total": rate.total,
        "memory_bytes": hw.memory_bytes,
        "memory_needed_bytes": memory_needed,
        "fits": memory_needed <= hw.memory_bytes,
        "max_users": memory_budget(spec, hw, context, dtype, cost.kv_dtype),
    }
