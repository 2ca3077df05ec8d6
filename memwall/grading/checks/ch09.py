"""Checks for chapter 9, "Measuring inference"."""

from memwall.grading import compare_function, register

CASES = 12


def reference_fraction_of_roofline(tok_per_s, bytes_per_step, bandwidth_gb_s, tokens_per_step=1):
    # The ceiling: tokens per step times the steps per second the bandwidth allows.
    ceiling = tokens_per_step * bandwidth_gb_s * 1e9 / bytes_per_step
    return tok_per_s / ceiling


def reference_percentile(values, q):
    # Linear interpolation between the two closest ranks (numpy's default).
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def reference_moe_weight_bytes(batch, n_experts, active_experts, expert_bytes, shared_bytes):
    # Each token picks `active_experts` of `n_experts`; an expert is read if any token in the batch picks it.
    touched = n_experts * (1 - (1 - active_experts / n_experts) ** batch)
    return shared_bytes + touched * expert_bytes


@register(
    "ch09.fraction_of_roofline",
    wrong_answers=[
        lambda tok_per_s, bytes_per_step, bandwidth_gb_s, tokens_per_step=1: (
            tok_per_s * bytes_per_step / (bandwidth_gb_s * 1e9)
        ),
    ],
)
def check_fraction_of_roofline(student, rng):
    cases = [
        dict(
            tok_per_s=rng.uniform(1, 500),
            bytes_per_step=rng.uniform(1e8, 2e10),
            bandwidth_gb_s=rng.uniform(20, 5000),
            tokens_per_step=rng.choice([1, 1, 2, 4, 16]),
        )
        for _ in range(CASES)
    ]
    return compare_function(student, reference_fraction_of_roofline, cases)


@register(
    "ch09.percentile",
    wrong_answers=[
        lambda values, q: sorted(values)[int((len(values) - 1) * q / 100)],
        lambda values, q: sum(values) / len(values),
    ],
)
def check_percentile(student, rng):
    cases = []
    for _ in range(CASES):
        values = [rng.lognormvariate(3.5, 0.3) for _ in range(rng.randint(2, 60))]
        cases.append(dict(values=values, q=rng.choice([10, 50, 90, 99, rng.uniform(0, 100)])))
    cases.append(dict(values=[5.0], q=90))
    return compare_function(student, reference_percentile, cases)


@register(
    "ch09.moe_weight_bytes",
    wrong_answers=[
        lambda batch, n_experts, active_experts, expert_bytes, shared_bytes: (
            shared_bytes + active_experts * expert_bytes
        ),
        lambda batch, n_experts, active_experts, expert_bytes, shared_bytes: (
            shared_bytes + min(n_experts, batch * active_experts) * expert_bytes
        ),
    ],
)
def check_moe_weight_bytes(student, rng):
    cases = []
    for _ in range(CASES):
        n_experts = rng.choice([8, 16, 64, 128])
        cases.append(
            dict(
                batch=rng.randint(2, 256),
                n_experts=n_experts,
                active_experts=rng.randint(1, min(8, n_experts - 1)),
                expert_bytes=rng.uniform(1e7, 5e9),
                shared_bytes=rng.uniform(1e8, 5e9),
            )
        )
    return compare_function(student, reference_moe_weight_bytes, cases)
