"""Checks for chapter 4, "The KV cache".

- ch04.kv_cache_bytes: 2 x layers x KV heads x head dim x bytes, per token, per sequence.
- ch04.tokens_processed: positions run through the model, with and without a cache.
- ch04.cached_attention: one decode step of grouped-query attention over a growing cache,
  checked against memwall's engine (`memwall.engine.layers.attend`).
- ch04.step_time_ms: the predicted decode step time as the context grows.
"""

from memwall.grading import compare_function, register

CASES_PER_CHECK = 12


def reference_kv_cache_bytes(context, batch, n_layers, n_kv_heads, head_dim, bytes_per_element):
    return (
        2 * n_layers * n_kv_heads * head_dim * bytes_per_element * context * batch
    )  # keys and values


@register(
    "ch04.kv_cache_bytes",
    wrong_answers=[
        lambda context, batch, n_layers, n_kv_heads, head_dim, bytes_per_element: (
            n_layers * n_kv_heads * head_dim * bytes_per_element * context * batch
        ),  # keys only
        lambda context, batch, n_layers, n_kv_heads, head_dim, bytes_per_element: (
            2 * n_layers * n_kv_heads * head_dim * bytes_per_element * context
        ),  # one sequence only
    ],
)
def check_kv_cache_bytes(student, rng):
    cases = [
        dict(
            context=rng.randint(0, 131072),
            batch=rng.randint(2, 256),
            n_layers=rng.randint(1, 80),
            n_kv_heads=rng.choice([1, 2, 4, 8, 32]),
            head_dim=rng.choice([64, 96, 128]),
            bytes_per_element=rng.choice([1, 2, 4]),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    cases[0]["context"] = max(cases[0]["context"], 1)
    return compare_function(student, reference_kv_cache_bytes, cases)


def reference_tokens_processed(prompt_tokens, new_tokens, use_cache):
    if use_cache:
        # The prompt once (prefill), then one position per further token (the last one is never fed back).
        return prompt_tokens + new_tokens - 1
    # Step i (from 0) reruns the prompt and the i tokens generated so far.
    return new_tokens * prompt_tokens + new_tokens * (new_tokens - 1) // 2


@register(
    "ch04.tokens_processed",
    wrong_answers=[
        lambda prompt_tokens, new_tokens, use_cache: (
            prompt_tokens + new_tokens - 1
        ),  # the cache case only
        lambda prompt_tokens, new_tokens, use_cache: (
            prompt_tokens + new_tokens - 1
            if use_cache
            else new_tokens * (prompt_tokens + new_tokens)
        ),
    ],
)
def check_tokens_processed(student, rng):
    cases = [
        dict(
            prompt_tokens=rng.randint(1, 4000),
            new_tokens=rng.randint(2, 4000),
            use_cache=number % 2 == 0,
        )
        for number in range(CASES_PER_CHECK)
    ]
    return compare_function(student, reference_tokens_processed, cases)


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


@register(
    "ch04.cached_attention",
    wrong_answers=[_wrong_forgets_new_token, _wrong_tiles_heads, _wrong_unscaled],
)
def check_cached_attention(student, rng):
    cases = [random_attention_case(rng) for _ in range(CASES_PER_CHECK)]
    return compare_function(student, reference_cached_attention, cases, rtol=1e-4, atol=1e-5)


def reference_step_time_ms(context, weight_mb, kv_kib_per_token, bandwidth_gb_s):
    bytes_per_step = (
        weight_mb * 1e6 + context * kv_kib_per_token * 1024
    )  # weights + the cached context
    return bytes_per_step / (bandwidth_gb_s * 1e9) * 1e3


@register(
    "ch04.step_time_ms",
    wrong_answers=[
        lambda context, weight_mb, kv_kib_per_token, bandwidth_gb_s: (
            weight_mb * 1e6 / (bandwidth_gb_s * 1e9) * 1e3
        ),
        lambda context, weight_mb, kv_kib_per_token, bandwidth_gb_s: (
            (weight_mb * 1e6 + context * kv_kib_per_token * 1000) / (bandwidth_gb_s * 1e9) * 1e3
        ),  # KB, not KiB
    ],
)
def check_step_time_ms(student, rng):
    cases = [
        dict(
            context=rng.randint(1, 131072),
            weight_mb=rng.uniform(100, 140000),
            kv_kib_per_token=rng.choice([32, 45, 64, 128, 160, 320]),
            bandwidth_gb_s=rng.uniform(20, 5000),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return compare_function(student, reference_step_time_ms, cases)
