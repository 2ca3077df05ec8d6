"""Chapter 9, "Measuring inference": the notebook's cells."""

from nbcells import code, md


def cells():
    return [
        md("""
        # 9. Measuring inference

        Every chapter so far has set a prediction beside a measurement. This one is about the measuring
        itself: how to time an inference engine so that the number means something, which numbers to
        report, how far each technique in this book got from its roofline on *this* machine, and which
        questions are still open in the field.
        """),
        code("""
        import os, statistics, time
        import numpy as np
        import matplotlib.pyplot as plt
        import torch
        from memwall import cost, hardware, models
        from memwall.engine import Transformer, decode_step, generate, prefill

        torch.manual_seed(0);  # the semicolon hides the returned Generator
        hf_model, tokenizer = models.load("smollm2-135m")
        model = Transformer.from_hf(hf_model)
        machine = hardware.measure()
        print(f"{machine.device}: {machine.threads} threads, "
              f"measured bandwidth {machine.bandwidth / 1e9:.1f} GB/s, "
              f"fp32 matmul {machine.flops['fp32'] / 1e9:.0f} GFLOP/s")
        """),
        md("""
        ## Method

        A decode step on this machine takes tens of milliseconds, and the machine is shared: other
        processes, the operating system and frequency changes all add noise, and almost all of it makes a
        run *slower*. Four habits make measurements trustworthy.

        **Warm up.** The first call of anything can pay for one-off work: memory allocation, thread-pool
        start-up, lazy initialisation, filling caches. Time a few calls and throw them away. Below, a model
        that has never run decodes five tokens with no prefill first, so step 1 is its very first call:
        """),
        code("""
        def time_decode_steps(model, n_steps, context=64):
            \"\"\"Wall time of each of n_steps decode steps after a prefill of `context` tokens,
            in seconds.\"\"\"
            cache = model.new_cache(max_tokens=context + n_steps + 1)
            if context:
                token = prefill(model, torch.randint(0, 1000, (1, context)), cache).argmax(-1)
            else:
                # no prefill: the first step is the model's first call
                token = torch.randint(0, 1000, (1,))
            times = []
            for _ in range(n_steps):
                start = time.perf_counter()
                token = decode_step(model, token, cache).argmax(-1)
                times.append(time.perf_counter() - start)
            return times

        fresh = Transformer.from_hf(hf_model)   # never run
        first = time_decode_steps(fresh, 5, context=0)
        print("first five steps of a fresh model (ms):", " ".join(f"{t * 1e3:.0f}" for t in first))
        ratio = first[0] / statistics.median(first[1:])
        print(f"step 1 took {ratio:.1f}x the median of steps 2-5 -> "
              + ("the one-off costs show" if ratio > 1.3 else "no clear one-off cost this time"))
        del fresh
        """),
        md("""
        How much the first call costs depends on what ran before it. In this notebook the hardware
        measurement and the model loading have already started PyTorch's thread pool, so a fresh model's
        first step may cost little extra; in a new process, or on a GPU (where the first call also loads
        kernels and picks algorithms), it can cost several normal steps. The last line says what it cost
        here. Either way the habit is cheap: discard the first calls, so that what you time is the steady
        state and not the start-up.
        """),
        md("""
        **Repeat and take the median; report the spread.** A single timing is one draw from a skewed
        distribution. The median ignores the occasional step that lost the CPU to someone else; the
        10th–90th percentile range says how noisy the machine was.
        """),
        code("""
        steps = np.array(time_decode_steps(model, 40)) * 1e3
        p10, p50, p90 = np.percentile(steps, [10, 50, 90])
        print(f"40 decode steps: median {p50:.1f} ms, p10 {p10:.1f} ms, p90 {p90:.1f} ms, "
              f"min {steps.min():.1f} ms, max {steps.max():.1f} ms, mean {steps.mean():.1f} ms")

        fig, ax = plt.subplots(figsize=(6, 2.8))
        ax.hist(steps, bins=20, color="tab:blue")
        for value, label in ((p50, "median"), (steps.mean(), "mean")):
            ax.axvline(value, color="k", ls="--" if label == "mean" else "-",
                       label=f"{label} {value:.1f} ms")
        ax.set_xlabel("decode step time (ms)"); ax.set_ylabel("steps"); ax.legend()
        ax.set_title("One model, one machine, 40 identical steps")
        plt.show()
        """),
        md("""
        **Control the threads.** PyTorch uses one thread per core by default. Decode on a CPU is a race to
        stream the weights, and one core alone usually cannot pull the full memory bandwidth: compare one
        thread with all of them. (memwall's engine lays its weights out for the thread count at load time,
        so we build a model for each setting.)
        """),
        code("""
        threads_default = torch.get_num_threads()
        per_threads = {}
        for n in sorted({1, threads_default}):
            torch.set_num_threads(n)
            model_n = Transformer.from_hf(hf_model)
            time_decode_steps(model_n, 3)
            per_threads[n] = statistics.median(time_decode_steps(model_n, 15)) * 1e3
            del model_n
        torch.set_num_threads(threads_default)
        for n, ms in per_threads.items():
            print(f"{n} thread(s): {ms:.1f} ms per decode step")
        """),
        md("""
        **Know which memory you are measuring.** A working set that fits in the CPU's last-level cache is
        read far faster than one that must come from DRAM. A small model can sit entirely in cache, and then
        "tokens per second" measures the cache, not the memory wall this book is about. Sweep the working
        set size and watch the read rate fall once it no longer fits.
        """),
        code("""
        def last_level_cache_bytes():
            \"\"\"The largest CPU cache the OS reports (Linux sysfs), or None.\"\"\"
            sizes = []
            for index in range(8):
                path = f"/sys/devices/system/cpu/cpu0/cache/index{index}/size"
                if os.path.exists(path):
                    text = open(path).read().strip()
                    scale = {"K": 1024, "M": 1024**2, "G": 1024**3}.get(text[-1], 1)
                    sizes.append(int(text.rstrip("KMG")) * scale)
            return max(sizes) if sizes else None

        def read_rate(n_bytes, repeats=5):
            data = torch.ones(n_bytes // 4)
            data.sum()
            times = []
            for _ in range(repeats):
                start = time.perf_counter(); data.sum(); times.append(time.perf_counter() - start)
            return n_bytes / min(times)

        llc = last_level_cache_bytes()
        sizes = [2**p for p in range(20, 31)]   # 1 MiB ... 1 GiB
        rates = [read_rate(s) for s in sizes]
        fig, ax = plt.subplots(figsize=(6, 3))
        ax.semilogx([s / 2**20 for s in sizes], [r / 1e9 for r in rates], "o-")
        if llc:
            ax.axvline(llc / 2**20, color="tab:red", ls="--",
                       label=f"last-level cache per core group: {llc / 2**20:.0f} MiB (per cpu0)")
            ax.legend()
        ax.set_xlabel("working set (MiB)"); ax.set_ylabel("read rate (GB/s)")
        ax.set_title("Reading a tensor once: cache versus DRAM")
        plt.show()
        print("SmolLM2-135M's weights in fp32: "
              f"{model.weight_bytes_per_step() / 2**20:.0f} MiB per step"
              + (f", {model.weight_bytes_per_step() / llc:.0f}x the last-level cache: "
                 "a DRAM measurement." if llc else "."))
        """),
        md("""
        When the model is smaller than the cache, say so next to every number, or make it larger (longer
        contexts, bigger batches, a bigger random-weight model of a real shape).

        **Time the device, not the launch.** On a GPU, PyTorch returns as soon as a kernel is *queued*.
        A timer around `model(x)` then measures Python, not the GPU. Call `torch.cuda.synchronize()` before
        reading the clock (memwall's `bench` does), or use CUDA events. On a CPU the work is done when the
        call returns; converting the next token to a Python `int`, as a real generation loop must, also
        forces the wait on either device.
        """),
        md("""
        ## The measures

        - **Time to first token (TTFT):** from the request to the first generated token. Dominated by prefill,
          so it grows with the prompt (chapter 1).
        - **Time per output token (TPOT):** the gap between later tokens; the decode step (chapter 3).
        - **Throughput:** generated tokens per second summed over all requests (chapter 6). A server can trade
          TPOT for throughput by batching; report both, with the batch size and context.
        """),
        code("""
        prompt = tokenizer("Explain in two sentences why decoding "
                           "is limited by memory bandwidth.").input_ids
        run = generate(model, prompt, 32)
        tpot = statistics.median(run.step_times_s)
        print(f"prompt {len(prompt)} tokens, {len(run.tokens)} generated")
        print(f"TTFT {run.ttft_s * 1e3:.0f} ms, TPOT {tpot * 1e3:.1f} ms (median), "
              f"so {1 / tpot:.1f} tok/s for this one user; "
              f"end-to-end {(run.ttft_s + sum(run.step_times_s)) * 1e3:.0f} ms")
        """),
    ]
