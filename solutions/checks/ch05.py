"""Checks for chapter 5 (grouped-query and multi-query attention).

1. ``ch05.kv_overtakes_batch``: the smallest batch whose KV cache outgrows the weights at a
   context (Pope et al. 2022), for any number of KV heads.
2. ``ch05.max_users``: how many sequences fit next to the weights when each holds whole blocks of
   cache; the calculator's "max users" (``memwall.cost.memory_budget``) ignores blocks, so it does
   not answer this.
3. ``ch05.mean_pool_heads``: mean-pool KV heads (Ainslie et al. 2023); graded on the attention
   output that the pooled keys and values produce, against a reference pooling.
"""

import math

from memwall.grading import compare_function, register
from memwall.grading.registry import register_cases
from memwall.widgets.practice import attention_after_pooling, grouped_attention, pooling_error  # noqa: F401

CASES_PER_CHECK = 12


# ---- 1. the batch at which the KV cache overtakes the weights -------------------------------------


def reference_kv_overtakes_batch(weight_bytes, n_layers, n_heads, n_kv_heads, head_dim,
                                 kv_bytes_per_element, context):  # fmt: skip
    # Smallest batch whose cache (a key and a value per KV head per layer, per token of every
    # sequence) is larger than the weights a decode step reads once for the whole batch.
    per_sequence = 2 * n_layers * n_kv_heads * head_dim * kv_bytes_per_element * context
    return math.floor(weight_bytes / per_sequence) + 1


def _counts_query_heads(weight_bytes, n_layers, n_heads, n_kv_heads, head_dim,
                        kv_bytes_per_element, context):  # fmt: skip
    # MHA's cache, not GQA's: one KV head per query head
    return reference_kv_overtakes_batch(weight_bytes, n_layers, n_heads, n_heads, head_dim,
                                        kv_bytes_per_element, context)  # fmt: skip


def _keys_only(weight_bytes, n_layers, n_heads, n_kv_heads, head_dim, kv_bytes_per_element,
               context):  # fmt: skip
    return reference_kv_overtakes_batch(weight_bytes, n_layers, n_heads, n_kv_heads, head_dim,
                                        kv_bytes_per_element / 2, context)  # fmt: skip


def _one_token_per_sequence(weight_bytes, n_layers, n_heads, n_kv_heads, head_dim,
                            kv_bytes_per_element, context):  # fmt: skip
    return reference_kv_overtakes_batch(weight_bytes, n_layers, n_heads, n_kv_heads, head_dim,
                                        kv_bytes_per_element, 1)  # fmt: skip


def kv_overtakes_cases(rng):
    cases = []
    for _ in range(CASES_PER_CHECK):
        n_heads = rng.choice([8, 16, 32, 64])
        head_dim = rng.choice([64, 128])
        n_layers = rng.randint(16, 80)
        params = rng.uniform(0.5e9, 70e9)
        cases.append(
            dict(
                weight_bytes=params * rng.choice([2, 1, 0.5]),
                n_layers=n_layers,
                n_heads=n_heads,
                n_kv_heads=n_heads // rng.choice([2, 4, 8]),  # GQA: fewer KV heads than queries
                head_dim=head_dim,
                kv_bytes_per_element=rng.choice([2, 1]),
                context=rng.randint(256, 131072),
            )
        )
    return cases


@register_cases(
    "ch05.kv_overtakes_batch",
    reference=reference_kv_overtakes_batch,
    wrong_answers=[_counts_query_heads, _keys_only, _one_token_per_sequence],
)
def check_kv_overtakes_batch(rng):
    return kv_overtakes_cases(rng)


# ---- 2. max users, in whole blocks ------------------------------------------------------------------


def reference_max_users(memory_bytes, weight_bytes, kv_bytes_per_token, context, block_tokens):
    free = memory_bytes - weight_bytes
    if free <= 0:
        return 0  # the weights alone do not fit
    blocks_per_user = math.ceil(context / block_tokens)  # a user holds whole blocks
    return math.floor(free / (blocks_per_user * block_tokens * kv_bytes_per_token))


def _calculator_ignores_blocks(memory_bytes, weight_bytes, kv_bytes_per_token, context,
                               block_tokens):  # fmt: skip
    # memwall's memory_budget (the calculator's "max users"): exactly context tokens per user
    return reference_max_users(memory_bytes, weight_bytes, kv_bytes_per_token, context, 1)


def _rounds_blocks_down(memory_bytes, weight_bytes, kv_bytes_per_token, context, block_tokens):
    free = memory_bytes - weight_bytes
    if free <= 0:
        return 0
    blocks_per_user = max(1, context // block_tokens)
    return math.floor(free / (blocks_per_user * block_tokens * kv_bytes_per_token))


def _forgets_the_weights(memory_bytes, weight_bytes, kv_bytes_per_token, context, block_tokens):
    return reference_max_users(memory_bytes, 0, kv_bytes_per_token, context, block_tokens)


def _fraction_of_a_user(memory_bytes, weight_bytes, kv_bytes_per_token, context, block_tokens):
    return (memory_bytes - weight_bytes) / (
        math.ceil(context / block_tokens) * block_tokens * kv_bytes_per_token
    )


@register_cases(
    "ch05.max_users",
    reference=reference_max_users,
    wrong_answers=[
        _calculator_ignores_blocks,
        _rounds_blocks_down,
        _forgets_the_weights,
        _fraction_of_a_user,
    ],
)
def cases_max_users(rng):
    cases = []
    for number in range(CASES_PER_CHECK):
        memory = rng.choice([16e9, 24e9, 40e9, 80e9, 141e9])
        # a third of the cases have weights that do not fit
        weights = memory * (rng.uniform(1.01, 3) if number % 3 == 0 else rng.uniform(0.05, 0.95))
        kv_bytes_per_token = rng.choice([4096, 32768, 46080, 131072, 327680, 524288])
        if number % 3 == 1:
            # A few small blocks, the last holding one token: a user of `context` tokens, one
            # of a block fewer and one of whole blocks take different numbers of users (at least
            # 0.8 GB free, at most 33.5 MB a user).
            block_tokens, blocks, last = rng.choice([16, 32]), rng.randint(2, 8), 1
            kv_bytes_per_token = rng.choice([4096, 32768, 46080, 131072])
        else:
            block_tokens = rng.choice([16, 32, 256, 2048])
            blocks = rng.randint(1, max(1, 16384 // block_tokens))  # up to 16k tokens a user
            last = rng.randint(1, block_tokens)  # tokens in the last block
        cases.append(
            dict(
                memory_bytes=memory,
                weight_bytes=weights,
                kv_bytes_per_token=kv_bytes_per_token,
                context=(blocks - 1) * block_tokens + last,
                block_tokens=block_tokens,
            )
        )
    return cases


# ---- 3. mean-pooling KV heads ------------------------------------------------------------------------


def reference_mean_pool_heads(kv, n_groups):
    """kv [batch, kv_heads, tokens, head_dim] -> [batch, n_groups, tokens, head_dim]: group g is the
    mean of the consecutive heads g*r ... (g+1)*r - 1, r = kv_heads / n_groups."""
    batch, heads, tokens, head_dim = kv.shape
    return kv.reshape(batch, n_groups, heads // n_groups, tokens, head_dim).mean(dim=2)


def _sum_heads(kv, n_groups):
    b, h, t, d = kv.shape
    return kv.reshape(b, n_groups, h // n_groups, t, d).sum(dim=2)


def _strided_groups(kv, n_groups):  # groups heads g, g + n_groups, ... instead of neighbours
    b, h, t, d = kv.shape
    return kv.reshape(b, h // n_groups, n_groups, t, d).mean(dim=1)


def _first_of_group(kv, n_groups):
    return kv[:, :: kv.shape[1] // n_groups]


def draw_attention_inputs(batch, n_heads, kv_heads, tokens, head_dim, seed):
    """Random q [batch, n_heads, tokens, head_dim] and k, v with kv_heads heads (float64)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(batch, heads, tokens, head_dim, generator=generator, dtype=torch.float64)
        for heads in (n_heads, kv_heads, kv_heads)
    )


@register("ch05.mean_pool_heads", wrong_answers=[_sum_heads, _strided_groups, _first_of_group])
def check_mean_pool_heads(student, rng):
    cases = []
    for number in range(CASES_PER_CHECK):
        # every other case keeps several groups, so that which heads are grouped together matters
        kv_heads = rng.choice([4, 6, 8] if number % 2 == 0 else [2, 4, 6, 8])
        groups = [g for g in range(2 if number % 2 == 0 else 1, kv_heads) if kv_heads % g == 0]
        cases.append(
            dict(
                batch=rng.randint(1, 2),
                n_heads=kv_heads * rng.choice([1, 2]),
                kv_heads=kv_heads,
                tokens=rng.randint(1, 7),
                head_dim=rng.choice([4, 8]),
                n_groups=rng.choice(groups),
                seed=rng.randrange(2**31),
            )
        )

    def attention_with_your_pooling(batch, n_heads, kv_heads, tokens, head_dim, n_groups, seed):
        q, k, v = draw_attention_inputs(batch, n_heads, kv_heads, tokens, head_dim, seed)
        return attention_after_pooling(student, q, k, v, n_groups)

    def attention_with_reference_pooling(
        batch, n_heads, kv_heads, tokens, head_dim, n_groups, seed
    ):
        q, k, v = draw_attention_inputs(batch, n_heads, kv_heads, tokens, head_dim, seed)
        return attention_after_pooling(reference_mean_pool_heads, q, k, v, n_groups)

    return compare_function(
        attention_with_your_pooling, attention_with_reference_pooling, cases, rtol=1e-6, atol=1e-9
    )
