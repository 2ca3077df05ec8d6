"""Chapter 5, first half: the attention maths, and KV bytes for the catalog's real models."""

from nbcells import code, md


def cells():
    return [
        md("""
        # 5. Grouped-query and multi-query attention

        Chapter 4 ended with a bill. Every token of every conversation leaves a key and a value vector in
        the cache, for each KV head of each layer, and each decode step reads all of them back. Of the three
        costs behind a generated token (weight bytes, KV bytes, and how many tokens one read of the weights
        produces), this chapter is about the second, and about one number in its formula that the
        architecture chooses: **the number of key/value heads**. Fewer KV heads means fewer bytes per
        token of context. It does not shrink the weights, and it does not batch anything.

        We will compare multi-head, multi-query and grouped-query attention. Then we will count what each
        costs for real published models, convert the real SmolLM2-135M from 3 KV heads to 1 and measure
        what that buys and what it breaks. At the end, a calculator puts real models on real GPUs.
        """),
        code("""
        import statistics, time
        import matplotlib.pyplot as plt
        import torch
        from IPython.display import HTML, Markdown, display
        from memwall import cost, models, quality, specs
        from memwall.engine import Transformer, decode_step, generate
        from memwall.engine.kv_heads import convert_kv_heads, pool_heads
        from memwall.engine.layers import attend
        from memwall.widgets import cache_calculator, static_calculator

        torch.manual_seed(0);  # the semicolon hides the returned Generator
        """),
        md("""
        ## Three ways to share keys and values

        Attention with $H$ query heads and $G$ key/value heads, where $G$ divides $H$: query head $h$
        reads KV head $g(h) = \\lfloor h\\,G / H \\rfloor$, so consecutive query heads form groups of
        $H/G$ that share one key head and one value head:

        $$o_h = \\operatorname{softmax}\\!\\left(\\frac{q_h K_{g(h)}^\\top}{\\sqrt{d_\\text{head}}}\\right) V_{g(h)}.$$

        - **Multi-head attention (MHA)** {cite}`vaswani2017attention`: $G = H$. Every query head has its own keys and values.
        - **Multi-query attention (MQA)** {cite}`shazeer2019fast`: $G = 1$. All query heads share a single
          key head and value head. Shazeer proposed it because incremental decoding is limited by the
          memory bandwidth spent reloading the large key and value tensors, not by arithmetic.
        - **Grouped-query attention (GQA)** {cite}`ainslie2023gqa`: $1 < G < H$, the middle ground that
          Llama 2 70B, Llama 3, Mistral, Qwen2.5 and the two smaller SmolLM2 models use.

        The query projections, the output projection and the MLP are the same in all three. What changes
        is what the cache must keep: $K_g$ and $V_g$ for every layer and every token, so

        $$\\text{KV bytes per token} = 2 \\times \\text{layers} \\times G \\times d_\\text{head} \\times \\text{bytes per element},$$

        which is $H/G$ times less than MHA. Here is the formula for $o_h$ written as a loop over heads,
        checked against the attention function in memwall's engine for MHA, GQA and MQA:
        """),
        code("""
        def grouped_attention(q, k, v):
            \"\"\"q: [heads, tokens, d]; k, v: [kv_heads, keys, d].
            Query head h reads KV head h // (heads / kv_heads).\"\"\"
            heads, kv_heads, d = q.shape[0], k.shape[0], q.shape[-1]
            group = heads // kv_heads
            out = []
            for h in range(heads):
                g = h // group
                weights = torch.softmax(q[h] @ k[g].T / d ** 0.5, dim=-1)
                out.append(weights @ v[g])
            return torch.stack(out)

        heads, head_dim, context = 8, 64, 100
        q = torch.randn(heads, 1, head_dim)  # one decode step: one query token
        for kv_heads, kind in [(8, "MHA"), (2, "GQA"), (1, "MQA")]:
            k, v = (torch.randn(kv_heads, context, head_dim),
                    torch.randn(kv_heads, context, head_dim))
            ours = grouped_attention(q, k, v)
            engine = attend(q[None], k[None], v[None])[0]
            print(f"{kind}: {kv_heads} KV head{'s' * (kv_heads > 1)}; "
                  f"the cache holds {2 * kv_heads * head_dim} numbers per token per layer "
                  f"(MHA: {2 * heads * head_dim}); max "
                  f"|ours - engine| = {(ours - engine).abs().max():.1e}")
            assert torch.allclose(ours, engine, atol=1e-5)
        """),
        md("""
        memwall's engine never copies a KV head for its group: it views the query heads of one group
        together, so each key and value head is read from memory once per step. That matters, because
        reading fewer bytes is the whole point.

        ## KV bytes per token for real models

        The formula, applied to published configurations, with the ratio to what the same model would need
        with MHA (one KV head per query head). The counts are in bf16, 2 bytes per element.
        """),
        code("""
        def kv_bytes_per_token(spec, kv_heads, bytes_per_element=2):
            return 2 * spec.n_layers * kv_heads * spec.head_dim * bytes_per_element

        def kind(spec):
            return ("MHA" if spec.n_kv_heads == spec.n_heads
                    else "MQA" if spec.n_kv_heads == 1 else "GQA")

        rows = ["| model | layers | query heads | KV heads | head dim "
                "| kind | KV per token | as MHA | MHA ÷ this |",
                "|---|---:|---:|---:|---:|---|---:|---:|---:|"]
        for spec in specs.CATALOG.values():
            ours, mha = (kv_bytes_per_token(spec, spec.n_kv_heads),
                         kv_bytes_per_token(spec, spec.n_heads))
            assert ours == cost.kv_bytes_per_token(spec, "bf16")  # memwall's ledger agrees
            rows.append(f"| {spec.name} | {spec.n_layers} | {spec.n_heads} "
                        f"| {spec.n_kv_heads} | {spec.head_dim} | "
                        f"{kind(spec)} | {ours / 1024:,.0f} KiB | "
                        f"{mha / 1024:,.0f} KiB | {mha / ours:.0f}× |")
        display(Markdown("\\n".join(rows)))
        """),
        md("""
        Llama 2 7B and 13B, GPT-2 and SmolLM2-1.7B use MHA; everything newer in the catalog shares KV heads,
        by a factor of 3 to 8 (the last column). Llama 2 70B and Llama 3 70B keep a smaller cache per token than Llama 2 7B,
        although they are ten times larger, because 8 KV heads serve 64 query heads.

        ## The cache against the weights

        A cache of a few hundred KiB per token sounds small until it is multiplied by a context length
        and a number of users. Below, for the catalog models that accept a 32k context, the weights (bf16)
        next to the KV cache at 8k and 32k tokens, for one user and for 16. The grey dots mark what
        the 32k cache would be with MHA.
        """),
        code("""
        long_context = [s for s in specs.CATALOG.values() if s.max_context >= 32768]
        names = [s.name for s in long_context]
        fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
        for ax, users in zip(axes, (1, 16)):
            xs = range(len(long_context))
            weights = [s.n_params * 2 for s in long_context]
            kv_8k = [users * 8192 * kv_bytes_per_token(s, s.n_kv_heads) for s in long_context]
            kv_32k = [users * 32768 * kv_bytes_per_token(s, s.n_kv_heads) for s in long_context]
            mha_32k = [users * 32768 * kv_bytes_per_token(s, s.n_heads) for s in long_context]
            ax.bar([x - 0.27 for x in xs], [w / 1e9 for w in weights], 0.27, label="weights (bf16)",
                   color="#4c72b0")
            ax.bar(xs, [b / 1e9 for b in kv_8k], 0.27, label="KV cache, 8k context",
                   color="#f0b27a")
            ax.bar([x + 0.27 for x in xs], [b / 1e9 for b in kv_32k], 0.27,
                   label="KV cache, 32k context", color="#dd8452")
            ax.plot([x + 0.27 for x in xs], [b / 1e9 for b in mha_32k], "o", color="gray",
                    label="32k context if MHA")
            ax.set_yscale("log")
            ax.set_xticks(list(xs), names, rotation=40, ha="right")
            ax.set_title(f"{users} user{'s' if users > 1 else ''}")
            ax.grid(axis="y", alpha=0.3)
        axes[0].set_ylabel("GB (10⁹ bytes)")
        axes[0].legend(fontsize=8)
        fig.tight_layout()
        plt.show()

        print("one user at 8k: weights > cache for every model above:",
              all(s.n_params * 2 > 8192 * kv_bytes_per_token(s, s.n_kv_heads)
                  for s in long_context))
        for s in long_context:
            cache = 16 * 32768 * kv_bytes_per_token(s, s.n_kv_heads)
            print(f"{s.name:>14}: 16 users x 32k tokens = {cache / 1e9:6.1f} GB of cache, "
                  f"{cache / (s.n_params * 2):4.1f}x its {s.n_params * 2 / 1e9:5.1f} GB of weights")
        larger = sum(16 * 32768 * kv_bytes_per_token(s, s.n_kv_heads) > s.n_params * 2
                     for s in long_context)
        print("cache larger than the weights at 16 users x 32k: "
              f"{larger} of {len(long_context)} models")
        """),
        md("""
        With one user at 8k tokens, the weights are the bigger read (the first line above). With 16 users
        at 32k tokens, look at the ratios: for most of these models the cache is now larger than the
        weights, GQA and all, so a decode step reads more cache than weights. That is the regime Pope et
        al. describe {cite}`pope2022efficiently`, where loading the KV cache dominates. The dots show how much worse it would be with MHA. (Mixtral's cache is the
        same as Mistral 7B's: its experts multiply the FFN weights, not the attention.)
        """),
    ]
