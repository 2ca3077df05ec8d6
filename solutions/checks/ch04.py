"""Checks for chapter 4, "The KV cache".

- ch04.kv_cost (measured): fit the step time's slope against the context on a fake clock,
  and say whether the cache's reads use up bandwidth or FLOPs.
- ch04.tokens_processed: positions run through the model, with and without a cache.
- ch04.cached_attention: one decode step of grouped-query attention over a growing cache,
  checked against memwall's engine (`memwall.engine.layers.attend`).
- ch04.step_time_ms: the predicted decode step time as the context grows.
"""

from memwall.fakeclock import bench_spec
from memwall.grading.measured_compare import noisy_machine
from memwall.grading.registry import register_cases

CASES_PER_CHECK = 12
# A sound fit (medians, then a least-squares line) lands within ~2% of the true slope.
KV_SLOPE_RTOL = 0.1


def kv_cost_cases(rng, n_cases=8):
    """Decode steps whose time grows with the context, on a noisy machine with a slow start."""
    cases = []
    for number in range(n_cases):
        weights_s = rng.uniform(5e-3, 50e-3)
        step = rng.choice([128, 256, 512])
        contexts = [step * i for i in range(1, rng.randint(8, 12) + 1)]
        # At the longest context the cache adds 80-200% of the weights' time.
        s_per_token = weights_s * rng.uniform(0.8, 2.0) / contexts[-1]
        kv_bytes_per_token = rng.choice([16, 32, 64, 128, 160]) * 1024
        kv_flops_per_token = rng.choice([4, 8, 16]) * kv_bytes_per_token / 2
        # One resource runs at 40-90% of its ceiling, the other well below (alternating cases).
        busy, idle = rng.uniform(0.4, 0.9), rng.uniform(0.01, 0.15)
        bytes_fraction, flops_fraction = (busy, idle) if number % 2 == 0 else (idle, busy)
        bench = bench_spec(
            "kv_steps",
            # rarer outliers than elsewhere: a fit over ~10 medians must not meet a context
            # where most of the repeats were interrupted
            machine=noisy_machine(rng, outlier_rate=rng.uniform(0.005, 0.015)),
            weights_s=weights_s,
            s_per_token=s_per_token,
        )
        cases.append(
            dict(
                bench=bench,
                contexts=contexts,
                repeats=rng.randint(7, 11),
                kv_bytes_per_token=kv_bytes_per_token,
                kv_flops_per_token=kv_flops_per_token,
                bandwidth_gb_s=kv_bytes_per_token / s_per_token / bytes_fraction / 1e9,
                peak_gflops=kv_flops_per_token / s_per_token / flops_fraction / 1e9,
            )
        )
    return cases


def reference_kv_cost(bench, contexts, repeats, kv_bytes_per_token, kv_flops_per_token,
                      bandwidth_gb_s, peak_gflops):  # fmt: skip
    # The pretend machine's true cost of one more cached token, and the resource it uses up most.
    s_per_token = bench["spec"]["s_per_token"]
    bound = _bound(s_per_token, kv_bytes_per_token, kv_flops_per_token, bandwidth_gb_s, peak_gflops)
    return {"s_per_token": s_per_token, "bound": bound}


def _bound(s_per_token, kv_bytes_per_token, kv_flops_per_token, bandwidth_gb_s, peak_gflops):
    bytes_fraction = kv_bytes_per_token / s_per_token / (bandwidth_gb_s * 1e9)
    flops_fraction = kv_flops_per_token / s_per_token / (peak_gflops * 1e9)
    return "bytes" if bytes_fraction >= flops_fraction else "flops"


def _step_seconds(bench, context):
    start = bench.clock()
    bench.step(context)
    return bench.clock() - start


def _line_slope(xs, ys):
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys))
    return covariance / sum((x - mean_x) ** 2 for x in xs)


def _median_times(bench, contexts, repeats):
    times = []
    for context in contexts:
        runs = sorted(_step_seconds(bench, context) for _ in range(repeats))
        times.append(runs[len(runs) // 2])
    return times


def _one_step_each(bench, contexts, repeats, *machine):  # the slow first steps bend the line
    slope = _line_slope(contexts, [_step_seconds(bench, c) for c in contexts])
    return {"s_per_token": slope, "bound": _bound(abs(slope) or 1e-12, *machine)}


def _time_over_context(bench, contexts, repeats, *machine):  # forgets the weights' fixed cost
    slope = _median_times(bench, contexts, repeats)[-1] / contexts[-1]
    return {"s_per_token": slope, "bound": _bound(slope, *machine)}


def _always_bytes(bench, contexts, repeats, *machine):  # a sound fit that never looks at FLOPs
    slope = _line_slope(contexts, _median_times(bench, contexts, repeats))
    return {"s_per_token": slope, "bound": "bytes"}


@register_cases(
    "ch04.kv_cost",
    reference=reference_kv_cost,
    rtol=KV_SLOPE_RTOL,
    measured=True,
    wrong_answers=[_one_step_each, _time_over_context, _always_bytes],
)
def cases_kv_cost(rng):
    return kv_cost_cases(rng)


def reference_tokens_processed(prompt_tokens, new_tokens, use_cache):
    if use_cache:
        # The prompt once (prefill), then one position per further token (the last one is never fed back).
        return prompt_tokens + new_tokens - 1
    # Step i (from 0) reruns the prompt and the i tokens generated so far.
    return new_tokens * prompt_tokens + new_tokens * (new_tokens - 1) // 2


@register_cases(
    "ch04.tokens_processed",
    reference=reference_tokens_processed,
    wrong_answers=[
        lambda prompt_tokens, new_tokens, use_cache: prompt_tokens + new_tokens - 1,
        lambda prompt_tokens, new_tokens, use_cache: (
            prompt_tokens + new_tokens - 1
            if use_cache
            else new_tokens * (prompt_tokens + new_tokens)
        ),
    ],
)
def cases_tokens_processed(rng):
    cases = [
        dict(
            prompt_tokens=rng.randint(1, 4000),
            new_tokens=rng.randint(2, 4000),
            use_cache=number % 2 == 0,
        )
        for number in range(CASES_PER_CHECK)
    ]
    return cases


def reference_cached_attention(q, k_cache, v_cache, k_new, v_new):
    """q [heads, d]; caches [kv_heads, T, d]; new k/v [kv_heads, d] -> output [heads, d]."""
    import torch

    from memwall.engine.layers import attend

    keys = torch.cat([k_cache, k_new[:, None]], dim=1)  # the new token attends to itself too
    values = torch.cat([v_cache, v_new[:, None]], dim=1)
    return attend(q[None, :, None], keys[None], values[None])[0, :, 0]


def _wrong_forgets_new_token(q, k_cache, v_cache, k_new, v_new):
    return reference_cached_attention(
        q, k_cache[:, :-1], v_cache[:, :-1], k_cache[:, -1], v_cache[:, -1]
    )


def _wrong_tiles_heads(q, k_cache, v_cache, k_new, v_new):
    # Pairs query head h with KV head h % kv_heads; GQA groups neighbours: h // (heads / kv_heads).
    import torch

    keys = torch.cat([k_cache, k_new[:, None]], dim=1)
    values = torch.cat([v_cache, v_new[:, None]], dim=1)
    group = q.shape[0] // keys.shape[0]
    keys, values = keys.repeat(group, 1, 1), values.repeat(group, 1, 1)
    weights = torch.softmax(q[:, None] @ keys.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return (weights @ values)[:, 0]


def _wrong_unscaled(q, k_cache, v_cache, k_new, v_new):
    return reference_cached_attention(q * q.shape[-1] ** 0.5, k_cache, v_cache, k_new, v_new)


def random_attention_case(rng, context=None):
    import torch

    generator = torch.Generator().manual_seed(rng.getrandbits(32))
    kv_heads, group, head_dim = rng.choice([2, 3, 4]), rng.choice([2, 3]), rng.choice([4, 8, 16])
    context = rng.randint(1, 24) if context is None else context
    shape = dict(
        heads=(kv_heads * group, head_dim),
        cache=(kv_heads, context, head_dim),
        new=(kv_heads, head_dim),
    )
    draw = lambda key: torch.randn(*shape[key], generator=generator)  # noqa: E731
    return dict(
        q=draw("heads"),
        k_cache=draw("cache"),
        v_cache=draw("cache"),
        k_new=draw("new"),
        v_new=draw("new"),
    )


@register_cases(
    "ch04.cached_attention",
    reference=reference_cached_attention,
    rtol=0.0001,
    atol=1e-05,
    wrong_answers=[_wrong_forgets_new_token, _wrong_tiles_heads, _wrong_unscaled],
)
def cases_cached_attention(rng):
    cases = [random_attention_case(rng) for _ in range(CASES_PER_CHECK)]
    return cases


def reference_step_time_ms(context, weight_mb, kv_kib_per_token, bandwidth_gb_s):
    bytes_per_step = (
        weight_mb * 1e6 + context * kv_kib_per_token * 1024
    )  # weights + the cached context
    return bytes_per_step / (bandwidth_gb_s * 1e9) * 1e3


@register_cases(
    "ch04.step_time_ms",
    reference=reference_step_time_ms,
    wrong_answers=[
        lambda context, weight_mb, kv_kib_per_token, bandwidth_gb_s: (
            weight_mb * 1000000.0 / (bandwidth_gb_s * 1000000000.0) * 1000.0
        ),
        lambda context, weight_mb, kv_kib_per_token, bandwidth_gb_s: (
            (weight_mb * 1000000.0 + context * kv_kib_per_token * 1000)
            / (bandwidth_gb_s * 1000000000.0)
            * 1000.0
        ),
    ],
)
def cases_step_time_ms(rng):
    cases = [
        dict(
            context=rng.randint(1, 131072),
            weight_mb=rng.uniform(100, 140000),
            kv_kib_per_token=rng.choice([32, 45, 64, 128, 160, 320]),
            bandwidth_gb_s=rng.uniform(20, 5000),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return cases
