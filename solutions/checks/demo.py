"""Demo checks: the worked example of a check module, and the grader's own test fixture.

A check is a case generator (``cases(rng)``, plain data drawn from a seeded ``random.Random``),
a reference written here, out of the student's sight, and a comparison (``register_cases``).
``demo.mean_step_s`` is a measured exercise whose cases hold a build spec for a fake clock and
workload. (A check that cannot be cases and a reference, because it compares something built
from the student's function, uses ``@register``: ``ch05.mean_pool_heads`` is the one.)
"""

from memwall.exercise_driver.values import build_spec
from memwall.grading.registry import register_cases

CASES_PER_CHECK = 12


def reference_matrix_bytes(rows, cols, bytes_per_element):
    return rows * cols * bytes_per_element


def reference_matmul_intensity(m, n, k, bytes_per_element):
    # (m x k) @ (k x n): one multiply and one add per term; read both inputs, write the output once.
    flops = 2 * m * n * k
    bytes_moved = (m * k + k * n + m * n) * bytes_per_element
    return flops / bytes_moved


def reference_decode_ceilings(bandwidth_gb_s, model_sizes_gb):
    # Each generated token reads every weight once, so tokens/s <= bandwidth / model size.
    return [bandwidth_gb_s / size for size in model_sizes_gb]


@register_cases(
    "demo.matrix_bytes",
    reference=reference_matrix_bytes,
    wrong_answers=[lambda rows, cols, bytes_per_element: rows * cols],
)
def cases_matrix_bytes(rng):
    return [
        dict(
            rows=rng.randint(1, 8192),
            cols=rng.randint(1, 8192),
            bytes_per_element=rng.choice([1, 2, 4]),
        )
        for _ in range(CASES_PER_CHECK)
    ]


@register_cases(
    "demo.matmul_intensity",
    reference=reference_matmul_intensity,
    wrong_answers=[
        lambda m, n, k, bytes_per_element: m * n * k / ((m * k + k * n + m * n) * bytes_per_element)
    ],
)
def cases_matmul_intensity(rng):
    return [
        dict(
            m=rng.randint(1, 4096),
            n=rng.randint(1, 4096),
            k=rng.randint(1, 4096),
            bytes_per_element=rng.choice([1, 2, 4]),
        )
        for _ in range(CASES_PER_CHECK)
    ]


@register_cases(
    "demo.decode_ceilings",
    reference=reference_decode_ceilings,
    wrong_answers=[
        lambda bandwidth_gb_s, model_sizes_gb: [s / bandwidth_gb_s for s in model_sizes_gb]
    ],
)
def cases_decode_ceilings(rng):
    cases = [
        dict(
            bandwidth_gb_s=rng.uniform(20, 4800),
            model_sizes_gb=[rng.uniform(0.1, 140) for _ in range(rng.randint(1, 5))],
        )
        for _ in range(CASES_PER_CHECK)
    ]
    return cases


# A measured exercise: the student's function gets a workload and a fake clock (built from plain
# data on whichever side calls it) and must time the steps after the first, slow one.
def reference_mean_step_s(workload):
    workload.run_step()  # warm-up, not timed
    started = workload.clock()
    for _ in range(workload.n_steps - 1):
        workload.run_step()
    return (workload.clock() - started) / (workload.n_steps - 1)


def _timing_the_warm_up_too(workload):
    started = workload.clock()
    for _ in range(workload.n_steps):
        workload.run_step()
    return (workload.clock() - started) / workload.n_steps


@register_cases(
    "demo.mean_step_s", reference=reference_mean_step_s, wrong_answers=[_timing_the_warm_up_too]
)
def cases_mean_step_s(rng):
    cases = []
    for _ in range(CASES_PER_CHECK):
        step = rng.uniform(0.001, 0.1)
        steps = [step * rng.uniform(5, 50)] + [
            step * rng.uniform(0.9, 1.1) for _ in range(rng.randint(2, 20))
        ]
        cases.append(dict(workload=build_spec("fake_clock_workload", step_times_s=steps)))
    return cases
