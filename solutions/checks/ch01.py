"""Checks for chapter 1, "Two phases behind one API call": TTFT, TPOT, and which phase dominates.

Definitions as in the chapter: TTFT is when the first output token arrives (seconds after the
request); TPOT is the average gap between output tokens after the first; a reply of n tokens
takes TTFT + (n - 1) x TPOT. Hidden cases are drawn at random around realistic timings.
"""

import math

from memwall.grading.registry import register_cases

CASES_PER_CHECK = 12


# ---- references ------------------------------------------------------------------------------


def reference_prefill_dominates_at(ttft_fixed_s, ttft_s_per_token, tpot_s, answer_tokens):
    # The smallest prompt whose TTFT (a line through the chapter's sweep) is at least the time
    # the other answer_tokens - 1 tokens take to decode; a prompt has at least one token.
    decode_s = (answer_tokens - 1) * tpot_s
    return max(1, math.ceil((decode_s - ttft_fixed_s) / ttft_s_per_token))


def reference_time_per_output_token(token_times_s):
    # The mean of the n - 1 gaps telescopes to (last - first) / (n - 1); TTFT is not a gap.
    return (token_times_s[-1] - token_times_s[0]) / (len(token_times_s) - 1)


def reference_decode_tokens_per_s(step_times_s):
    # The median step, so one pause (another process, a page fault) does not drag the rate down.
    ordered = sorted(step_times_s)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return 1.0 / median


def reference_predict_ttft(prompt_lengths, ttfts_s, prompt_tokens):
    # Least-squares line ttft = intercept + slope x length through the measurements.
    count = len(prompt_lengths)
    mean_x = sum(prompt_lengths) / count
    mean_y = sum(ttfts_s) / count
    covariance = sum((x - mean_x) * (y - mean_y) for x, y in zip(prompt_lengths, ttfts_s))
    variance = sum((x - mean_x) ** 2 for x in prompt_lengths)
    slope = covariance / variance
    return mean_y + slope * (prompt_tokens - mean_x)


# ---- random cases ----------------------------------------------------------------------------


def token_stream(rng, n_tokens):
    """Arrival times of n tokens: a TTFT, then decode gaps with jitter and now and then a pause."""
    ttft = rng.uniform(0.02, 3.0)
    tpot = rng.uniform(0.005, 0.2)
    times = [ttft]
    for _ in range(n_tokens - 1):
        pause = rng.uniform(2, 10) * tpot if rng.random() < 0.1 else 0.0
        times.append(times[-1] + tpot * rng.uniform(0.8, 1.25) + pause)
    return times


def step_times_with_outliers(rng):
    """Decode step times: mostly near one value, with one or two long pauses."""
    typical = rng.uniform(0.005, 0.2)
    times = [typical * rng.uniform(0.9, 1.15) for _ in range(rng.randint(5, 40))]
    for _ in range(rng.randint(1, 2)):
        times[rng.randrange(len(times))] = typical * rng.uniform(5, 30)
    return times


def measured_ttfts(rng):
    """A sweep of prompt lengths and noisy TTFTs on a line, as in the chapter."""
    intercept, slope = rng.uniform(0.005, 0.1), rng.uniform(1e-4, 5e-3)
    lengths = sorted(rng.sample(range(8, 4097), rng.randint(3, 8)))
    return lengths, [intercept + slope * n * rng.uniform(0.9, 1.1) for n in lengths]


# ---- checks ----------------------------------------------------------------------------------


def prefill_cases(rng):
    cases = []
    for _ in range(CASES_PER_CHECK):
        tpot_s = rng.uniform(0.005, 0.1)
        cases.append(
            dict(
                ttft_fixed_s=rng.uniform(0.005, 0.1),
                ttft_s_per_token=tpot_s
                / rng.uniform(5, 200),  # prefill is 5-200x cheaper per token
                tpot_s=tpot_s,
                answer_tokens=rng.randint(2, 2000),
            )
        )
    cases[0]["answer_tokens"] = 1  # nothing left to decode: any prompt dominates
    return cases


def _counts_every_answer_token(ttft_fixed_s, ttft_s_per_token, tpot_s, answer_tokens):
    return max(1, math.ceil((answer_tokens * tpot_s - ttft_fixed_s) / ttft_s_per_token))


def _forgets_the_fixed_cost(ttft_fixed_s, ttft_s_per_token, tpot_s, answer_tokens):
    return max(1, math.ceil((answer_tokens - 1) * tpot_s / ttft_s_per_token))


def _rounds_down(ttft_fixed_s, ttft_s_per_token, tpot_s, answer_tokens):
    return max(1, int(((answer_tokens - 1) * tpot_s - ttft_fixed_s) / ttft_s_per_token))


@register_cases(
    "ch01.prefill_dominates_at",
    reference=reference_prefill_dominates_at,
    wrong_answers=[_counts_every_answer_token, _forgets_the_fixed_cost, _rounds_down],
)
def check_prefill_dominates_at(rng):
    return prefill_cases(rng)


@register_cases(
    "ch01.tpot",
    reference=reference_time_per_output_token,
    wrong_answers=[
        lambda token_times_s: token_times_s[-1] / len(token_times_s),
        lambda token_times_s: (token_times_s[-1] - token_times_s[0]) / len(token_times_s),
    ],
)
def cases_time_per_output_token(rng):
    cases = [
        dict(token_times_s=token_stream(rng, rng.randint(2, 300))) for _ in range(CASES_PER_CHECK)
    ]
    return cases


@register_cases(
    "ch01.decode_rate",
    reference=reference_decode_tokens_per_s,
    wrong_answers=[
        lambda step_times_s: len(step_times_s) / sum(step_times_s),
        lambda step_times_s: sorted(step_times_s)[len(step_times_s) // 2],
    ],
)
def cases_decode_tokens_per_s(rng):
    cases = [dict(step_times_s=step_times_with_outliers(rng)) for _ in range(CASES_PER_CHECK)]
    return cases


def _through_last_point(prompt_lengths, ttfts_s, prompt_tokens):
    return ttfts_s[-1] / prompt_lengths[-1] * prompt_tokens


def _through_first_and_last(prompt_lengths, ttfts_s, prompt_tokens):
    slope = (ttfts_s[-1] - ttfts_s[0]) / (prompt_lengths[-1] - prompt_lengths[0])
    return ttfts_s[0] + slope * (prompt_tokens - prompt_lengths[0])


@register_cases(
    "ch01.predict_ttft",
    reference=reference_predict_ttft,
    atol=1e-09,
    wrong_answers=[_through_last_point, _through_first_and_last],
)
def cases_predict_ttft(rng):
    cases = []
    for _ in range(CASES_PER_CHECK):
        lengths, ttfts = measured_ttfts(rng)
        cases.append(
            dict(prompt_lengths=lengths, ttfts_s=ttfts, prompt_tokens=rng.randint(1, 8192))
        )
    return cases
