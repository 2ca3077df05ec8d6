"""Chapter 5, second half: SmolLM2-135M converted to MQA and MHA, measured; the calculator."""

from nbcells import code, md


def conversion_cells():
    return [
        md("""
        ## Converting SmolLM2-135M to MQA

        SmolLM2-135M {cite}`allal2025smollm2` has 9 query heads and 3 KV heads: GQA with groups of 3.
        Ainslie et al. turn a multi-head checkpoint into a grouped one by **mean-pooling**: the key
        projection of a merged head is the average of the key projections of the heads it replaces, and the
        same for values {cite}`ainslie2023gqa`. We do the same to go from 3 KV heads to 1, which makes the
        model MQA. A projection stores each head as `head_dim` consecutive rows, so pooling heads means
        averaging blocks of rows:
        """),
        code("""
        hf_model, tokenizer = models.load("smollm2-135m")
        model = Transformer.from_hf(hf_model)
        del hf_model  # the engine has its own copy of the weights
        spec = specs.get_spec("smollm2-135m")
        H, G, d = model.n_heads, model.n_kv_heads, model.head_dim

        def mean_pool_heads(projection, n_heads, n_groups):
            \"\"\"[n_heads * head_dim, in] -> [n_groups * head_dim, in]:
            each group of consecutive heads averaged.\"\"\"
            head_dim, per_group = projection.shape[0] // n_heads, n_heads // n_groups
            heads = projection.reshape(n_heads, head_dim, -1)
            pooled = [heads[g * per_group:(g + 1) * per_group].mean(dim=0) for g in range(n_groups)]
            return torch.cat(pooled)

        qkv = model.blocks[0].attn.qkv.weight  # fused [q; k; v] rows of layer 0
        k_rows = qkv[H * d:(H + G) * d]
        ours = mean_pool_heads(k_rows, G, 1)
        print(f"layer 0: K projection {tuple(k_rows.shape)} -> pooled {tuple(ours.shape)}; "
              f"max |ours - memwall| = {(ours - pool_heads(k_rows, G, 1)).abs().max():.1e}")
        """),
        md("""
        Averaging the projections averages the keys themselves: $x W_\\text{pooled} = \\frac13 \\sum_g x W_g$.
        Rotary position embeddings do not spoil this, because they rotate every head by the same angles, and
        a rotation of an average is the average of the rotations.

        `memwall.engine.kv_heads.convert_kv_heads` applies this to the fused QKV projection of every layer.
        Going the other way, to **MHA**, it repeats each KV head for the 3 query heads that already read it:
        every query head then sees exactly the keys and values it saw before, so the outputs cannot change,
        while the cache triples. That tells us what MHA would cost this model without retraining anything.
        """),
        code("""
        variants = {"MQA (1 KV head)": convert_kv_heads(model, 1), "GQA (3, as trained)": model,
                    "MHA (9 KV heads)": convert_kv_heads(model, 9)}
        eval_ids = quality.eval_token_ids(tokenizer)
        sample = torch.tensor([eval_ids[:64]])
        with torch.inference_mode():
            drift = (variants["MHA (9 KV heads)"](sample) - model(sample)).abs().max().item()
        print(f"MHA vs the original, 64 tokens: max |logit difference| = {drift:.1e}")
        assert drift < 1e-4, "expanding KV heads must not change the outputs"
        """),
        md("""
        ### Cache bytes, from the real tensors

        Each model allocates a cache for its full context of 8,192 tokens. `KVCache.nbytes` counts the bytes
        of its key and value tensors; divided by the tokens it holds, that is the bytes per token, which must
        equal the formula (fp32 here, 4 bytes per element).
        """),
        code("""
        max_tokens = model.max_positions
        weight_bytes = model.weight_bytes_per_step()
        caches = {}
        print(f"{'':>20} {'KV heads':>8} {'cache, 8k tokens':>17} "
              f"{'per token':>10} {'vs weights':>10}")
        for name, variant in variants.items():
            cache = variant.new_cache(max_tokens=max_tokens)
            per_token = cache.nbytes / max_tokens
            assert per_token == cost.kv_bytes_per_token(spec.with_kv_heads(variant.n_kv_heads),
                                                        "fp32")
            caches[name] = cache
            print(f"{name:>20} {variant.n_kv_heads:>8} "
                  f"{cache.nbytes / 1e6:>14.0f} MB {per_token / 1024:>7.0f} KiB "
                  f"{cache.nbytes / weight_bytes:>9.2f}x")
        print(f"weights read per decode step: {weight_bytes / 1e6:.0f} MB")
        """),
        md("""
        ### The cost in quality

        The bytes were the easy part. Perplexity on the text that ships with memwall (several paragraphs of
        plain English prose, `memwall/data/eval_text.txt`) tells us what pooling did to the model. The
        top-1 agreement is the fraction of positions where the MQA model's most likely next token is the
        original's.
        """),
        code("""
        start = time.perf_counter()
        scores = {name: quality.score(variants[name], eval_ids)
                  for name in ("GQA (3, as trained)", "MQA (1 KV head)")}
        original, pooled = scores["GQA (3, as trained)"], scores["MQA (1 KV head)"]
        print(f"{len(eval_ids)} tokens, scored in {time.perf_counter() - start:.0f} s")
        for name, s in scores.items():
            print(f"{name:>20}: "
                  f"perplexity {s.perplexity:10.1f}   next token right {100 * s.accuracy:4.1f}%")
        print("MQA agrees with the original's top-1 prediction at "
              f"{100 * pooled.agreement(original):.1f}% of positions")
        print(f"perplexity ratio MQA / original: {pooled.perplexity / original.perplexity:.0f}x")
        """),
        code("""
        prompt = tokenizer("The tide comes in twice a day")["input_ids"]
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")  # the end-of-turn token
        for name in ("GQA (3, as trained)", "MQA (1 KV head)"):
            reply = generate(variants[name], prompt, max_new_tokens=16,  # greedy
                             stop_tokens=(end,))
            text = tokenizer.decode(prompt + reply.tokens, skip_special_tokens=True)
            print(f"{name:>20}: {text!r}")
        """),
        md("""
        Pooling without any further training breaks this model: compare the two perplexities above. Each
        query head was trained against its own key head, and the averaged key matches none of them; the
        averaged values blur three different signals into one. This is why Ainslie et al. do not stop at
        pooling: they continue pre-training the converted model for a small fraction (about 5%) of the
        original pre-training compute, "uptraining", which recovers most of the quality
        {cite}`ainslie2023gqa`. Models that ship with GQA or MQA (Llama 3, Mistral, SmolLM2) are trained that
        way from the start. A conversion that saves bytes is only worth it if its quality is measured.
        """),
    ]


def timing_cells():
    return [
        md("""
        ### Decode step time at long context

        What the smaller cache buys is a faster decode step at long context. Filling 8k tokens of cache
        with a real prefill would take minutes on a CPU, and the time of a step depends on how many bytes it
        reads, not on their values. So we write a value into every element of each cache and mark the
        first tokens as filled. (Writing matters: an untouched fresh tensor can be backed by the operating
        system's shared zero page, and reading it would cost nothing.) Then we time single decode steps at
        several context lengths, alternating the three models in each round, and keep the medians.
        """),
        code("""
        # longest first: each step rolls the cache back to the context it measures
        contexts = [8000, 4096, 1024]
        for cache in caches.values():
            cache.keys.fill_(0.01)
            cache.values.fill_(0.01)
            cache.length = max(contexts)  # the filled prefix now counts as cached tokens
        token = torch.tensor([42])
        rounds = 5
        medians = {name: {} for name in variants}
        for context in contexts:
            times = {name: [] for name in variants}
            for r in range(rounds + 1):  # round 0 is a warm-up
                order = list(variants) if r % 2 else list(reversed(variants))
                for name in order:
                    cache = caches[name]
                    cache.rollback(context)
                    start = time.perf_counter()
                    decode_step(variants[name], token, cache)
                    if r:
                        times[name].append(time.perf_counter() - start)
            for name in variants:
                medians[name][context] = statistics.median(times[name])

        print(f"{'context':>8}" + "".join(f"{name:>22}" for name in variants))
        for context in sorted(contexts):
            print(f"{context:>8}"
                  + "".join(f"{1000 * medians[name][context]:>19.1f} ms" for name in variants))
        """),
        code("""
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for name in variants:
            ax.plot(sorted(contexts), [1000 * medians[name][c] for c in sorted(contexts)], "o-",
                    label=name)
        ax.set_xlabel("context (tokens in the cache)")
        ax.set_ylabel("decode step, median (ms)")
        ax.set_title("SmolLM2-135M, fp32, batch 1, this machine")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
        plt.show()

        longest, shortest = max(contexts), min(contexts)
        gqa = "GQA (3, as trained)"
        print(f"bytes read per step at {longest} tokens, and the step time, relative to GQA:")
        def bytes_read(name, context):  # every weight once, plus the cached tokens' keys and values
            return (variants[name].weight_bytes_per_step()
                    + caches[name].nbytes * context / max_tokens)

        for name in variants:
            read, read_gqa = bytes_read(name, longest), bytes_read(gqa, longest)
            print(f"{name:>20}: {read / 1e6:6.0f} MB ({read / read_gqa:.2f}x bytes), "
                  f"{1000 * medians[name][longest]:6.1f} ms "
                  f"({medians[name][longest] / medians[gqa][longest]:.2f}x time), "
                  f"{read / medians[name][longest] / 1e9:5.1f} GB/s achieved")
        for name in variants:
            grown = medians[name][longest] - medians[name][shortest]
            print(f"{name:>20}: "
                  f"+{1000 * grown:.1f} ms from {shortest} to {longest} tokens of context")
        """),
        md("""
        Read the two ratio columns side by side. If a step were nothing but streaming bytes, the time ratio
        would equal the byte ratio. Where part of each step is fixed per-operation overhead, as chapter 3
        found on a machine like this one, that fixed cost pulls the time ratios towards 1, while attention
        that reads the cache more slowly than the weights are streamed (chapter 4's slope) pushes them
        away from 1; compare each pair in the printed lines to see which wins here. The growth
        with context is where the KV heads show: the more KV heads, the more each extra token of context
        costs, and the steeper the line.

        ## The reverse direction: what MHA would cost

        The expanded model above computes exactly what the original computes, and its cache is three times
        larger. For a single user of this small model at 8k tokens, the "Cache bytes" table above
        prints its size in fp32 and the lines below print it in bf16; compare both with the weights. In serving it multiplies by
        the number of users:
        """),
        code("""
        for kv_heads, label in [(1, "MQA"), (3, "GQA, as published"), (9, "MHA")]:
            variant_spec = spec.with_kv_heads(kv_heads)
            per_user = cost.kv_cache_bytes(variant_spec, 8192, 1, "bf16")
            for_16 = cost.kv_cache_bytes(variant_spec, 8192, 16, "bf16")
            print(f"{label:>18}: "
                  f"{cost.kv_bytes_per_token(variant_spec, 'bf16') / 1024:5.1f} KiB/token, "
                  f"8k context: {per_user / 1e6:5.0f} MB per user, "
                  f"{for_16 / 1e9:5.2f} GB for 16 users "
                  f"(weights {cost.weight_storage_bytes(variant_spec, 'bf16') / 1e6:.0f} MB)")
        """),
    ]


def calculator_cells():
    return [
        md("""
        ## How big is the cache?

        The calculator puts a catalog model on a catalog GPU. Choose the weight and KV dtypes, the context,
        the number of users, and, to ask "what if", the number of KV heads. The bar shows the GPU's memory
        split into weights, KV cache and what is left; below it are the most users that fit and the roofline
        ceiling on tokens/s. Every figure is `memwall.cost` arithmetic. This version runs in the page itself
        (plain JavaScript, no kernel and no network needed), and memwall's tests check its numbers against
        the Python over a grid of inputs:
        """),
        code("""
        display(HTML(static_calculator.html(model="llama-3.1-8b", hardware="h100-sxm",
                                            context=32768, batch=8)))
        """),
        md("""
        The calculator starts at Llama 3.1 8B as released, with 8 KV heads (GQA), serving 8 users at 32k
        tokens each. Try the KV-heads menu: set 32 KV heads (MHA), as if the model had kept one KV head per
        query head, and compare the bar with the default; then set 1 (MQA). Then try Llama 2 70B on an H100
        in bf16, in int4-g128 and with an fp8 cache. The same three KV-head settings from Python (the first
        line is the model's own setting, and each line says whether it fits):
        """),
        code("""
        for kv_heads in (None, 32, 1):
            f = cost.calc("llama-3.1-8b", "h100-sxm", dtype="bf16", context=32768, batch=8,
                          kv_heads=kv_heads)
            print(f"llama-3.1-8b with {f['n_kv_heads']:>2} KV heads, "
                  f"{f['batch']} users x {f['context'] // 1024}k: "
                  f"needs {f['memory_needed_bytes'] / 1e9:6.1f} "
                  f"GB of {f['memory_bytes'] / 1e9:.0f} GB "
                  f"({'fits' if f['fits'] else 'does not fit'}); max users {f['max_users']:>3}; "
                  f"ceiling {f['tokens_per_s_per_user']:5.1f} tok/s per user, "
                  f"{f['tokens_per_s_total']:6.0f} total")
        """),
        md("""
        In a live notebook (Jupyter, Colab) the same calculator also exists as an ipywidgets widget, which
        calls `memwall.cost` in Python on every change. Run the next cell to get it:
        """),
        code("""
        cache_calculator(model="llama-3.1-8b", hardware="h100-sxm", context=32768, batch=8)
        """, tags=["remove-output"]),
        md("""
        ## What to remember

        - Attention with $G$ KV heads for $H$ query heads keeps $2 \\times \\text{layers} \\times G \\times
          d_\\text{head}$ numbers per token in the cache: MHA ($G = H$), GQA, MQA ($G = 1$). Sharing cuts the
          **KV bytes** by $H/G$; it does not touch the weight bytes or the tokens per weight read.
        - At long contexts and many users the cache, not the weights, fills the GPU and dominates the bytes
          of each decode step; that is what MQA and GQA were invented for.
        - Repeating KV heads (GQA → MHA) changes no output and multiplies the cache. Mean-pooling them
          (GQA → MQA) shrinks the cache, but without uptraining it wrecked SmolLM2 here: always measure
          quality next to speed.
        - The calculator's figures are arithmetic, not measurements: upper bounds on users and tokens/s,
          to be checked against a real run.

        The exercises are in [exercises/05_gqa.ipynb](../exercises/05_gqa.ipynb): KV bytes per token,
        the calculator's "max users", and mean-pooling KV heads checked on the attention output.
        """),
    ]


def cells():
    return conversion_cells() + timing_cells() + calculator_cells()
