"""Checks for chapter 9, "Measuring inference".

- ch09.fraction_of_roofline: measured tokens/s as a fraction of the bandwidth ceiling.
- ch09.ab_slowdown (measured): an A/B timer on a pretend machine that drifts and jumps; the
  median of per-round ratios survives, all-A-then-all-B and means do not.
- ch09.moe_weight_bytes: expected expert bytes a mixture-of-experts step reads at a batch, when
  each expert has its own pick chance; memwall's expected_experts_touched assumes even routing,
  so it does not answer this.
- ch09.warmup_steps (measured): how many slow steps a run starts with.
"""

from memwall.fakeclock import bench_spec
from memwall.grading.measured_compare import drifting, noisy_machine
from memwall.grading.registry import register_cases

CASES = 12
# A sound A/B method lands within 1-2% of the truth on these machines; a naive one is off by 10-40%.
AB_RTOL = 0.05


def reference_fraction_of_roofline(tok_per_s, bytes_per_step, bandwidth_gb_s, tokens_per_step=1):
    # The ceiling: tokens per step times the steps per second the bandwidth allows.
    ceiling = tokens_per_step * bandwidth_gb_s * 1e9 / bytes_per_step
    return tok_per_s / ceiling


def reference_moe_weight_bytes(batch, pick_probs, expert_bytes, shared_bytes):
    # Expert i is read unless all `batch` tokens miss it, each with probability 1 - pick_probs[i];
    # the expected number read is the sum of those chances (linearity of expectation).
    touched = sum(1 - (1 - p) ** batch for p in pick_probs)
    return shared_bytes + touched * expert_bytes


def _batch_of_one(batch, pick_probs, expert_bytes, shared_bytes):  # every token the same experts
    return shared_bytes + sum(pick_probs) * expert_bytes


def _even_router(batch, pick_probs, expert_bytes, shared_bytes):
    # The chapter's formula, as memwall.cost.expected_experts_touched computes it: every expert
    # equally likely, E (1 - (1 - a/E)^B).
    n_experts, active = len(pick_probs), sum(pick_probs)
    touched = n_experts * (1 - (1 - active / n_experts) ** batch)
    return shared_bytes + touched * expert_bytes


def _no_expert_twice(batch, pick_probs, expert_bytes, shared_bytes):  # the batch never repeats
    return shared_bytes + min(len(pick_probs), batch * sum(pick_probs)) * expert_bytes


def router_probs(rng, n_experts, active):
    """Per-expert pick chances adding up to `active`: a router with favourites, or an uneven one."""
    even = active / n_experts
    shape = rng.choice(["favourites", "uneven", "uneven"])
    if shape == "favourites":  # some tokens go to a fixed set of experts, the rest evenly
        favouritism = rng.uniform(0.3, 0.95)
        favourites = set(rng.sample(range(n_experts), active))
        return [(1 - favouritism) * even + (favouritism if i in favourites else 0)
                for i in range(n_experts)]  # fmt: skip
    weights = [rng.uniform(0.05, 1) ** 3 for _ in range(n_experts)]  # a few popular experts
    probs = [active * w / sum(weights) for w in weights]
    # No expert can be picked more than once per token: mix with the even router until p <= 1.
    mix = min(1.0, (1 - even) / (max(probs) - even)) if max(probs) > 1 else 1.0
    return [min(1.0, even + mix * (p - even)) for p in probs]


@register_cases(
    "ch09.fraction_of_roofline",
    reference=reference_fraction_of_roofline,
    wrong_answers=[
        lambda tok_per_s, bytes_per_step, bandwidth_gb_s, tokens_per_step=1: (
            tok_per_s * bytes_per_step / (bandwidth_gb_s * 1000000000.0)
        )
    ],
)
def cases_fraction_of_roofline(rng):
    cases = [
        dict(
            tok_per_s=rng.uniform(1, 500),
            bytes_per_step=rng.uniform(1e8, 2e10),
            bandwidth_gb_s=rng.uniform(20, 5000),
            tokens_per_step=rng.choice([1, 1, 2, 4, 16]),
        )
        for _ in range(CASES)
    ]
    return cases


def ab_cases(rng, n_cases=CASES):
    """A/B benches on a machine that drifts and jumps: plain data only."""
    cases = []
    for _ in range(n_cases):
        a_s = rng.uniform(1e-3, 50e-3)
        b_s = a_s * rng.choice([rng.uniform(0.5, 0.9), rng.uniform(1.1, 2.5)])
        repeats = rng.randint(20, 40)
        run_s = repeats * (a_s + b_s)
        machine = noisy_machine(rng, **drifting(rng, run_s))
        bench = bench_spec("ab", machine=machine, a_s=a_s, b_s=b_s)
        cases.append(dict(bench=bench, repeats=repeats))
    return cases


def reference_slowdown(bench, repeats):
    # The truth of the pretend machine: how many times longer B's work is than A's.
    return bench["spec"]["b_s"] / bench["spec"]["a_s"]


def _median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def _timed(bench, work):
    start = bench.clock()
    work()
    return bench.clock() - start


def _all_a_then_all_b(bench, repeats):  # medians, but B is timed after A: drift decides
    a = [_timed(bench, bench.run_a) for _ in range(repeats)]
    b = [_timed(bench, bench.run_b) for _ in range(repeats)]
    return _median(b) / _median(a)


def _interleaved_means(bench, repeats):  # interleaved, but one outlier moves a mean
    a, b = [], []
    for _ in range(repeats):
        a.append(_timed(bench, bench.run_a))
        b.append(_timed(bench, bench.run_b))
    return sum(b) / sum(a)


def _one_pair(bench, repeats):  # a single cold pair
    return _timed(bench, bench.run_b) / _timed(bench, bench.run_a)


@register_cases(
    "ch09.ab_slowdown",
    reference=reference_slowdown,
    rtol=AB_RTOL,
    measured=True,
    wrong_answers=[_all_a_then_all_b, _interleaved_means],
)
def cases_ab_slowdown(rng):
    return ab_cases(rng)


@register_cases(
    "ch09.moe_weight_bytes",
    reference=reference_moe_weight_bytes,
    wrong_answers=[_batch_of_one, _even_router, _no_expert_twice],
)
def cases_moe_weight_bytes(rng):
    cases = []
    for number in range(CASES):
        n_experts = rng.choice([8, 16, 64, 128])
        active = rng.randint(1, min(8, n_experts - 1))
        if number == CASES - 1:  # the chapter's even router, which the formula above also covers
            pick_probs = [active / n_experts] * n_experts
        else:
            pick_probs = router_probs(rng, n_experts, active)
        cases.append(
            dict(
                batch=rng.randint(2, 256),
                pick_probs=pick_probs,
                expert_bytes=rng.uniform(1e7, 5e9),
                shared_bytes=rng.uniform(1e8, 5e9),
            )
        )
    return cases


def warmup_cases(rng, n_cases=CASES):
    """Runs whose first 2-8 steps are slow; the rest jitter around one level (no outliers)."""
    cases = []
    for _ in range(n_cases):
        machine = dict(
            seed=rng.getrandbits(32),
            noise=rng.uniform(0.01, 0.04),
            warmup_calls=rng.randint(2, 8),
            warmup_factor=rng.uniform(3.0, 6.0),
        )
        bench = bench_spec("steps", machine=machine, step_s=rng.uniform(1e-3, 0.1))
        cases.append(dict(bench=bench, n_steps=rng.randint(30, 60)))
    return cases


def reference_warmup_steps(bench, n_steps):
    # The pretend run's truth: how many steps at its start are slow.
    return bench["spec"]["machine"]["warmup_calls"]


def _step_times(bench, n_steps):
    times = []
    for _ in range(n_steps):
        start = bench.clock()
        bench.step()
        times.append(bench.clock() - start)
    return times


def _always_one(bench, n_steps):  # "drop the first step", whatever the run does
    _step_times(bench, n_steps)
    return 1


def _fixed_five(bench, n_steps):  # a fixed warm-up count, whatever the run does
    _step_times(bench, n_steps)
    return 5


def _slower_than_the_next(bench, n_steps):  # stops at the first step not slower than the next
    times = _step_times(bench, n_steps)
    return next((i for i in range(len(times) - 1) if times[i] <= times[i + 1]), 0)


@register_cases(
    "ch09.warmup_steps",
    reference=reference_warmup_steps,
    rtol=0,
    measured=True,
    wrong_answers=[_always_one, _fixed_five, _slower_than_the_next],
)
def cases_warmup_steps(rng):
    return warmup_cases(rng)
