"""Chapter 8 exercises (solutions notebook; `memwall exercises` makes the student copy)."""

from nbcells import check, code, exercise, md, notebook


def build():
    return notebook("08_speculative_solutions", [
        md("""
        # Exercises 8: speculative decoding

        Four pieces of chapter 8, written by you. Each has a widget that draws your function next to
        memwall's; until you fill it in, the widget says "not implemented yet". The check cell under each
        exercise tests your function on hidden random cases. Everything here is plain Python: no model is
        loaded.
        """),
        code("""
        import random
        from functools import lru_cache

        from memwall.widgets import compare_plot
        """),
        md("""
        ## Exercise 1: expected tokens per target pass

        A draft proposes `k` tokens and each is accepted with probability `alpha`, independently, until the
        first rejection. The target's pass always contributes one token of its own: the replacement for
        the first rejected guess, or a bonus token when all `k` survive. Return the expected number of
        tokens one target pass produces. Mind `alpha = 1`.
        """),
        exercise("ch08.tokens_per_pass", "1 + alpha + alpha^2 + ... + alpha^k; every guess kept gives k + 1", '''
        def tokens_per_pass(alpha, k):
            """Expected tokens per target pass with k guesses,
            each accepted with probability alpha."""
            ### BEGIN SOLUTION
            if alpha >= 1:
                return float(k + 1)
            return (1 - alpha ** (k + 1)) / (1 - alpha)
            ### END SOLUTION
        '''),
        md("""
        Move `alpha` and watch the curve flatten. However many guesses you allow, a pass never yields more
        than `1 / (1 - alpha)` tokens on average.
        """),
        code("""
        from memwall.grading.checks.ch08 import reference_tokens_per_pass

        compare_plot(tokens_per_pass, reference_tokens_per_pass, x=("k", list(range(1, 17))),
                     sliders={"alpha": (0.0, 1.0, 0.05, 0.8)},
                     xlabel="guesses per pass k", ylabel="expected tokens per pass")
        """),
        check("ch08.tokens_per_pass", "tokens_per_pass", 1),
        md("""
        ## Exercise 2: the acceptance step

        Implement one verification step of the exact rule, for a single guess. `p` and `q` are lists of
        probabilities over the same tokens (target and draft), and `guess` was drawn from `q`. So that the
        answer is checkable, the randomness is passed in as two uniform numbers in [0, 1):

        - accept the guess if `u < p[guess] / q[guess]`, and return it;
        - otherwise return a token drawn from the residual `max(0, p - q)`, normalised to sum to 1, by
          inverting its cumulative distribution at `v`: the first token whose cumulative residual
          probability exceeds `v`.
        """),
        exercise("ch08.accept_step", "accept if u < p/q; else walk the normalised residual max(0, p - q) until the running sum exceeds v", '''
        def accept_step(p, q, guess, u, v):
            """The token a verify step emits for one guess drawn from q, given uniforms u and v."""
            ### BEGIN SOLUTION
            if u < p[guess] / q[guess]:
                return guess
            residual = [max(0.0, pi - qi) for pi, qi in zip(p, q)]
            total = sum(residual)
            cumulative = 0.0
            for token, weight in enumerate(residual):
                cumulative += weight / total
                if v < cumulative:
                    return token
            return max(token for token, weight in enumerate(residual) if weight > 0)
            ### END SOLUTION
        '''),
        md("""
        The widget runs your step 4,000 times on a toy pair: a target `p` over six tokens, and a draft that
        is `p` shifted by `draft_shift` tokens and blended with a uniform guess by `draft_mix`. It plots how
        often each token comes out. The reference curve is `p` itself. If your rule is exact, the two agree
        to within sampling noise, *whatever the draft*. Try a draft that is badly wrong (shift 3, mix 0).
        """),
        code('''
        TOY_P = (0.35, 0.25, 0.20, 0.10, 0.07, 0.03)


        def toy_draft(draft_shift, draft_mix):
            shifted = TOY_P[-draft_shift:] + TOY_P[:-draft_shift] if draft_shift else TOY_P
            return tuple((1 - draft_mix) * s + draft_mix / len(TOY_P) for s in shifted)


        @lru_cache(maxsize=64)
        def emitted_frequencies(step, draft_shift, draft_mix, trials=4000):
            q = toy_draft(draft_shift, draft_mix)
            rng = random.Random(0)
            counts = [0] * len(TOY_P)
            for _ in range(trials):
                guess = rng.choices(range(len(q)), weights=q)[0]
                counts[step(list(TOY_P), list(q), guess, rng.random(), rng.random())] += 1
            return tuple(c / trials for c in counts)


        compare_plot(lambda token, draft_shift, draft_mix:
                         emitted_frequencies(accept_step, draft_shift, draft_mix)[token],
                     lambda token, draft_shift, draft_mix: TOY_P[token],
                     x=("token", list(range(len(TOY_P)))),
                     sliders={"draft_shift": (0, 5, 1, 2), "draft_mix": (0.0, 1.0, 0.1, 0.2)},
                     xlabel="token", ylabel="frequency emitted (reference: p)")
        '''),
        check("ch08.accept_step", "accept_step", 2),
        md("""
        ## Exercise 3: the speed-up

        Count time in units of one plain decode step of the target (one token). One speculative round runs
        the draft `k` times, at `draft_cost` each. It then runs one verify pass over `k + 1` tokens, which
        costs one step plus `verify_cost_per_token` for each of the `k` guesses. On a memory-bound GPU that
        extra cost is near 0; chapter 8 measured it on this CPU. Return the expected speed-up over plain
        decoding: the tokens per round divided by the cost of a round.
        """),
        exercise("ch08.speedup", "tokens_per_pass(alpha, k) / (k * draft_cost + 1 + k * verify_cost_per_token)", '''
        def speedup(alpha, k, draft_cost, verify_cost_per_token):
            """Expected tokens per unit of time, relative to plain decoding (1.0 = no gain)."""
            ### BEGIN SOLUTION
            return tokens_per_pass(alpha, k) / (k * draft_cost + 1 + k * verify_cost_per_token)
            ### END SOLUTION
        '''),
        md("""
        The defaults describe a good small draft model on a GPU. Raise `verify_cost_per_token` towards what
        chapter 8 measured here, or `draft_cost` towards a self-draft's, and watch the speed-up sink below 1.
        """),
        code("""
        from memwall.grading.checks.ch08 import reference_speedup

        compare_plot(speedup, reference_speedup, x=("k", list(range(1, 17))),
                     sliders={"alpha": (0.0, 0.99, 0.01, 0.8), "draft_cost": (0.0, 1.0, 0.01, 0.05),
                              "verify_cost_per_token": (0.0, 1.0, 0.01, 0.02)},
                     xlabel="guesses per pass k", ylabel="speed-up over plain decoding")
        """),
        check("ch08.speedup", "speedup", 2),
        md("""
        ## Exercise 4: choosing k

        Return the `k` between 1 and `k_max` with the largest speed-up (the smallest such `k` if several
        tie). If no `k` gives a speed-up above 1, return 0: do not speculate at all.
        """),
        exercise("ch08.best_k", "evaluate speedup for every k in 1..k_max, keep the best; 0 if it is not above 1", '''
        def best_k(alpha, draft_cost, verify_cost_per_token, k_max=16):
            """The number of guesses per pass that decodes fastest,
            or 0 if speculation never pays."""
            ### BEGIN SOLUTION
            best, best_speedup = 0, 1.0
            for k in range(1, k_max + 1):
                s = speedup(alpha, k, draft_cost, verify_cost_per_token)
                if s > best_speedup:
                    best, best_speedup = k, s
            return best
            ### END SOLUTION
        '''),
        md("""
        The best k climbs steeply as α approaches 1, and falls to 0, meaning "decode plainly", when the
        draft is slow or verification is expensive.
        """),
        code("""
        from memwall.grading.checks.ch08 import reference_best_k

        compare_plot(best_k, reference_best_k, x=("alpha", [i / 20 for i in range(20)]),
                     sliders={"draft_cost": (0.0, 1.0, 0.01, 0.05),
                              "verify_cost_per_token": (0.0, 1.0, 0.01, 0.02),
                              "k_max": 16},
                     xlabel="acceptance rate alpha", ylabel="best k (0 = do not speculate)")
        """),
        check("ch08.best_k", "best_k", 2),
    ])
