"""Chapter 5 exercises (solutions notebook; `memwall exercises` makes the student copy)."""

from nbcells import check, code, exercise, md, notebook


def build():
    return notebook("05_gqa_solutions", [
        md("""
        # Exercises 5: grouped-query and multi-query attention

        Three pieces of chapter 5, written by you. Each comes with a widget that uses your function next to
        memwall's; until you fill it in, the widget says "not implemented yet". The check cell under each
        exercise tests your function on hidden random cases.
        """),
        md("""
        ## Exercise 1: KV bytes per token

        Each token leaves a key vector and a value vector in the cache, for every KV head of every layer.
        Return the bytes one token adds, for `n_layers` layers, `n_kv_heads` KV heads of `head_dim`
        elements each, at `bytes_per_element` bytes per element (2 for bf16, 0.5 for int4).
        """),
        exercise("ch05.kv_bytes_per_token", "a key and a value per KV head, per layer", '''
        def kv_bytes_per_token(n_layers, n_kv_heads, head_dim, bytes_per_element):
            """Bytes of KV cache one token adds."""
            ### BEGIN SOLUTION
            return 2 * n_layers * n_kv_heads * head_dim * bytes_per_element
            ### END SOLUTION
        '''),
        md("""
        The plot sweeps the number of KV heads for a model with 32 query heads: 32 is MHA, 1 is MQA, and
        everything between is GQA. The sliders set the other inputs; the MHA/MQA ratio is the ratio of the
        two ends of the line.
        """),
        code('''
        from memwall.grading.checks.ch05 import reference_kv_bytes_per_token
        from memwall.widgets import compare_plot

        compare_plot(kv_bytes_per_token, reference_kv_bytes_per_token,
                     x=("n_kv_heads", [1, 2, 4, 8, 16, 32]),
                     sliders={"n_layers": (1, 128, 1, 32), "head_dim": [128, 64, 96, 256],
                              "bytes_per_element": [2, 1, 0.5, 4]},
                     logx=True, logy=True, xlabel="KV heads (32 query heads: 1 = MQA, 32 = MHA)",
                     ylabel="KV bytes per token")
        '''),
        check("ch05.kv_bytes_per_token", "kv_bytes_per_token", 1),
        md("""
        ## Exercise 2: how many users fit

        The calculator's "max users": a GPU has `memory_bytes` of memory; the weights take `weight_bytes`;
        each user's sequence of `context` tokens needs `context × kv_bytes_per_token` bytes of cache.
        Return how many whole users fit in what the weights leave free (0 if the weights alone do not fit).
        """),
        exercise("ch05.max_users", "whole users in (memory - weights); 0 if the weights do not fit", '''
        def max_users(memory_bytes, weight_bytes, kv_bytes_per_token, context):
            """How many sequences of `context` tokens fit next to the weights."""
            ### BEGIN SOLUTION
            free = memory_bytes - weight_bytes
            if free <= 0:
                return 0
            return int(free // (context * kv_bytes_per_token))
            ### END SOLUTION
        '''),
        code('''
        from memwall.grading.checks.ch05 import reference_max_users

        compare_plot(max_users, reference_max_users,
                     x=("context", [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]),
                     sliders={"memory_bytes": [80e9, 141e9, 40e9, 24e9],
                              "weight_bytes": (1e9, 150e9, 1e9, 16e9),
                              "kv_bytes_per_token": [131072, 32768, 327680, 524288]},
                     logx=True, xlabel="context (tokens per user)", ylabel="users that fit")
        '''),
        md("""
        Your function inside the calculator: Llama 3.1 8B in bf16 at a 32k context on each catalog GPU, your
        answer next to the one `memwall.cost` gives the calculator.
        """),
        code('''
        from memwall import cost
        from memwall.hardware import CATALOG as GPUS

        spec = "llama-3.1-8b"
        for gpu in GPUS.values():
            f = cost.calc(spec, gpu, dtype="bf16", context=32768)
            try:
                yours = max_users(f["memory_bytes"], f["weight_storage_bytes"],
                                  f["kv_bytes_per_token"], 32768)
            except NotImplementedError:
                yours = "not implemented yet"
            print(f"{gpu.name:>14}: yours {yours!s:>20}   calculator {f['max_users']:>4}")
        '''),
        check("ch05.max_users", "max_users", 2),
        md("""
        ## Exercise 3: mean-pooling KV heads

        `kv` holds keys (or values) shaped `[batch, kv_heads, tokens, head_dim]`. Merge them into `n_groups`
        heads, where group `g` is the **mean** of the consecutive heads `g*r … (g+1)*r - 1`, with
        `r = kv_heads / n_groups` (query heads that share a KV head are neighbours, so merged KV heads must be
        neighbours too). Return a `[batch, n_groups, tokens, head_dim]` tensor. The check runs grouped
        attention with your pooled keys and values and compares its output with the reference.
        """),
        exercise("ch05.mean_pool_heads", "reshape the head axis into (n_groups, r) and average over r", '''
        def mean_pool_heads(kv, n_groups):
            """[batch, kv_heads, tokens, head_dim] -> [batch, n_groups, tokens, head_dim],
            neighbours averaged."""
            ### BEGIN SOLUTION
            batch, heads, tokens, head_dim = kv.shape
            return kv.reshape(batch, n_groups, heads // n_groups, tokens, head_dim).mean(dim=2)
            ### END SOLUTION
        '''),
        md("""
        How much does pooling move the attention output? The widget starts from 8 KV heads whose keys and
        values are `similarity × (a part shared by all heads) + (1 - similarity) × (their own part)`, pools
        them into fewer groups with your function, and plots the relative change of the attention output.
        Heads that are alike pool almost for free; unrelated heads, like those of a model never trained to
        share, do not.
        """),
        code('''
        from memwall.grading.checks.ch05 import pooling_error, reference_mean_pool_heads

        compare_plot(lambda n_groups, similarity:
                         pooling_error(mean_pool_heads, n_groups, similarity),
                     lambda n_groups, similarity:
                         pooling_error(reference_mean_pool_heads, n_groups, similarity),
                     x=("n_groups", [1, 2, 4, 8]), sliders={"similarity": (0.0, 1.0, 0.1, 0.5)},
                     xlabel="KV heads after pooling (from 8)",
                     ylabel="relative change of the attention output")
        '''),
        check("ch05.mean_pool_heads", "mean_pool_heads", 3),
    ])
