"""Chapter 6, batching: the ledger of a batched step, measured throughput, the KV cache taking over,
static vs continuous batching, and the paged KV cache."""

from nbcells import code, md

from ch06 import chapter_serving


def cells():
    return intro_cells() + ledger_cells() + measured_cells() + kv_cells() + chapter_serving.cells()


def intro_cells():
    return [
        md("""
        # 6. Batching

        Every cost of a generated token falls into one of three accounts: **weight bytes**, a fixed cost per
        step; **KV-cache bytes**, which grow with context × users; and **activations**, which are small in
        decode. Chapters 3 to 5 cut the bytes. This chapter leaves the bytes alone and changes the third
        lever: **how many tokens each read of the weights produces**.

        One decode step for one user reads every weight to produce one token. The same step can serve B users
        at once: stack their B current tokens into a matrix, and each weight matrix, read once, is multiplied
        by B rows instead of one. While decode is memory-bound, those extra rows cost almost nothing on
        hardware whose kernels stream the weights as fast for a few rows as for one: total throughput grows
        almost B-fold, and each user's time per token barely moves. Whether this machine's kernels do, the
        measured table below shows. The free ride stops when the arithmetic catches up with the bytes (the
        ridge point) or when the users' KV caches outweigh the weights {cite}`pope2022efficiently`.

        In this chapter we:
        1. write the ledger of a batched step and find where the ridge point lies, for this CPU and for an H100;
        2. batch sequences of different lengths in memwall's engine and check every output against decoding alone;
        3. measure throughput and latency against B next to the cost model, and look at where this CPU falls short;
        4. watch the KV cache take over at long contexts, with the calculator and a measurement;
        5. compare static and continuous batching on a stream of requests {cite}`yu2022orca`;
        6. look at the paged KV cache, with its block tables and fragmentation {cite}`kwon2023vllm`.
        """),
        code("""
        import math, random, statistics, time
        from collections import deque

        import matplotlib.pyplot as plt
        import numpy as np
        import torch
        import torch.nn.functional as F
        from IPython.display import Markdown, display

        from memwall import cost, models
        from memwall.bench.batch import predicted, time_decode_steps
        from memwall.engine import Transformer, cpu_kernels, generate
        from memwall.engine.batch import generate_batch, prefill_positions_and_mask
        from memwall.engine.block_manager import BlockManager
        from memwall.engine.scheduler import Request, Scheduler
        from memwall.hardware import get_hardware, measure
        from memwall.specs import get_spec

        torch.manual_seed(0);
        """),
    ]


def ledger_cells():
    return [
        md(r"""
        ## The ledger of a batched decode step

        One decode step for B sequences, each holding `context` cached tokens:

        - **weights**: every parameter is read once, whatever B is: $N \times b$ bytes for $N$ parameters of $b$ bytes;
        - **KV cache**: each sequence reads its own keys and values: $B \times (\text{context} + 1) \times \text{KV bytes per token}$;
        - **FLOPs**: each sequence multiplies its vector by every weight, 2 FLOPs per multiply-add, so
          $2 N B$, plus attention, which is $4 \times \text{layers} \times \text{heads} \times d_\text{head}$
          per attended position.

        Here it is for SmolLM2-135M in fp32, the model this machine runs, written out and checked against
        `memwall.cost.step`, which also counts the activations:
        """),
        code("""
        spec = get_spec("smollm2-135m")

        def batched_step(spec, batch, context, bytes_per_param, kv_bytes_per_element):
            kv_per_token = (2 * spec.n_layers * spec.n_kv_heads * spec.head_dim
                            * kv_bytes_per_element)
            weights = spec.n_params * bytes_per_param                 # read once per step
            kv = batch * (context + 1) * kv_per_token                 # read per sequence
            matmul_flops = 2 * batch * cost.matmul_params_per_token(spec)
            attention_flops = (4 * spec.n_layers * spec.n_heads * spec.head_dim
                               * batch * (context + 1))
            return weights, kv, matmul_flops + attention_flops

        rows = ["| B | weights | KV cache | activations | FLOPs | FLOPs per byte |",
                "|---:|---:|---:|---:|---:|---:|"]
        for batch in [1, 4, 16, 64, 256]:
            weights, kv, flops = batched_step(spec, batch, 512, 4, 4)
            ledger = cost.step(spec, batch=batch, context=512, weight_dtype="fp32")
            assert (weights, kv, flops) == (ledger.weight_bytes, ledger.kv_bytes, ledger.flops)
            rows.append(f"| {batch} | {weights / 1e6:,.0f} MB | {kv / 1e6:,.0f} MB "
                        f"| {ledger.activation_bytes / 1e6:.2f} MB "
                        f"| {flops / 1e9:,.1f} G | {ledger.arithmetic_intensity:.1f} |")
        display(Markdown("SmolLM2-135M, fp32, "
                         "512 cached tokens per sequence\\n\\n" + "\\n".join(rows)))
        """),
        md(r"""
        The weights column never changes, and the FLOPs grow with B. A 4-byte weight read once feeds $2B$
        FLOPs, so if the weights were the only bytes, the intensity would be $B/2$ FLOPs per byte in fp32
        (and $B$ with 2-byte weights). The first rows of the table are close to that. But the KV column grows
        with B as well, and at 512 tokens it soon rivals the weights. In the lower rows the intensity
        therefore falls far below $B/2$ and levels off. We come back to this below.

        ## Where the ridge point lies

        A step is memory-bound while its intensity is below the chip's **ridge point**, peak FLOP/s ÷
        bandwidth (chapter 2). While it is below, extra sequences ride along on the weight reads for free. So
        the ridge point sets the batch size at which batching stops being free. Here are this machine's
        ridge point, measured, and an H100's, from its datasheet:
        """),
        code("""
        # this machine: streaming bandwidth, fp32 matmul FLOP/s
        hw = measure(quick=True)
        this_machine = hw.as_hardware()
        cpu_ridge = cost.ridge_point(this_machine, "fp32")
        h100 = get_hardware("h100-sxm")
        h100_ridge = cost.ridge_point(h100, "bf16")
        print(f"this machine: {hw.bandwidth / 1e9:.1f} GB/s, "
              f"{hw.flops['fp32'] / 1e9:.0f} GFLOP/s fp32 "
              f"-> ridge point {cpu_ridge:.1f} FLOPs/byte")
        print(f"H100 SXM:     {h100.memory_bandwidth / 1e12:.2f} TB/s, "
              f"{cost.peak_flops(h100, 'bf16') / 1e12:.0f} "
              f"TFLOP/s dense bf16 -> ridge point {h100_ridge:.0f} FLOPs/byte")
        print(f"the H100's ridge point is {h100_ridge / cpu_ridge:.0f}x this machine's")

        def first_compute_bound_batch(spec, hardware, dtype, context, largest=4096):
            for batch in range(1, largest + 1):
                step = cost.step(spec, batch=batch, context=context, weight_dtype=dtype)
                if cost.compute_time(step, hardware) >= cost.memory_time(step, hardware):
                    return batch
            return None  # never, up to `largest`

        cases = [("SmolLM2-135M fp32 on this machine", spec, this_machine, "fp32"),
                 ("Llama 3 8B bf16 on an H100", get_spec("llama-3-8b"), h100, "bf16")]
        for label, model_spec, hardware, dtype in cases:
            found = {c: first_compute_bound_batch(model_spec, hardware, dtype, c)
                     for c in (32, 256, 2048)}
            print(f"{label}: compute-bound from B = " +
                  ", ".join(f"{b if b else 'never'} at context {c}" for c, b in found.items()))
        """),
        code("""
        batches = np.unique(np.geomspace(1, 4096, 40).astype(int))
        fig, ax = plt.subplots(figsize=(7.5, 4.2))
        for label, model_spec, dtype, context, style in [
                ("SmolLM2-135M fp32, context 32", spec, "fp32", 32, "C0-"),
                ("SmolLM2-135M fp32, context 2048", spec, "fp32", 2048, "C0--"),
                ("Llama 3 8B bf16, context 32", get_spec("llama-3-8b"), "bf16", 32, "C1-"),
                ("Llama 3 8B bf16, context 2048", get_spec("llama-3-8b"), "bf16", 2048, "C1--")]:
            intensity = [cost.step(model_spec, batch=int(b), context=context,
                                   weight_dtype=dtype).arithmetic_intensity
                         for b in batches]
            ax.plot(batches, intensity, style, label=label)
        ax.axhline(cpu_ridge, color="C2", lw=1)
        ax.text(1.2, cpu_ridge * 1.15, f"ridge point, this machine ({cpu_ridge:.1f})", color="C2")
        ax.axhline(h100_ridge, color="C3", lw=1)
        ax.text(1.2, h100_ridge * 1.15, f"ridge point, H100 bf16 ({h100_ridge:.0f})", color="C3")
        ax.set(xscale="log", yscale="log", xlabel="batch size B",
               ylabel="FLOPs per byte of a decode step",
               title="Batching raises the intensity of decode, until the KV cache caps it")
        ax.legend(fontsize=8, loc="lower right")
        plt.show()
        """),
        md(r"""
        At short context the lines rise in step with B. A step becomes compute-bound where its line crosses
        the ridge point, and the cell above printed that batch size for both machines. With 2-byte weights
        the intensity is at most about B, and with 4-byte weights about B/2. The KV and activation bytes
        lower it further, so the first compute-bound B lies above the ridge point (2-byte weights) or above
        twice the ridge point (4-byte weights). For Llama 3 8B on an H100 that takes hundreds of sequences.
        The H100's ridge point is the printed multiple of this machine's. Where that multiple is large, as
        on a CPU, far fewer sequences get there: compare the two printed batch sizes. The dashed lines bend
        over: at 2048 tokens each extra sequence adds KV bytes as fast as it adds FLOPs. The intensity then
        tends to $2N / (\text{context} \times \text{KV bytes per token})$ however large B gets, and for Llama 3
        8B at 2048 tokens that limit is below the H100's ridge. No batch size makes it compute-bound. The
        last section of this chapter comes back to that.

        ## Batching sequences of different lengths

        Real requests have prompts of different lengths, and a batch is a rectangle. memwall's
        `generate_batch` **left-pads**: prompts are right-aligned, so every sequence's newest token lands in
        the same cache slot, and one contiguous cache with one write position serves the whole batch. Two
        things make the padding invisible:

        - **positions**: a sequence padded by $p$ slots has the token in slot $s$ at position $s - p$. The
          rotary embedding then sees exactly the positions it would see alone.
        - **the attention mask**: no query attends to a pad slot. A pad query attends to itself only,
          because a softmax row with nothing to attend to would give NaN. That NaN would be written into
          the cache, and $0 \times \text{NaN}$ is still NaN.

        The alternative is a **ragged** layout, where each sequence keeps its own length and nothing is padded.
        It wastes no memory or FLOPs on pad slots, but it needs a cache that can put each sequence anywhere.
        The paged cache at the end of this chapter does that, and the continuous-batching scheduler uses it,
        because its sequences join at different times. For a batch that starts together, padding is the
        simplest correct choice. Here is the mask, written out and compared with the engine's:
        """),
        code("""
        def left_pad_positions_and_mask(lengths):
            longest = max(lengths)
            pads = [longest - n for n in lengths]
            positions = [[max(0, slot - pad) for slot in range(longest)] for pad in pads]
            mask = [[[(pad <= key <= query) or key == query for key in range(longest)]
                     for query in range(longest)]
                    for pad in pads]
            return torch.tensor(positions), torch.tensor(mask)[:, None]

        lengths = [5, 2, 4]
        ours = left_pad_positions_and_mask(lengths)
        engine = prefill_positions_and_mask(torch.tensor([max(lengths) - n for n in lengths]),
                                            max(lengths))
        assert all(torch.equal(a, b) for a, b in zip(ours, engine))
        print("positions:\\n", ours[0])
        print("mask of the 2-token prompt (rows: queries, columns: cache slots):\\n",
              ours[1][1, 0].int())
        """),
        md("""
        The real model next. Four prompts of different lengths are decoded as one batch, and each one alone.
        Greedy decoding is deterministic, so the tokens must be identical, and `tests/test_batching.py`
        asserts exactly this:
        """),
        code("""
        hf_model, tokenizer = models.load("smollm2-135m")
        model = Transformer.from_hf(hf_model)
        del hf_model  # the engine keeps its own copy of the weights

        texts = ["The capital of France is",
                 "def fibonacci(n):",
                 "Once upon a time, in a small village by the sea, "
                 "there lived an old fisherman who",
                 "Memory bandwidth limits the speed of language model inference because"]
        prompts = [tokenizer(t).input_ids for t in texts]
        together = generate_batch(model, prompts, 12)
        for prompt, tokens in zip(prompts, together.tokens):
            alone = generate(model, prompt, 12).tokens
            assert tokens == alone, "batched decoding changed a sequence's output"
            print(f"{len(prompt):>3} prompt tokens, same as alone: "
                  f"{tokens == alone}  ->  {tokenizer.decode(tokens)!r}")
        """),
    ]


def measured_cells():
    return [
        md("""
        ## Throughput and latency against B, measured

        Now the measurement. For each B, SmolLM2-135M in fp32 decodes B sequences that already hold
        32 tokens each. The cache is filled with random keys and values, because a step's time depends on
        how many bytes and FLOPs it has, not on their values. We time a few steps with memwall's
        `time_decode_steps`, the same function `memwall bench batch` uses, and repeat the whole sweep three
        times, interleaved, so that a burst of load from elsewhere does not land on one B only. The prediction
        next to each measurement comes from `memwall.bench.batch.predicted`: the cost model's step at the
        bandwidth and FLOP/s measured above, `max(bytes / bandwidth, FLOPs / peak)`.
        """),
        code("""
        BATCHES, CONTEXT, STEPS, ROUNDS = [1, 2, 4, 8, 16, 32], 32, 4, 3
        time_decode_steps(model, 4, CONTEXT, 2)  # warm-up: allocator, thread pool, caches
        samples = {b: [] for b in BATCHES}
        for _ in range(ROUNDS):
            for b in BATCHES:
                samples[b].append(time_decode_steps(model, b, CONTEXT, STEPS, seed=b)["step_s"])

        measured = {b: statistics.median(samples[b]) for b in BATCHES}
        forecast = {b: predicted(spec, this_machine, "fp32", b, CONTEXT + STEPS // 2)
                    for b in BATCHES}
        rows = ["| B | step (ms) | total tok/s | × B=1 | predicted step (ms) "
                "| predicted tok/s | bound | measured ÷ predicted |",
                "|---:|---:|---:|---:|---:|---:|---|---:|"]
        for b in BATCHES:
            f = forecast[b]
            rows.append(f"| {b} | {measured[b] * 1e3:.1f} | {b / measured[b]:.1f} "
                        f"| {measured[1] / measured[b] * b:.2f} "
                        f"| {f['predicted_step_ms']:.1f} | "
                        f"{f['predicted_tok_per_s']:.0f} | {f['predicted_bound']} "
                        f"| {b / measured[b] / f['predicted_tok_per_s']:.0%} |")
        display(Markdown("\\n".join(rows)))
        speedup_16 = (16 / measured[16]) / (1 / measured[1])
        print(f"B=16 gives {speedup_16:.1f}x the total tokens/s of B=1 "
              f"(the course's target is 8x: {'met' if speedup_16 >= 8 else 'NOT met'} in this run)")
        """),
        code("""
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        b = np.array(BATCHES)
        left.plot(b, [x / measured[x] for x in BATCHES], "o-", label="measured")
        left.plot(b, [forecast[x]["predicted_tok_per_s"] for x in BATCHES], "s--",
                  label="cost model (ceiling)")
        left.plot(b, b / measured[1], ":", color="gray", label="B × (B=1 measured)")
        left.set(xscale="log", yscale="log", xlabel="batch size B", ylabel="total tokens/s",
                 title="Throughput: all users together")
        left.set_xticks(BATCHES, [str(x) for x in BATCHES])
        right.plot(b, [measured[x] * 1e3 for x in BATCHES], "o-", label="measured")
        right.plot(b, [forecast[x]["predicted_step_ms"] for x in BATCHES], "s--",
                   label="cost model (floor)")
        right.set(xscale="log", xlabel="batch size B", ylabel="ms per token, per user",
                  ylim=(0, None),
                  title="Latency: what each user waits per token")
        right.set_xticks(BATCHES, [str(x) for x in BATCHES])
        for ax in (left, right):
            ax.legend()
        plt.show()
        """),
        md("""
        Read the two panels together. In the memory-bound ideal, the cost model's dashed lines show the
        signature: each user's time per token (right) stays flat while B grows, and total throughput (left)
        rises in step with B. Past the ridge point the dashed step time climbs and the throughput flattens,
        because every extra user now pays for their own FLOPs. The extra users are really free only as long as
        the measured throughput hugs the gray B× line and the measured step time stays flat.

        The cost model is a ceiling, and the measurement should land under it. The last column of the
        table says how far under, for each B. Two kinds of cost pull it down, and they change with B in
        opposite ways. The first is the per-step overhead chapter 3 measured: a SmolLM2 step is well over
        a thousand small operations (chapter 3 counted them), each with its Python and dispatch cost.
        That cost is paid once per step,
        whatever B is, so batching amortises it, and on its own it would make the last column rise with B.
        The second is the matrix multiplies themselves. A kernel that is much slower with a few rows than with
        one makes the step time climb long before the ridge point, and the last column then falls as B grows.
        Where the measured step time climbs from the first doublings of B, the second cost dominates. On a
        CPU this is common: many matmul kernels, MKL's fp32 ones among them (the BLAS that PyTorch uses on
        x86), are tuned for one row or for many. The engine uses memwall's own C kernel for up to 256 rows,
        and the next section measures it beside MKL's at a few rows.

        ### Small-M matrix multiplies: how fast can a few rows go?

        The FLOPs of a batched step are matrix products with B rows, so "M" (the row count) is small,
        from 2 to 32. BLAS libraries are tuned above all for large square matrices; thin shapes, M = 1
        included (compare `F.linear`'s first row with the others), are often a weak spot. Here is the biggest matrix of the model, the 576 × 49152 output head
        (113 MB in fp32, far beyond the caches), multiplied by M rows in up to five ways:

        - memwall's own kernel (`memwall/engine/cpu_kernels.c`), which the engine's `Linear` uses on a CPU
          where it builds: each core takes a slab of output rows and keeps a tile of 4 output rows × 3
          input rows of sums in registers, so every weight it loads serves 3 rows;
        - the row split the engine falls back to without it: one batched matmul over slabs of the
          output rows, one per core (chapter 3);
        - `F.linear` with the usual `[out, in]` weight;
        - `x @ W`, with the weight stored `[in, out]` (a transposed copy);
        - MKL's pre-packed GEMM (`torch.ops.mkl._mkl_linear`), which reorders the weight once for a given M.
        """),
        code("""
        head = model.lm_head
        K, N = head.in_features, head.out_features
        w_out_in = head.weight                        # [N, K]: the engine's own weight
        w_in_out = head.weight.t().contiguous()       # [K, N]: a transposed copy
        slabs = w_out_in.view(head.splits, N // head.splits, K)
        variants = {"row split (bmm)":
                    lambda x: torch.bmm(slabs, x.t().expand(head.splits, -1, -1)),
                    "F.linear, W [out, in]": lambda x: F.linear(x, w_out_in),
                    "x @ W, W [in, out]": lambda x: x @ w_in_out}
        if cpu_kernels.fp32_usable(torch.zeros(1, K), w_out_in):
            variants = {"memwall C kernel": lambda x: cpu_kernels.fp32_linear(x, w_out_in),
                        **variants}
        has_mkl_packed = hasattr(torch.ops, "mkl") and hasattr(torch.ops.mkl, "_mkl_linear")

        def median_seconds(fn, x, repeats=5):
            fn(x)
            times = []
            for _ in range(repeats):
                start = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        ROWS = [1, 2, 4, 8, 16, 32]
        gemm = {name: {} for name in [*variants, "MKL packed"]}
        with torch.inference_mode():
            for m in ROWS:
                x = torch.randn(m, K)
                for name, fn in variants.items():
                    gemm[name][m] = median_seconds(fn, x)
                if has_mkl_packed:
                    packed = torch.ops.mkl._mkl_reorder_linear_weight(w_out_in, m)
                    gemm["MKL packed"][m] = median_seconds(
                        lambda x: torch.ops.mkl._mkl_linear(x, packed, w_out_in, None, m), x)
                    del packed
        gemm = {name: t for name, t in gemm.items() if t}
        del w_in_out

        weight_bytes = K * N * 4
        rows = ["| rows M | " + " | ".join(gemm) + " |", "|---:|" + "---:|" * len(gemm)]
        for m in ROWS:
            rows.append(f"| {m} | " + " | ".join(f"{t[m] * 1e3:.1f} ms, "
                                                 f"{weight_bytes / t[m] / 1e9:.1f} GB/s, "
                                                 f"{2 * m * K * N / t[m] / 1e9:.0f} GFLOP/s"
                                                 for t in gemm.values()) + " |")
        display(Markdown("576 × 49152 fp32 weight times M rows: "
                         "time, weight bytes ÷ time, FLOP/s\\n\\n" + "\\n".join(rows)))
        best = {m: min(gemm, key=lambda name: gemm[name][m]) for m in ROWS}
        print("fastest per M:", best)
        print(f"this machine's roofline: {hw.bandwidth / 1e9:.1f} GB/s, "
              f"{hw.flops['fp32'] / 1e9:.0f} GFLOP/s")
        """),
        code("""
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, t in gemm.items():
            ax.plot(ROWS, [2 * m * K * N / t[m] / 1e9 for m in ROWS], "o-", label=name)
        intensity = [2 * m * K * N / (4 * (K * N + m * K + m * N)) for m in ROWS]
        ax.plot(ROWS, [min(hw.flops["fp32"], i * hw.bandwidth) / 1e9 for i in intensity], "k--",
                label="roofline of this machine")
        ax.set(xscale="log", yscale="log", xlabel="rows M (the batch size)",
               ylabel="GFLOP/s achieved",
               title="576 × 49152 fp32 matmul with M rows")
        ax.set_xticks(ROWS, [str(m) for m in ROWS])
        ax.legend(fontsize=8)
        plt.show()
        """),
        md("""
        The achieved FLOP/s should rise with M, since each weight byte now feeds M rows. How close each
        variant comes to the dashed roofline is that kernel's efficiency at this shape. The table and the
        plot are this run's figures. Which variant wins at which M depends on the CPU, the BLAS version and
        how busy the machine is, so measure before choosing one. On a GPU the engine uses plain `F.linear`
        (cuBLAS) for every M.

        What this means for the performance target (B = 16 at 8× the tokens/s of B = 1, printed above): on a
        2-core CPU with a ridge point of a few FLOPs per byte, B = 16 is at or past the ridge wherever the
        first compute-bound B printed in the ridge-point section is 16 or less. The step then
        costs FLOPs, not bytes, and the ceiling on the speed-up is the ratio of the two step times in the
        cost model, not 16. Where the run above misses 8×, the measured FLOP/s at M = 16 against the matmul
        peak show how much of the miss is the kernel, and the prediction column shows how much is
        the roofline itself.
        """),
    ]


def kv_cells():
    return [
        md(r"""
        ## Where the KV cache takes over

        Weights are a fixed cost per step. The KV cache grows with B × context, so at some point it
        outweighs them. Pope et al. make this the central trade-off of serving large models: at small batch
        and short context, loading the weights dominates; at large batch and long context, loading the KV
        cache does {cite}`pope2022efficiently`. That pressure is why MQA and GQA exist (chapter 5). The
        crossover is where

        $$B \times \text{context} \times \text{KV bytes per token} = \text{weight bytes}.$$

        With the calculator, for Llama 3 8B in bf16 on an H100. The dashed lines show what the same model
        would need with multi-head attention (32 KV heads instead of 8):
        """),
        code("""
        llama = get_spec("llama-3-8b")
        llama_mha = llama.with_kv_heads(llama.n_heads)
        contexts = np.unique(np.geomspace(128, 8000, 30).astype(int))
        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        for i, batch in enumerate([1, 8, 32, 128]):
            for model_spec, style in [(llama, "-"), (llama_mha, "--")]:
                steps = [cost.step(model_spec, batch=batch, context=int(c), weight_dtype="bf16")
                         for c in contexts]
                left.plot(contexts, [s.kv_bytes / s.total_bytes for s in steps], style,
                          color=f"C{i}",
                          label=f"B = {batch}" if style == "-" else None)
                right.plot(contexts, [cost.step_time_lower_bound(s, h100) * 1e3 for s in steps],
                           style, color=f"C{i}")
        left.axhline(0.5, color="gray", lw=1)
        left.set(xscale="log", xlabel="context (tokens per sequence)",
                 ylabel="share of step bytes that is KV cache",
                 title="Llama 3 8B bf16: GQA (solid) vs MHA (dashed)")
        right.set(xscale="log", yscale="log", xlabel="context (tokens per sequence)",
                  ylabel="step time at least (ms)",
                  title="H100 SXM: the floor under each step")
        left.legend()
        plt.show()

        weights = cost.weight_bytes(llama, "bf16")
        for model_spec, label in [(llama, "GQA, 8 KV heads"), (llama_mha, "MHA, 32 KV heads")]:
            crossover = weights / cost.kv_bytes_per_token(model_spec, "bf16")
            print(f"Llama 3 8B {label}: "
                  f"KV bytes equal the weights at B × context = {crossover:,.0f} tokens "
                  f"(e.g. B = 32 at {crossover / 32:,.0f} tokens)")
        """),
        md("""
        Below the gray line the weights dominate, and batching is nearly free. Above it, every extra user
        brings as many bytes as the model itself would at that point. The step time on the right then
        grows with B, and tokens/s per user fall. GQA pushes that point four times further out.

        **On this machine.** SmolLM2-135M has 538 MB of fp32 weights and 45 KiB of fp32 KV cache per token,
        so the crossover is near B × context ≈ 11,700 tokens. That fits in memory here. We time B = 8 at
        growing contexts, next to the cost model's prediction:
        """),
        code("""
        smol_weights = cost.weight_bytes(spec, "fp32")
        smol_kv = cost.kv_bytes_per_token(spec, "fp32")
        print("crossover for SmolLM2-135M fp32: "
              f"B × context = {smol_weights / smol_kv:,.0f} tokens")
        B_LONG, LONG_CONTEXTS = 8, [32, 512, 1024, 2048]
        long_rows, long_ms = [], {}
        for context in LONG_CONTEXTS:
            long_ms[context] = time_decode_steps(model, B_LONG, context, 4,
                                                 seed=context)["step_s"] * 1e3
            f = predicted(spec, this_machine, "fp32", B_LONG, context)
            long_rows.append(f"| {context} | {f['predicted_kv_bytes'] / 1e6:,.0f} MB | "
                             f"{f['predicted_kv_bytes'] / f['predicted_bytes_per_step']:.0%} "
                             f"| {long_ms[context]:.1f} | {f['predicted_step_ms']:.1f} "
                             f"| {f['predicted_step_ms'] / long_ms[context]:.0%} |")
        display(Markdown(f"B = {B_LONG}, "
                         f"SmolLM2-135M fp32 (weights {smol_weights / 1e6:,.0f} MB)\\n\\n"
                         "| context | KV bytes per step | KV share | "
                         "measured step (ms) | predicted (ms) | predicted ÷ measured |\\n"
                         "|---:|---:|---:|---:|---:|---:|\\n" + "\\n".join(long_rows)))
        # What does one more byte of KV cache cost? The
        # slope between the shortest and longest context.
        extra_bytes = B_LONG * (LONG_CONTEXTS[-1] - LONG_CONTEXTS[0]) * smol_kv
        extra_s = (long_ms[LONG_CONTEXTS[-1]] - long_ms[LONG_CONTEXTS[0]]) / 1e3
        print(f"extra KV bytes read per step: {extra_bytes / 1e6:,.0f} MB, "
              f"extra time: {extra_s * 1e3:.1f} ms "
              f"-> {extra_bytes / extra_s / 1e9:.1f} GB/s (streaming bandwidth measured: "
              f"{hw.bandwidth / 1e9:.1f} GB/s)")
        """),
        md("""
        At the longest context the KV cache is the larger share of the bytes, and the step time grows
        with it. The line that starts "extra KV bytes" converts that growth into a
        bandwidth. If it is close to the streaming bandwidth, KV bytes cost what the ledger says they cost. If it is lower, the attention code reads
        its bytes less efficiently than a plain stream: memwall's engine does attention with two batched
        matmuls per layer and no fused kernel.
        """),
    ]
