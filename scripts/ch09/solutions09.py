"""Chapter 9 exercises (solutions notebook; `memwall exercises` makes the student copy)."""

from nbcells import check, code, exercise, md, notebook


def build():
    return notebook("09_measuring_solutions", [
        md("""
        # Exercises 9: measuring inference

        Three small tools from chapter 9. Each comes with a widget that draws your function beside memwall's;
        until you fill it in, the plot says "not implemented yet". The check cell under each one tests your
        function on hidden random cases.
        """),
        md("""
        ## Exercise 1: fraction of the roofline

        A run produced `tok_per_s` tokens per second. Each step read `bytes_per_step` bytes and produced
        `tokens_per_step` tokens (1 for plain decode, B for a batch of B, the mean tokens per pass for speculative
        decoding). The memory `bandwidth_gb_s` is in GB/s (10⁹ bytes per second). Return the measured speed as a
        fraction of the bandwidth ceiling.
        """),
        exercise("ch09.fraction_of_roofline", "measured tok/s divided by tokens_per_step x bandwidth / bytes_per_step", '''
        def fraction_of_roofline(tok_per_s, bytes_per_step, bandwidth_gb_s, tokens_per_step=1):
            """Measured tokens/s as a fraction of the memory-bandwidth ceiling."""
            ### BEGIN SOLUTION
            ceiling = tokens_per_step * bandwidth_gb_s * 1e9 / bytes_per_step
            return tok_per_s / ceiling
            ### END SOLUTION
        '''),
        code('''
        from memwall.grading.checks.ch09 import reference_fraction_of_roofline
        from memwall.widgets import compare_plot

        compare_plot(fraction_of_roofline, reference_fraction_of_roofline,
                     x=("tok_per_s", [1, 2, 5, 10, 20, 30, 40, 50]),
                     sliders={"bytes_per_step": (1e8, 2e9, 1e8, 5.4e8),
                              "bandwidth_gb_s": (5, 100, 5, 20),
                              "tokens_per_step": [1, 2, 4, 8]},
                     xlabel="measured tokens/s", ylabel="fraction of the roofline")
        '''),
        check("ch09.fraction_of_roofline", "fraction_of_roofline", 2),
        md("""
        ## Exercise 2: percentiles of step times

        Benchmarks report the median and the tail (p90, p99) of many timings. Return the `q`-th percentile
        (0 ≤ q ≤ 100) of `values` by linear interpolation between the two closest ranks: sort the values,
        take position `(n - 1) * q / 100`, and interpolate between the values on either side of it. (This is
        what `numpy.percentile` does by default; write it without numpy.)
        """),
        exercise("ch09.percentile", "sort, find position (n-1)*q/100, interpolate between neighbours", '''
        def percentile(values, q):
            """The q-th percentile of values, interpolating linearly between ranks."""
            ### BEGIN SOLUTION
            ordered = sorted(values)
            position = (len(ordered) - 1) * q / 100
            low = int(position)
            high = min(low + 1, len(ordered) - 1)
            return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
            ### END SOLUTION
        '''),
        code('''
        import random
        from memwall.grading.checks.ch09 import reference_percentile

        # like chapter 9's histogram
        noisy_steps = [random.Random(9).lognormvariate(3.5, 0.3) for _ in range(40)]
        compare_plot(lambda q, spread: percentile([t * spread for t in noisy_steps], q),
                     lambda q, spread: reference_percentile([t * spread for t in noisy_steps], q),
                     x=("q", list(range(0, 101, 5))), sliders={"spread": (0.5, 2.0, 0.25, 1.0)},
                     xlabel="percentile q", ylabel="step time (ms)")
        '''),
        check("ch09.percentile", "percentile", 2),
        md("""
        ## Exercise 3: weights a mixture-of-experts step reads

        A mixture-of-experts layer has `n_experts` experts and routes each token to `active_experts` of them.
        Suppose every token picks its experts independently and uniformly. In a batch of `batch` tokens, an expert
        is read if at least one token picked it. Return the expected weight bytes read per step: `shared_bytes`
        (attention, embeddings, everything that is not an expert) plus the expected number of experts read times
        `expert_bytes`.

        Hint: the chance that one token does *not* pick a given expert is `1 - active_experts / n_experts`.
        """),
        exercise("ch09.moe_weight_bytes", "experts read = n_experts * (1 - (1 - active/n_experts)**batch)", '''
        def moe_weight_bytes(batch, n_experts, active_experts, expert_bytes, shared_bytes):
            """Expected weight bytes per step of a mixture-of-experts model
            at a given batch size."""
            ### BEGIN SOLUTION
            touched = n_experts * (1 - (1 - active_experts / n_experts) ** batch)
            return shared_bytes + touched * expert_bytes
            ### END SOLUTION
        '''),
        code('''
        from memwall.grading.checks.ch09 import reference_moe_weight_bytes

        compare_plot(moe_weight_bytes, reference_moe_weight_bytes,
                     x=("batch", [1, 2, 4, 8, 16, 32, 64, 128]),
                     sliders={"n_experts": [8, 16, 64], "active_experts": (1, 8, 1, 2),
                              "expert_bytes": 0.35e9, "shared_bytes": 3.2e9},
                     logx=True, xlabel="tokens in the batch", ylabel="bytes read per step")
        '''),
        check("ch09.moe_weight_bytes", "moe_weight_bytes", 2),
    ])
