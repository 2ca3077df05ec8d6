"""Chapter 2, "Arithmetic intensity and the roofline": matmuls on this machine against the roofline."""

from nbcells import code, md, notebook

SLUG = "ch02"


def cells():
    return [
        md("""
        # 2. Arithmetic intensity and the roofline

        Chapter 1 found that prefill and decode run the same layers yet differ many times over in cost
        per token. The difference was how much arithmetic each byte read from memory pays for. This
        chapter turns that into the tool the rest of the book uses: the **roofline**
        {cite}`williams2009roofline`.
        """),
        md("""
        ## Two speeds and one ratio

        A chip has two speeds that matter here: its peak arithmetic rate $P$ (FLOP/s) and its memory
        bandwidth $B$ (bytes/s). A computation that does $F$ floating-point operations and moves $Q$
        bytes between memory and the chip can take no less than $F/P$ (arithmetic) and no less
        than $Q/B$ (traffic). Its **arithmetic intensity** is

        $$I = \\frac{F}{Q} \\quad \\text{(FLOPs per byte moved)},$$

        and the FLOP rate it can reach is at most

        $$\\text{attainable FLOP/s} = \\min(P,\\; I \\cdot B).$$

        On log-log axes this bound is a slanted line (bandwidth times intensity) that meets a flat
        roof (the peak) at the **ridge point** $I^* = P/B$. Below the ridge a computation is
        *memory-bound*: faster arithmetic would not help. Above it, it is *compute-bound*.

        ## The intensity of a matmul

        Take $A$ of shape $[M \\times K]$ times $W$ of shape $[K \\times N]$, as when $M$ tokens pass
        through a linear layer with weight $W$. Each of the $MN$ outputs is a sum of $K$ products:
        $2MKN$ FLOPs, counting the multiply and the add. In the best case each matrix crosses the
        memory bus once: read $A$ and $W$, write the output, $(MK + KN + MN)$ elements of $b$ bytes.
        So

        $$I(M) = \\frac{2MKN}{b\\,(MK + KN + MN)} \\;\\approx\\; \\frac{2M}{b} \\quad \\text{when } M \\ll K, N.$$

        With one row ($M=1$, one decoding token) each weight is used for one multiply-add: half a
        FLOP per byte in fp32 ($b=4$), one FLOP per byte in bf16 ($b=2$). Every extra row reuses the
        weights it has already paid for.
        """),
        code("""
        import os
        import time

        import matplotlib.pyplot as plt
        import numpy as np
        import torch

        from memwall import cost, hardware
        from memwall.plots import roofline


        def matmul_flops_bytes(m, k, n, bytes_per_element):
            \"\"\"FLOPs and bytes moved of [m x k] @ [k x n], each matrix crossing the bus once.\"\"\"
            return 2 * m * k * n, (m * k + k * n + m * n) * bytes_per_element


        # A GPU, if there is one, else the CPU; the weight must be much larger than the last-level
        # cache (32 MiB of L3 on the course machine, ~50 MiB of L2 on an H100) to time memory.
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        K = N = 4096 if device.type == "cpu" else 8192
        rows = [2**i for i in range(13)]  # M = 1, 2, 4, ..., 4096
        print(f"[M x {K}] @ [{K} x {N}]")
        print(f"{'M':>5} {'GFLOPs':>9} {'MB fp32':>9} "
              f"{'FLOPs/byte fp32':>16} {'FLOPs/byte bf16':>16}")
        for m in rows:
            flops, fp32_bytes = matmul_flops_bytes(m, K, N, 4)
            _, bf16_bytes = matmul_flops_bytes(m, K, N, 2)
            print(f"{m:>5} {flops / 1e9:>9.3f} {fp32_bytes / 1e6:>9.1f} "
                  f"{flops / fp32_bytes:>16.2f} {flops / bf16_bytes:>16.2f}")
        """),
        md("""
        ## This machine's roofline, measured

        `memwall.hardware.measure()` runs two short microbenchmarks: it streams a buffer much larger
        than the last-level cache (so the bytes really come from DRAM) and times a large square
        matmul. Each roof comes from one shape (one stream, one square matmul), timed a few times;
        the fastest repeat counts, since noise on a shared machine only slows a run down and the
        roofline is a ceiling.
        """),
        code("""
        started = time.perf_counter()
        measured = hardware.measure(device)
        this_machine = measured.as_hardware()
        peak, bandwidth = measured.flops["fp32"], measured.bandwidth
        print(f"{measured.device}, "
              f"{measured.threads} threads (measured in {time.perf_counter() - started:.1f} s)")
        print(f"memory bandwidth {bandwidth / 1e9:.1f} GB/s, fp32 matmul {peak / 1e9:.1f} GFLOP/s")
        print(f"ridge point: {peak / bandwidth:.1f} FLOPs per byte")

        h100 = hardware.CATALOG["h100-sxm"]
        print(f"\\nH100 SXM (datasheet): {h100.memory_bandwidth / 1e12:.2f} TB/s, "
              f"{h100.flops('bf16') / 1e12:.0f} dense bf16 TFLOP/s, "
              f"ridge {h100.ridge_point('bf16'):.0f} FLOPs per byte")
        print(f"the H100 computes {h100.flops('bf16') / peak:,.0f}× "
              f"faster than this {device.type.upper()} in fp32, "
              f"but streams memory only {h100.memory_bandwidth / bandwidth:,.0f}× faster")
        """),
        md("""
        A word on the H100's number. NVIDIA's datasheet {cite}`nvidia2023h100` quotes 1,979 TFLOP/s
        for bf16, but that figure assumes 2:4 structured sparsity: two of every four weights are
        zero and the tensor cores skip them. Ordinary dense weights get half, about 989 TFLOP/s,
        which is the rate memwall uses. Dividing by 3.35 TB/s puts the ridge near 295 FLOPs per
        byte: a bf16 matmul on an H100 needs hundreds of FLOPs per byte before its arithmetic units,
        rather than its memory, are the limit.

        ## Matmuls from 1 to 4,096 rows

        Now the experiment. On a CPU the weight is $4096 \\times 4096$ in fp32, 64 MiB: larger than
        the course machine's 32 MiB last-level cache, so a small-$M$ matmul has to stream it from
        DRAM. (A $2048 \\times 2048$ weight, 16 MiB, would sit in cache after the first call and
        measure the cache instead.) On a GPU the code picks $8192 \\times 8192$ for the same reason.
        Each point is the median of several timed calls.
        """),
        code("""
        def l3_cache_bytes():
            \"\"\"The L3 size the kernel reports for CPU 0 (None if it does not say).\"\"\"
            try:
                text = open("/sys/devices/system/cpu/cpu0/cache/index3/size").read().strip()
            except OSError:
                return None
            units = {"K": 2**10, "M": 2**20, "G": 2**30}
            return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


        def synchronize():
            if device.type == "cuda":
                torch.cuda.synchronize(device)


        def median_seconds(fn, repeats=5, min_total_s=0.2):
            \"\"\"Median time of one call to fn(), over `repeats` samples of enough calls
            to be timeable.\"\"\"
            start = time.perf_counter()
            fn()  # warm-up, and a first guess at how many calls make a sample long enough to time
            synchronize()
            calls = max(1, int(min_total_s / repeats / max(time.perf_counter() - start, 1e-9)))
            samples = []
            for _ in range(repeats):
                start = time.perf_counter()
                for _ in range(calls):
                    fn()
                synchronize()  # a GPU runs asynchronously: wait for the work, not just its launch
                samples.append((time.perf_counter() - start) / calls)
            return float(np.median(samples))


        torch.manual_seed(0);  # the semicolon hides the returned Generator
        weight = torch.randn(K, N, device=device)
        l3 = l3_cache_bytes()
        l3_text = f"{l3 / 2**20:.0f} MiB" if l3 else "not reported"
        print(f"weight: {weight.numel() * 4 / 2**20:.0f} MiB; L3 cache: {l3_text}")

        sweep_started = time.perf_counter()
        seconds, achieved, intensity = [], [], []
        with torch.inference_mode():
            for m in rows:
                activations = torch.randn(m, K, device=device)
                t = median_seconds(lambda: activations @ weight, repeats=5 if m < 512 else 3)
                flops, moved = matmul_flops_bytes(m, K, N, 4)
                seconds.append(t)
                achieved.append(flops / t)
                intensity.append(flops / moved)
        print(f"sweep took {time.perf_counter() - sweep_started:.0f} s\\n")
        print(f"{'M':>5} {'ms':>9} {'GFLOP/s':>9} {'GB/s':>7} "
              f"{'FLOPs/byte':>11} {'% of roofline':>14}")
        for m, t, rate, i in zip(rows, seconds, achieved, intensity):
            bound = min(peak, i * bandwidth)
            print(f"{m:>5} {t * 1e3:>9.2f} {rate / 1e9:>9.1f} "
                  f"{rate / i / 1e9:>7.1f} {i:>11.2f} {100 * rate / bound:>13.0f}%")
        above = [m for m, rate, i in zip(rows, achieved, intensity)
                 if rate > min(peak, i * bandwidth)]
        if above:
            print(f"\\nabove 100% at M = {', '.join(map(str, above))}: "
                  "each roof comes from one shape (one square matmul, one stream), "
                  "fastest of a few repeats taken earlier on a shared machine, "
                  "so a sweep point can beat it")
        """),
        code("""
        def rows_to_reach_ridge(k, n, bytes_per_element, ridge):
            \"\"\"Smallest M whose [M x k] @ [k x n] intensity reaches the ridge
            (None if none up to 2**20).\"\"\"
            for m in range(1, 2**20):
                flops, moved = matmul_flops_bytes(m, k, n, bytes_per_element)
                if flops / moved >= ridge:
                    return m
            return None


        fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
        (machine_line,) = roofline(left, this_machine, dtype="fp32", intensity_range=(0.1, 1000),
                               labels=[f"this {device.type.upper()} (measured roof)"],
                               points={f"matmul [M x {K}] @ [{K} x {N}], fp32":
                                           (intensity, achieved)})
        for m, i, rate in zip(rows, intensity, achieved):
            if m in (1, 16, 256, 4096):
                left.annotate(f"M={m}", (i, rate / 1e9), textcoords="offset points",
                              xytext=(-10, 8), fontsize=8)
        left.set_title("This machine: measured")

        bf16_intensity = [matmul_flops_bytes(m, K, N, 2)[0] / matmul_flops_bytes(m, K, N, 2)[1]
                          for m in rows]
        bf16_bound = [min(h100.flops("bf16"), i * h100.memory_bandwidth) for i in bf16_intensity]
        (gpu_line,) = roofline(right, h100, dtype="bf16",
                               labels=["H100 SXM, dense bf16 (datasheet)"],
                               colors=["C3"], flops_unit=1e12, flops_unit_name="TFLOP/s",
                               points={"same shapes in bf16: roofline bound":
                                           (bf16_intensity, bf16_bound)})
        right.set_title("H100 SXM: datasheet roofline (not measured here)")
        fig.tight_layout()
        plt.show()

        print(f"rows needed to reach the ridge for a {K} x {N} weight: "
              f"this {device.type.upper()} (fp32) M = "
              f"{rows_to_reach_ridge(K, N, 4, machine_line['ridge'])}, "
              f"H100 (bf16) M = {rows_to_reach_ridge(K, N, 2, gpu_line['ridge'])}; "
              "the H100's ridge is "
              f"{gpu_line['ridge'] / machine_line['ridge']:.0f}× further right")
        """),
        md("""
        Read the left panel from left to right. Below the ridge an ideal kernel climbs the slanted
        line: every call streams the same weight, so the time should barely change while the FLOPs
        double with each extra power of two in $M$. Real libraries need not behave like that:
        compare $M = 1$ with $M$ = 4 to 32 in the "ms" column. A library that runs $M = 1$ through
        a matrix-vector kernel and a few rows through a general matmul kernel tuned for other
        shapes can take several times as long for a few rows as for one, although it moves about
        the same bytes. Past the ridge the points should flatten out under the roof, where doubling
        the rows doubles the time. The "% of roofline" column says how close this machine's matmul
        library comes at each shape. A library tuned for big square matrices can sit well below the
        roof for thin shapes, and on a shared machine other processes take their share of both
        roofs. Where points land above the roof (the table says so when that happens), the
        measurement behind that part of the roof underestimated this machine: the single square
        matmul in `measure()` for the flat part, the stream for the slanted part. The roof was
        measured low, not beaten.

        The right panel puts the same shapes under the H100's roofline. Its ridge sits far to the
        right of this machine's, so on a GPU a matmul against a weight this size needs a few hundred
        rows before its tensor cores, not its memory, set the pace. Decoding one sequence gives it
        one row.

        ## Three regimes

        Horace He's "Making Deep Learning Go Brrrr" {cite}`he2022brrr` sorts the time a program
        spends into three buckets, and the fix depends on the bucket:

        - **Compute-bound**: the arithmetic units are busy. Large matmuls and long prefills live
          here. What helps: faster math (tensor cores, lower-precision arithmetic), fewer FLOPs.
        - **Memory-bound**: the units wait for bytes. Small-$M$ matmuls (decode!), element-wise
          operations and normalisations live here. What helps: fewer bytes (smaller weights, fused
          operations) or more work per byte (batching).
        - **Overhead-bound**: neither is busy; the time goes to Python, the framework's dispatch and
          launching each operation. Many tiny operations live here. What helps: fewer, bigger
          operations (fusion, compilation, CUDA graphs), not faster math or memory.

        The roofline covers the first two. The third is easy to see: time square matmuls from
        $1 \\times 1$ upwards and compare with the roofline's lower bound on their time,
        $\\max(F/P,\\, Q/B)$.
        """),
        code("""
        sizes = [2**i for i in range(10)]  # n x n @ n x n, n = 1 ... 512
        call_seconds, bound_seconds = [], []
        with torch.inference_mode():
            for n in sizes:
                a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
                call_seconds.append(median_seconds(lambda: a @ b, repeats=5, min_total_s=0.1))
                flops, moved = matmul_flops_bytes(n, n, n, 4)
                bound_seconds.append(max(flops / peak, moved / bandwidth))

        small = sizes.index(32)
        print(f"n = 1 → 32: FLOPs grow {(32 / 1) ** 3:,.0f}×, "
              f"measured time {call_seconds[small] / call_seconds[0]:.1f}×")
        print(f"a 1 x 1 matmul takes {call_seconds[0] * 1e6:.1f} µs; the roofline allows "
              f"{bound_seconds[0] * 1e9:.2f} ns, {call_seconds[0] / bound_seconds[0]:,.0f}× less")
        print(f"at n = {sizes[-1]} the measured time is "
              f"{call_seconds[-1] / bound_seconds[-1]:.1f}× the roofline bound")

        fig, ax = plt.subplots(figsize=(6.5, 4))
        ax.plot(sizes, np.array(call_seconds) * 1e6, "o-", label="measured time per call")
        ax.plot(sizes, np.array(bound_seconds) * 1e6, "--", color="gray",
                label="roofline bound max(F/P, Q/B)")
        ax.set(xscale="log", yscale="log", xlabel="matrix size n ([n x n] @ [n x n])",
               ylabel="time per call (µs)", title="Tiny matmuls are overhead-bound")
        ax.set_xticks(sizes, [str(n) for n in sizes])
        ax.minorticks_off()
        ax.legend()
        plt.show()
        """),
        md("""
        Compare the two growth factors printed above. For small matrices the time per call hardly
        follows the FLOPs: it is the fixed cost of calling into PyTorch and its matmul library,
        microseconds, while the arithmetic itself would take nanoseconds. Only for larger matrices
        does the measured line bend up towards the roofline bound. On a GPU the fixed cost of each
        operation (launching a kernel) is of the same order, which is why a decode step made of
        hundreds of small operations can be overhead-bound there too.

        ## Decoding one sequence has an intensity of about 1

        A decode step for one sequence multiplies every weight matrix by a single row. With 16-bit
        weights that is two FLOPs per two-byte weight: an intensity of about one, a few hundred
        times below the H100's ridge. memwall's cost model counts every byte (weights, KV cache,
        activations) and every FLOP of a real model's step; here is Llama 3 8B in bf16 at a 1,024-token
        context, as the batch grows:
        """),
        code("""
        print(f"{'batch':>6} {'FLOPs/byte':>11} {'KV share of bytes':>18} {'on an H100':>11}")
        for batch in [1, 4, 16, 64, 256, 1024]:
            step = cost.step("llama-3-8b", batch=batch, context=1024, weight_dtype="bf16")
            bound = "compute" if step.arithmetic_intensity >= h100.ridge_point("bf16") else "memory"
            print(f"{batch:>6} {step.arithmetic_intensity:>11.2f} "
                  f"{step.kv_bytes / step.total_bytes:>17.0%} {bound + '-bound':>15}")
        """),
        md("""
        At batch 1 the intensity is about one FLOP per byte, so decode runs at the bandwidth slope
        of the roofline and the arithmetic units of any modern chip sit mostly idle. Batching raises
        the intensity because the weights are read once for the whole batch, but only until the KV
        cache, which every sequence reads for itself, dominates the bytes; at this context the
        intensity levels off below the H100's ridge however large the batch (chapters 4 to 6).
        Chapter 3 turns the slope into a speed limit for decode: tokens/s ≤ bandwidth ÷ bytes per
        step.

        ## What to remember

        - **Arithmetic intensity** = FLOPs ÷ bytes moved. For $[M \\times K] \\cdot [K \\times N]$
          it is $2MKN / (b(MK + KN + MN))$, about $2M/b$ for few rows.
        - The **roofline**: attainable FLOP/s = min(peak, intensity × bandwidth). The **ridge
          point** peak ÷ bandwidth separates memory-bound from compute-bound; about 295 FLOPs/byte
          for an H100 SXM in dense bf16 (not the 1,979 TFLOP/s sparse figure).
        - Three regimes: **compute-**, **memory-** and **overhead-bound**. Identify which one you
          are in before picking a fix.
        - Batch-1 decode with 16-bit weights has intensity ≈ 1: deep in memory-bound territory.

        Exercises: [exercises/02_roofline.ipynb](../exercises/02_roofline.ipynb).
        """),
    ]


def build():
    return notebook(SLUG, cells())
