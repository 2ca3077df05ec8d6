"""Exercises of chapter 1 (solution notebook): TTFT, TPOT, end-to-end latency from timings.

Pure functions on made-up timings, so the notebook runs in seconds and never loads the model.
"""

from nbcells import check, code, exercise, md, notebook

SLUG = "ex01"


def cells():
    return [
        md("""
        # Exercises 1: two phases behind one API call

        Four small functions about the numbers chapter 1 measured. Write each one, move the sliders
        to compare it with memwall's reference, then run the check cell below it: it tries your
        function on hidden random cases.

        Reminder: a reply of $n$ tokens arrives after TTFT + (n − 1)·TPOT, where TTFT (time to first
        token) is mostly prefill and TPOT (time per output token) is one decode step.
        """),
        code("""
        import random
        import statistics

        from memwall.widgets import compare_plot
        """),
        md("""
        ## Exercise 1: end-to-end latency

        Return the seconds until the last of `n_tokens` output tokens arrives, given the TTFT and
        the TPOT in seconds.
        """),
        exercise("ch01.latency", "the first token at TTFT, then n - 1 decode steps", """
        def end_to_end_latency(ttft_s, tpot_s, n_tokens):
            \"\"\"Seconds from sending the request until the n-th output token arrives.\"\"\"
            ### BEGIN SOLUTION
            return ttft_s + (n_tokens - 1) * tpot_s
            ### END SOLUTION
        """),
        md("""
        Slide the TTFT and TPOT: which one matters for a 20-token answer, and which for a 1,000-token one?
        """),
        code("""
        from memwall.grading.checks.ch01 import reference_end_to_end_latency

        compare_plot(end_to_end_latency, reference_end_to_end_latency,
                     x=("n_tokens", list(range(1, 1001, 10))),
                     sliders={"ttft_s": (0.05, 5.0, 0.05, 0.5),
                              "tpot_s": (0.005, 0.2, 0.005, 0.05)},
                     xlabel="output tokens n", ylabel="seconds until the last token",
                     title="TTFT + (n - 1) x TPOT")
        """),
        check("ch01.latency", "end_to_end_latency", 2),
        md("""
        ## Exercise 2: TPOT from a token stream

        A streaming client records when each token arrived, in seconds since the request was sent
        (`token_times_s[0]` is the TTFT). Return the TPOT: the average gap between consecutive
        tokens *after the first*. There are at least two tokens.
        """),
        exercise("ch01.tpot", "average of the gaps after the first token; TTFT is not a gap", """
        def time_per_output_token(token_times_s):
            \"\"\"Average seconds between consecutive output tokens, from their arrival times.\"\"\"
            ### BEGIN SOLUTION
            return (token_times_s[-1] - token_times_s[0]) / (len(token_times_s) - 1)
            ### END SOLUTION
        """),
        md("""
        The widget makes a stream with the TTFT and TPOT you choose (and a little jitter) and plots
        your estimate for replies of different lengths. A good estimate stays on the TPOT you set,
        even for short replies where a long TTFT could mislead it.
        """),
        code("""
        from memwall.grading.checks.ch01 import reference_time_per_output_token


        def stream(n_tokens, ttft_s, tpot_s):
            jitter = random.Random(n_tokens)  # the same stream for yours and the reference
            times = [ttft_s]
            for _ in range(n_tokens - 1):
                times.append(times[-1] + tpot_s * jitter.uniform(0.9, 1.1))
            return times


        compare_plot(lambda n_tokens, ttft_s, tpot_s:
                         time_per_output_token(stream(n_tokens, ttft_s, tpot_s)),
                     lambda n_tokens, ttft_s, tpot_s:
                         reference_time_per_output_token(stream(n_tokens, ttft_s, tpot_s)),
                     x=("n_tokens", list(range(2, 200, 4))),
                     sliders={"ttft_s": (0.05, 3.0, 0.05, 1.0), "tpot_s": (0.01, 0.2, 0.01, 0.05)},
                     xlabel="tokens in the reply", ylabel="estimated TPOT (s)")
        """),
        check("ch01.tpot", "time_per_output_token", 2),
        md("""
        ## Exercise 3: decode speed, robustly

        You timed a list of decode steps (seconds each). On a shared machine a step now and then
        takes far longer, because another process got the CPU. Return the decode speed in tokens
        per second from the *median* step time, so one such pause does not change the answer.
        """),
        exercise("ch01.decode_rate", "one token per step; use the median step time", """
        def decode_tokens_per_s(step_times_s):
            \"\"\"Tokens per second of decode, from the median of the measured step times.\"\"\"
            ### BEGIN SOLUTION
            return 1.0 / statistics.median(step_times_s)
            ### END SOLUTION
        """),
        md("""
        Here twenty steps take `step_ms` each, and one of them is stretched by a pause. A rate from
        the median stays flat however long the pause; one from the mean (`steps / total time`)
        falls as the pause grows. Try returning that instead and watch your curve leave the reference.
        """),
        code("""
        from memwall.grading.checks.ch01 import reference_decode_tokens_per_s


        def steps_with_pause(pause_ms, step_ms):
            return [step_ms / 1e3] * 19 + [(step_ms + pause_ms) / 1e3]


        compare_plot(lambda pause_ms, step_ms:
                         decode_tokens_per_s(steps_with_pause(pause_ms, step_ms)),
                     lambda pause_ms, step_ms:
                         reference_decode_tokens_per_s(steps_with_pause(pause_ms, step_ms)),
                     x=("pause_ms", list(range(0, 2001, 50))),
                     sliders={"step_ms": (5, 200, 5, 50)},
                     xlabel="length of one pause (ms)", ylabel="decode tokens/s")
        """),
        check("ch01.decode_rate", "decode_tokens_per_s", 2),
        md("""
        ## Exercise 4: predict TTFT for a new prompt

        Chapter 1 fitted a straight line through (prompt length, TTFT) measurements. Do the same:
        fit `ttft = intercept + slope × length` by least squares through all the points and return
        its prediction for a prompt of `prompt_tokens` tokens. (Plain Python is enough; `numpy.polyfit`
        is fine too.)
        """),
        exercise("ch01.predict_ttft", "least-squares line through all the points", """
        def predict_ttft(prompt_lengths, ttfts_s, prompt_tokens):
            \"\"\"TTFT (s) predicted for prompt_tokens by a least-squares line
            through the measurements.\"\"\"
            ### BEGIN SOLUTION
            mean_x = sum(prompt_lengths) / len(prompt_lengths)
            mean_y = sum(ttfts_s) / len(ttfts_s)
            slope = (sum((x - mean_x) * (y - mean_y) for x, y in zip(prompt_lengths, ttfts_s))
                     / sum((x - mean_x) ** 2 for x in prompt_lengths))
            return mean_y + slope * (prompt_tokens - mean_x)
            ### END SOLUTION
        """),
        md("""
        The sliders set the true line and the noise of five made-up measurements (at 64 … 1,024
        tokens); the plot extrapolates your fit to 4,096 tokens.
        """),
        code("""
        from memwall.grading.checks.ch01 import reference_predict_ttft

        LENGTHS = [64, 128, 256, 512, 1024]


        def noisy_ttfts(ms_per_token, fixed_ms, noise):
            draw = random.Random(7)
            return [(fixed_ms + ms_per_token * n) / 1e3 * draw.uniform(1 - noise, 1 + noise)
                    for n in LENGTHS]


        compare_plot(lambda prompt_tokens, ms_per_token, fixed_ms, noise:
                         predict_ttft(LENGTHS, noisy_ttfts(ms_per_token, fixed_ms, noise),
                                      prompt_tokens),
                     lambda prompt_tokens, ms_per_token, fixed_ms, noise:
                         reference_predict_ttft(LENGTHS, noisy_ttfts(ms_per_token, fixed_ms, noise),
                                                prompt_tokens),
                     x=("prompt_tokens", list(range(16, 4097, 64))),
                     sliders={"ms_per_token": (0.5, 10.0, 0.5, 3.0), "fixed_ms": (0, 200, 10, 50),
                              "noise": (0.0, 0.3, 0.05, 0.1)},
                     xlabel="prompt tokens", ylabel="predicted TTFT (s)")
        """),
        check("ch01.predict_ttft", "predict_ttft", 3),
    ]


def build():
    return notebook(SLUG, cells())
