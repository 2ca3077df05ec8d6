"""Chapter 9: percent of roofline for every technique in the book, in one table."""

from nbcells import code, md


def cells():
    return [
        md("""
        ## Percent of roofline, technique by technique

        Each technique in this book reduces one of three things: the **weight** bytes read per step, the
        **KV-cache** bytes read per step, or the number of weight reads per generated token (**tokens per
        read**). For each, the ceiling is

        $$\\text{tokens/s} \\le \\frac{\\text{tokens produced per step} \\times \\text{bandwidth}}{\\text{bytes read per step}},$$

        with the bytes counted from the real tensors of the model being timed and the bandwidth measured above.
        Every row below is measured in this notebook, in one run, with short runs (medians of a few dozen
        steps), so read the ratios, not the third digit.
        """),
        code("""
        import copy
        from memwall.bench import bench_decode
        from memwall.engine.batch import generate_batch
        from memwall.engine.drafts import SelfDraft
        from memwall.engine.kv_heads import pool_kv_heads
        from memwall.engine.quant import quantize
        from memwall.engine.speculative import speculative_generate

        bandwidth = machine.bandwidth
        rows = []

        def kv_bytes_per_token(m):
            return 2 * m.n_layers * m.n_kv_heads * m.head_dim * next(m.parameters()).element_size()

        def decode_rate(m, context, steps=16):
            \"\"\"Median tok/s of batch-1 decode steps with `context` tokens already in the cache.\"\"\"
            cache = m.new_cache(max_tokens=context + steps + 2)
            token = prefill(m, torch.tensor([prompt[:8]]), cache).argmax(-1)
            # a step's cost depends on how many tokens are cached, not on their values
            cache.length = context
            times = []
            for _ in range(steps):
                start = time.perf_counter()
                token = decode_step(m, token, cache).argmax(-1)
                times.append(time.perf_counter() - start)
            return 1 / statistics.median(times[2:])

        def add(technique, reduces, tokens_per_step, bytes_per_step, measured):
            ceiling = tokens_per_step * bandwidth / bytes_per_step
            rows.append((technique, reduces, bytes_per_step, ceiling, measured))

        # fp32 baseline and transformers on the same model: same bytes, different overheads.
        base = decode_rate(model, 64)
        add("memwall fp32, batch 1", "(baseline)", 1,
            model.weight_bytes_per_step() + 64 * kv_bytes_per_token(model), base)
        hf_run = bench_decode(hf_model, engine="hf", tokenizer=tokenizer, prompt_tokens=64,
                              new_tokens=12,
                              repeats=1, warmup=0, bandwidth=bandwidth, progress=False)
        add("transformers generate", "(baseline)", 1, hf_run["bytes_per_step"], hf_run["tok_per_s"])

        # KV bytes: grouped-query (3 KV heads) against
        # multi-query (1, mean-pooled) at a long context.
        long_context = 2048
        mqa = pool_kv_heads(model, 1)
        for name, m in (("GQA (3 KV heads), 2k context", model),
                        ("MQA (1 KV head), 2k context", mqa)):
            add(name, "KV", 1, m.weight_bytes_per_step() + long_context * kv_bytes_per_token(m),
                decode_rate(m, long_context))
        del mqa

        # Weight bytes: weight-only int8 and int4 (group 32).
        for scheme in ("int8", "int4"):
            qmodel = quantize(copy.deepcopy(model), scheme, group_size=32)
            add(f"{scheme} weights", "weights", 1,
                qmodel.weight_bytes_per_step() + 64 * kv_bytes_per_token(qmodel),
                decode_rate(qmodel, 64))
            del qmodel

        # Tokens per read: a batch of 8 users, and speculative decoding with a self-draft.
        batch = 8
        batched = generate_batch(model, [prompt[: 8 + i] for i in range(batch)], 12)
        step = statistics.median(batched.step_times_s[2:])
        add(f"batch of {batch}", "tokens per read", batch,
            model.weight_bytes_per_step() + batch * 32 * kv_bytes_per_token(model), batch / step)

        k, draft_layers = 4, 8
        spec = speculative_generate(model, SelfDraft(model, draft_layers), prompt, 32, k=k)
        layer_bytes = sum(t.numel() * t.element_size()
                          for t in model.blocks[0].state_dict().values())
        draft_bytes = draft_layers * layer_bytes + model.lm_head.weight.numel() * 4
        bytes_per_round = model.weight_bytes_per_step() + k * draft_bytes
        add(f"speculative, self-draft {draft_layers} layers, k={k}", "tokens per read",
            spec.mean_tokens_per_pass,
            bytes_per_round, len(spec.tokens) / (spec.total_s - spec.prefill_s))

        print(f"bandwidth {bandwidth / 1e9:.1f} GB/s (measured above)\\n")
        print(f"{'technique':<42} {'reduces':<16} {'MB/step':>8} "
              f"{'ceiling':>8} {'measured':>9} {'% of ceiling':>12}")
        for technique, reduces, nbytes, ceiling, measured in rows:
            print(f"{technique:<42} {reduces:<16} {nbytes / 1e6:>8.0f} "
                  f"{ceiling:>8.1f} {measured:>9.1f} "
                  f"{100 * measured / ceiling:>11.0f}%")
        """),
        code("""
        fig, ax = plt.subplots(figsize=(7, 3.6))
        names = [r[0] for r in rows]
        y = np.arange(len(rows))
        ax.barh(y, [r[3] for r in rows], color="lightgray",
                label="ceiling (bandwidth / bytes per token)")
        ax.barh(y, [r[4] for r in rows], color="tab:blue", height=0.5, label="measured")
        ax.set_yticks(y, names); ax.invert_yaxis()
        ax.set_xlabel("tokens/s"); ax.legend(loc="lower right")
        ax.set_title("Every technique against its own roofline, this machine")
        plt.show()
        """),
        md("""
        Read the table as the book's summary. The ceiling column says what each technique *could* do on this
        machine, given the bytes it removes. The measured column says what it did. Where the ratio is low,
        something other than the memory wall is in the way: per-operation overhead (the overhead-bound regime of
        chapter 2), a matrix kernel that is slow for a few rows, dequantisation work, or a draft that costs more
        than it saves. Those gaps are where the next engineering effort should go, and no amount of reducing
        bytes will close them.
        """),
    ]
