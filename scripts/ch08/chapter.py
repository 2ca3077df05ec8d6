"""Chapter 8, speculative decoding: the cells of chapters/08_speculative.ipynb."""

from nbcells import code, md


def cells():
    return [
        md(r"""
        # 8. Speculative decoding

        Chapter 3 showed that a batch-1 decode step reads every weight to produce a single token, so
        its speed is set by bytes, not FLOPs. Chapter 6 spent the same weight read on several users at
        once. This chapter spends it on several tokens **of one user**. A cheap *draft* guesses the next
        k tokens. The model we actually want, the *target*, then checks all k guesses in one forward
        pass, which reads its weights once. Every guess it agrees with is a token that cost no extra
        weight read {cite}`leviathan2023fast,chen2023accelerating`.

        Two things make this more than a trick:

        - **It is exact.** With the right acceptance rule the output has *exactly* the target's
          distribution. With greedy decoding it is token for token the target's own greedy output.
          Nothing about quality is traded.
        - **Its pay-off is a formula.** If each guess is accepted with probability α, a target pass
          yields on average (1 − α^(k+1)) / (1 − α) tokens. Whether that makes decoding *faster*
          depends on two costs: running the draft, and verifying k+1 tokens instead of one.

        We measure all of it on SmolLM2-135M {cite}`allal2025smollm2`, on this machine, with three
        drafts that need no download, and then look honestly at when it pays.
        """),
        code("""
        import statistics
        import time

        import matplotlib.pyplot as plt
        import numpy as np
        import torch

        from memwall import models
        from memwall.engine import Transformer, generate
        from memwall.engine.drafts import PromptLookupDraft, SelfDraft, first_layers
        from memwall.engine.speculative import (exact_acceptance, expected_tokens_per_pass,
                                                speculative_generate)

        hf_model, tokenizer = models.load("smollm2-135m")
        model = Transformer.from_hf(hf_model)
        del hf_model  # the engine holds its own copy of the weights
        print(f"{model.n_layers} layers, "
              f"{model.weight_bytes_per_step() / 1e6:.0f} MB of weights read per decode step")
        """),
        md(r"""
        We use two prompts, both through the model's chat template. One asks for a story: new text,
        which nothing but a language model can predict. The other asks the model to repeat a paragraph,
        so most of the answer is already sitting in the prompt.
        """),
        code('''
        PASSAGE = ("The memory wall is the growing gap between how fast processors compute "
                   "and how fast memory can feed them. When a language model decodes, it "
                   "reads every weight once for each token it produces, so the speed of "
                   "generation is set by memory bandwidth, not by arithmetic.")
        PROMPTS = {"story": "Write a short story about a lighthouse keeper who finds a message "
                            "in a bottle.",
                   "quote": "Repeat this paragraph word for word:\\n\\n" + PASSAGE}
        END = tokenizer.convert_tokens_to_ids("<|im_end|>")  # the end-of-turn token


        def chat(text):
            """Token ids of one user message, ready for the assistant's answer."""
            templated = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                      add_generation_prompt=True, tokenize=False)
            return tokenizer(templated, add_special_tokens=False)["input_ids"]


        prompt_ids = {name: chat(text) for name, text in PROMPTS.items()}
        print({name: len(ids) for name, ids in prompt_ids.items()}, "prompt tokens")
        '''),
        md(r"""
        ## Several tokens for one weight read

        Verification feeds the target the last accepted token plus k guesses: k+1 tokens in one forward
        pass, with the KV cache holding everything before them. In the ledger of chapter 3 that pass reads
        the same weight bytes as a one-token step. It reads a little more KV cache and does k+1 times the
        FLOPs. On a memory-bound machine it should therefore cost about one step. Let us measure it rather
        than assume it: the time of one forward pass of 1, 2, 3, 5 and 9 new tokens after a 64-token
        context, interleaved, median of five.
        """),
        code("""
        context_ids = prompt_ids["quote"][:64]
        fed_counts = [1, 2, 3, 5, 9]
        cache = model.new_cache(max_tokens=128)
        times = {n: [] for n in fed_counts}
        with torch.inference_mode():
            model(torch.tensor([context_ids]), cache)  # a 64-token context in the cache
            for repeat in range(6):
                for n in fed_counts:
                    fed = torch.tensor([context_ids[:n]])
                    start = time.perf_counter()
                    model(fed, cache)
                    elapsed = time.perf_counter() - start
                    cache.rollback(64)  # forget those tokens again
                    if repeat > 0:  # the first round is a warm-up
                        times[n].append(elapsed)

        pass_ms = {n: 1e3 * statistics.median(t) for n, t in times.items()}
        step_ms = pass_ms[1]
        # cost of a pass, in decode steps
        verify_ratio = {n: pass_ms[n] / step_ms for n in fed_counts}
        print(f"{'tokens fed':>10} {'ms':>8} {'x one step':>11} {'ms per token':>13}")
        for n in fed_counts:
            print(f"{n:>10} {pass_ms[n]:8.1f} {verify_ratio[n]:11.2f} {pass_ms[n] / n:13.1f}")
        print("one decode step reads the weights at "
              f"{model.weight_bytes_per_step() / step_ms / 1e6:.1f} GB/s")
        """),
        code("""
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        ax.plot(fed_counts, [verify_ratio[n] for n in fed_counts], "o-", label="measured")
        ax.plot(fed_counts, [1] * len(fed_counts), "--", color="gray",
                label="free: weights read once, 1 step")
        ax.plot(fed_counts, fed_counts, ":", color="C3", label="no sharing: one step per token")
        ax.set_xlabel("tokens fed in one forward pass (1 + k guesses)")
        ax.set_ylabel("time, in one-token decode steps")
        ax.set_title("What a verify pass costs on this machine")
        ax.legend()
        fig.tight_layout()
        """),
        md(r"""
        Read the middle column. On hardware whose ridge point (chapter 2) is far above the few FLOPs per
        byte of a k+1-token pass, such as a GPU at batch 1, that pass should cost close to one step: the
        extra FLOPs hide behind the weight read. A CPU need not behave like that. The one-token step is a
        matrix-vector product that the engine spreads over both cores (see `memwall/engine/linear.py`).
        A pass of a few tokens turns it into a skinny matrix-matrix product: each weight now serves k+1
        rows, which brings the pass towards a CPU's low ridge point (chapter 6), and how well the kernel
        handles a few rows decides how much of the extra arithmetic stays hidden. Chapter 6 times the same
        shape with memwall's kernel, a batched matmul and MKL's: they differ by more than the bytes. Where the middle column rises
        well above 1, verification is not free on this machine. The last column, the time per token, is what speculation lives on: it falls as more
        tokens share one pass. Every speed-up estimate below uses the measured ratios, not 1. On a shared
        machine they move from run to run, so read them as rough.
        """),
        md(r"""
        ## Draft, then verify, written out

        Here is greedy speculative decoding in a dozen lines, with the simplest draft there is: **prompt
        lookup** {cite}`saxena2023prompt`. It finds the last place where the context's final few tokens
        appeared before, and guesses that what followed then follows again. It costs no model call at all.

        The target's KV cache always holds every context token but the last. Each pass feeds that last
        token plus the guesses. The target's argmax after each fed token says what it would have produced
        there, so we keep guesses while they match, then take the target's own token. One rule keeps the
        cache honest: after a rejection, the keys and values of the rejected guesses are already in the
        cache, and `rollback` forgets them.
        """),
        code('''
        def lookup_guesses(context, k, ngram=3):
            """Up to k tokens that followed the latest earlier occurrence of the context's
            last n-gram."""
            for n in range(ngram, 0, -1):
                tail = context[-n:]
                for start in range(len(context) - n - 1, -1, -1):
                    if context[start:start + n] == tail:
                        return context[start + n:start + n + k]
            return []


        @torch.inference_mode()
        def greedy_speculative(model, guess, prompt, new_tokens, k):
            cache = model.new_cache(max_tokens=len(prompt) + new_tokens + k + 1)
            context = list(prompt)
            model(torch.tensor([context[:-1]]), cache)  # the cache holds all but the last token
            passes = 0
            while len(context) - len(prompt) < new_tokens:
                guesses = guess(context, k)
                fed = torch.tensor([[context[-1], *guesses]])
                # the target's token after each fed token
                best = model(fed, cache)[0].argmax(-1).tolist()
                kept = 0
                while kept < len(guesses) and guesses[kept] == best[kept]:
                    kept += 1
                # the kept guesses, then one token of its own
                context += guesses[:kept] + [best[kept]]
                cache.rollback(len(context) - 1)  # forget the rejected guesses' keys and values
                passes += 1
            return context[len(prompt):][:new_tokens], passes


        N_NEW = 48
        ours, passes = greedy_speculative(model, lookup_guesses, prompt_ids["quote"], N_NEW, k=4)
        plain = generate(model, prompt_ids["quote"], N_NEW).tokens
        memwall_out = speculative_generate(model, PromptLookupDraft(ngram=3), prompt_ids["quote"],
                                           N_NEW, k=4)
        print("same tokens as plain greedy decoding:", ours == plain)
        print("same tokens as memwall's speculative_generate:", ours == memwall_out.tokens)
        print(f"{N_NEW} tokens in {passes} target passes: {N_NEW / passes:.2f} tokens per pass")
        print(repr(tokenizer.decode(ours)))
        '''),
        md(r"""
        The output is the target's own greedy output, and it took far fewer target passes than tokens. One
        honest footnote on "identical". The k+1-token pass and the one-token step add up the same numbers
        in a different order, so their logits can differ in the last bits of a float. If two candidate
        tokens were tied to within that rounding, the two methods could pick different ones. The tests of
        `memwall.engine.speculative` check on real text that this does not happen in practice.
        """),
        md(r"""
        ## The acceptance rule, and why it is exact

        Greedy decoding only needs "does the guess equal the argmax?". Sampling needs more care. A draft
        that guesses x with probability q(x) is not the target, which would produce x with probability
        p(x). Leviathan et al. {cite}`leviathan2023fast` and Chen et al. {cite}`chen2023accelerating` give
        a rule that corrects the difference exactly:

        1. accept the guess x with probability min(1, p(x) / q(x));
        2. if it is rejected, draw a replacement from the **residual** max(0, p − q), normalised, and stop
           this pass (later guesses were built on the rejected token);
        3. if all k guesses survive, draw one **bonus** token from the target's distribution after the last
           guess. The verify pass computed it anyway.

        Why this gives exactly p: the chance of emitting x through acceptance is q(x) · min(1, p(x)/q(x)) =
        min(p(x), q(x)). A rejection happens with probability β' = 1 − Σ min(p, q), and Σ max(0, p − q)
        is that same number. So the replacement path adds max(0, p(x) − q(x)), and min(p, q) + max(0, p − q)
        = p. Greedy decoding is the special case where p and q are point masses: a guess survives iff it
        is the argmax, and the residual is the argmax.

        A toy distribution over six tokens makes this concrete. Below, a draft that is wrong about the
        shape (q) drives the rule 200,000 times, vectorised in numpy.
        """),
        code('''
        p = np.array([0.35, 0.25, 0.20, 0.10, 0.07, 0.03])  # the target
        # the draft: a different guess at the same vocabulary
        q = np.array([0.10, 0.40, 0.10, 0.30, 0.05, 0.05])


        def speculate_once(p, q, samples, rng, replacement="residual"):
            """One guess per sample from q, the acceptance test, and a replacement
            for each rejection."""
            guess = rng.choice(len(q), size=samples, p=q)
            accepted = rng.random(samples) < p[guess] / q[guess]
            residual = np.maximum(p - q, 0)
            fallback = residual / residual.sum() if replacement == "residual" else p
            replacement_token = rng.choice(len(p), size=samples, p=fallback)
            return np.where(accepted, guess, replacement_token), accepted.mean()


        rng = np.random.default_rng(0)
        samples = 200_000
        exact_tokens, acceptance = speculate_once(p, q, samples, rng)
        wrong_tokens, _ = speculate_once(p, q, samples, rng, replacement="p")
        exact_freq = np.bincount(exact_tokens, minlength=len(p)) / samples
        wrong_freq = np.bincount(wrong_tokens, minlength=len(p)) / samples

        overlap = np.minimum(p, q)
        print("min(p,q)           ", overlap.round(3))
        print("max(0,p-q)         ", np.maximum(p - q, 0).round(3))
        print("sum of the two rows", (overlap + np.maximum(p - q, 0)).round(3), "= p")
        print(f"acceptance: predicted sum(min(p,q)) = {overlap.sum():.3f}, "
              f"measured {acceptance:.3f}")
        print(f"total variation from p: exact rule {0.5 * np.abs(exact_freq - p).sum():.4f}, "
              f"replacement drawn from p instead {0.5 * np.abs(wrong_freq - p).sum():.4f}")
        '''),
        code("""
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        width = 0.2
        tokens = np.arange(len(p))
        for offset, (values, label) in enumerate([(p, "target p"), (q, "draft q"),
                                                  (exact_freq, "exact rule"),
                                                  (wrong_freq, "replacement from p (wrong)")]):
            ax.bar(tokens + (offset - 1.5) * width, values, width, label=label)
        ax.set_xlabel("token")
        ax.set_ylabel("probability / frequency")
        ax.set_title("What the verify step emits, 200,000 trials")
        ax.legend(fontsize=8)
        fig.tight_layout()
        """),
        md(r"""
        The exact rule lands on p to within sampling noise. The plausible-looking shortcut of redrawing
        from p after a rejection does not: it gives too much weight to tokens the draft already overrates
        (token 1 and token 3 here). The acceptance rate Σ min(p, q) is 1 minus the total variation
        distance between the two distributions, so a draft is good exactly when it is close to the target.

        memwall's `exact_acceptance` takes p and q for k guesses at once and returns how many survive
        and the next token. Its statistical test against the true distribution, and the same test
        catching two broken rules, live in `tests/test_speculative.py`. Here we only confirm that it
        matches the toy:
        """),
        code("""
        generator = torch.Generator().manual_seed(0)
        p_t, q_t = (torch.tensor(np.stack([p, p]), dtype=torch.float32),
                    torch.tensor(q[None], dtype=torch.float32))
        emitted = []
        for _ in range(5000):
            guess = torch.multinomial(q_t[0], 1, generator=generator)
            kept, token = exact_acceptance(p_t, q_t, guess, generator)
            emitted.append(int(guess) if kept == 1 else token)
        memwall_freq = np.bincount(emitted, minlength=len(p)) / len(emitted)
        print("memwall's rule, 5,000 trials:", memwall_freq.round(3))
        print(f"total variation from p: {0.5 * np.abs(memwall_freq - p).sum():.3f}")
        """),
        md(r"""
        ## How many tokens per target pass?

        If each guess is accepted with the same probability α, independently, a pass yields one token of
        the target's own plus every guess before the first rejection. It yields at least i+1 tokens with
        probability α^i (for i ≤ k), so the mean is 1 + α + α² + … + α^k = (1 − α^(k+1)) / (1 − α). This
        is eq. 1 of Leviathan et al. It can never exceed 1/(1 − α), however large k gets: at α = 0.5, no
        k gives more than 2 tokens per pass.
        """),
        code("""
        def tokens_per_pass(alpha, k):
            return sum(alpha ** i for i in range(k + 1))


        ks = np.arange(1, 17)
        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for alpha in [0.2, 0.5, 0.8, 0.95]:
            ax.plot(ks, [tokens_per_pass(alpha, k) for k in ks], "o-", markersize=3,
                    label=f"α = {alpha}")
            assert all(abs(tokens_per_pass(alpha, k) - expected_tokens_per_pass(alpha, k)) < 1e-9
                       for k in ks)
        ax.set_xlabel("guesses per pass k")
        ax.set_ylabel("expected tokens per target pass")
        ax.set_title("(1 − α^(k+1)) / (1 − α)")
        ax.legend()
        fig.tight_layout()
        print("our sum matches memwall's expected_tokens_per_pass")
        """),
        md(r"""
        ## How good are the drafts?

        α is a property of a draft *and* of the text. We need the target's plain greedy answer to both
        prompts; the quote's we already have.
        """),
        code("""
        answers = {"quote": plain, "story": generate(model, prompt_ids["story"], N_NEW).tokens}
        print(repr(tokenizer.decode(answers["story"])))
        """),
        md(r"""
        **Self-drafting** uses the target's own first N layers, then its final norm and LM head, as the
        draft. It shares every weight, so it needs no extra memory. How often does such an early exit agree
        with the full model? Reading the prediction off every layer of one forward pass answers that for
        every N at once: it is the "logit lens" {cite}`nostalgebraist2020logit`. For greedy decoding this
        agreement rate over the answer's positions *is* α: a guess survives exactly when the draft's argmax
        at a prefix of the true output equals the target's.
        """),
        code('''
        from memwall.engine.model import causal_mask


        @torch.inference_mode()
        def early_exit_agreement(model, prompt, answer):
            """For each depth N: how often the argmax after N layers equals the full model's,
            over the answer."""
            ids = torch.tensor([prompt + answer])
            length = ids.shape[1]
            x = model.embed(ids)
            rope = model.rotary(torch.arange(length), x.dtype)
            mask = causal_mask(length, 0, ids.device)
            # the positions that predicted the answer
            answer_positions = slice(len(prompt) - 1, length - 1)
            guesses = []
            for layer, block in enumerate(model.blocks):
                x = block(x, rope, None, layer, mask)
                guesses.append(model.lm_head(model.norm(x[:, answer_positions])).argmax(-1))
            final = guesses[-1]
            return [float((g == final).float().mean()) for g in guesses]


        depths = list(range(1, model.n_layers + 1))
        alpha_self = {name: early_exit_agreement(model, prompt_ids[name], answers[name])
                      for name in prompt_ids}
        for name, alphas in alpha_self.items():
            print(name, " ".join(f"N={n}:{alphas[n - 1]:.2f}" for n in (4, 8, 12, 16, 20, 24, 28)))
        '''),
        md(r"""
        And what does an N-layer draft step cost? The LM head (49,152 × 576 weights) is read whatever N is.
        We time one decode step of each truncated model, interleaved, as a fraction of the full step.
        """),
        code("""
        cost_depths = [4, 8, 16, 24, 28, 30]
        draft_times = {n: [] for n in cost_depths}
        views = {n: first_layers(model, n) for n in cost_depths}
        caches = {n: views[n].new_cache(max_tokens=80) for n in cost_depths}
        with torch.inference_mode():
            for n in cost_depths:
                views[n](torch.tensor([context_ids]), caches[n])
            for repeat in range(8):
                for n in cost_depths:
                    start = time.perf_counter()
                    views[n](torch.tensor([[context_ids[0]]]), caches[n])
                    elapsed = time.perf_counter() - start
                    caches[n].rollback(64)
                    if repeat > 0:
                        draft_times[n].append(elapsed)
        draft_cost = {n: statistics.median(draft_times[n]) / statistics.median(draft_times[30])
                      for n in cost_depths}
        print("cost of an N-layer step, in full steps:",
              {n: round(c, 2) for n, c in draft_cost.items()})
        for name, alphas in alpha_self.items():
            # the best any depth and any k could do for this prompt, even if verification were free
            best = max((expected_tokens_per_pass(alphas[n - 1], k) / (k * draft_cost[n] + 1), n, k)
                       for n in cost_depths[:-1] for k in range(1, 9))
            print(f"{name}: best self-draft, verification free: "
                  f"{best[0]:.2f}x (N={best[1]}, k={best[2]})")

        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for name, alphas in alpha_self.items():
            ax.plot(depths, alphas, "o-", markersize=3, label=f"α, {name} prompt")
        ax.plot(cost_depths, [draft_cost[n] for n in cost_depths], "s--", color="gray",
                label="draft step cost")
        ax.set_xlabel("draft depth N (layers of the target's 30)")
        ax.set_ylabel("α  /  cost in full steps")
        ax.set_title("Self-drafting: agreement with the full model vs cost")
        ax.legend()
        fig.tight_layout()
        """),
        md(r"""
        This is the weak spot of the self-draft on an off-the-shelf model. Its shallow layers were never
        trained to predict the next token, so where a draft step is cheap the early exit is rarely right,
        and where it is often right the step costs most of a full one. The last lines printed above are the
        best speed-up that any of these depths could give even with free verification; below 1 means the
        self-draft cannot win on this model. Published self-speculative methods
        choose which layers to skip by search {cite}`zhang2024draft`, or train the model so that early exits
        predict well {cite}`elhoushi2024layerskip`. Prompt lookup, by contrast, costs nothing to run, and
        is right whenever the answer copies the prompt.
        """),
        md(r"""
        ## Measured α, tokens per pass and speed-up against k

        Now the real runs, with memwall's `speculative_generate`. Each configuration generates the same 48
        tokens as plain greedy decoding (checked). α is counted over the guesses the rule actually tested,
        since guesses after a rejection are never looked at. Speed leaves the prompt's prefill out: tokens
        over the time after it. The plain speed it is divided by is measured by a short plain run just
        before, so that both halves of each ratio see the same load on this shared machine (one pair per
        row; `memwall bench speculative` repeats and takes medians). Next to the measured tokens per pass
        we put the formula at the measured α.
        Next to the measured speed-up we put a prediction built only from the costs measured earlier in this
        chapter: (tokens per pass from the formula) / (k × draft step cost + verify pass cost), in decode steps.
        """),
        code('''
        def predicted_speedup(alpha, k, draft_step_cost):
            verify = np.interp(k + 1, fed_counts, [verify_ratio[n] for n in fed_counts])
            return expected_tokens_per_pass(alpha, k) / (k * draft_step_cost + verify)


        def plain_tok_per_s(prompt, tokens=10):
            out = generate(model, prompt, tokens)
            return (len(out.tokens) - 1) / sum(out.step_times_s)


        runs = [("lookup:3", "quote", k) for k in (1, 2, 4, 8)] + [("lookup:3", "story", 4)]
        runs += [("self:8", "quote", 1), ("self:24", "quote", 2)]
        rows = []
        for draft_name, prompt_name, k in runs:
            kind, _, arg = draft_name.partition(":")
            draft = PromptLookupDraft(int(arg)) if kind == "lookup" else SelfDraft(model, int(arg))
            plain_speed = plain_tok_per_s(prompt_ids[prompt_name])
            out = speculative_generate(model, draft, prompt_ids[prompt_name], N_NEW, k=k)
            assert out.tokens == answers[prompt_name], (
                "speculative output differs from plain greedy")
            speed = len(out.tokens) / (out.total_s - out.prefill_s)
            alpha = out.acceptance_rate
            cost = 0.0 if kind == "lookup" else float(
                np.interp(int(arg), cost_depths, [draft_cost[n] for n in cost_depths]))
            rows.append(dict(draft=draft_name, prompt=prompt_name, k=k, alpha=alpha,
                             measured=out.mean_tokens_per_pass,
                             formula=expected_tokens_per_pass(alpha, k),
                             speedup=speed / plain_speed,
                             predicted=predicted_speedup(alpha, k, cost)))

        print(f"{'draft':>9} {'prompt':>6} {'k':>2} "
              f"{'alpha':>6} {'tokens/pass':>11} {'formula':>8} "
              f"{'speed-up':>9} {'predicted':>9}")
        for r in rows:
            print(f"{r['draft']:>9} {r['prompt']:>6} {r['k']:>2} "
                  f"{r['alpha']:6.2f} {r['measured']:11.2f} "
                  f"{r['formula']:8.2f} {r['speedup']:8.2f}x {r['predicted']:8.2f}x")
        '''),
        md(r"""
        How to read the table:

        - **Every run reproduced plain greedy output** (the `assert`), whatever the draft.
        - **Prompt lookup on the quoting prompt** has a high α, because the answer is the prompt. Its tokens
          per pass grow with k, as the formula says, but more slowly. Three things the formula leaves out
          cost tokens. Lookup sometimes has fewer than k tokens to propose, or none. The last pass is cut
          short at 48 tokens. And real acceptances are not independent: they come in runs, long stretches
          of copying and then a miss.
        - **The same draft on the story** has little to copy, so α and the tokens per pass drop.
        - **Self-drafting** pays for k draft steps, each a large fraction of a full step, and the early exit
          is rarely right at the depths that are cheap.

        Whether any row is a real speed-up on this machine depends on the verify cost measured at the top,
        and the "predicted" column shows how much of the measured result those costs explain. Timings on a
        shared machine are noisy. Trust the tokens per pass, which are exact, more than the
        second decimal of a speed-up.
        """),
        md(r"""
        ## When does it pay?

        Put the pieces together. In units of one decode step, a pass costs k·c for the draft plus v(k) for
        verification, and yields (1 − α^(k+1))/(1 − α) tokens. Speculation pays when that ratio exceeds 1.
        With the measured verify costs, the smallest α at which even a *free* draft breaks even is the α
        where the tokens per pass equal v(k):
        """),
        code("""
        alphas = np.linspace(0, 0.99, 100)
        for k in (1, 2, 4, 8):
            verify = np.interp(k + 1, fed_counts, [verify_ratio[n] for n in fed_counts])
            pays = [a for a in alphas if expected_tokens_per_pass(a, k) > verify]
            if verify <= 1:
                need = "any alpha above 0 (the pass costs no more than a step)"
            else:
                need = f"alpha > {pays[0]:.2f}" if pays else "more than alpha = 0.99"
            print(f"k={k}: a verify pass costs {verify:.2f} steps here; a free draft needs {need}")

        fig, ax = plt.subplots(figsize=(6.4, 3.6))
        for label, alpha, cost in [("lookup, quote", rows[2]["alpha"], 0.0),
                                   ("lookup, story", rows[4]["alpha"], 0.0),
                                   ("self:24, quote", rows[6]["alpha"], draft_cost[24])]:
            ax.plot(ks[:8], [predicted_speedup(alpha, k, cost) for k in ks[:8]], "o-", markersize=3,
                    label=f"{label} (α={alpha:.2f})")
            ax.plot(ks[:8], [expected_tokens_per_pass(alpha, k) / (k * cost + 1) for k in ks[:8]],
                    ":",
                    color=ax.lines[-1].get_color())
        ax.axhline(1, color="gray", linewidth=1)
        ax.set_xlabel("guesses per pass k")
        ax.set_ylabel("predicted speed-up")
        ax.set_title("Solid: this machine's verify cost. Dotted: verification free")
        ax.legend(fontsize=8)
        fig.tight_layout()
        """),
        md(r"""
        Three ways it fails to pay, each visible above:

        - **Low α.** Tokens per pass stay near 1, and every guess still costs draft time and verify width.
        - **A slow draft.** A draft step that costs a sizeable fraction of a target step eats the gain. The
          self-draft's N-layer step plus the full LM head does exactly that.
        - **Verification that is not free.** Where feeding k+1 tokens costs about one step (a memory-bound
          GPU at batch 1), the dotted curves apply. The solid curves use the v(k) measured on this machine.
          Wherever v(k) sits well above 1, the same draft with the same α can be a loss.

        When it pays is the classic setting. A big target is firmly memory-bound on a GPU, a small draft
        model has the same tokenizer and costs a few percent of a target step, and the text is predictable
        enough for a high α. Large batches, on the other hand, already share the weight read among
        users (chapter 6), so there is less left for speculation to win.
        """),
        md(r"""
        ## The online path: a separate draft model

        The draft from the original papers is a small model of the same family. SmolLM2-135M, -360M and
        -1.7B share one tokenizer, so the 135M model can draft for its big siblings. Its cost per step,
        relative to the target, is roughly the ratio of weight bytes, which memwall's cost model gives
        without downloading anything:
        """),
        code("""
        from memwall import cost
        from memwall.specs import get_spec

        draft_bytes = cost.weight_bytes(get_spec("smollm2-135m"), "bf16")
        for target in ("smollm2-360m", "smollm2-1.7b"):
            c = draft_bytes / cost.weight_bytes(get_spec(target), "bf16")
            vocab_ok = get_spec(target).vocab_size == get_spec("smollm2-135m").vocab_size
            best = max((expected_tokens_per_pass(0.7, k) / (k * c + 1), k) for k in range(1, 9))
            print(f"{target}: draft step ~ {c:.2f} of a target step; same vocabulary: {vocab_ok}; "
                  f"if alpha were 0.7 and verification free: {best[0]:.2f}x at k={best[1]}")
        """),
        md(r"""
        On a machine with network access (Colab, a workstation) the pair runs with the same code. It is not
        executed here, because the 1.7B model is a download:

        ```python
        from memwall.engine.drafts import ModelDraft

        target = Transformer.from_hf(models.load("smollm2-1.7b")[0])
        draft = ModelDraft(model)  # the SmolLM2-135M engine loaded at the top
        out = speculative_generate(target, draft, prompt, 128, k=4)
        print(out.acceptance_rate, out.mean_tokens_per_pass)
        ```

        or, from a shell, `memwall bench speculative --model smollm2-1.7b --draft model:smollm2-135m --k 4`.
        The same command with `--draft self:8` or `--draft lookup:3` runs offline on SmolLM2-135M. It reports
        α, tokens per pass next to the formula, and tok/s against plain decoding timed in the same run.
        """),
        md(r"""
        ## What to remember

        - Speculative decoding makes **each weight read produce several tokens** for one user. A draft
          guesses k tokens, and the target checks them all in one forward pass with its KV cache. Then the
          cache is rolled back past the first rejection.
        - The acceptance rule (accept with min(1, p/q), otherwise draw from the normalised max(0, p − q),
          plus a bonus token if all pass) makes the output **exactly** the target's distribution. Greedy
          speculation is token for token the target's greedy output.
        - Tokens per pass are (1 − α^(k+1))/(1 − α) if acceptances are independent, capped at 1/(1 − α).
          Measured runs come in lower, more so as k grows: proposals run short, the last pass is cut,
          and acceptances come in runs rather than independently. Compare the "tokens/pass" and
          "formula" columns above.
        - **Speed-up = tokens per pass ÷ (k × draft cost + verify cost).** It fails with a slow draft, a low
          α, or hardware where verifying k+1 tokens costs more than one step (the first table above says
          whether this one does). Measure the
          verify cost before believing a speed-up.
        - Which of the three levers is it? Not weight bytes and not KV bytes per step. It raises **how many
          tokens each weight read produces**, and so cuts the number of steps.

        Exercises: [exercises/08_speculative.ipynb](../exercises/08_speculative.ipynb). Compute tokens per
        pass, implement the acceptance step, and choose the best k for a draft's cost.
        """),
    ]
