"""Chapter 7, second half: decode speed per format, the cost of dequantizing, quality, the KV cache."""

from nbcells import code, md


def speed_cells():
    return [
        md(r"""
        ## Measured decode speed for each format

        `memwall.engine.quant.quantize(model, "int8" | "int4", group_size=...)` swaps every linear layer
        of the engine for a packed one. An int4 layer keeps its codes packed two to a byte, plus a bf16 scale
        and offset per group. The byte count comes from the real tensors, and it matches `memwall.cost`.
        When a few activation rows come in, as in decode, the packed layers multiply with memwall's own CPU
        kernels (`memwall/engine/cpu_kernels.c`, about 150 lines of C with AVX2 instructions, compiled
        on first use). Each thread takes a slab of output rows, loads the int8 codes (or two int4 codes per
        byte), turns them into floats in registers and multiplies them with the fp32 activations: no
        full-size float copy of the weights is ever written. For more than a few rows, int8 layers use
        PyTorch's packed kernel `aten._weight_int8pack_mm` (bf16 activations), and int4 layers in memwall's
        layout dequantize the matrix and call `F.linear`. Where the C kernels cannot be built (no AVX2, no
        C compiler), both use PyTorch's packed kernels, `aten._weight_int8pack_mm` and
        `aten._weight_int4pack_mm_for_cpu`, which take bf16 activations. The next section times these
        paths on the same bytes.

        The output head has the largest int4 error in the table above, and the file itself keeps it at
        8 bits. So two int4 variants keep an **int8 head**, as the GGUF file keeps it at 8 bits; a third
        quantizes the head to int4 too. All six are timed in one run, with their repeats interleaved:
        """),
        code("""
        variants = {
            "fp32": fp32_model,
            "bf16": copy.deepcopy(fp32_model).to(torch.bfloat16),
            "int8": quantize(fp32_model, "int8", inplace=False),
            "int4-g32 + int8 head": quantize(fp32_model, "int4", group_size=32, head="int8",
                                             inplace=False),
            "int4-g64 + int8 head": quantize(fp32_model, "int4", group_size=64, head="int8",
                                             inplace=False),
            "int4-g32, int4 head": quantize(fp32_model, "int4", group_size=32, inplace=False),
        }
        print("memwall's CPU kernels:", "in use" if cpu_kernels.available()
              else f"not available ({cpu_kernels.unavailable_reason()}), PyTorch's kernels instead")
        prompt = quality.eval_token_ids(tokenizer, 32)
        NEW_TOKENS, REPEATS = 16, 5
        for model in variants.values():
            generate(model, prompt, 2)  # warm-up
        step_times = {name: [] for name in variants}
        # interleaved: a burst of load from elsewhere slows every format alike
        for _ in range(REPEATS):
            for name, model in variants.items():
                step_times[name] += generate(model, prompt, NEW_TOKENS).step_times_s

        speed = {}
        print(f"{'format':<22} {'weights':>9} {'ms/token':>9} "
              f"{'tok/s':>7} {'ceiling':>8} {'of ceiling':>10} "
              f"{'vs fp32':>8} {'not bytes':>10}")
        for name, model in variants.items():
            seconds = statistics.median(step_times[name])
            kv_bytes = model.new_cache(max_tokens=1).nbytes * (len(prompt) + NEW_TOKENS / 2)
            step_bytes = model.weight_bytes_per_step() + kv_bytes
            speed[name] = dict(tok_s=1 / seconds, ceiling=bandwidth / step_bytes,
                               weight_mb=model.weight_bytes_per_step() / 1e6,
                               leftover_ms=(seconds - step_bytes / bandwidth) * 1e3)
            row = speed[name]
            print(f"{name:<22} {row['weight_mb']:>6.0f} MB "
                  f"{seconds * 1e3:>9.1f} {row['tok_s']:>7.1f} "
                  f"{row['ceiling']:>8.0f} {row['tok_s'] / row['ceiling']:>10.0%} "
                  f"{row['tok_s'] / speed['fp32']['tok_s']:>7.2f}x {row['leftover_ms']:>7.1f} ms")

        all_int4 = variants["int4-g32, int4 head"].weight_bytes_per_step()
        print(f"\\nint4-g32 weights from the real tensors: {all_int4 / 1e6:.2f} MB; memwall.cost: "
              f"{cost.weight_bytes(spec, 'int4-g32') / 1e6:.2f} MB (the rest: "
              "fp32 norms and one embedding row)")
        for name in ("bf16", "int8", "int4-g32 + int8 head"):
            print(f"{name}: {speed['fp32']['weight_mb'] / speed[name]['weight_mb']:.1f}x "
                  "fewer weight bytes than fp32, "
                  f"{speed[name]['tok_s'] / speed['fp32']['tok_s']:.2f}x its tokens/s")
        """),
        code("""
        fig, ax = plt.subplots(figsize=(8, 3.8))
        names = list(speed)
        positions = np.arange(len(names))
        ax.bar(positions - 0.2, [speed[n]["ceiling"] for n in names], 0.4,
               label="ceiling: bandwidth / bytes per step", color="lightgray")
        ax.bar(positions + 0.2, [speed[n]["tok_s"] for n in names], 0.4, label="measured",
               color="C0")
        ax.set_xticks(positions, [n.replace(" + ", "\\n+ ").replace(", ", ",\\n") for n in names],
                      fontsize=8)
        ax.set_ylabel("decode tokens/s (batch 1)")
        ax.set_title(f"SmolLM2-135M on this machine ({bandwidth / 1e9:.0f} GB/s measured)")
        ax.legend()
        plt.tight_layout()
        plt.show()
        """),
        md(r"""
        Read the table with chapter 3's ledger in mind. The "not bytes" column is the step time minus the
        time needed to read the step's bytes at the measured bandwidth. Compare it across the formats. It is
        not one fixed number, because it mixes two costs. One is paid by every format alike: dozens of small
        operations per layer (norms, rotary embeddings, attention, casts), each dispatched from Python. The
        other belongs to the kernel: a matmul that reads its weights slower than the streaming bandwidth
        adds time that the bytes alone do not explain. The next section measures each kernel's read rate.
        Quantization shrinks only the bytes. So the further the bytes fall, the more the rest dominates, and
        the speed-up stays below the byte ratio (Amdahl's law). The bytes set the ceiling, and the overhead
        and the kernels decide how close you get to it. An engine that runs the whole step in compiled code,
        as llama.cpp does, can get much closer to the ceiling.

        bf16 halves the bytes. Compare its tokens/s with fp32 in the lines above. Where bf16 comes out
        slower than fp32, the kernel is the cause, not the bytes. On a CPU the engine's bf16 layers run the
        row-split batched matmul (chapter 3), and on a CPU without fast bf16 support that path can be far
        slower than its fp32 version. Chapter 3's bf16 `F.linear` is a different kernel, and there bf16 can
        win. Fewer bytes pay off only when the kernel's arithmetic keeps up with them.
        """),
    ]


def dequant_cost_cells():
    return [
        md(r"""
        ## Where dequantizing costs more than the bytes save

        The speed-up above depends on the kernel. Here are the 30 gate/up projections (1.77 M weights
        each), multiplied in several ways: memwall's C kernels, PyTorch's packed kernels, and the reference
        path that dequantizes the whole matrix first. Each way takes one row (a decode step) or 128 rows (a
        prefill chunk, or a batch):
        """),
        code("""
        def gate_ups(model):
            return [block.mlp.gate_up for block in model.blocks]

        int8_layers, int4_layers = (gate_ups(variants["int8"]),
                                    gate_ups(variants["int4-g32 + int8 head"]))
        with cpu_kernels.switched_off():  # the same int4 codes, in PyTorch's kernel layout
            int4_pytorch = [Int4Linear(layer.codes(), layer.scale_zero, 32)
                            for layer in int4_layers]
        # name: (one function per layer, weight bytes per weight)
        paths = {"fp32 (the engine's Linear)": (gate_ups(fp32_model), 4)}
        if cpu_kernels.available():
            paths["int8, memwall's C kernel"] = (
                [lambda x, l=l: cpu_kernels.int8_linear(x, l.codes, l.scales)
                 for l in int8_layers], 1)
        paths |= {
            "int8, PyTorch kernel, bf16 activations":
                ([lambda x, l=l: torch.ops.aten._weight_int8pack_mm(x.bfloat16(), l.codes, l.scales)
                  for l in int8_layers], 1),
            "int8, PyTorch kernel, fp32 activations":
                ([lambda x, l=l: torch.ops.aten._weight_int8pack_mm(x, l.codes, l.scales.float())
                  for l in int8_layers], 1),
            "int8: dequantize all, then matmul":
                ([layer.reference_forward for layer in int8_layers], 1),
        }
        if cpu_kernels.available():
            paths["int4-g32, memwall's C kernel"] = (
                [lambda x, l=l: cpu_kernels.int4_linear(x, l.packed, l.scale_zero, 32)
                 for l in int4_layers], 0.625)
        paths |= {
            "int4-g32, PyTorch kernel": (int4_pytorch, 0.625),
            "int4-g32: dequantize all, then matmul":
                ([layer.reference_forward for layer in int4_layers], 0.625),
        }

        def median_seconds(functions, x, repeats):
            \"\"\"Median seconds per call. Cycling through every layer's matrix (212 MB in fp32)
            means the weights come from memory, as in a decode step, not from the 32 MB cache.\"\"\"
            for fn in functions:
                fn(x)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                for fn in functions:
                    fn(x)
                times.append((time.perf_counter() - start) / len(functions))
            return statistics.median(times)

        one_row, many_rows = torch.randn(1, 576), torch.randn(128, 576)
        timings = {}
        print(f"{'path':<40} {'1 row':>9} {'read rate':>10} {'128 rows':>9}")
        with torch.inference_mode():
            for name, (functions, bytes_per_weight) in paths.items():
                t1, t_many = median_seconds(functions, one_row, 5), median_seconds(functions[:1],
                                                                                   many_rows, 3)
                weight_bytes = W.numel() * bytes_per_weight
                timings[name] = (t1, t_many)
                print(f"{name:<40} {t1 * 1e6:>6.0f} us "
                      f"{weight_bytes / t1 / 1e9:>6.1f} GB/s {t_many * 1e3:>6.1f} ms")

        fp32_1, fp32_many = timings["fp32 (the engine's Linear)"]
        pytorch_int8 = timings["int8, PyTorch kernel, bf16 activations"]
        print()
        if cpu_kernels.available():
            c_int8 = timings["int8, memwall's C kernel"][0]
            c_int4 = timings["int4-g32, memwall's C kernel"][0]
            print(f"1 row: memwall's int8 kernel is {fp32_1 / c_int8:.1f}x and its int4 kernel "
                  f"{fp32_1 / c_int4:.1f}x as fast as fp32; PyTorch's int8 kernel "
                  f"{fp32_1 / pytorch_int8[0]:.1f}x")
        print("1 row: dequantize-then-matmul takes "
              f"{timings['int8: dequantize all, then matmul'][0] / fp32_1:.1f}x (int8) and "
              f"{timings['int4-g32: dequantize all, then matmul'][0] / fp32_1:.1f}x "
              "(int4) the fp32 time")
        fp32_over_bf16 = timings['int8, PyTorch kernel, fp32 activations'][0] / pytorch_int8[0]
        print(f"1 row: PyTorch's int8 kernel with fp32 activations takes "
              f"{fp32_over_bf16:.0f}x its bf16 time")
        print("128 rows, against fp32: " + ", ".join(
            f"{name} {timings[name][1] / fp32_many:.1f}x" for name in timings if "kernel" in name))
        """),
        md(r"""
        Four lessons. The ratios printed above show how large each one is on this machine:

        - **Dequantizing all, then multiplying, throws the saving away.** The reference path writes a
          full-size fp32 copy of the matrix and reads it back, so it moves *more* bytes than fp32 does, and
          it also does the conversion work. Small bytes help only if the kernel reads them directly, with the
          dequantization *fused* into the matmul.
        - **The same int8 bytes can be fast or slow: the kernel decides.** Compare the read rates. To keep
          up with memory, a kernel has a few instructions per weight at most. memwall's int8 kernel spends
          three per 8 weights: one widening load, one integer-to-float conversion, one fused multiply-add,
          with four independent sums so that the additions do not wait on each other. PyTorch's kernel
          does more work per weight on this CPU (its bf16 activations must be converted too), and with
          fp32 activations it takes a path without SIMD, where converting each weight costs far more than
          reading it.
        - **Half the bytes is not half the time.** An int4 code must be masked and shifted out of its byte
          before it is converted, so the int4 kernel does more arithmetic per weight than the int8 one.
          Compare the two C kernels' times: where int4 is not twice as fast, or even slower, the
          unpacking, not memory, sets its speed.
        - **With many rows, the weights are reused.** The work becomes compute-bound (chapter 2), and bytes
          no longer decide the time. memwall's int8 and int4 kernels convert every weight again for every
          row, while the fp32 kernel reuses each loaded weight for several rows, so at 128 rows the
          quantized kernels fall behind fp32 (the last line gives the factors). The quantized layers
          therefore use their C kernels only up to 8 rows and hand larger inputs to another path:
          PyTorch's int8 kernel, or dequantize-then-`F.linear` for int4. Compare those rows' 128-row times
          with the C kernels' to see whether the hand-off pays here. Weight-only quantization helps the
          memory-bound regime: decode at small batch.
        """),
    ]


def quality_cells():
    return [
        md(r"""
        ## What it costs in quality

        Two measures, both from `memwall.quality` on the first tokens of the project's evaluation text. The
        first is **perplexity**, $\exp$ of the mean negative log-likelihood of each next token. The second is
        **top-1 agreement**, the fraction of positions where a format predicts the same next token as the
        fp32 model. Two variants appear here for quality only. **int4-g192** is a group size that
        PyTorch's int4 kernel does not take (memwall's takes any multiple of 32). **int8 KV cache** keeps fp32 weights but passes every key and value
        through `memwall.engine.kv_quant.KVCacheInt8` (one scale per token and head). bf16 is left out, to
        keep the chapter's run time down; its decode speed is in the table above.
        """),
        code("""
        EVAL_TOKENS = 256
        eval_ids = quality.eval_token_ids(tokenizer, EVAL_TOKENS)

        def with_int8_kv(model):
            \"\"\"The model, scoring the window through an int8 KV cache.\"\"\"
            return lambda ids: model(ids, KVCacheInt8.for_model(model, max_tokens=ids.shape[1]))

        scored = {"fp32": quality.score(fp32_model, eval_ids, window=EVAL_TOKENS)}
        for name in list(variants)[2:]:  # skip fp32 (done) and bf16
            scored[name] = quality.score(variants[name], eval_ids, window=EVAL_TOKENS)
        g192 = quantize(fp32_model, "int4", group_size=192, head="int8", inplace=False)
        scored["int4-g192 + int8 head"] = quality.score(g192, eval_ids, window=EVAL_TOKENS)
        weight_mb = {name: speed[name]["weight_mb"] for name in speed}
        weight_mb["int4-g192 + int8 head"] = g192.weight_bytes_per_step() / 1e6
        del g192
        scored["fp32 + int8 KV cache"] = quality.score(with_int8_kv(fp32_model), eval_ids,
                                                       window=EVAL_TOKENS)
        weight_mb["fp32 + int8 KV cache"] = weight_mb["fp32"]

        base = scored["fp32"].perplexity
        print(f"{len(eval_ids)} tokens of memwall's evaluation text\\n")
        print(f"{'format':<24} {'weights':>9} {'tok/s':>7} "
              f"{'perplexity':>11} {'change':>8} {'top-1 agreement':>16}")
        for name, result in scored.items():
            tok_s = f"{speed[name]['tok_s']:.1f}" if name in speed else "-"
            print(f"{name:<24} {weight_mb[name]:>6.0f} MB {tok_s:>7} {result.perplexity:>11.2f} "
                  f"{result.perplexity / base - 1:>+8.1%} "
                  f"{result.agreement(scored['fp32']):>16.1%}")

        head_saving = weight_mb["int4-g32 + int8 head"] - weight_mb["int4-g32, int4 head"]
        head_cost = (scored["int4-g32, int4 head"].perplexity
                     / scored["int4-g32 + int8 head"].perplexity - 1)
        print("\\nthe output head in int4 instead of int8: "
              f"{head_saving:.1f} MB fewer per step, perplexity {head_cost:+.1%}")
        """),
        code("""
        fig, ax = plt.subplots(figsize=(7, 4))
        for name in (n for n in speed if n in scored):
            ax.scatter(speed[name]["tok_s"], scored[name].perplexity, s=40)
            ax.annotate(name, (speed[name]["tok_s"], scored[name].perplexity), fontsize=8,
                        xytext=(5, 4), textcoords="offset points")
        ax.axhline(base, color="gray", linestyle=":", label="fp32 perplexity")
        ax.set_xlabel("measured decode tokens/s (batch 1, this machine)")
        ax.set_ylabel(f"perplexity ({len(eval_ids)} tokens, lower is better)")
        ax.set_title("Speed against quality")
        ax.legend(loc="upper left")
        plt.tight_layout()
        plt.show()
        """),
        md(r"""
        How to read the table, for this model, which (remember) was already 4-bit:

        - **int8** rounds every weight to within half of a step that is 1/127 of its row's range. Expect
          perplexity within noise of fp32 and most top-1 predictions kept. It is the safe choice nearly
          everywhere.
        - **int4-g32 with an int8 head** reuses the file's own grid, as shown above, so its body weights
          lose only the rounding of their bf16 scales. The output can still change: the head is rounded
          to its own int8 per-row grid, not the file's Q8_0 blocks, and when many tokens go through at once
          the int8 head's kernel (PyTorch's) rounds the activations to bf16. Its top-1 agreement shows how much those two change here. A model trained in
          16 bits would show a real loss from the int4 body as well, and that is the gap GPTQ and AWQ
          close.
        - **Larger groups** no longer line up with the file's blocks. At g = 64 or g = 192, the range of two
          or six blocks is squeezed into 16 levels. Compare their rows with g = 32.
        - **The output head** is where the last line above puts a price on a few megabytes. GGUF files keep
          the head at 8 bits or more for this reason.
        - **The int8 KV cache** row shows what rounding every key and value costs (next section).

        Perplexity on a few hundred tokens is a noisy estimate, so treat differences under a few percent as
        ties. Top-1 agreement is blunter, but it does not depend on how predictable the text is.
        """),
    ]


def kv_cells():
    return [
        md(r"""
        ## Quantizing the KV cache: what it buys at long context

        Weights are a fixed cost per step. The KV cache grows with context × users (chapters 4 to 6), so at
        long context it is the cache that needs shrinking. `KVCacheInt8` stores each key or value vector
        (one token, one KV head, 64 numbers) as int8 codes plus one fp32 scale. That is 1 + 4/64 bytes per
        number, which `memwall.cost` calls "int8-g64". The calculator first:
        """),
        code("""
        kv_formats = {"fp32": "fp32", "bf16": "bf16", "int8 (+ scales)": "int8-g64"}
        int8_weights = cost.weight_bytes(spec, "int8")
        print(f"SmolLM2-135M, one user; int8 weights = {int8_weights / 1e6:.0f} MB per step")
        for context in (1024, 8192):
            parts = ", ".join(f"{name} {cost.kv_cache_bytes(spec, context, 1, dtype) / 1e6:.0f} MB"
                              for name, dtype in kv_formats.items())
            print(f"  KV cache at {context:>5} tokens: {parts}")
        big = "llama-3.1-8b"
        print(f"\\n{big}, 16 users x 8192 tokens: "
              f"weights {cost.weight_bytes(big, 'bf16') / 1e9:.1f} GB in bf16; KV cache "
              f"{cost.kv_cache_bytes(big, 8192, 16, 'bf16') / 1e9:.1f} GB in bf16, "
              f"{cost.kv_cache_bytes(big, 8192, 16, 'int8-g128') / 1e9:.1f} GB in int8")

        contexts = np.arange(256, 8193, 256)
        fig, ax = plt.subplots(figsize=(7, 3.6))
        for name, dtype in kv_formats.items():
            total = [int8_weights + cost.kv_cache_bytes(spec, int(c), 1, dtype) for c in contexts]
            ax.plot(contexts, np.array(total) / 1e6, label=f"int8 weights + {name} KV cache")
        ax.axhline(int8_weights / 1e6, color="gray", linestyle=":", label="int8 weights alone")
        ax.set_xlabel("context (tokens)")
        ax.set_ylabel("bytes read per decode step (MB)")
        ax.set_title("SmolLM2-135M, one user: the cache overtakes the weights")
        ax.legend(fontsize=8)
        plt.tight_layout()
        plt.show()
        """),
        md(r"""
        Now measured. We take the int8-weight model and two caches holding 3,072 tokens each, one fp32 and
        one int8. Decode steps are timed at that context. Their contents are random, which changes
        nothing about the bytes. After each step we roll the cache back, so every step sees the same context.
        """),
        code("""
        CONTEXT = 3072
        model = variants["int8"]
        caches = {"fp32 KV": model.new_cache(max_tokens=CONTEXT + 1),
                  "int8 KV": KVCacheInt8.for_model(model, max_tokens=CONTEXT + 1)}
        caches["fp32 KV"].keys.normal_(), caches["fp32 KV"].values.normal_()
        for codes, scales in ((caches["int8 KV"].keys, caches["int8 KV"].key_scales),
                              (caches["int8 KV"].values, caches["int8 KV"].value_scales)):
            codes.random_(-127, 128), scales.fill_(1 / 127)
        for cache in caches.values():
            cache.length = CONTEXT
        calculator = {"fp32 KV": cost.kv_cache_bytes(spec, CONTEXT + 1, 1, "fp32"),
                      "int8 KV": cost.kv_cache_bytes(spec, CONTEXT + 1, 1, "int8-g64")}

        token = torch.tensor([prompt[0]])
        kv_times = {name: [] for name in caches}
        for _ in range(6):
            for name, cache in caches.items():
                start = time.perf_counter()
                decode_step(model, token, cache)
                kv_times[name].append(time.perf_counter() - start)
                cache.rollback(CONTEXT)
        print(f"{'cache':<8} {'allocated':>10} {'calculator':>11} "
              f"{'read per step':>14} {'bound':>9} {'measured':>9}")
        for name, cache in caches.items():
            read = model.weight_bytes_per_step() + cache.nbytes * CONTEXT / cache.max_tokens
            print(f"{name:<8} {cache.nbytes / 1e6:>7.1f} MB "
                  f"{calculator[name] / 1e6:>8.1f} MB {read / 1e6:>11.0f} MB "
                  f"{read / bandwidth * 1e3:>6.1f} ms "
                  f"{statistics.median(kv_times[name]) * 1e3:>6.1f} ms")
        print("the int8 cache holds the same tokens in "
              f"{caches['fp32 KV'].nbytes / caches['int8 KV'].nbytes:.2f}x "
              "less memory than fp32 "
              f"({calculator['fp32 KV'] / 2 / calculator['int8 KV']:.2f}x less than bf16)")
        ratio = statistics.median(kv_times["int8 KV"]) / statistics.median(kv_times["fp32 KV"])
        print(f"int8 KV step time / fp32 KV step time: {ratio:.2f}")
        """),
        md(r"""
        The allocated bytes match the calculator. Memory is the certain win: the same memory holds the
        printed factor more tokens, or more users (chapter 6's budget).

        Speed is less certain, and the last line above tells you what happened here. memwall's `update`
        hands attention a dequantized fp32 copy of the whole prefix at every layer of every step. That
        extra work is the same kind that made "dequantize, then matmul" slow for weights. It can eat the
        saving, or more than eat it. A serving engine fuses this into the attention kernel, which reads
        the int8 codes and scales directly. KIVI {cite}`liu2024kivi` goes down to 2 bits, quantizing keys
        per channel and values per token. Its point is the same: at long context the cache, not the
        weights, is the byte budget.

        ## What to remember

        - Weight-only quantization reduces **weight bytes**, the fixed cost of every step. From fp32,
          int8 is 4× fewer and int4-g32 (or Q4_1, both 5 bits per weight) 6.4× fewer. The ceiling rises by
          the same factor; the measured speed-up is smaller, because the per-step overhead does not shrink,
          and because the packed kernels can read their bytes below the streaming bandwidth (the section on
          dequantizing prints each kernel's read rate).
        - Bytes turn into speed only when the kernel reads the packed bytes and dequantizes in registers,
          with few enough instructions per weight to keep up with memory. A "dequantize, then matmul" path
          moves more bytes than fp32, and a kernel that does too much work per weight is compute-bound on
          a few bytes.
        - In int4, the group size trades bits for accuracy ($4 + 32/g$ bits per weight). The output head is
          the most sensitive layer. GPTQ and AWQ choose better codes for the same bytes.
        - GGUF Q4_1 is 32 four-bit codes plus an fp16 scale and an fp16 minimum per block, $x = d\,q + m$.
          The offline SmolLM2 model *is* that file decoded to floats, so it is already 4-bit.
        - KV-cache quantization reduces **KV bytes**, which grow with context × users. It buys memory at
          once, and speed only with a fused attention kernel.

        The exercises are in [exercises/07_quantization.ipynb](../exercises/07_quantization.ipynb): bits per
        weight and the ceiling, symmetric quantization with an error-against-bits slider, packing two int4
        codes into a byte, and a Q4_1 block decoder.
        """),
    ]


def cells():
    return speed_cells() + dequant_cost_cells() + quality_cells() + kv_cells()
