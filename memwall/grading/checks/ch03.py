"""Checks for chapter 3, "Decode and the memory wall".

- ch03.decode_ceiling: tokens/s <= bandwidth / (weight bytes + KV bytes) read per step.
- ch03.llama_params: the weights row of the ledger, counted from a Llama-family shape.
- ch03.decode_step_ms: the roofline's step time, max(memory time, compute time), against batch.
"""

from memwall.grading import compare_function, register

CASES_PER_CHECK = 12


def reference_decode_ceiling(bandwidth_gb_s, weight_gb, kv_gb):
    # Each token's step reads all weights and the whole KV cache once.
    return bandwidth_gb_s / (weight_gb + kv_gb)


@register(
    "ch03.decode_ceiling",
    wrong_answers=[
        lambda bandwidth_gb_s, weight_gb, kv_gb: bandwidth_gb_s / weight_gb,  # forgets the KV cache
        lambda bandwidth_gb_s, weight_gb, kv_gb: (
            (weight_gb + kv_gb) / bandwidth_gb_s
        ),  # seconds, not tokens/s
    ],
)
def check_decode_ceiling(student, rng):
    cases = [
        dict(
            bandwidth_gb_s=rng.uniform(20, 5000),
            weight_gb=rng.uniform(0.1, 150),
            kv_gb=rng.choice([0.0, rng.uniform(0.01, 40)]),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    cases[0]["kv_gb"] = 1.0  # at least one case where the cache matters
    return compare_function(student, reference_decode_ceiling, cases)


def reference_llama_params(
    n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, tied
):
    attention = (
        d_model * (n_heads + 2 * n_kv_heads) * head_dim + n_heads * head_dim * d_model
    )  # q,k,v + o
    mlp = 3 * d_model * d_ff  # gate, up, down
    norms = 2 * d_model  # RMSNorm weights before attention and before the MLP
    embeddings = vocab_size * d_model * (1 if tied else 2)  # input table, and an untied output head
    return n_layers * (attention + mlp + norms) + d_model + embeddings  # + the final norm


def _wrong_mha_params(n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, tied):
    return reference_llama_params(
        n_layers, d_model, n_heads, n_heads, head_dim, d_ff, vocab_size, tied
    )


def _wrong_ignores_tying(n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, tied):
    return reference_llama_params(
        n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, False
    )


@register("ch03.llama_params", wrong_answers=[_wrong_mha_params, _wrong_ignores_tying])
def check_llama_params(student, rng):
    cases = []
    for number in range(CASES_PER_CHECK):
        n_kv_heads = rng.choice([1, 2, 4, 8])
        n_heads = n_kv_heads * rng.choice([2, 4, 8])  # grouped-query: every case has fewer KV heads
        head_dim = rng.choice([64, 128])
        cases.append(
            dict(
                n_layers=rng.randint(2, 80),
                d_model=rng.choice([512, 1024, 2048, 4096]),
                n_heads=n_heads,
                n_kv_heads=n_kv_heads,
                head_dim=head_dim,
                d_ff=rng.choice([1536, 8192, 14336]),
                vocab_size=rng.randint(32000, 152064),
                tied=number % 2 == 0,
            )
        )
    return compare_function(student, reference_llama_params, cases)


def reference_decode_step_ms(batch, weight_gb, params_billion, bandwidth_gb_s, peak_tflops):
    memory_ms = weight_gb / bandwidth_gb_s * 1e3  # the weights are read once for the whole batch
    compute_ms = (
        2 * params_billion * 1e9 * batch / (peak_tflops * 1e12) * 1e3
    )  # 2 FLOPs per weight per token
    return max(memory_ms, compute_ms)


@register(
    "ch03.decode_step_ms",
    wrong_answers=[
        lambda batch, weight_gb, params_billion, bandwidth_gb_s, peak_tflops: (
            weight_gb / bandwidth_gb_s * 1e3
        ),
        lambda batch, weight_gb, params_billion, bandwidth_gb_s, peak_tflops: (
            weight_gb / bandwidth_gb_s * 1e3 + 2 * params_billion * batch / peak_tflops
        ),  # adds instead of max
        lambda batch, weight_gb, params_billion, bandwidth_gb_s, peak_tflops: max(
            weight_gb / bandwidth_gb_s * 1e3, params_billion * batch / peak_tflops
        ),  # 1 FLOP per weight
    ],
)
def check_decode_step_ms(student, rng):
    cases = []
    for _ in range(CASES_PER_CHECK):
        params = rng.uniform(0.1, 70)
        cases.append(
            dict(
                batch=rng.choice([1, 4, 64, 512, 2048, 8192]),
                weight_gb=params * rng.choice([0.5, 1, 2]),
                params_billion=params,
                bandwidth_gb_s=rng.uniform(50, 5000),
                peak_tflops=rng.uniform(1, 1000),
            )
        )
    cases[0].update(batch=8192, peak_tflops=10.0)  # surely compute-bound
    cases[1].update(batch=1)  # surely memory-bound
    return compare_function(student, reference_decode_step_ms, cases)
