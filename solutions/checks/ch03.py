"""Checks for chapter 3, "Decode and the memory wall".

- ch03.cache_cliff (measured): find the last-level cache in a bandwidth sweep timed with a fake
  clock; a sweep that reads each size once, or cycles through the sizes, sees no cliff.
- ch03.llama_params: the weights row of the ledger, counted from a Llama-family shape with a gated
  (SwiGLU) or a plain MLP; memwall's ModelSpec counts only the gated kind, so it does not answer.
- ch03.decode_step_ms: the roofline's step time, max(memory time, compute time), against batch.
"""

from memwall.fakeclock import bench_spec
from memwall.grading.measured_compare import noisy_machine
from memwall.grading.registry import register_cases

CASES_PER_CHECK = 12


def cache_sweep_cases(rng, n_cases=8):
    """Bandwidth sweeps over buffer sizes on a machine whose last-level cache sits somewhere."""
    cases = []
    for _ in range(n_cases):
        sizes = [2**k for k in range(16, 29)]  # 64 KiB ... 256 MiB
        fits = rng.randint(3, 9)  # index of the largest size that fits in the cache
        cache_bytes = int(sizes[fits] * rng.uniform(1.1, 1.8))
        memory_gb_s = rng.uniform(10, 200)
        bench = bench_spec(
            "cache_sweep",
            machine=noisy_machine(rng),
            cache_bytes=cache_bytes,
            cache_gb_s=memory_gb_s * rng.uniform(2.5, 6.0),
            memory_gb_s=memory_gb_s,
        )
        cases.append(dict(bench=bench, sizes=sizes, repeats=rng.randint(5, 9)))
    return cases


def reference_cache_cliff(bench, sizes, repeats):
    # The truth of the pretend machine: the largest buffer in the sweep that fits in its cache.
    return max(size for size in sizes if size <= bench["spec"]["cache_bytes"])


def _read_seconds(bench, n_bytes):
    start = bench.clock()
    bench.read(n_bytes)
    return bench.clock() - start


def _biggest_drop(sizes, gb_s):
    drops = [gb_s[i] / gb_s[i + 1] for i in range(len(sizes) - 1)]
    return sizes[drops.index(max(drops))]


def _one_cold_read_each(bench, sizes, repeats):  # every first read comes from memory
    return _biggest_drop(sizes, [n / _read_seconds(bench, n) for n in sizes])


def _sizes_round_robin(bench, sizes, repeats):  # each read evicts the last size
    times = {n: [] for n in sizes}
    for _ in range(repeats):
        for n in sizes:
            times[n].append(_read_seconds(bench, n))
    return _biggest_drop(sizes, [n / sorted(times[n])[len(times[n]) // 2] for n in sizes])


def _first_size_that_misses(bench, sizes, repeats):  # the right sweep, off by one size
    gb_s = []
    for n in sizes:
        bench.read(n)
        gb_s.append(n / sorted(_read_seconds(bench, n) for _ in range(repeats))[repeats // 2])
    return sizes[sizes.index(_biggest_drop(sizes, gb_s)) + 1]


@register_cases(
    "ch03.cache_cliff",
    reference=reference_cache_cliff,
    rtol=0,
    measured=True,
    wrong_answers=[_one_cold_read_each, _sizes_round_robin, _first_size_that_misses],
)
def cases_cache_cliff(rng):
    return cache_sweep_cases(rng)


def reference_llama_params(
    n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, tied, gated
):
    attention = (
        d_model * (n_heads + 2 * n_kv_heads) * head_dim + n_heads * head_dim * d_model
    )  # q,k,v + o
    mlp = (3 if gated else 2) * d_model * d_ff  # gate, up, down; a plain MLP has no gate
    norms = 2 * d_model  # RMSNorm weights before attention and before the MLP
    embeddings = vocab_size * d_model * (1 if tied else 2)  # input table, and an untied output head
    return n_layers * (attention + mlp + norms) + d_model + embeddings  # + the final norm


def _wrong_mha_params(
    n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, tied, gated
):
    return reference_llama_params(
        n_layers, d_model, n_heads, n_heads, head_dim, d_ff, vocab_size, tied, gated
    )


def _wrong_ignores_tying(
    n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, tied, gated
):
    return reference_llama_params(
        n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, False, gated
    )


def _memwall_model_spec(
    n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff, vocab_size, tied, gated
):
    # The package's count (ModelSpec.n_params): a Llama MLP is always gated there.
    from memwall.specs import ModelSpec

    shape = ModelSpec("exercise", n_layers, d_model, n_heads, n_kv_heads, head_dim, d_ff,
                      vocab_size, tied, max_context=1)  # fmt: skip
    return shape.n_params


@register_cases(
    "ch03.llama_params",
    reference=reference_llama_params,
    wrong_answers=[_wrong_mha_params, _wrong_ignores_tying, _memwall_model_spec],
)
def cases_llama_params(rng):
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
                gated=number % 4 >= 2,  # every pairing of tied and gated, in every four cases
            )
        )
    return cases


def reference_decode_step_ms(batch, weight_gb, params_billion, bandwidth_gb_s, peak_tflops):
    memory_ms = weight_gb / bandwidth_gb_s * 1e3  # the weights are read once for the whole batch
    compute_ms = (
        2 * params_billion * 1e9 * batch / (peak_tflops * 1e12) * 1e3
    )  # 2 FLOPs per weight per token
    return max(memory_ms, compute_ms)


@register_cases(
    "ch03.decode_step_ms",
    reference=reference_decode_step_ms,
    wrong_answers=[
        lambda batch, weight_gb, params_billion, bandwidth_gb_s, peak_tflops: (
            weight_gb / bandwidth_gb_s * 1000.0
        ),
        lambda batch, weight_gb, params_billion, bandwidth_gb_s, peak_tflops: (
            weight_gb / bandwidth_gb_s * 1000.0 + 2 * params_billion * batch / peak_tflops
        ),
        lambda batch, weight_gb, params_billion, bandwidth_gb_s, peak_tflops: max(
            weight_gb / bandwidth_gb_s * 1000.0, params_billion * batch / peak_tflops
        ),
    ],
)
def cases_decode_step_ms(rng):
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
    return cases
