"""Checks for chapter 8 (speculative decoding).

1. ``ch08.tokens_per_pass``: expected tokens per target pass when each guess position has its
   own acceptance rate (Leviathan et al. 2023 take one rate for all; so does the package's
   ``expected_tokens_per_pass``, which therefore does not answer this), k + 1 when all are kept.
2. ``ch08.accept_step``: one verification step of the exact rule, made deterministic by passing
   the two uniform draws: accept the guess if u < p/q, else invert the residual's CDF at v.
3. ``ch08.speedup``: speed-up over plain decoding from alpha, k, the draft's cost per step and
   the verify pass's extra cost per guessed token, all relative to one target decode step.
4. ``ch08.best_k``: the k that maximises that speed-up, or 0 when no k beats plain decoding.
5. ``ch08.verify_cost_per_token`` (measured): the verify pass's extra cost per guess, in decode
   steps, timed interleaved with plain decode steps on a pretend machine with a fake clock.
"""

from memwall.fakeclock import bench_spec
from memwall.grading.measured_compare import drifting, noisy_machine
from memwall.grading.registry import register_cases

CASES_PER_CHECK = 12
MAX_K = 16
# The measured extra cost per guess (in decode steps): a sound interleaved fit lands within a
# few percent, or within 0.02 of a step when the extra cost is tiny.
VERIFY_RTOL, VERIFY_ATOL = 0.1, 0.02


# ---- 1. expected tokens per target pass ------------------------------------------------------


def _tokens_per_pass(alpha, k):
    # The same acceptance at every position: 1 + alpha + ... + alpha^k.
    if alpha >= 1:
        return float(k + 1)
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def reference_tokens_per_pass(alphas):
    # The j-th guess counts only if guesses 1..j are all kept: 1 + sum over j of their product.
    expected, all_kept = 1.0, 1.0
    for alpha in alphas:
        all_kept *= alpha
        expected += all_kept
    return expected


def _constant_at_the_first_rate(alphas):  # the chapter's formula with alphas[0] everywhere
    return _tokens_per_pass(alphas[0], len(alphas))


def _forgets_the_target_token(alphas):
    return reference_tokens_per_pass(alphas) - 1


def _independent_guesses(alphas):  # each guess counted on its own, not only after the others
    return 1 + sum(alphas)


def acceptance_rates(rng, k):
    """Per-position acceptance rates: a draft that agrees less the further it guesses."""
    first, decay = rng.uniform(0.3, 1.0), rng.uniform(0.6, 1.0)
    return [min(1.0, first * decay**position) for position in range(k)]


@register_cases(
    "ch08.tokens_per_pass",
    reference=reference_tokens_per_pass,
    rtol=1e-09,
    wrong_answers=[_constant_at_the_first_rate, _forgets_the_target_token, _independent_guesses],
)
def cases_tokens_per_pass(rng):
    cases = [
        dict(alphas=acceptance_rates(rng, rng.randint(2, MAX_K)))
        for _ in range(CASES_PER_CHECK - 4)
    ]
    cases += [
        dict(alphas=[rng.uniform(0, 1) for _ in range(rng.randint(2, MAX_K))]),
        dict(alphas=[0.0] * rng.randint(1, MAX_K)),
        dict(alphas=[1.0] * rng.randint(1, MAX_K)),
        dict(alphas=[0.5]),
    ]
    return cases


# ---- 2. one step of the acceptance rule --------------------------------------------------------


def reference_accept_step(p, q, guess, u, v):
    if u < p[guess] / q[guess]:
        return guess
    residual = [max(0.0, pi - qi) for pi, qi in zip(p, q)]
    total = sum(residual)
    cumulative = 0.0
    for token, weight in enumerate(residual):
        cumulative += weight / total
        if v < cumulative:
            return token
    return max(
        token for token, weight in enumerate(residual) if weight > 0
    )  # v just below 1, rounding


def _inverse_cdf(weights, v):
    total, cumulative = sum(weights), 0.0
    for token, weight in enumerate(weights):
        cumulative += weight / total
        if v < cumulative:
            return token
    return len(weights) - 1


def _resample_from_p(p, q, guess, u, v):
    return guess if u < p[guess] / q[guess] else _inverse_cdf(p, v)


def _always_accept(p, q, guess, u, v):
    return guess


def random_distribution(rng, size, zeros=0):
    weights = [rng.random() ** 2 for _ in range(size)]
    for index in rng.sample(range(size), zeros):
        weights[index] = 0.0
    total = sum(weights)
    return [w / total for w in weights]


@register_cases(
    "ch08.accept_step",
    reference=reference_accept_step,
    wrong_answers=[_resample_from_p, _always_accept],
)
def cases_accept_step(rng):
    cases = []
    while len(cases) < CASES_PER_CHECK:
        size = rng.randint(3, 8)
        p, q = (
            random_distribution(rng, size, zeros=rng.randint(0, 1)),
            random_distribution(rng, size),
        )
        guess = rng.choices(range(size), weights=q)[0]
        u, v = rng.random(), rng.random()
        rejected = u >= p[guess] / q[guess]
        # two thirds rejections, so the residual is exercised; never a guess the target gives p = q
        if (rejected or len(cases) % 3 == 0) and any(abs(a - b) > 1e-9 for a, b in zip(p, q)):
            cases.append(dict(p=p, q=q, guess=guess, u=u, v=v))
    # Random draws can miss the usual mistakes (resampling from p or from q instead of the
    # residual) by landing on the same token, so a third of the cases are rejections where
    # those draws differ from the residual's.
    while sum(_telling_rejection(**case) for case in cases) < CASES_PER_CHECK // 3:
        size = rng.randint(3, 8)
        p, q = random_distribution(rng, size), random_distribution(rng, size)
        case = dict(p=p, q=q, guess=rng.randrange(size), u=rng.random(), v=rng.random())
        if _telling_rejection(**case):
            cases[rng.randrange(len(cases))] = case
    return cases


def _telling_rejection(p, q, guess, u, v):
    if u < p[guess] / q[guess]:
        return False
    right = reference_accept_step(p, q, guess, u, v)
    return right not in (_inverse_cdf(p, v), _inverse_cdf(q, v))


# ---- 3. speed-up from the cost model -----------------------------------------------------------


def reference_speedup(alpha, k, draft_cost, verify_cost_per_token):
    # One round: k draft steps, then one verify pass over k + 1 tokens that costs a decode step
    # plus verify_cost_per_token for each guess. Time unit: one plain decode step (one token).
    round_cost = k * draft_cost + 1 + k * verify_cost_per_token
    return _tokens_per_pass(alpha, k) / round_cost


@register_cases(
    "ch08.speedup",
    reference=reference_speedup,
    rtol=1e-09,
    wrong_answers=[
        lambda alpha, k, draft_cost, verify_cost_per_token: (
            _tokens_per_pass(alpha, k) / (k * draft_cost + 1)
        ),
        lambda alpha, k, draft_cost, verify_cost_per_token: (
            _tokens_per_pass(alpha, k) / (1 + k * verify_cost_per_token)
        ),
    ],
)
def cases_speedup(rng):
    cases = [
        dict(
            alpha=rng.uniform(0, 0.98),
            k=rng.randint(1, MAX_K),
            draft_cost=rng.uniform(0.01, 1),
            verify_cost_per_token=rng.uniform(0.01, 1),
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return cases


# ---- 4. the best k -----------------------------------------------------------------------------


def reference_best_k(alpha, draft_cost, verify_cost_per_token, k_max=MAX_K):
    speedups = {
        k: reference_speedup(alpha, k, draft_cost, verify_cost_per_token)
        for k in range(1, k_max + 1)
    }
    best = max(speedups, key=lambda k: (speedups[k], -k))  # ties go to the smaller k
    return best if speedups[best] > 1 else 0


def _best_tokens_per_pass_only(alpha, draft_cost, verify_cost_per_token, k_max=MAX_K):
    return k_max  # more guesses always give more tokens per pass, but not more per second


def _never_declines(alpha, draft_cost, verify_cost_per_token, k_max=MAX_K):
    return max(
        range(1, k_max + 1),
        key=lambda k: reference_speedup(alpha, k, draft_cost, verify_cost_per_token),
    )


@register_cases(
    "ch08.best_k",
    reference=reference_best_k,
    wrong_answers=[_best_tokens_per_pass_only, _never_declines],
)
def cases_best_k(rng):
    cases = []
    for number in range(CASES_PER_CHECK):
        if number % 3 == 0:  # a poor draft on a CPU: speculating does not pay
            case = dict(
                alpha=rng.uniform(0, 0.3),
                draft_cost=rng.uniform(0.3, 1),
                verify_cost_per_token=rng.uniform(0.2, 1),
            )
        else:
            case = dict(
                alpha=rng.uniform(0.5, 0.97),
                draft_cost=rng.uniform(0, 0.2),
                verify_cost_per_token=rng.uniform(0, 0.1),
            )
        cases.append({**case, "k_max": rng.choice([8, 16])})
    return cases


# ---- 5. the verify pass's cost, measured on a fake clock --------------------------------------


def verify_cost_cases(rng, n_cases=8):
    """A target whose verify pass costs one step plus a little per guess, on a drifting machine."""
    cases = []
    for _ in range(n_cases):
        decode_s = rng.uniform(2e-3, 40e-3)
        per_guess = rng.choice([rng.uniform(0.01, 0.08), rng.uniform(0.1, 0.6)])
        ks = sorted(rng.sample(range(1, 13), rng.randint(3, 6)))
        repeats = rng.randint(12, 20)
        run_s = repeats * sum(2 + per_guess * k for k in ks) * decode_s
        bench = bench_spec(
            "verify",
            machine=noisy_machine(rng, **drifting(rng, run_s)),
            decode_s=decode_s,
            extra_s_per_guess=per_guess * decode_s,
        )
        cases.append(dict(bench=bench, ks=ks, repeats=repeats))
    return cases


def reference_verify_cost_per_token(bench, ks, repeats):
    # The pretend target's true extra cost per guess, in plain decode steps.
    return bench["spec"]["extra_s_per_guess"] / bench["spec"]["decode_s"]


def _timed(bench, work, *args):
    start = bench.clock()
    work(*args)
    return bench.clock() - start


def _slope_through_origin(ks, ratios):
    return sum(k * (r - 1) for k, r in zip(ks, ratios)) / sum(k * k for k in ks)


def _decode_first_then_verify(bench, ks, repeats):  # medians, but drift separates the two
    bench.decode()
    bench.decode()
    decode = sorted(_timed(bench, bench.decode) for _ in range(repeats))[repeats // 2]
    ratios = []
    for k in ks:
        bench.verify(k)
        bench.verify(k)
        ratios.append(
            sorted(_timed(bench, bench.verify, k) for _ in range(repeats))[repeats // 2] / decode
        )
    return _slope_through_origin(ks, ratios)


def _whole_pass_per_token(bench, ks, repeats):  # verify time / (k + 1): not the extra cost
    bench.decode()
    bench.decode()
    ratios = []
    for k in ks:
        bench.verify(k)
        bench.verify(k)
        pairs = [
            _timed(bench, bench.verify, k) / _timed(bench, bench.decode) for _ in range(repeats)
        ]
        ratios.append(sorted(pairs)[repeats // 2])
    return sum(r / (k + 1) for k, r in zip(ks, ratios)) / len(ks)


def _cold_single_pairs(bench, ks, repeats):  # one pair each, slow first calls included
    ratios = [_timed(bench, bench.verify, k) / _timed(bench, bench.decode) for k in ks]
    return _slope_through_origin(ks, ratios)


@register_cases(
    "ch08.verify_cost_per_token",
    reference=reference_verify_cost_per_token,
    rtol=VERIFY_RTOL,
    atol=VERIFY_ATOL,
    measured=True,
    wrong_answers=[_decode_first_then_verify, _whole_pass_per_token, _cold_single_pairs],
)
def cases_verify_cost_per_token(rng):
    return verify_cost_cases(rng)
