"""Chapter 1, "Two phases behind one API call": prefill and decode, measured on SmolLM2-135M."""

from nbcells import code, md, notebook

SLUG = "ch01"


def cells():
    return [
        md("""
        # 1. Two phases behind one API call

        Send a prompt to a language model and two things happen, one after the other. First nothing
        shows up for a moment; then words arrive at a steady pace until the answer is done. These
        are two different computations with different limits:

        - **Prefill** runs the whole prompt through the model in *one* forward pass. Every weight
          matrix multiplies a matrix with one row per prompt token, so each weight that is read from
          memory is used for many tokens. Prefill is limited by arithmetic (it is *compute-heavy*).
        - **Decode** then produces the answer *one token per forward pass*, because each new token
          depends on the one before. Every step reads every weight once to do the work of a single
          row. Decode is limited by how fast the weights stream out of memory (it is
          *memory-bound*).

        This chapter measures both on a real model on this machine. The two numbers that describe
        one request are

        - **TTFT**, *time to first token*: from sending the request to receiving the first output
          token. It is dominated by prefill.
        - **TPOT**, *time per output token*: the average gap between consecutive output tokens after
          the first. It is the time of one decode step.

        and the latency of a whole answer of $n$ tokens is

        $$\\text{end-to-end latency} = \\text{TTFT} + (n - 1)\\cdot\\text{TPOT}.$$
        """),
        md("""
        ## A real model and memwall's engine

        The model is SmolLM2-135M-Instruct {cite}`allal2025smollm2`, a 30-layer Llama-style model,
        loaded in fp32 from the copy that ships with memwall. We run it with memwall's small
        inference engine, which keeps an explicit KV cache (chapter 4), after checking that it
        predicts the same next token as the transformers implementation.
        """),
        code("""
        import time

        import matplotlib.pyplot as plt
        import numpy as np
        import torch
        import transformers

        from memwall import cost
        from memwall.engine import Sampling, Transformer, generate
        from memwall.models import load
        from memwall.specs import get_spec

        transformers.utils.logging.disable_progress_bar()
        started = time.perf_counter()
        hf_model, tokenizer = load("smollm2-135m")
        model = Transformer.from_hf(hf_model)
        spec = get_spec("smollm2-135m")

        probe = torch.tensor([tokenizer("The capital of France is")["input_ids"]])
        with torch.inference_mode():
            reference_logits = hf_model(probe).logits[0, -1]
            engine_logits = model(probe)[0, -1]
        print(f"loaded in {time.perf_counter() - started:.1f} s; "
              f"{spec.n_params / 1e6:.0f}M parameters, "
              f"{cost.weight_bytes(spec, 'fp32') / 1e6:.0f} MB in fp32, "
              f"{torch.get_num_threads()} threads")
        print("same next token as transformers: "
              f"{bool(reference_logits.argmax() == engine_logits.argmax())}, "
              "largest logit difference "
              f"{float((reference_logits - engine_logits).abs().max()):.1e}")
        del hf_model  # from here on only the engine runs
        """),
        md("""
        ## Timing one request, token by token

        Here is generation written out with the two phases in plain sight. It records the moment each
        token becomes available, which is what a client streaming the answer would see. Greedy
        decoding (always the most likely token) keeps the run deterministic.
        """),
        code("""
        @torch.inference_mode()
        def timed_generate(model, prompt_ids, new_tokens):
            \"\"\"Greedy generation; returns the tokens and when each one was ready
            (s since the call).\"\"\"
            cache = model.new_cache(batch=1, max_tokens=len(prompt_ids) + new_tokens)
            start = time.perf_counter()
            # Prefill: the whole prompt in one pass; only the last position's logits are needed.
            logits = model(torch.tensor([prompt_ids]), cache, last_only=True)[:, -1]
            token = logits.argmax(-1)
            tokens, times = [int(token)], [time.perf_counter() - start]
            # Decode: one token per pass, each pass reading every weight again.
            while len(tokens) < new_tokens:
                token = model(token[:, None], cache)[:, -1].argmax(-1)
                tokens.append(int(token))  # int() waits for the result, so the clock is honest
                times.append(time.perf_counter() - start)
            return tokens, times


        def ttft_and_tpot(times):
            \"\"\"TTFT is when the first token arrived. TPOT is the average gap between later tokens;
            on a shared machine the median gap is a steadier estimate of it than the mean.\"\"\"
            return times[0], float(np.median(np.diff(times)))


        question = tokenizer("Explain why the sky is blue.")["input_ids"]
        ours, times = timed_generate(model, question, 8)
        theirs = generate(model, question, 8, Sampling(temperature=0.0))
        ttft, tpot = ttft_and_tpot(times)
        print(f"same tokens as memwall.engine.generate: {ours == theirs.tokens}")
        print(f"TTFT {ttft * 1e3:.0f} ms, "
              f"TPOT {tpot * 1e3:.0f} ms for a {len(question)}-token prompt")
        """),
        md("""
        ## Prefill grows with the prompt; decode does not

        Now the experiment: prompts from 16 to 1,024 tokens, a few decode steps after each, three
        repeats, medians. The prompts are cut from one longer text so that only the length changes.
        The repeats go round the whole sweep rather than one length at a time, so a burst of noise
        on this shared machine smears over all lengths instead of bending one of them.
        """),
        code("""
        paragraph = (
            "Long before computers could talk, people wrote down the rules of language in "
            "grammars and dictionaries. A modern language model learns those rules from "
            "examples instead: it reads a great deal of text and adjusts its weights until "
            "it predicts each next word well. When you ask it a question it does the same "
            "thing, one word at a time, and every word costs a full pass over all of its "
            "weights. "
        )
        long_text = tokenizer(paragraph * 20)["input_ids"]
        prompt_lengths = [16, 32, 64, 128, 256, 512, 1024]
        repeats, decode_steps = 3, 6
        assert len(long_text) >= max(prompt_lengths)

        timed_generate(model, long_text[:64], 4)  # warm-up: first calls allocate and pick kernels
        ttfts = {length: [] for length in prompt_lengths}
        gaps = {length: [] for length in prompt_lengths}
        sweep_started = time.perf_counter()
        for _ in range(repeats):
            for length in prompt_lengths:
                _, times = timed_generate(model, long_text[:length], decode_steps)
                ttfts[length].append(times[0])
                gaps[length].extend(np.diff(times))
        ttft_ms = np.array([np.median(ttfts[length]) for length in prompt_lengths]) * 1e3
        tpot_ms = np.array([np.median(gaps[length]) for length in prompt_lengths]) * 1e3
        print(f"sweep took {time.perf_counter() - sweep_started:.0f} s\\n")
        print(f"{'prompt tokens':>13} {'TTFT ms':>9} {'TPOT ms':>9} {'prefill ms/token':>17}")
        for length, t_first, t_step in zip(prompt_lengths, ttft_ms, tpot_ms):
            print(f"{length:>13} {t_first:>9.1f} {t_step:>9.1f} {t_first / length:>17.2f}")
        """),
        code("""
        slope_ms, intercept_ms = np.polyfit(prompt_lengths, ttft_ms, 1)
        print(f"TTFT ≈ {intercept_ms:.0f} ms + {slope_ms:.2f} "
              "ms × prompt tokens (least-squares line)")
        print(f"TTFT grew {ttft_ms[-1] / ttft_ms[0]:.0f}× from "
              f"{prompt_lengths[0]} to {prompt_lengths[-1]} "
              f"tokens; TPOT changed by {tpot_ms[-1] / tpot_ms[0]:.2f}×")
        print("per token: "
              f"prefill {ttft_ms[-1] / prompt_lengths[-1]:.2f} ms at {prompt_lengths[-1]} tokens, "
              f"decode {np.median(tpot_ms):.1f} ms, "
              f"{np.median(tpot_ms) / (ttft_ms[-1] / prompt_lengths[-1]):.0f}× more")

        fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
        left.plot(prompt_lengths, ttft_ms, "o", color="C0", label="measured (median)")
        fit_x = np.linspace(0, max(prompt_lengths), 50)
        left.plot(fit_x, intercept_ms + slope_ms * fit_x, "--", color="C0", alpha=0.6,
                  label=f"{intercept_ms:.0f} ms + {slope_ms:.2f} ms/token")
        left.set(xlabel="prompt length (tokens)", ylabel="TTFT (ms)",
                 title="Prefill: time to first token")
        left.set_ylim(bottom=0)
        left.legend()
        right.plot(prompt_lengths, tpot_ms, "o-", color="C1", label="decode: time per output token")
        right.plot(prompt_lengths, ttft_ms / np.array(prompt_lengths), "s-", color="C0",
                   label="prefill: time per prompt token")
        right.set(xlabel="prompt length (tokens)", ylabel="ms per token", xscale="log",
                  title="Cost per token: decode vs prefill",
                  ylim=(0, 1.2 * max(tpot_ms.max(), ttft_ms[0] / prompt_lengths[0])))
        right.set_xticks(prompt_lengths, [str(n) for n in prompt_lengths])
        right.minorticks_off()
        right.legend()
        fig.tight_layout()
        plt.show()
        """),
        md("""
        The left panel is close to a straight line: each prompt token adds about the same amount of
        prefill work. Attention adds a little more per token as the prompt grows, because each new
        token attends to all the earlier ones; the "prefill ms/token" column of the table shows how
        much that adds at these lengths on this machine (at the shortest prompts the fixed cost of
        the call raises that column too). The right panel shows why decode feels slow. A decode
        step's time changes far less with the prompt length than TTFT does (compare the two
        printed ratios), and it costs far more than one prompt token does in prefill, even though
        both push one token through the same 30 layers.

        The difference is reuse. Prefill reads each weight once and uses it for every prompt token;
        decode reads each weight once *per token*. memwall's cost model (`memwall.cost`, the
        subject of chapter 3) counts the FLOPs and bytes of both, and with the measured times we get
        the rate each phase achieved:
        """),
        code("""
        longest = prompt_lengths[-1]
        prefill_cost = cost.step(spec, new_tokens=longest, weight_dtype="fp32")
        # The engine computes logits for the last prompt
        # position only; drop the other rows' LM head.
        prefill_flops = prefill_cost.flops - 2 * (longest - 1) * spec.n_lm_head_params
        decode_cost = cost.step(spec, context=longest, new_tokens=1, weight_dtype="fp32")
        prefill_s, decode_s = ttft_ms[-1] / 1e3, tpot_ms[-1] / 1e3

        print(f"{'':26}{'prefill':>12}{'decode step':>14}")
        print(f"{'tokens processed':26}{longest:>12}{1:>14}")
        print(f"{'FLOPs (G)':26}{prefill_flops / 1e9:>12.1f}{decode_cost.flops / 1e9:>14.2f}")
        print(f"{'bytes moved (MB)':26}{prefill_cost.total_bytes / 1e6:>12.0f}"
              f"{decode_cost.total_bytes / 1e6:>14.0f}")
        print(f"{'FLOPs per byte':26}{prefill_flops / prefill_cost.total_bytes:>12.1f}"
              f"{decode_cost.arithmetic_intensity:>14.2f}")
        print(f"{'measured time (ms)':26}{prefill_s * 1e3:>12.0f}{decode_s * 1e3:>14.1f}")
        print(f"{'achieved GFLOP/s':26}{prefill_flops / prefill_s / 1e9:>12.1f}"
              f"{decode_cost.flops / decode_s / 1e9:>14.1f}")
        print(f"{'achieved GB/s':26}{prefill_cost.total_bytes / prefill_s / 1e9:>12.2f}"
              f"{decode_cost.total_bytes / decode_s / 1e9:>14.1f}")
        """),
        md("""
        Prefill does many FLOPs per byte it moves and runs at a rate set by the matmul units.
        A decode step does about half a FLOP per byte (two FLOPs per fp32 weight of four bytes), so
        its FLOP rate is a small fraction of prefill's, and its speed is set by how many bytes per
        second come out of memory (on this CPU part of each step also goes to Python and per-layer
        overhead). Chapter 2 turns this into a picture, the roofline; chapter 3 builds the decode
        speed limit from it.

        ## One API call, predicted and measured

        If the two phases are all there is, the two fitted numbers should predict a whole request.
        We ask the instruct model a question through its chat template, predict the latency of a
        200-token answer from the measurements above, then time the real call with
        `memwall.engine.generate`. Stop tokens are switched off so that the answer has exactly
        200 tokens. TPOT creeps up slowly as the context grows (each step also reads the KV cache),
        so the prediction uses the measured TPOT at the answer's average context length.
        """),
        code("""
        chat = [{"role": "user",
                 "content": "Why do language models generate text one token at a time?"}]
        prompt_ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True,
                                                   return_dict=True)["input_ids"]
        answer_tokens = 200

        predicted_ttft = (intercept_ms + slope_ms * len(prompt_ids)) / 1e3
        predicted_tpot = np.interp(len(prompt_ids) + answer_tokens / 2, prompt_lengths,
                                   tpot_ms) / 1e3
        predicted = predicted_ttft + (answer_tokens - 1) * predicted_tpot

        call_started = time.perf_counter()
        answer = generate(model, prompt_ids, answer_tokens, Sampling(temperature=0.0),
                          stop_tokens=())
        measured = time.perf_counter() - call_started
        measured_tpot = float(np.mean(answer.step_times_s))

        print(f"prompt: {len(prompt_ids)} tokens; answer: {len(answer.tokens)} tokens\\n")
        print(f"{'':16}{'TTFT ms':>9}{'TPOT ms':>9}{'latency s':>11}")
        print(f"{'predicted':16}{predicted_ttft * 1e3:>9.0f}"
              f"{predicted_tpot * 1e3:>9.1f}{predicted:>11.2f}")
        print(f"{'measured':16}{answer.ttft_s * 1e3:>9.0f}"
              f"{measured_tpot * 1e3:>9.1f}{measured:>11.2f}")
        print(f"\\nprediction off by {100 * (predicted - measured) / measured:+.0f}%; "
              f"TTFT + (n-1)·TPOT from the measured parts = "
              f"{answer.ttft_s + (len(answer.tokens) - 1) * measured_tpot:.2f} s")
        print(f"decode was {100 * (1 - answer.ttft_s / measured):.0f}% of this call's latency\\n")
        print(tokenizer.decode(answer.tokens)[:400] + " ...")
        """),
        md("""
        The error printed above is the test of the model "one call = one prefill + a string of decode
        steps". The measured parts add up to the whole by definition; the interesting part is how well
        numbers taken from *other* prompts predict it. The total is mostly decode steps, each
        predicted from many timed steps. TTFT is a single short call read off a line fitted to all
        the prompt lengths. Where the per-token column rises at long prompts (a negative intercept
        in the fit is the sign), that line underestimates short prompts, and one slow moment on a
        shared machine can move it further: compare the predicted and measured TTFT above with the
        error in the total. For a short
        question and a long answer, as here, nearly all the waiting is decode. A long document
        with a short answer (summarising, classifying) flips that, and then TTFT dominates.

        ## What to remember

        - One request is one **prefill** (the whole prompt, one pass, big matmuls) followed by
          **decode** (one token per pass, every weight read each time).
        - **TTFT** grows about linearly with the prompt; **TPOT** changes far less than TTFT.
          End-to-end latency is TTFT + (n − 1)·TPOT.
        - Per token, decode costs many times what prefill costs on the same model and machine,
          because prefill reuses each weight read for every prompt token and decode does not.
          Which of the two a change speeds up is the first question to ask about any optimisation.

        Exercises: [exercises/01_two_phases.ipynb](../exercises/01_two_phases.ipynb).
        """),
    ]


def build():
    return notebook(SLUG, cells())
